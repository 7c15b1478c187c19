// The public Engine API: the factory over a checkpoint, and the helpers every engine shares.
#include "deepinfer/engine.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "deepinfer/backend.h"
#include "deepinfer/communicator.h"
#include "deepinfer/config.h"
#include "deepinfer/error.h"
#include "deepinfer/v41_config.h"
#include "engine/dp_group.h"
#include "engine/engine_config.h"
#include "engine/engine_impl.h"
#include "engine/model_executor.h"
#include "engine/process_group.h"
#include "model/cache_tensors.h"

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

namespace {

struct Prepared {
  EngineConfig resolved;
  ModelConfig model;
  engine::ModelExecutorOptions options;
};

// The config resolved against the checkpoint's config.json, and one rank's executor options.
Prepared prepare(const EngineConfig& config, const LoadProgress& progress) {
  if (config.model_path.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "engine config: 'model_path' is empty");
  }
  Prepared p;
  // Cache sizes derive from the model's position limit: read its config first.
  p.model =
      ModelConfig::from_file((std::filesystem::path(config.model_path) / "config.json").string());
  const int max_position = static_cast<int>(
      std::min<int64_t>(p.model.max_position_embeddings, std::numeric_limits<int32_t>::max()));
  // ModelInstance resolves "auto" by the same rule (auto_kv_is_fp8).
  p.resolved = engine::resolve_engine_config(config, max_position, /*kv_from_device_memory=*/true,
                                             auto_kv_is_fp8(p.model));
  const EngineConfig& resolved = p.resolved;
  // A verify step rolls back at most num_speculative_tokens positions.
  set_yoco_truncation(p.model, resolved.placement.yoco_prefill_truncation,
                      resolved.placement.yoco_keep_tokens,
                      resolved.scheduler.num_speculative_tokens);
  set_engram_table_memory(p.model, resolved.placement.engram_table_memory);
  // Before the weights load; EngineImpl checks what was loaded. V4.1's drafter blocks are DSpark's
  // (its shared ModelConfig has no V4 MTP block).
  engine::check_mtp_blocks(resolved, p.model.v41 != nullptr ? p.model.v41->num_nextn_predict_layers
                                                            : p.model.num_nextn_predict_layers);
  if (p.model.v41 != nullptr) {
    engine::check_dspark_block_size(resolved, p.model.v41->dspark_block_size,
                                    engine::ModelExecutorOptions{}.max_backtrack);
    // DSpark drafts once a step's tokens are on the host (ModelExecutor::wait), which under
    // zero-overhead scheduling would also wait for the next step's forward.
    if (engine::uses_mtp_drafts(resolved)) p.resolved.scheduler.zero_overhead = false;
  }
  engine::check_mtp_layer_kinds(resolved, p.model.mtp_layer_types);
  engine::ModelExecutorOptions& o = p.options;
  o.checkpoint_dir = resolved.model_path;
  o.dummy_weights = resolved.load_format == "dummy";
  o.seed = resolved.seed;
  o.model_config = p.model;
  o.placement = resolved.placement;
  o.progress = progress;
  o.kv_cache_dtype = resolved.cache.kv_cache_dtype;
  o.num_mtp_drafts =
      engine::uses_mtp_drafts(resolved) ? resolved.scheduler.num_speculative_tokens : 0;
  // The scheduler's rule (Scheduler::device_carries); V4.1's DSpark turned zero_overhead off.
  o.device_carried_rows = o.num_mtp_drafts > 0 && resolved.scheduler.zero_overhead;
  o.num_kv_blocks = resolved.cache.num_kv_blocks;
  o.gpu_memory_utilization = resolved.cache.gpu_memory_utilization;
  o.max_num_batched_tokens = resolved.scheduler.max_num_batched_tokens;
  o.max_num_seqs = resolved.scheduler.max_num_seqs;
  o.speculative = resolved.scheduler.num_speculative_tokens > 0;
  o.num_state_slots = engine::live_state_slots(resolved);
  o.num_snapshot_slots =
      resolved.cache.enable_prefix_cache ? resolved.cache.num_prefix_snapshots : 0;
  return p;
}

}  // namespace

std::unique_ptr<Engine> Engine::create(const EngineConfig& config, const LoadProgress& progress) {
  const Prepared p = prepare(config, progress);
  if (p.resolved.parallel.data_parallel_size > 1 &&
      p.resolved.parallel.data_parallel_backend == "processes") {
    throw Error(ErrorCode::kInvalidArgument,
                "engine config: 'data_parallel_backend' \"processes\" starts one process per rank: "
                "use deepinfer.LLM, deepinfer.run or deepinfer.serve (they start the ranks), or "
                "Engine::create_front and Engine::serve_rank from a server that starts them");
  }
  if (p.resolved.parallel.data_parallel_size > 1)
    return engine::create_dp_group(p.resolved, p.model, p.options, progress);
  return std::make_unique<engine::EngineImpl>(p.resolved,
                                              std::make_unique<engine::ModelExecutor>(p.options));
}

std::unique_ptr<Engine> Engine::create_rank(const EngineConfig& config,
                                            std::unique_ptr<Backend> backend,
                                            dist::Communicator& comm,
                                            const LoadProgress& progress) {
  if (backend == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "Engine::create_rank: 'backend' is null");
  }
  Prepared p = prepare(config, progress);
  if (p.resolved.parallel.data_parallel_size != comm.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "engine config: 'data_parallel_size' is " +
                    std::to_string(p.resolved.parallel.data_parallel_size) +
                    " but the communicator's group has " + std::to_string(comm.size()) + " ranks");
  }
  p.options.placement.device = backend->name();
  return engine::create_rank_engine(p.resolved, p.model, p.options, std::move(backend), comm);
}

std::unique_ptr<Engine> Engine::create_front(const EngineConfig& config,
                                             std::unique_ptr<Backend> backend,
                                             std::unique_ptr<dist::Communicator> comm,
                                             const LoadProgress& progress) {
  if (comm == nullptr || comm->rank() != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "Engine::create_front: 'comm' must be rank 0 of the group");
  }
  std::unique_ptr<Engine> local = create_rank(config, std::move(backend), *comm, progress);
  return std::make_unique<engine::ProcessGroupFront>(std::move(local), std::move(comm));
}

void Engine::serve_rank(const EngineConfig& config, std::unique_ptr<Backend> backend,
                        dist::Communicator& comm, const LoadProgress& progress) {
  std::unique_ptr<Engine> engine = create_rank(config, std::move(backend), comm, progress);
  engine::serve_rank(*engine, comm);
}

}  // namespace deepinfer
