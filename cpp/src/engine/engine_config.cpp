#include "engine/engine_config.h"

#include <algorithm>
#include <string>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "kv/cache_geometry.h"
#include "model/cache_tensors.h"

namespace deepinfer::engine {

namespace {

[[noreturn]] void bad_config(const std::string& field, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "engine config: '" + field + "' " + what);
}

// The parallel layout (docs/parallel.md): checked, with what a group of ranks turns off.
void resolve_parallel(EngineConfig& c) {
  ParallelConfig& p = c.parallel;
  const int n = p.data_parallel_size;
  if (n < 1) bad_config("data_parallel_size", "must be >= 1, got " + std::to_string(n));
  if (p.expert_parallel_size != 1 && p.expert_parallel_size != n) {
    bad_config("expert_parallel_size",
               "must be 1 (every rank holds every expert) or data_parallel_size (" +
                   std::to_string(n) +
                   ": the experts are split across the data-parallel ranks), got " +
                   std::to_string(p.expert_parallel_size));
  }
  if (p.tensor_parallel_size != 1) {
    bad_config("tensor_parallel_size",
               "must be 1, got " + std::to_string(p.tensor_parallel_size) +
                   ": tensor parallelism is not supported; the layouts are data-parallel attention "
                   "with expert-parallel MoE, and plain replicas (docs/parallel.md says why)");
  }
  if (p.data_parallel_backend != "auto" && p.data_parallel_backend != "threads" &&
      p.data_parallel_backend != "processes") {
    bad_config("data_parallel_backend", "must be \"auto\", \"threads\" or \"processes\", got \"" +
                                            p.data_parallel_backend + "\"");
  }
  if (p.redundant_experts_per_rank < 0 ||
      (p.redundant_experts_per_rank > 0 && p.expert_parallel_size == 1)) {
    bad_config("redundant_experts_per_rank",
               "must be >= 0, and 0 without expert parallelism, got " +
                   std::to_string(p.redundant_experts_per_rank));
  }
  if (p.dp_prefill_all_interval < 1 || p.dp_prefill_any_interval < 1) {
    bad_config(
        p.dp_prefill_all_interval < 1 ? "dp_prefill_all_interval" : "dp_prefill_any_interval",
        "must be >= 1 (decode steps between prefill points)");
  }
  if (p.eplb_window_steps < 1 || p.eplb_rebalance_interval < 0) {
    bad_config(p.eplb_window_steps < 1 ? "eplb_window_steps" : "eplb_rebalance_interval",
               "must be >= 1 (window) and >= 0 (interval, 0 = never), got " +
                   std::to_string(p.eplb_window_steps) + " and " +
                   std::to_string(p.eplb_rebalance_interval));
  }
  if (p.enable_eplb && p.expert_parallel_size == 1) {
    bad_config("enable_eplb",
               "needs expert parallelism (expert_parallel_size = data_parallel_size > 1): "
               "without it every rank holds every expert and there is nothing to balance");
  }
  if (n == 1) return;
  if (c.scheduler.num_speculative_tokens > 0) {
    bad_config("num_speculative_tokens",
               "must be 0 with data_parallel_size > 1: speculative decoding does not run in a "
               "data-parallel group yet");
  }
  // The expert exchange reads the routing on the host: no graph can hold it.
  if (p.expert_parallel_size > 1) c.placement.decode_graph_max_batch = 0;
}

}  // namespace

EngineConfig resolve_engine_config(const EngineConfig& config, int max_position,
                                   bool kv_from_device_memory, bool fp8_weights) {
  EngineConfig c = config;
  SchedulerConfig& s = c.scheduler;
  CacheConfig& cache = c.cache;
  if (s.max_num_seqs < 1)
    bad_config("max_num_seqs", "must be >= 1, got " + std::to_string(s.max_num_seqs));
  if (s.max_num_batched_tokens < 1) {
    bad_config("max_num_batched_tokens",
               "must be >= 1, got " + std::to_string(s.max_num_batched_tokens));
  }
  if (s.max_model_len == 0) s.max_model_len = std::min(max_position, 8192);
  if (s.max_model_len < 2 || s.max_model_len > max_position) {
    bad_config("max_model_len", "must be in [2, " + std::to_string(max_position) +
                                    "] (the model's "
                                    "max_position_embeddings), got " +
                                    std::to_string(s.max_model_len));
  }
  if (!(cache.gpu_memory_utilization > 0.0 && cache.gpu_memory_utilization <= 1.0)) {
    bad_config("gpu_memory_utilization",
               "must be in (0, 1], got " + std::to_string(cache.gpu_memory_utilization));
  }
  c.placement.device = resolve_device(c.placement.device);
  if (c.load_format != "auto" && c.load_format != "dummy") {
    bad_config("load_format", "must be \"auto\" or \"dummy\", got \"" + c.load_format + "\"");
  }
  // Drafts and their verified successor fit the rings' rollback slack (ModelExecutorOptions::
  // max_backtrack = 6 positions), so at most 5 drafts.
  if (s.num_speculative_tokens < 0 || s.num_speculative_tokens > 5) {
    bad_config("num_speculative_tokens",
               "must be in [0, 5], got " + std::to_string(s.num_speculative_tokens));
  }
  if (s.speculative_method != "ngram" && s.speculative_method != "external" &&
      s.speculative_method != "mtp") {
    bad_config("speculative_method",
               "must be \"ngram\", \"external\" or \"mtp\", got \"" + s.speculative_method + "\"");
  }
  if (s.speculative_budget != "fixed" && s.speculative_budget != "confidence") {
    bad_config("speculative_budget",
               "must be \"fixed\" or \"confidence\", got \"" + s.speculative_budget + "\"");
  }
  if (s.prompt_lookup_min < 1 || s.prompt_lookup_max < s.prompt_lookup_min) {
    bad_config("prompt_lookup_min", "must be >= 1 and <= prompt_lookup_max, got " +
                                        std::to_string(s.prompt_lookup_min) + " and " +
                                        std::to_string(s.prompt_lookup_max));
  }
  // Drafting overlaps with zero-overhead scheduling (Scheduler::sits_out) only on request: a
  // sequence whose row verifies drafts sits out the next step, which measured slower than
  // drafting without ZOS for host drafters (engine_config.h). V4's MTP drafts are made on the
  // device in the step's launch, so they overlap too; V4.1's DSpark drafts are made on the host's
  // cue (ModelExecutor::wait), which engine.cpp's prepare() turns ZOS off for.
  if (s.num_speculative_tokens > 0 && !s.speculative_zero_overhead) s.zero_overhead = false;
  const bool sized_at_load = kv_from_device_memory && c.placement.device.starts_with("cuda");
  const int blocks_per_seq = static_cast<int>(kv::blocks_for_tokens(s.max_model_len));
  if (cache.num_kv_blocks == 0 && !sized_at_load) {
    cache.num_kv_blocks = 1 + s.max_num_seqs * blocks_per_seq;
  }
  if (cache.num_kv_blocks < 2 && !(cache.num_kv_blocks == 0 && sized_at_load))
    bad_config("num_kv_blocks", "must be >= 2, got " + std::to_string(cache.num_kv_blocks));
  if (cache.num_prefix_snapshots == 0) cache.num_prefix_snapshots = s.max_num_seqs;
  if (cache.num_prefix_snapshots < 0) {
    bad_config("num_prefix_snapshots",
               "must be >= 0, got " + std::to_string(cache.num_prefix_snapshots));
  }
  if (!(s.kv_admission_watermark > 0.0 && s.kv_admission_watermark <= 1.0)) {
    bad_config("kv_admission_watermark",
               "must be in (0, 1], got " + std::to_string(s.kv_admission_watermark));
  }
  const bool tiers = cache.kv_host_cache_bytes > 0 || !cache.kv_store_path.empty();
  if (tiers && !cache.enable_prefix_cache) {
    bad_config(cache.kv_store_path.empty() ? "kv_host_cache_bytes" : "kv_store_path",
               "needs enable_prefix_cache: the tiers hold the prefix cache's blocks and snapshots");
  }
  if (cache.kv_store_ttl_class != "chat" && cache.kv_store_ttl_class != "agent") {
    bad_config("kv_store_ttl_class",
               "must be \"chat\" or \"agent\", got \"" + cache.kv_store_ttl_class + "\"");
  }
  if (cache.kv_window_state != "exact" && cache.kv_window_state != "bounded_replay") {
    bad_config("kv_window_state",
               "must be \"exact\" or \"bounded_replay\", got \"" + cache.kv_window_state + "\"");
  }
  if (cache.fetch_threads < 1 || cache.fetch_threads > 64) {
    bad_config("fetch_threads", "must be in [1, 64], got " + std::to_string(cache.fetch_threads));
  }
  if (s.prefill_steps_per_decode_step < 1) {
    bad_config("prefill_steps_per_decode_step",
               "must be >= 1, got " + std::to_string(s.prefill_steps_per_decode_step));
  }
  if (c.placement.num_threads < 0)
    bad_config("num_threads", "must be >= 0, got " + std::to_string(c.placement.num_threads));
  resolve_parallel(c);
  const DeviceKind device =
      c.placement.device.rfind("cuda", 0) == 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
  try {
    cache.kv_cache_dtype =
        kv_cache_dtype_name(resolve_kv_cache_dtype(cache.kv_cache_dtype, device, fp8_weights));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;
    bad_config("kv_cache_dtype", "must be \"auto\", \"f32\", \"bf16\" or \"fp8\", got \"" +
                                     cache.kv_cache_dtype + "\"");
  }
  return c;
}

bool uses_mtp_drafts(const EngineConfig& config) {
  return config.scheduler.num_speculative_tokens > 0 &&
         config.scheduler.speculative_method == "mtp";
}

void check_mtp_blocks(const EngineConfig& config, int num_mtp_blocks) {
  if (uses_mtp_drafts(config) && num_mtp_blocks == 0) {
    bad_config("speculative_method",
               "is \"mtp\", but the checkpoint has no MTP block or DSpark drafter (no mtp.* "
               "tensors, or config.json's num_nextn_predict_layers is 0): use \"ngram\" or "
               "\"external\"");
  }
}

void check_dspark_block_size(const EngineConfig& config, int block_size, int max_backtrack) {
  if (uses_mtp_drafts(config) && block_size > max_backtrack) {
    bad_config("speculative_method",
               "is \"mtp\", but the checkpoint's DSpark drafter has dspark_block_size = " +
                   std::to_string(block_size) + ": its draft keys need " +
                   std::to_string(block_size) +
                   " ring positions past the sliding window and the "
                   "caches keep " +
                   std::to_string(max_backtrack));
  }
}

void check_mtp_layer_kinds(const EngineConfig& config, const std::vector<AttentionKind>& kinds) {
  if (!uses_mtp_drafts(config)) return;
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (kinds[k] != AttentionKind::kSliding) {
      bad_config("speculative_method",
                 std::string("is \"mtp\", but MTP block ") + std::to_string(k) + " is a " +
                     attention_kind_name(kinds[k]) +
                     " layer; drafting inside the engine takes sliding MTP layers only");
    }
  }
}

// Live state slots: every sequence holding KV (max_num_seqs) plus finished ones whose last step is
// still in flight, plus the reserved slot 0.
int live_state_slots(const EngineConfig& c) {
  return 1 + c.scheduler.max_num_seqs + std::max(2, c.scheduler.max_num_seqs / 4);
}

}  // namespace deepinfer::engine
