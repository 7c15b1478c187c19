#include "model/model_instance.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>

#include "deepinfer/error.h"
#include "model/checkpoint.h"
#include "model/weights.h"

namespace deepinfer {

int resolve_decode_graph_max_batch(int requested, const Backend& backend, int num_state_slots) {
  if (requested < -1) {
    throw Error(ErrorCode::kInvalidArgument,
                "decode_graph_max_batch must be -1 (auto), 0 (off) or a batch size, got " +
                    std::to_string(requested));
  }
  const int wanted =
      requested >= 0 ? requested : (backend.device_kind() == DeviceKind::kCuda ? 256 : 0);
  return std::min(wanted, num_state_slots);
}

ModelInstance::Output ModelInstance::forward(RowSpan rows, size_t max_blocks, LogitsMode mode,
                                             const Tensor& previous_tokens) {
  if (graphs != nullptr && graphs->accepts(rows)) {
    DecodeGraphs::Output out = graphs->forward(rows, max_blocks, previous_tokens);
    return {out.logits, out.next_positions};
  }
  const BatchPlan plan =
      build_batch_plan(rows, config, caches->shape(), *backend, mode, max_blocks);
  take_carried_tokens(*backend, rows, plan, previous_tokens);
  return {model->forward(plan, *caches), plan.next_positions};
}

namespace {

// Creates the caches (with the graphs' scratch slot when graphs are on) and the graphs.
void finish_instance(ModelInstance& m, CacheShape shape, int decode_graph_max_batch,
                     ModelWeights weights) {
  const int max_batch =
      resolve_decode_graph_max_batch(decode_graph_max_batch, *m.backend, shape.num_state_slots);
  shape.num_scratch_slots = max_batch > 0 ? 1 : 0;
  m.caches = std::make_unique<ModelCaches>(m.config, shape, *m.backend);
  m.model = std::make_unique<DeepseekV4Model>(m.config, std::move(weights), *m.backend);
  if (max_batch > 0) {
    m.graphs = std::make_unique<DecodeGraphs>(m.config, *m.model, *m.caches, *m.backend, max_batch,
                                              /*scratch_slot=*/shape.num_state_slots);
  }
}

}  // namespace

bool resolve_activation_quant(const std::string& mode, const Backend& backend) {
  if (mode == "fp8") return true;
  if (mode == "none") return false;
  if (mode == "auto") return backend.device_kind() != DeviceKind::kCpu;
  throw Error(ErrorCode::kInvalidArgument,
              "activation_quant must be \"auto\", \"fp8\" or \"none\", got \"" + mode + "\"");
}

std::unique_ptr<ModelInstance> ModelInstance::load(
    const std::string& checkpoint_dir, const ModelConfig& config, const CacheShape& shape,
    const std::string& device, int num_threads, int decode_graph_max_batch,
    const std::string& activation_quant, const std::string& kv_cache_dtype) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(checkpoint_dir)) {
    throw Error(ErrorCode::kNotFound, checkpoint_dir + ": checkpoint directory does not exist");
  }
  auto m = std::make_unique<ModelInstance>();
  m->config = config;
  Checkpoint checkpoint = Checkpoint::open(checkpoint_dir);
  m->backend = make_backend(device, num_threads);
  WeightLoadOptions options;
  options.quantize_activations = resolve_activation_quant(activation_quant, *m->backend);
  CacheShape cache_shape = shape;
  cache_shape.kv_dtype = resolve_kv_cache_dtype(kv_cache_dtype, m->backend->device_kind());
  ModelWeights weights = load_model_weights(checkpoint, m->config, *m->backend, options);
  m->notes = weights.notes;
  finish_instance(*m, cache_shape, decode_graph_max_batch, std::move(weights));
  return m;
}

std::unique_ptr<ModelInstance> ModelInstance::random(
    const ModelConfig& config, const CacheShape& shape, const std::string& device, int num_threads,
    uint64_t seed, DType stored, int decode_graph_max_batch, const std::string& activation_quant,
    const std::string& kv_cache_dtype) {
  auto m = std::make_unique<ModelInstance>();
  m->config = config;
  m->backend = make_backend(device, num_threads);
  WeightLoadOptions options;
  options.quantize_activations = resolve_activation_quant(activation_quant, *m->backend);
  CacheShape cache_shape = shape;
  cache_shape.kv_dtype = resolve_kv_cache_dtype(kv_cache_dtype, m->backend->device_kind());
  finish_instance(*m, cache_shape, decode_graph_max_batch,
                  random_model_weights(m->config, *m->backend, seed, stored, options));
  m->backend->synchronize();
  return m;
}

}  // namespace deepinfer
