// EngineConfig: every engine option, defined once (its default is the initialiser below).
//
// The options are grouped by what they steer: `scheduler` (batching and admission), `cache` (KV
// blocks and prefix cache), `placement` (where the model runs) and `parallel` (ranks), plus the
// checkpoint and the seed. Field names are unique across the parts, so the flat spelling used by
// the Python API and run configs (`max_num_seqs=8`, `engine: {device: cuda}`) names exactly one
// field. A value of 0 where the comment says "derive it" is filled in for the model when the engine
// is created (Engine::config() returns the resolved config).
#pragma once

#include <cstdint>
#include <string>

namespace deepinfer {

enum class PreemptionMode {
  kRecompute,  // release the sequence's KV and recompute it later (outputs unchanged)
  kStop,       // finish it with FinishReason::kPreempted
};

struct SchedulerConfig {
  int max_num_seqs = 32;              // sequences holding KV at once (running + prefilling)
  int max_num_batched_tokens = 2048;  // tokens per prefill step
  int max_model_len = 0;              // 0: derive it, min(max_position_embeddings, 8192)
  bool enable_chunked_prefill = true;
  bool zero_overhead = true;  // schedule step N+1 while step N runs
  PreemptionMode preemption = PreemptionMode::kRecompute;
  double kv_admission_watermark = 0.9;  // admit a new prompt only while KV usage <= this
  // When both prefill and decode work exist: this many prefill steps, then one decode step.
  int prefill_steps_per_decode_step = 1;
  // Speculative decoding: up to this many drafts per request and decode step (0: off), proposed
  // by `speculative_method`: "ngram" (prompt lookup: the tokens that followed the latest earlier
  // occurrence of the context's last n tokens, n from prompt_lookup_max down to
  // prompt_lookup_min), "external" (Engine::set_drafter) or "mtp" (the checkpoint's MTP block,
  // greedy; needs mtp.* tensors). Drafting turns zero_overhead off unless
  // speculative_zero_overhead is set. Then a host drafter's sequence verifies drafts every other
  // step, the step between running the others while the host commits its tokens; with V4's MTP
  // block, which drafts on the device within each step, every step's row is planned while the
  // one before it runs, carrying its tokens and drafts on the device (cpp/src/engine/README.md).
  // Off by default: for host drafters it measured slower on the H200 than drafting without
  // zero-overhead scheduling (benchmarks/RESULTS.md). V4.1's DSpark drafter ("mtp" on a V4.1
  // checkpoint) always turns zero_overhead off (its drafts are made on the host's cue once a
  // step's tokens are known).
  int num_speculative_tokens = 0;
  bool speculative_zero_overhead = false;
  std::string speculative_method = "ngram";
  int prompt_lookup_min = 1;
  int prompt_lookup_max = 3;
  // "fixed": every request verifies up to num_speculative_tokens drafts; "confidence": per step,
  // the number of drafts each request verifies maximises the expected tokens per second under
  // a step-cost model measured from the engine's own decode steps, given each request's
  // acceptance history (sched/draft_budget.h).
  std::string speculative_budget = "fixed";

  bool operator==(const SchedulerConfig&) const = default;
};

struct CacheConfig {
  // 0: derive it. On a GPU: every block that fits in gpu_memory_utilization of its memory after
  // the weights, the state slots and an activation reserve. On the CPU: enough for max_num_seqs
  // full-length sequences (+ block 0).
  int num_kv_blocks = 0;
  int num_prefix_snapshots = 0;  // 0: max_num_seqs; state snapshots kept for prefix-cache hits
  bool enable_prefix_cache = true;
  // The fraction of the GPU's memory the engine may take (as vLLM's option of that name).
  double gpu_memory_utilization = 0.9;
  // How the KV caches (SWA rings, compressed entries, CSA index keys) store their rows
  // (docs/model.md#kv-cache-dtypes): "f32" (the reference), "bf16" (rounded to nearest even),
  // "fp8" (DeepSeek-V4's records: e4m3 with power-of-two scales, the RoPE channels in bf16) or
  // "auto" (f32 on the CPU; on a GPU fp8 for an FP8 V4 checkpoint and every DeepSeek-V4.1 one,
  // where "fp8" means V4.1's FP8 / FP4 records; bf16 otherwise: auto_kv_is_fp8). The compressor
  // rings stay f32 whatever this says.
  std::string kv_cache_dtype = "auto";
  // KV tiers beyond the GPU (docs/kv_store.md): prompts' full blocks up to their prefix-cache
  // checkpoint, with the state snapshot there, are written through to a host-memory cache and a
  // store directory, and a later prompt (in this engine, or another one after a restart or on
  // another host sharing the directory) fetches them instead of recomputing. Both need
  // enable_prefix_cache.
  uint64_t kv_host_cache_bytes = 0;      // host-memory tier capacity; 0: off
  std::string kv_store_path;             // store directory on any POSIX path; "": off
  uint64_t kv_store_capacity_bytes = 0;  // the store's bound over its whole root; 0: unbounded
  // Retention class of the blocks written: "chat" (7 days) or "agent" (3 days).
  std::string kv_store_ttl_class = "chat";
  // Threads that read store files for fetches (at least 1; used only with kv_store_path). A store
  // on a network mount with high latency per file gains from more reads in flight.
  int fetch_threads = 2;
  // The window state at a tier hit (docs/kv_store.md#window-state-on-a-hit): "exact" stores the
  // SWA/compressor ring snapshot beside the checkpoint block and restores it (bit-identical to a
  // cold run); "bounded_replay" stores blocks only (a hit may end at any full block) and
  // recomputes the last kReplayTokens before the hit with the sliding windows confined to them
  // (constant cost, approximate).
  std::string kv_window_state = "exact";

  bool operator==(const CacheConfig&) const = default;
};

struct PlacementConfig {
  // "auto" (the GPU when this build has the CUDA backend and one is present, else the CPU),
  // "cpu", "cuda" or "cuda:N". Resolved to the device actually used.
  std::string device = "auto";
  int num_threads = 0;  // CPU backend threads (0 = hardware concurrency)
  // Largest decode batch replayed as a recorded graph (CUDA graphs): -1 = the backend's default
  // (256 on CUDA, off on the CPU), 0 = off.
  int decode_graph_max_batch = -1;
  // The activations in front of quantized (FP8 / MXFP4) weights: "auto" (the backend's native
  // path: exact f32 on the CPU, DeepSeek's dynamic FP8 on CUDA), "fp8" (always; on the CPU the
  // emulation that is the GPU's oracle) or "none" (never: exact dequantized weights).
  std::string activation_quant = "auto";
  // DeepSeek-V4.1's YOCO prefill truncation (docs/model.md#yoco-prefill-truncation): "off"
  // (exact), "mask" (every row, consumer windows narrowed) or "compact" (the consumer layers run
  // on the last yoco_keep_tokens positions of a prefill only; about half the prefill FLOPs). Both
  // approximate "off"; they agree with each other. yoco_keep_tokens >= sliding_window +
  // num_speculative_tokens. A prefix-cache hit then ends at least yoco_keep_tokens before the
  // prompt's end, so hits and cold runs agree.
  std::string yoco_prefill_truncation = "off";
  int yoco_keep_tokens = 140;
  // Where DeepSeek-V4.1's Engram tables live (docs/model.md#engram-tables): "device" (device
  // memory), "host" (pinned host memory the GPU reads in place, only the looked-up rows cross the
  // bus) or "auto" (device for a table up to 1/8 of the device's memory, else host). The CPU
  // backend keeps them in host memory (the checkpoint's mapping) under every mode.
  std::string engram_table_memory = "auto";

  bool operator==(const PlacementConfig&) const = default;
};

// Several ranks (docs/parallel.md): data-parallel attention (each rank its own scheduler, KV
// pools and requests) with the routed experts of every MoE layer split across the ranks
// (expert parallelism; the shared expert and everything else is replicated). Supported layouts:
// data_parallel_size N with expert_parallel_size N (DP attention + EP, DeepSeek's layout) or 1
// (plain replicas), tensor_parallel_size 1. The ranks are threads of one process: on the CPU over
// the in-process communicator; with device "cuda", rank r runs on cuda:r over NCCL; with
// "cuda:K", every rank shares GPU K and the collectives go through host memory (for tests).
struct ParallelConfig {
  int data_parallel_size = 1;
  int expert_parallel_size = 1;  // 1 or data_parallel_size
  int tensor_parallel_size = 1;  // only 1: the attention projections are not split
  // How the ranks run: "threads" (one process, a thread per rank), "processes" (one process per
  // rank over TCP, with NCCL between GPUs; started by the Python front ends, deepinfer/ranks.py,
  // a launcher such as torchrun, or an embedding server through deepinfer/rank_group.h;
  // Engine::create refuses it) or "auto": one process per GPU where the Python front ends start
  // the ranks on device "cuda", threads otherwise (and always in Engine::create).
  std::string data_parallel_backend = "auto";
  // Extra expert slots per rank for replicas of hot experts (DeepSeek: 1 per card); the first
  // placement spreads replicas round-robin.
  int redundant_experts_per_rank = 0;
  // DP-group voting (sched/dp_vote.h): a switch to prefill at ALL points needs every rank, at ANY
  // points one rank; DeepSeek's intervals in decode steps. A request reaching a group where no
  // rank decodes is prefilled at the next step (false: it waits for the next point, as
  // DeepSeek's engine does).
  int dp_prefill_all_interval = 70;
  int dp_prefill_any_interval = 100;
  bool dp_prefill_when_idle = true;
  // EPLB in the running engine (expert parallelism only; docs/architecture.md#eplb-in-the-engine):
  // every rank counts the tokens each expert slot receives over the last `eplb_window_steps`
  // group steps and the group re-plans the placement, moving expert weights between ranks, after
  // a quarter of `eplb_rebalance_interval` group steps, then every interval (0: never).
  bool enable_eplb = false;
  int eplb_window_steps = 1000;
  int eplb_rebalance_interval = 10000;

  bool operator==(const ParallelConfig&) const = default;
};

struct EngineConfig {
  std::string model_path;  // checkpoint directory (config.json + safetensors)
  // "auto": the checkpoint's weights; "dummy": random weights for the config.json alone (no
  // safetensors needed), in the checkpoint's formats (quantization_config) or bf16 on a GPU and
  // f32 on the CPU: for benchmarks and load tests at full model widths (vLLM's load_format).
  std::string load_format = "auto";
  SchedulerConfig scheduler;
  CacheConfig cache;
  PlacementConfig placement;
  ParallelConfig parallel;
  uint64_t seed = 0;  // engine seed for requests without their own

  bool operator==(const EngineConfig&) const = default;
};

}  // namespace deepinfer
