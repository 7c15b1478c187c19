#include "engine/dp_group.h"

#include <algorithm>
#include <atomic>
#include <tuple>
#include <utility>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "dist/expert_placement.h"
#include "dist/host_staged_communicator.h"
#include "dist/inprocess_communicator.h"
#include "dist/nccl_group.h"
#include "engine/expert_balancer.h"

namespace deepinfer::engine {

std::string rank_device(const std::string& device, int rank) {
  if (device == "cuda") return "cuda:" + std::to_string(rank);
  return device;
}

namespace {

std::vector<dist::ExpertPlacement> initial_placements(const ParallelConfig& par,
                                                      const ModelConfig& model) {
  const int n = par.data_parallel_size;
  if (par.expert_parallel_size == 1) return {};
  if (model.n_routed_experts % n != 0) {
    throw Error(ErrorCode::kInvalidArgument, "engine config: 'expert_parallel_size' " +
                                                 std::to_string(n) +
                                                 " must divide the model's n_routed_experts (" +
                                                 std::to_string(model.n_routed_experts) + ")");
  }
  return std::vector<dist::ExpertPlacement>(
      static_cast<size_t>(model.num_hidden_layers),
      dist::ExpertPlacement::initial(model.n_routed_experts, n, par.redundant_experts_per_rank));
}

}  // namespace

std::unique_ptr<EngineImpl> create_rank_engine(const EngineConfig& resolved,
                                               const ModelConfig& model,
                                               const ModelExecutorOptions& options,
                                               std::unique_ptr<Backend> backend,
                                               dist::Communicator& comm) {
  const ParallelConfig& par = resolved.parallel;
  ParallelRank rank;
  rank.backend = std::move(backend);
  rank.comm = &comm;
  rank.placements = initial_placements(par, model);
  if (par.enable_eplb && !rank.placements.empty()) {
    dist::EplbOptions eplb;
    eplb.window_steps = par.eplb_window_steps;
    eplb.bucket_steps = eplb_bucket_steps(par.eplb_window_steps);
    eplb.rebalance_interval = par.eplb_rebalance_interval;
    eplb.redundant_slots_per_rank = par.redundant_experts_per_rank;
    rank.eplb = eplb;
  }
  sched::DpVoteConfig vote;
  vote.all_interval = par.dp_prefill_all_interval;
  vote.any_interval = par.dp_prefill_any_interval;
  vote.prefill_when_group_idle = par.dp_prefill_when_idle;
  auto executor = std::make_unique<ModelExecutor>(options, std::move(rank));
  return std::make_unique<EngineImpl>(resolved, std::move(executor), DpRank{&comm, vote});
}

std::unique_ptr<Engine> create_dp_group(const EngineConfig& resolved, const ModelConfig& model,
                                        const ModelExecutorOptions& base,
                                        const LoadProgress& progress) {
  const ParallelConfig& par = resolved.parallel;
  const int n = par.data_parallel_size;
  const std::string& device = resolved.placement.device;
  // Every rank on one GPU ("cuda:K"): NCCL cannot join two ranks on one device, so the
  // collectives go through host memory (make_host_staged_group).
  const bool shared_gpu = device.starts_with("cuda:");
  // Checked before any rank loads.
  initial_placements(par, model);
  // The backends first: the communicators are made over them.
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Backend*> raw;
  int threads = resolved.placement.num_threads;
  if (threads == 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / n);
  }
  for (int r = 0; r < n; ++r) {
    backends.push_back(make_backend(rank_device(device, r), threads));
    raw.push_back(backends.back().get());
  }
  std::vector<std::unique_ptr<dist::Communicator>> comms;
  if (device == "cuda") {
    comms = dist::make_nccl_group(raw);  // rank r on cuda:r
  } else if (shared_gpu) {
    comms = dist::make_host_staged_group(raw);
  } else {
    comms = dist::make_inprocess_group(raw);
  }
  std::vector<std::unique_ptr<EngineImpl>> ranks;
  for (int r = 0; r < n; ++r) {
    ModelExecutorOptions o = base;
    o.placement.device = rank_device(device, r);
    o.placement.num_threads = threads;
    // Ranks sharing a GPU size their KV one after another from what is left: rank r may fill
    // up to (r + 1) / n of the allowed fraction, so each gets about 1 / n of it.
    if (shared_gpu) o.gpu_memory_utilization = base.gpu_memory_utilization * (r + 1) / n;
    // One bar over every rank's load.
    o.progress = {};
    if (progress) {
      o.progress = [&progress, r, n](int done, int total) {
        progress(r * total + done, n * total);
      };
    }
    raw[static_cast<size_t>(r)]->make_current();  // it loads on this thread
    ranks.push_back(create_rank_engine(resolved, model, o,
                                       std::move(backends[static_cast<size_t>(r)]),
                                       *comms[static_cast<size_t>(r)]));
  }
  return std::make_unique<DpEngineGroup>(std::move(ranks), std::move(comms));
}

RankThreads::RankThreads(int num_ranks) : errors_(static_cast<size_t>(num_ranks)) {
  for (int r = 0; r < num_ranks; ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::vector<std::exception_ptr> RankThreads::run(const std::function<void(int)>& fn) {
  std::unique_lock lock(mutex_);
  job_ = &fn;
  remaining_ = static_cast<int>(threads_.size());
  std::fill(errors_.begin(), errors_.end(), nullptr);
  ++generation_;
  start_cv_.notify_all();
  done_cv_.wait(lock, [&] { return remaining_ == 0; });
  job_ = nullptr;
  return errors_;
}

void RankThreads::worker(int rank) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const std::function<void(int)>* job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*job)(rank);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    errors_[static_cast<size_t>(rank)] = error;
    if (--remaining_ == 0) done_cv_.notify_all();
  }
}

DpEngineGroup::DpEngineGroup(std::vector<std::unique_ptr<EngineImpl>> ranks,
                             std::vector<std::unique_ptr<dist::Communicator>> comms)
    : ranks_(std::move(ranks)),
      comms_(std::move(comms)),
      router_(static_cast<int>(ranks_.size())),
      threads_(static_cast<int>(ranks_.size())) {
  DEEPINFER_CHECK(!ranks_.empty() && ranks_.size() == comms_.size(),
                  "a DP group needs one communicator per rank");
}

DpEngineGroup::~DpEngineGroup() = default;

RequestId DpEngineGroup::add_request(std::vector<int32_t> prompt, const SamplingParams& params) {
  const int r = router_.least_loaded();
  const auto tokens = static_cast<int64_t>(prompt.size());
  const RequestId id = ranks_[static_cast<size_t>(r)]->add_request(std::move(prompt), params);
  router_.assigned(r, id, tokens);
  return id;
}

void DpEngineGroup::abort(RequestId id) {
  const int r = rank_of_request(id, num_ranks());
  if (r >= 0) ranks_[static_cast<size_t>(r)]->abort(id);
}

void DpEngineGroup::set_drafter(std::shared_ptr<Drafter> drafter) {
  (void)drafter;
  throw Error(ErrorCode::kUnsupported,
              "set_drafter: speculative decoding does not run with data_parallel_size > 1 yet");
}

std::vector<RequestOutput> DpEngineGroup::step() {
  if (!failure_.empty()) {
    throw Error(ErrorCode::kInternal, "the data-parallel group failed earlier: " + failure_);
  }
  const size_t n = ranks_.size();
  std::vector<std::vector<RequestOutput>> outputs(n);
  // The first rank to fail names the cause; the others then fail in their next collective.
  std::atomic<int> first_failed{-1};
  const std::vector<std::exception_ptr> errors = threads_.run([&](int r) {
    try {
      EngineImpl& rank = *ranks_[static_cast<size_t>(r)];
      rank.make_current();
      outputs[static_cast<size_t>(r)] = rank.step();
    } catch (...) {
      int none = -1;
      first_failed.compare_exchange_strong(none, r);
      std::string what = "an exception that is not a std::exception";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      // Every rank's: an NCCL abort is local, and the other ranks may be inside a collective.
      for (auto& comm : comms_) comm->abort("rank " + std::to_string(r) + " failed: " + what);
      throw;
    }
  });
  const int failed = first_failed.load();
  if (failed >= 0) {
    failure_ = "rank " + std::to_string(failed) + " failed";
    try {
      std::rethrow_exception(errors[static_cast<size_t>(failed)]);
    } catch (const std::exception& e) {
      failure_ = "rank " + std::to_string(failed) + ": " + e.what();
    } catch (...) {
    }
    std::rethrow_exception(errors[static_cast<size_t>(failed)]);
  }
  std::vector<RequestOutput> merged;
  for (auto& o : outputs) {
    merged.insert(merged.end(), std::make_move_iterator(o.begin()),
                  std::make_move_iterator(o.end()));
  }
  router_.account(merged, rank_of_request, num_ranks());
  return merged;
}

int DpEngineGroup::num_unfinished() const {
  int total = 0;
  for (const auto& r : ranks_) total += r->num_unfinished();
  return total;
}

EngineStats DpEngineGroup::stats() const {
  EngineStats s;
  for (const auto& rank : ranks_) accumulate_stats(s, rank->stats());
  return s;
}

std::vector<std::string> DpEngineGroup::load_notes() const {
  std::vector<std::string> notes = ranks_.front()->load_notes();
  const ParallelConfig& p = config().parallel;
  notes.push_back(std::to_string(ranks_.size()) + " data-parallel ranks" +
                  (p.expert_parallel_size > 1
                       ? " with the routed experts split across them (expert parallelism)"
                       : " (replicas)"));
  return notes;
}

KvCapacity DpEngineGroup::kv_capacity() const {
  KvCapacity k = ranks_.front()->kv_capacity();
  for (size_t r = 1; r < ranks_.size(); ++r) {
    const KvCapacity o = ranks_[r]->kv_capacity();
    k.num_blocks += o.num_blocks;
    k.max_tokens += o.max_tokens;
    k.max_seqs_at_max_model_len += o.max_seqs_at_max_model_len;
  }
  return k;
}

void DpEngineGroup::check_invariants() const {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    try {
      ranks_[r]->check_invariants();
    } catch (const Error& e) {
      throw Error(e.code(), "rank " + std::to_string(r) + ": " + e.what());
    }
  }
}

int DpEngineGroup::num_inflight_steps() const {
  int most = 0;
  for (const auto& r : ranks_) most = std::max(most, r->num_inflight_steps());
  return most;
}

void DpEngineGroup::flush_kv_tiers() {
  for (auto& r : ranks_) r->flush_kv_tiers();
}

void DpEngineGroup::hold_kv_fetches(bool hold) {
  for (auto& r : ranks_) r->hold_kv_fetches(hold);
}

}  // namespace deepinfer::engine
