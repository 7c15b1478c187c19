// ModelInstance: a loaded checkpoint on a backend with its caches; what ModelRunner and the
// engine's ModelExecutor both drive.
#pragma once

#include <memory>
#include <string>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "model/cache_tensors.h"
#include "model/deepseek_v4.h"

namespace deepinfer {

struct ModelInstance {
  ModelConfig config;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ModelCaches> caches;
  std::unique_ptr<DeepseekV4Model> model;

  // Reads <dir>/config.json and the safetensors weights onto a CPU backend with `num_threads`.
  static std::unique_ptr<ModelInstance> load(const std::string& checkpoint_dir,
                                             const CacheShape& shape, int num_threads);
};

}  // namespace deepinfer
