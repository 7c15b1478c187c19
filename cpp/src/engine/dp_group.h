// DpEngineGroup: one Engine over the data-parallel ranks of one process (docs/parallel.md).
//
// Each rank is a whole EngineImpl (its own scheduler, KV pools, prefix cache, tiers and requests)
// over its own backend; with expert parallelism the ranks' models hold disjoint shares of every
// MoE layer's routed experts and exchange tokens through the group's communicators. The group:
//   - routes each new request to the least-loaded rank (RankRouter);
//   - runs every rank's step() at once, each on its own thread (the same thread every step),
//     since the ranks' step-kind votes and expert exchanges wait for each other;
//   - names a request by the id its rank gave it (rank r hands out r + 1, r + 1 + N, ...), so
//     abort() finds the rank without a table;
//   - fails as a whole: when a rank's step throws, every rank's communicator is aborted (an NCCL
//     abort is local) so the other ranks' collectives throw instead of waiting, step() rethrows
//     the first rank's error, and every later step() throws naming it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "deepinfer/config.h"
#include "deepinfer/engine.h"
#include "dist/communicator.h"
#include "engine/engine_impl.h"
#include "engine/model_executor.h"
#include "engine/rank_router.h"

namespace deepinfer::engine {

// The group Engine::create makes when config.parallel.data_parallel_size > 1: `resolved` is the
// resolved config, `model` its checkpoint's config.json, `base` the executor options of one rank
// (each rank gets its device, backend, expert share and the shared progress callback).
std::unique_ptr<Engine> create_dp_group(const EngineConfig& resolved, const ModelConfig& model,
                                        const ModelExecutorOptions& base,
                                        const LoadProgress& progress);
// One rank of a group over `comm`, whose backend (`backend`, the one comm was made over) the
// caller made: Engine::create_rank, and each rank of create_dp_group.
std::unique_ptr<EngineImpl> create_rank_engine(const EngineConfig& resolved,
                                               const ModelConfig& model,
                                               const ModelExecutorOptions& options,
                                               std::unique_ptr<Backend> backend,
                                               dist::Communicator& comm);
// The device of rank `rank`: "cuda:<rank>" for "cuda"; any other name (cpu, cuda:K) is shared.
std::string rank_device(const std::string& device, int rank);

// One worker thread per rank; run(fn) calls fn(r) on worker r for every rank and returns when
// all have returned. The first exception (in time) is kept per call.
class RankThreads {
 public:
  explicit RankThreads(int num_ranks);
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;
  ~RankThreads();

  // Returns each rank's exception (null: returned normally).
  std::vector<std::exception_ptr> run(const std::function<void(int)>& fn);

 private:
  void worker(int rank);

  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int remaining_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

class DpEngineGroup final : public Engine {
 public:
  // `ranks[r]` was built over comms[r] (EngineImpl's DpRank); both vectors have one entry per
  // rank. The group owns them.
  DpEngineGroup(std::vector<std::unique_ptr<EngineImpl>> ranks,
                std::vector<std::unique_ptr<dist::Communicator>> comms);
  ~DpEngineGroup() override;

  RequestId add_request(std::vector<int32_t> prompt, const SamplingParams& params) override;
  void abort(RequestId id) override;
  void set_drafter(std::shared_ptr<Drafter> drafter) override;
  std::vector<RequestOutput> step() override;
  int num_unfinished() const override;
  EngineStats stats() const override;
  const EngineConfig& config() const override { return ranks_.front()->config(); }
  int vocab_size() const override { return ranks_.front()->vocab_size(); }
  const std::vector<int>& eos_token_ids() const override { return ranks_.front()->eos_token_ids(); }
  const ModelConfig* model_config() const override { return ranks_.front()->model_config(); }
  std::vector<std::string> load_notes() const override;
  KvCapacity kv_capacity() const override;
  void check_invariants() const override;
  int num_inflight_steps() const override;
  void flush_kv_tiers() override;
  void hold_kv_fetches(bool hold) override;

  int num_ranks() const { return static_cast<int>(ranks_.size()); }

 private:
  std::vector<std::unique_ptr<EngineImpl>> ranks_;
  // Destroyed before the ranks (declared after them): the ranks' backends outlive them.
  std::vector<std::unique_ptr<dist::Communicator>> comms_;

  RankRouter router_;
  std::string failure_;  // engine thread: why the group failed ("" while it works)
  // Declared last, so joined first: no rank runs while the rest is destroyed.
  RankThreads threads_;
};

}  // namespace deepinfer::engine
