// Engine: continuous batching over a DeepSeek-V4 checkpoint (or any StepExecutor).
//
//   auto engine = Engine::create(config);
//   RequestId id = engine->add_request(prompt_token_ids, params);
//   while (engine->has_unfinished()) for (RequestOutput& out : engine->step()) ...;
//
// Every request's outputs arrive in order: one output with `ready` set (prompt accepted, with
// the prefix-cache hit), outputs carrying new tokens, and exactly one output with `finish` set.
//
// Thread-safety: add_request, abort and num_unfinished may be called from any thread (they go
// through a locked inbox the engine thread drains at the start of each step). step(),
// run_until_idle() and stats() belong to one engine thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/config.h"
#include "deepinfer/engine_config.h"

namespace deepinfer {

class Backend;
namespace dist {
class Communicator;
}

using RequestId = uint64_t;

// A constraint on the tokens one request may generate (structured outputs: a JSON schema, a
// regex, a grammar). The engine calls it on its step thread only, never concurrently:
// `fill_allowed` before each token of the request is sampled, `accept` with each token it
// emitted, then `is_terminated`. With zero-overhead scheduling the forward of the next step is
// already running while these run, so the mask costs host time only, not device time. An
// exception from any of them ends that request alone (FinishReason::kGrammarError).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // mask has ceil(vocab_size / 32) words, zeroed: set bit t % 32 of word t / 32 for each token t
  // allowed next. A mask with no bit set lets only the model's EOS tokens through.
  virtual void fill_allowed(std::span<uint32_t> mask) = 0;
  // The request sampled `token`; false if the constraint does not allow it: the request ends
  // with kGrammarError and the token is not reported.
  virtual bool accept(int32_t token) = 0;
  // True once the constrained output is complete: the request finishes (kStop).
  virtual bool is_terminated() = 0;
  // Speculative decoding: a constraint that can undo its last `num_tokens` accepts lets its
  // request draft. The engine then accepts the drafts one by one to build each verify row's
  // mask and rolls them back before the commit accepts what was verified.
  virtual bool can_rollback() { return false; }
  virtual void rollback(int num_tokens) { (void)num_tokens; }
};

// Proposes draft tokens for speculative decoding on the host (prompt lookup, test drafters). The
// engine calls it on its step thread before a decode step; the target model verifies the drafts
// in that step (SchedulerConfig::num_speculative_tokens), so the output is the same as without
// drafts (greedy: identical; sampled: the same distribution). An exception means no drafts.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Appends at most `max_drafts` tokens likely to follow `tokens` (the request's prompt and
  // committed outputs) to `drafts` (empty on entry); appending none is always fine.
  virtual void propose(RequestId id, std::span<const int32_t> tokens, int max_drafts,
                       std::vector<int32_t>& drafts) = 0;
};

struct SamplingParams {
  float temperature = 1.0f;      // 0 = greedy
  int top_k = 0;                 // <= 0: off
  float top_p = 1.0f;            // (0, 1]
  std::optional<uint64_t> seed;  // unset: derived from the engine seed and the request id
  int max_tokens = 16;           // >= 1
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // extra stop tokens (the model's EOS ids always stop)
  int logprobs = 0;                     // top-N log-probabilities per generated token (0..20)
  // Test hook: output token i is forced_tokens[i] instead of a sampled token, while i is in range
  // (the model still runs; stop checks apply as usual). Servers expose it only for tests, to
  // drive output parsers (tool calls, thinking) on models that would never emit that markup.
  // Reported log-probabilities still describe the sampled token.
  std::vector<int32_t> forced_tokens;
  // Added to the logits before sampling (OpenAI's logit_bias): (token, bias) with distinct tokens.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // OpenAI's penalties over the tokens generated so far (not the prompt): the logit of token t is
  // lowered by presence_penalty if t occurred and by frequency_penalty times its count.
  float presence_penalty = 0.0f;                // [-2, 2]
  float frequency_penalty = 0.0f;               // [-2, 2]
  std::shared_ptr<TokenConstraint> constraint;  // null: unconstrained
  // How long the KV store keeps this request's prompt blocks: "agent" (3 days), "chat" (7 days)
  // or "" for the engine's kv_store_ttl_class.
  std::string kv_retention;
  // With logit_bias, penalties or a constraint, sampling and the reported log-probabilities see
  // the adjusted logits (a disallowed token has log-probability -inf).
  bool adjusts_logits() const {
    return !logit_bias.empty() || presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           constraint != nullptr;
  }
  // Whether the adjustment depends on the tokens generated so far (penalties, a constraint).
  bool adjusts_from_history() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || constraint != nullptr;
  }
};

enum class FinishReason {
  kNone,          // still running
  kStop,          // EOS or a stop token (included in the output)
  kLength,        // max_tokens, or the sequence reached max_model_len
  kAbort,         // abort(id)
  kPreempted,     // evicted under memory pressure with preemption = stop
  kRejected,      // the prompt can never run: longer than max_model_len or than the whole KV cache
  kGrammarError,  // the constraint rejected the emitted token or failed (finish_detail says how)
};
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "abort", ...

struct TokenLogprobs {
  float logprob = 0.0f;  // of the generated token, under the model's raw distribution
  std::vector<std::pair<int32_t, float>> top;
};

struct RequestOutput {
  RequestId id = 0;
  bool ready = false;               // first output of the request
  int num_prompt_tokens = 0;        // set with ready
  int prompt_cache_hit_tokens = 0;  // set with ready: prompt tokens served from the prefix cache
  std::vector<int32_t> tokens;      // tokens generated since the previous output
  std::vector<TokenLogprobs> logprobs;  // one per token when SamplingParams::logprobs > 0
  FinishReason finish = FinishReason::kNone;
  std::string finish_detail;  // why, for kRejected / kPreempted
};

// Calibration of speculative decoding's acceptance estimates: each verified draft's estimate p
// (the chance the engine gave it of being accepted, draft_budget.h) goes into one of kBins
// equal-width bins of p ([b / kBins, (b + 1) / kBins), p = 1 in the last) with its outcome.
struct DraftCalibration {
  static constexpr int kBins = 10;
  std::array<uint64_t, kBins> drafts{};      // verified drafts per bin
  std::array<uint64_t, kBins> accepted{};    // those accepted
  std::array<double, kBins> estimate_sum{};  // the sum of their p
};

// What the scheduler has done so far (it keeps these counters; EngineStats reports them).
struct SchedulerCounters {
  uint64_t num_steps = 0;
  uint64_t num_prefill_steps = 0;
  uint64_t num_preemptions = 0;
  uint64_t prompt_tokens_computed = 0;
  uint64_t prompt_tokens_cached = 0;
  uint64_t generated_tokens = 0;
  // Speculative decoding: drafts verified, accepted, and verify rows (one per request and step).
  uint64_t draft_tokens = 0;
  uint64_t accepted_draft_tokens = 0;
  uint64_t verify_rows = 0;
  // Rows planned while the step before them ran, with their tokens and drafts still on the
  // device and moved there by its accepted drafts (V4's MTP drafts under zero-overhead
  // scheduling): rows, and those of them that verified drafts.
  uint64_t device_carried_rows = 0;
  uint64_t device_carried_verify_rows = 0;
  // Per draft position j (0 = the first draft of a verify row): drafts proposed there, and those
  // accepted (accepted[j] / drafts[j] is the acceptance rate at j).
  std::array<uint64_t, 5> drafts_at_position{};
  std::array<uint64_t, 5> accepted_at_position{};
  uint64_t drafter_errors = 0;  // proposals dropped: the drafter threw or named a bad token
  uint64_t verify_steps = 0;    // decode steps with at least one verify row
  // Decode step times the confidence budget's cost model observed (speculative_budget
  // "confidence": until 16, every request verifies the most drafts).
  uint64_t budget_step_times = 0;
  DraftCalibration calibration;
  // Admissions that waited for another request's KV tier fetch of the same blocks (holding
  // nothing) instead of reading them again.
  uint64_t kv_fetch_waits = 0;
};

struct EngineStats : SchedulerCounters {
  int num_running = 0;
  int num_waiting = 0;
  int num_fetching = 0;  // waiting for KV tier blocks to be read (by their own fetch or another)
  int num_blocks_total = 0;  // usable KV blocks
  int num_blocks_free = 0;
  int num_blocks_cached = 0;  // free blocks still holding an indexed prefix
  int num_state_slots_free = 0;
  uint64_t num_graph_steps = 0;         // decode steps replayed from recorded graphs (or recorded)
  uint64_t num_graph_verify_steps = 0;  // those of them with a speculative verify row
  // KV tiers (CacheConfig::kv_host_cache_bytes, kv_store_path). host_ + store_hit_tokens: the
  // prompt tokens the tiers added to the GPU prefix cache's own hits (prompt_tokens_cached counts
  // them too), by the tier that supplied the blocks (or only the state snapshot, for blocks the
  // GPU still held).
  uint64_t host_hit_tokens = 0;
  uint64_t store_hit_tokens = 0;
  uint64_t store_bytes_read = 0;           // whole block files read by this engine
  uint64_t store_bytes_written = 0;        // whole block files this engine published
  uint64_t kv_blocks_written_through = 0;  // blocks copied out of the device for the tiers
  uint64_t kv_tier_fetch_failures = 0;     // tier hits that fell back to recompute
  // The host tier's arena when it is pinned (CUDA; kv_host_cache_bytes); 0 with ordinary memory.
  uint64_t kv_host_pinned_bytes = 0;
  // Speculative decoding, derived from the counters above (0 before the first verify row):
  // tokens per verify row (accepted drafts + 1), drafts verified and accepted per verify step,
  // and over every verified draft: the mean estimate p, the mean outcome (accepted: 1), and the
  // expected calibration error sum_b |sum of p - accepted in bin b| / drafts (DraftCalibration).
  double spec_mean_acceptance_length = 0;
  double spec_mean_verified_per_step = 0;
  double spec_mean_accepted_per_step = 0;
  double spec_mean_estimate = 0;
  double spec_mean_acceptance = 0;
  double spec_calibration_error = 0;
  // Tier fetches that read the store in the background (failed ones included), and their time
  // from admission until the last block was read.
  uint64_t kv_fetches = 0;
  double kv_fetch_seconds_total = 0;
  double kv_fetch_seconds_max = 0;
  // Data-parallel groups (ParallelConfig): steps the group ran (every rank takes part in each),
  // and the rank-steps among them a rank ran without rows (an empty prefill or a dummy decode,
  // so the others' expert exchanges line up): the steps voting costs. 0 for a single engine.
  uint64_t dp_group_steps = 0;
  uint64_t dp_idle_passes = 0;
  // EPLB (ParallelConfig::enable_eplb): rebalances done, the last one's pause (seconds the group
  // stood still: the window's all-reduce, the plan, the weight shuffle), and the busiest rank's
  // load over the mean rank load for the window the last rebalance planned with, under the
  // placement before and after it (the mean over MoE layers; 0 before the first rebalance).
  uint64_t eplb_rebalances = 0;
  double eplb_last_pause_seconds = 0;
  double eplb_max_over_mean_before = 0;
  double eplb_max_over_mean_after = 0;
};

// The KV cache the engine runs with, for logs and capacity planning.
struct KvCapacity {
  int num_blocks = 0;                 // usable paged blocks (the reserved block 0 excluded)
  int block_size = 0;                 // tokens per block
  int64_t bytes_per_block = 0;        // paged KV bytes of one block, all layers
  int64_t bytes_per_token = 0;        // bytes_per_block / block_size, rounded up
  int64_t bytes_per_state_slot = 0;   // rings of one sequence, all layers
  int64_t max_tokens = 0;             // num_blocks * block_size: the most context in the cache
  int max_seqs_at_max_model_len = 0;  // sequences of max_model_len tokens the blocks hold at once
  bool sized_from_memory = false;     // num_kv_blocks came from the device's memory
};

// Loading progress: `done` of `total` units finished.
using LoadProgress = std::function<void(int done, int total)>;

class Engine {
 public:
  // Loads the checkpoint at config.model_path on config.placement.device. Throws deepinfer::Error
  // naming the bad config field (by its flat name, e.g. 'max_num_seqs') or checkpoint problem.
  // `progress`, when set, is called on the calling thread as loading advances (done of total
  // units: the embedding and head, then each layer), for a progress bar: a real checkpoint loads
  // for minutes.
  static std::unique_ptr<Engine> create(const EngineConfig& config,
                                        const LoadProgress& progress = {});
  // One rank of a data-parallel group whose communicator the caller made: an embedding server
  // running one process per GPU (NCCL from a unique id it exchanged, or its own
  // dist::Communicator, deepinfer/communicator.h). `backend` is this rank's device (make_backend),
  // the one `comm` was made over; config.parallel.data_parallel_size must equal comm.size() and
  // expert_parallel_size 1 or the same. The rank loads only its share of the routed experts.
  // Every rank's step() must be called in lock-step with the others' (each step votes on its
  // kind and exchanges tokens over `comm`); request ids name the rank (rank r hands out r + 1,
  // r + 1 + size, ...). `comm` must outlive the engine. docs/parallel.md.
  static std::unique_ptr<Engine> create_rank(const EngineConfig& config,
                                             std::unique_ptr<Backend> backend,
                                             dist::Communicator& comm,
                                             const LoadProgress& progress = {});
  // A group of processes, one rank each (docs/parallel.md#one-process-per-rank): rank 0 is this
  // front, the Engine the caller drives (it is itself a rank and routes each request to the
  // least-loaded one); ranks 1..N-1 run serve_rank over the same group, which loads the rank and
  // serves rank 0's steps until the front is destroyed (it sends them the shutdown). Takes `comm`
  // (rank 0 of the group).
  static std::unique_ptr<Engine> create_front(const EngineConfig& config,
                                              std::unique_ptr<Backend> backend,
                                              std::unique_ptr<dist::Communicator> comm,
                                              const LoadProgress& progress = {});
  static void serve_rank(const EngineConfig& config, std::unique_ptr<Backend> backend,
                         dist::Communicator& comm, const LoadProgress& progress = {});
  virtual ~Engine() = default;

  // Queues a request. Throws Error(kInvalidArgument) naming the field for an empty prompt, a
  // token outside the vocabulary or invalid sampling parameters.
  virtual RequestId add_request(std::vector<int32_t> prompt, const SamplingParams& params) = 0;
  // Aborts a request; unknown or already finished ids are ignored. Its finish output (kAbort)
  // comes from a later step() unless it already finished.
  virtual void abort(RequestId id) = 0;
  // The drafter of speculative_method "external" (replaces any other); null turns drafting off.
  // Call before the first step or between steps, from the engine thread.
  virtual void set_drafter(std::shared_ptr<Drafter> drafter) = 0;
  // Runs one engine step and returns the outputs it produced.
  virtual std::vector<RequestOutput> step() = 0;
  // Requests not yet finished (including ones still in the inbox).
  virtual int num_unfinished() const = 0;
  bool has_unfinished() const { return num_unfinished() > 0; }
  // Steps until every request has finished; returns all outputs in order.
  std::vector<RequestOutput> run_until_idle();

  virtual EngineStats stats() const = 0;
  // Resolved: every derived size filled in, placement.device the device in use ("auto" resolved).
  virtual const EngineConfig& config() const = 0;
  virtual int vocab_size() const = 0;
  virtual const std::vector<int>& eos_token_ids() const = 0;
  // The checkpoint's config.json as read at create(); null for engines without a checkpoint
  // (the test doubles of deepinfer/testing).
  virtual const ModelConfig* model_config() const = 0;
  // What loading the checkpoint left out on purpose, one line each (e.g. the mtp.* tensors),
  // for a front end to show the user.
  virtual std::vector<std::string> load_notes() const = 0;
  virtual KvCapacity kv_capacity() const = 0;

  // Debug and test hooks (engine thread). Throws Error(kInternal) naming the first broken
  // invariant of the scheduler, its ledgers and pools (cpp/src/engine/README.md lists them).
  virtual void check_invariants() const = 0;
  // Steps launched on the device and not yet committed: 0, 1 or 2.
  virtual int num_inflight_steps() const = 0;
  // Waits until every block written through so far is in the host tier and the store (engine
  // thread). Write-through is otherwise asynchronous; tests and orderly shutdowns call this.
  virtual void flush_kv_tiers() {}
  // While held, the tiers start no store read, so a request on a store hit stays fetching
  // (deterministic tests of the fetching state); releasing lets the reads go.
  virtual void hold_kv_fetches(bool hold) { (void)hold; }
};

}  // namespace deepinfer
