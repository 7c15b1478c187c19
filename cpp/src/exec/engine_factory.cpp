#include <algorithm>
#include <filesystem>
#include <limits>

#include "deepinfer/config.h"
#include "deepinfer/engine.h"
#include "deepinfer/error.h"
#include "exec/engine_impl.h"
#include "exec/model_executor.h"

namespace deepinfer {

std::unique_ptr<Engine> Engine::create(const EngineConfig& config) {
  if (config.model_path.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "engine config: 'model_path' is empty");
  }
  // Cache sizes derive from the model's position limit: read its config first.
  const ModelConfig model =
      ModelConfig::from_file((std::filesystem::path(config.model_path) / "config.json").string());
  const int max_position = static_cast<int>(
      std::min<int64_t>(model.max_position_embeddings, std::numeric_limits<int32_t>::max()));
  const EngineConfig resolved = exec::resolve_engine_config(config, max_position);
  exec::ModelExecutorOptions o;
  o.checkpoint_dir = resolved.model_path;
  o.num_kv_blocks = resolved.num_kv_blocks;
  o.num_state_slots = exec::live_state_slots(resolved);
  o.num_snapshot_slots = resolved.enable_prefix_cache ? resolved.num_prefix_snapshots : 0;
  o.num_threads = resolved.num_threads;
  o.device = resolved.device;
  o.decode_graph_max_batch = resolved.decode_graph_max_batch;
  return std::make_unique<exec::EngineImpl>(resolved, std::make_unique<exec::ModelExecutor>(o));
}

}  // namespace deepinfer
