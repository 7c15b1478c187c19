// A data-parallel group of processes, one rank each (docs/parallel.md#one-process-per-rank):
// rank 0 is the front (ProcessGroupFront: the Engine a server or `run` drives, and itself a rank),
// ranks 1..N-1 run serve_rank. Each group step:
//   1. rank 0 broadcasts a StepOrder: the requests routed to other ranks since the last step and
//      the aborts of theirs (engine/rank_messages.h);
//   2. every rank adds its requests (with the ids rank 0 already handed out: rank r's ids are
//      r + 1, r + 1 + N, ... in the order it adds them) and runs its step() (the vote and the
//      expert exchange go over the same communicator);
//   3. every rank's RankReport (outputs and stats) is gathered, and rank 0 returns them all.
// Routing is the threads group's (RankRouter); a request with a constraint (structured outputs, a
// Python object) stays on rank 0, whose process holds it. When a rank fails, its communicator
// aborts the group: the others' collectives throw, the front's step() rethrows and every later one
// names the failure.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "deepinfer/communicator.h"
#include "deepinfer/engine.h"
#include "engine/rank_messages.h"
#include "engine/rank_router.h"

namespace deepinfer::engine {

class ProcessGroupFront final : public Engine {
 public:
  // `local` is rank 0 (Engine::create_rank over `comm`); the other ranks run serve_rank.
  ProcessGroupFront(std::unique_ptr<Engine> local, std::unique_ptr<dist::Communicator> comm);
  // Sends the other ranks the shutdown order (unless the group failed), so they leave serve_rank.
  ~ProcessGroupFront() override;

  RequestId add_request(std::vector<int32_t> prompt, const SamplingParams& params) override;
  void abort(RequestId id) override;
  void set_drafter(std::shared_ptr<Drafter> drafter) override;
  std::vector<RequestOutput> step() override;
  int num_unfinished() const override;
  EngineStats stats() const override;
  const EngineConfig& config() const override { return local_->config(); }
  int vocab_size() const override { return local_->vocab_size(); }
  const std::vector<int>& eos_token_ids() const override { return local_->eos_token_ids(); }
  const ModelConfig* model_config() const override { return local_->model_config(); }
  std::vector<std::string> load_notes() const override;
  KvCapacity kv_capacity() const override;
  // Rank 0's own (the other ranks check theirs in every debug-build step).
  void check_invariants() const override { local_->check_invariants(); }
  int num_inflight_steps() const override { return local_->num_inflight_steps(); }
  void flush_kv_tiers() override { local_->flush_kv_tiers(); }
  void hold_kv_fetches(bool hold) override { local_->hold_kv_fetches(hold); }

 private:
  std::unique_ptr<Engine> local_;  // owns the backend comm_ was made over: destroyed after it
  std::unique_ptr<dist::Communicator> comm_;
  const int size_;
  mutable std::mutex mu_;  // add_request and abort may come from another thread than step()
  RankRouter router_;
  StepOrder pending_;                      // guarded by mu_
  std::vector<RequestId> next_id_;         // guarded by mu_: per rank, the id its next request gets
  std::vector<EngineStats> remote_stats_;  // the last report of each rank (index 0 unused)
  std::string failure_;
};

// The loop of a rank other than 0: waits for rank 0's step orders over `comm`, runs `engine`'s
// steps, reports; returns when rank 0 sends the shutdown order. Throws (after aborting the
// group) when a step fails or the group is aborted.
void serve_rank(Engine& engine, dist::Communicator& comm);

}  // namespace deepinfer::engine
