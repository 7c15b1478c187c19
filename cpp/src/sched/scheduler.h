// Scheduler: continuous batching over waiting and running queues.
//
// The model in one paragraph: requests arrive in a FIFO `waiting` queue. Each step is all-prefill
// or all-decode (InterleavePolicy picks when both have work). A prefill step takes sequences from
// the head of `waiting` while the token budget (max_num_batched_tokens) and max_num_seqs allow;
// a sequence the budget cuts (chunked prefill) ends the batch and stays in its place, so its next
// chunk goes first. One cut at its prefix checkpoint (the state snapshot is taken after the step)
// also stays in its place, holding its blocks, but the sequences behind it still fill the step.
// Admission never skips: once a sequence cannot be admitted, none behind it is (arrival order is
// admission order; only recompute-preempted sequences jump back to the head), while the ones
// behind it that already hold their blocks still run their next pieces. A new
// sequence gets its state slot and the blocks of its whole prompt (less its prefix-cache hit) at
// admission, and only while KV usage is at most the watermark. A decode step gives every running
// sequence one token; when a sequence needs a block and none is free, the newest running sequence
// is preempted (recompute: its KV is dropped and it re-enters at the head of `waiting`; stop: it
// finishes). With zero-overhead scheduling the step being planned may overlap one step still in
// flight: lengths are optimistic (committed + in-flight reservation), a row whose input token is
// still on the device is marked carried, and a preemption that would hit an in-flight sequence
// asks the engine to drain first. With drafting, a sequence whose in-flight row verifies drafts
// gets no row (its next position depends on what the device accepts; sits_out). A sequence admitted
// on a KV tier hit whose blocks are still being read waits in `fetching` (SeqState::kFetching),
// holding its blocks and slot (it counts toward max_num_seqs and KV usage like any admitted
// sequence) while the steps go on without it; poll_fetches, at the start of each step, moves a
// finished one to the head of `waiting` to prefill the rest of its prompt, or, when the fetch
// failed, back to the head unadmitted. A sequence whose tier hit would read blocks another fetch is
// already reading waits in `fetching` too, holding nothing (not counted toward max_num_seqs), until
// that fetch is over; it then goes back to the head of `waiting`, behind the sequence it waited
// for, and its admission takes the fetched blocks from the GPU index.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "deepinfer/engine.h"
#include "deepinfer/engine_config.h"
#include "sched/dp_vote.h"
#include "sched/kv_allocator.h"
#include "sched/policies.h"
#include "sched/sequence.h"
#include "sched/step_plan.h"

namespace deepinfer::sched {

class Scheduler {
 public:
  enum class Outcome { kScheduled, kIdle, kNeedsDrain };

  // `config` is resolved (max_model_len filled in); `eos_token_ids` are the model's.
  Scheduler(const SchedulerConfig& config, std::vector<int> eos_token_ids, KvAllocator& kv);

  // Takes ownership of a validated new sequence (state kWaiting, nothing computed).
  void add(std::unique_ptr<Sequence> seq);
  // Finishes `id` with kAbort (ignored if unknown or finished); its finish output goes to `out`.
  void abort(RequestId id, std::vector<RequestOutput>& out);
  // Finishes the tier fetches that are done (non-blocking); ready outputs go to `out`.
  void poll_fetches(std::vector<RequestOutput>& out);

  // Plans the next step into `plan` (cleared first). kNeedsDrain: a preemption would hit a
  // sequence with a step in flight; commit the in-flight steps and call again. Ready, rejected and
  // preempted outputs go to `out`.
  // `kind`, when given, is the step kind the DP group voted for (sched/dp_vote.h): only that kind
  // is planned, with no fallback to the other (kIdle when this rank has none of it).
  Outcome schedule(StepPlan& plan, std::vector<RequestOutput>& out,
                   std::optional<StepKind> kind = std::nullopt);
  // This rank's wish for the DP vote: whether its waiting head is admissible (a live head that
  // holds KV already, or room under max_num_seqs and the KV watermark) and whether it has decode
  // work. Sweeps finished entries off the waiting queue first, so they never vote.
  LocalWish dp_wish();
  // Applies the sampled tokens of a launched `plan`; token and finish outputs go to `out`. Steps
  // are committed in launch order.
  void commit(const StepPlan& plan, const StepResult& result, std::vector<RequestOutput>& out);

  int num_unfinished() const { return num_unfinished_; }
  int num_running() const;
  int num_waiting() const;
  int num_fetching() const;
  int num_holding_resources() const { return num_holding_; }
  const SchedulerCounters& stats() const { return stats_; }
  const Sequence* find(RequestId id) const;

  // Speculative decoding: decode rows of sequences with nothing in flight carry up to
  // `max_drafts` drafts from `drafter` (null: none); drafts outside [0, vocab_size) are dropped.
  // Replaces any drafter, the executor's included.
  void set_drafter(std::shared_ptr<Drafter> drafter, int max_drafts, int vocab_size);
  // Drafts come from the executor instead (StepResult::drafts, kept on each sequence by the
  // commit): speculative_method "mtp".
  void use_executor_drafts(int max_drafts);
  // A decode step of `num_tokens` tokens took `seconds`: the confidence budget's cost model.
  void observe_decode_step(int num_tokens, double seconds) {
    budget_.observe_step(num_tokens, seconds);
    ++stats_.budget_step_times;
  }

  // Throws Error(kInternal) on the first broken invariant (sequences, ledgers, pools).
  void check_invariants() const;

 private:
  bool schedule_prefill(StepPlan& plan, std::vector<RequestOutput>& out);
  // An admission took effect (at once, or once its fetch finished): counts, checkpoint, ready.
  void on_admitted(Sequence& s, const Admission& a, std::vector<RequestOutput>& out);
  Outcome schedule_decode(StepPlan& plan, std::vector<RequestOutput>& out);
  bool has_decode_work() const;
  // `device_drafts` >= 0: a row carried on the device after `s`'s in-flight one, verifying that
  // many of the drafts the device made past it (device_carries).
  void add_row(StepPlan& plan, Sequence& s, int q, std::span<const int32_t> drafts = {},
               int device_drafts = -1);
  void propose_drafts(Sequence& s);
  void propose_within(Sequence& s, int budget);
  // Zero-overhead scheduling with drafting: whether `s`, with a step in flight, gets no row in
  // this step (scheduler_drafts.cpp says when).
  bool sits_out(Sequence& s);
  // Zero-overhead scheduling with drafts the executor makes on the device within each step (V4's
  // MTP block): a sequence with a step in flight gets a row carried on the device, planned where
  // every draft of the in-flight row is accepted and moved back by the device, verifying the
  // drafts the device made past that row (scheduler_drafts.cpp).
  bool device_carries() const {
    return executor_drafts_ && config_.zero_overhead && max_drafts_ > 0;
  }
  // How many of those drafts `s`'s carried row at `pos` verifies.
  int device_carried_drafts(const Sequence& s, int pos) const;
  // The executor's drafts for `s`'s next row came with their MTP probabilities.
  static bool has_draft_probs(const Sequence& s);
  int draft_limit(const Sequence& s) const;
  int drafts_allowed(const Sequence& s) const;
  bool drafting() const { return (drafter_ != nullptr || executor_drafts_) && max_drafts_ > 0; }
  void unreserve(const StepPlan& plan);
  void preempt(Sequence& s, std::vector<RequestOutput>& out);
  void finish(Sequence& s, FinishReason reason, std::string detail,
              std::vector<RequestOutput>& out);
  void release_if_done(Sequence& s);
  void retire_finished();
  void insert_running(Sequence* s);
  bool is_stop_token(const Sequence& s, int32_t token) const;
  static RequestOutput make_output(const Sequence& s);

  SchedulerConfig config_;
  std::vector<int> eos_token_ids_;
  KvAllocator& kv_;
  InterleavePolicy interleave_;
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;   // by arrival, oldest first
  std::vector<Sequence*> fetching_;  // kFetching, by admission
  std::vector<RequestId> retiring_;  // finished; erased once nothing of them is in flight
  int num_unfinished_ = 0;
  int num_holding_ = 0;  // sequences holding a state slot and blocks
  uint64_t next_step_id_ = 1;
  // Tokens the device output of the plan being built holds so far: one per logits row of its
  // sampling rows (1 + d for a verify row), the index a carried row of the next step names.
  int num_sampled_tokens_ = 0;
  int num_sampling_rows_ = 0;  // sampling rows of the plan being built
  std::shared_ptr<Drafter> drafter_;
  bool executor_drafts_ = false;  // use_executor_drafts
  int max_drafts_ = 0;
  int vocab_size_ = 0;
  std::vector<int32_t> drafts_;  // the row being planned
  DraftBudget budget_;
  void plan_draft_budget();
  SchedulerCounters stats_;
};

}  // namespace deepinfer::sched
