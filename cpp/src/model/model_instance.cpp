#include "model/model_instance.h"

#include <filesystem>

#include "deepinfer/error.h"
#include "model/checkpoint.h"
#include "model/weights.h"

namespace deepinfer {

std::unique_ptr<ModelInstance> ModelInstance::load(const std::string& checkpoint_dir,
                                                   const CacheShape& shape,
                                                   const std::string& device, int num_threads) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(checkpoint_dir)) {
    throw Error(ErrorCode::kNotFound, checkpoint_dir + ": checkpoint directory does not exist");
  }
  auto m = std::make_unique<ModelInstance>();
  m->config = ModelConfig::from_file((fs::path(checkpoint_dir) / "config.json").string());
  Checkpoint checkpoint = Checkpoint::open(checkpoint_dir);
  m->backend = make_backend(device, num_threads);
  m->caches = std::make_unique<ModelCaches>(m->config, shape, *m->backend);
  m->model = std::make_unique<DeepseekV4Model>(
      m->config, load_model_weights(checkpoint, m->config, *m->backend), *m->backend);
  return m;
}

std::unique_ptr<ModelInstance> ModelInstance::random(const ModelConfig& config,
                                                     const CacheShape& shape,
                                                     const std::string& device, int num_threads,
                                                     uint64_t seed, DType stored) {
  auto m = std::make_unique<ModelInstance>();
  m->config = config;
  m->backend = make_backend(device, num_threads);
  m->caches = std::make_unique<ModelCaches>(m->config, shape, *m->backend);
  m->model = std::make_unique<DeepseekV4Model>(
      m->config, random_model_weights(m->config, *m->backend, seed, stored), *m->backend);
  m->backend->synchronize();
  return m;
}

}  // namespace deepinfer
