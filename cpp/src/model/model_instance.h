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

  // Reads <dir>/config.json and the safetensors weights onto `device` ("cpu", "cuda", "cuda:N";
  // `num_threads` is for the CPU backend).
  static std::unique_ptr<ModelInstance> load(const std::string& checkpoint_dir,
                                             const CacheShape& shape, const std::string& device,
                                             int num_threads);
  // The model of `config` with random weights (matrices stored as `stored`), for benchmarks.
  static std::unique_ptr<ModelInstance> random(const ModelConfig& config, const CacheShape& shape,
                                               const std::string& device, int num_threads,
                                               uint64_t seed, DType stored);
};

}  // namespace deepinfer
