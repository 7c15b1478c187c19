// The public Engine API: the factory over a checkpoint, and the helpers every engine shares.
#include "deepinfer/engine.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "deepinfer/config.h"
#include "deepinfer/error.h"
#include "engine/dp_group.h"
#include "engine/engine_config.h"
#include "engine/engine_impl.h"
#include "engine/model_executor.h"

namespace deepinfer {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kPreempted:
      return "preempted";
    case FinishReason::kRejected:
      return "rejected";
    case FinishReason::kGrammarError:
      return "grammar_error";
  }
  return "?";
}

std::vector<RequestOutput> Engine::run_until_idle() {
  std::vector<RequestOutput> all;
  while (has_unfinished()) {
    std::vector<RequestOutput> out = step();
    all.insert(all.end(), std::make_move_iterator(out.begin()), std::make_move_iterator(out.end()));
  }
  return all;
}

std::unique_ptr<Engine> Engine::create(const EngineConfig& config, const LoadProgress& progress) {
  if (config.model_path.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "engine config: 'model_path' is empty");
  }
  // Cache sizes derive from the model's position limit: read its config first.
  const ModelConfig model =
      ModelConfig::from_file((std::filesystem::path(config.model_path) / "config.json").string());
  const int max_position = static_cast<int>(
      std::min<int64_t>(model.max_position_embeddings, std::numeric_limits<int32_t>::max()));
  const EngineConfig resolved = engine::resolve_engine_config(
      config, max_position, /*kv_from_device_memory=*/true, model.quantization.fp8);
  // Before the weights load; EngineImpl checks what was loaded.
  engine::check_mtp_blocks(resolved, model.num_nextn_predict_layers);
  engine::check_mtp_layer_kinds(resolved, model.mtp_layer_types);
  engine::ModelExecutorOptions o;
  o.checkpoint_dir = resolved.model_path;
  o.dummy_weights = resolved.load_format == "dummy";
  o.seed = resolved.seed;
  o.model_config = model;
  o.placement = resolved.placement;
  o.progress = progress;
  o.kv_cache_dtype = resolved.cache.kv_cache_dtype;
  o.num_mtp_drafts =
      engine::uses_mtp_drafts(resolved) ? resolved.scheduler.num_speculative_tokens : 0;
  o.num_kv_blocks = resolved.cache.num_kv_blocks;
  o.gpu_memory_utilization = resolved.cache.gpu_memory_utilization;
  o.max_num_batched_tokens = resolved.scheduler.max_num_batched_tokens;
  o.max_num_seqs = resolved.scheduler.max_num_seqs;
  o.num_state_slots = engine::live_state_slots(resolved);
  o.num_snapshot_slots =
      resolved.cache.enable_prefix_cache ? resolved.cache.num_prefix_snapshots : 0;
  if (resolved.parallel.data_parallel_size > 1)
    return engine::create_dp_group(resolved, model, o, progress);
  return std::make_unique<engine::EngineImpl>(resolved, std::make_unique<engine::ModelExecutor>(o));
}

}  // namespace deepinfer
