// EngineImpl: the engine step loop over a Scheduler and a StepExecutor (zero-overhead pipeline).
//
// One step() with zero_overhead on:
//   1. drain the inbox (adds, aborts);
//   2. schedule step N+1 while step N may still run (optimistic lengths from the in-flight ledger);
//   3. launch N+1 behind N on the device stream (carried rows take N's sampled tokens there);
//   4. wait for N and commit it: tokens, stop checks, prefix registration; a finished sequence's
//      blocks and slot are released once its last in-flight step is committed;
//   5. return the outputs.
// So the host's commit and scheduling work overlaps the device's work on N+1. With zero_overhead
// off, 3 is followed by waiting for and committing N+1 itself. At most two steps are ever
// launched and uncommitted (asserted). Before 1, tier fetches that finished are taken (their
// requests go on to prefill the rest of their prompts); a step with nothing to run while fetches
// are under way waits briefly for one instead of returning at once.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "deepinfer/engine.h"
#include "dist/communicator.h"
#include "engine/step_executor.h"
#include "sched/dp_vote.h"
#include "sched/kv_allocator.h"
#include "sched/scheduler.h"

namespace deepinfer::engine {

// Throws Error(kInvalidArgument) naming the field for an empty prompt, a token outside
// [0, vocab) or invalid sampling parameters (what Engine::add_request promises).
void check_request(const std::vector<int32_t>& prompt, const SamplingParams& params, int vocab);

// One data-parallel rank of a group (engine/dp_group.h): the group's communicator (its host
// channel carries the step-kind vote) and the rank's place, which also spaces the request ids
// (rank r hands out r + 1, r + 1 + size, ...: an id names its rank).
struct DpRank {
  dist::Communicator* comm = nullptr;
  sched::DpVoteConfig vote;
};

class EngineImpl final : public Engine {
 public:
  // With `dp.comm`, this engine is one rank of a data-parallel group: every step() first agrees
  // with the other ranks on the step kind (sched/dp_vote.h) and, in a step the group runs, a rank
  // without rows of that kind runs the executor's idle pass, so the ranks' collectives line up.
  // Every rank's step() must then be called together (the group does it).
  EngineImpl(const EngineConfig& config, std::unique_ptr<StepExecutor> executor, DpRank dp = {});
  ~EngineImpl() override;

  RequestId add_request(std::vector<int32_t> prompt, const SamplingParams& params) override;
  void abort(RequestId id) override;
  void set_drafter(std::shared_ptr<Drafter> drafter) override;
  std::vector<RequestOutput> step() override;
  int num_unfinished() const override { return unfinished_.load(); }
  EngineStats stats() const override;
  const EngineConfig& config() const override { return config_; }
  int vocab_size() const override { return executor_->vocab_size(); }
  const std::vector<int>& eos_token_ids() const override { return executor_->eos_token_ids(); }
  const ModelConfig* model_config() const override { return executor_->model_config(); }
  std::vector<std::string> load_notes() const override { return executor_->load_notes(); }
  KvCapacity kv_capacity() const override;

  void check_invariants() const override;
  int num_inflight_steps() const override { return static_cast<int>(inflight_.size()); }
  void flush_kv_tiers() override;
  void hold_kv_fetches(bool hold) override;
  // The executor's device becomes the calling thread's (a group's rank steps on its own thread).
  void make_current() { executor_->make_current(); }

 private:
  // A launched step and its plan, kept until the step is committed.
  struct Launched {
    std::unique_ptr<InflightStep> step;
    StepPlan plan;
    // A decode step launched behind another still in flight (zero-overhead scheduling): the
    // pipeline was full, so the time from its predecessor's commit to its own is its cost.
    bool pipelined_decode = false;
  };
  void drain_inbox(std::vector<RequestOutput>& out);
  void commit_oldest(std::vector<RequestOutput>& out);
  // When the last step was committed, and whether it was a decode step (the confidence budget's
  // step times under zero-overhead scheduling: commit_oldest).
  std::optional<std::chrono::steady_clock::time_point> last_commit_;
  bool last_commit_decode_ = false;
  void count_finishes(const std::vector<RequestOutput>& out, size_t from);
  // The group's vote for this step (DP ranks only): plans this rank's part of the step the group
  // runs into `plan`. Returns the step kind to plan again after a drain (none: nothing to plan);
  // `idle_pass` is set when the group runs a step in which this rank has no rows.
  std::optional<sched::StepKind> vote_step(StepPlan& plan, std::vector<RequestOutput>& out,
                                           sched::Scheduler::Outcome& outcome, bool& idle_pass);
  sched::Tally group_tally(const sched::Ballot& ballot);

  EngineConfig config_;
  std::unique_ptr<StepExecutor> executor_;
  // Host and store tiers (null: off). Destroyed before the executor, whose stream its pending
  // exports wait for, and after the scheduler and allocator that point to it.
  std::unique_ptr<sched::KvTiers> tiers_;
  sched::KvAllocator kv_;
  sched::Scheduler scheduler_;
  std::deque<Launched> inflight_;
  // Plans of committed steps, reused so that planning a step allocates nothing in steady state.
  std::vector<StepPlan> spare_plans_;

  mutable std::mutex inbox_mu_;
  std::vector<std::unique_ptr<sched::Sequence>> inbox_adds_;
  std::vector<RequestId> inbox_aborts_;
  dist::Communicator* comm_ = nullptr;  // DP rank: the group's (null: a single engine)
  sched::DpVote vote_;
  RequestId id_stride_ = 1;
  uint64_t dp_group_steps_ = 0;  // EngineStats::dp_group_steps / dp_idle_passes
  uint64_t dp_idle_passes_ = 0;
  std::atomic<RequestId> next_id_{1};
  std::atomic<int> unfinished_{0};
  uint64_t next_arrival_ = 0;  // engine thread
};

}  // namespace deepinfer::engine
