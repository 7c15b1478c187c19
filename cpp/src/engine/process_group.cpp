#include "engine/process_group.h"

#include <utility>

#include "deepinfer/error.h"
#include "dist/byte_collectives.h"
#include "engine/engine_impl.h"

namespace deepinfer::engine {

ProcessGroupFront::ProcessGroupFront(std::unique_ptr<Engine> local,
                                     std::unique_ptr<dist::Communicator> comm)
    : local_(std::move(local)),
      comm_(std::move(comm)),
      size_(comm_->size()),
      router_(size_),
      remote_stats_(static_cast<size_t>(size_)) {
  DEEPINFER_CHECK(comm_->rank() == 0, "the front of a process group is rank 0");
  for (int r = 0; r < size_; ++r) next_id_.push_back(static_cast<RequestId>(r) + 1);
}

ProcessGroupFront::~ProcessGroupFront() {
  if (!failure_.empty()) return;
  try {
    StepOrder bye;
    bye.shutdown = true;
    dist::broadcast_bytes(*comm_, encode(bye), 0);
  } catch (...) {  // a rank already gone: nothing left to tell
  }
}

RequestId ProcessGroupFront::add_request(std::vector<int32_t> prompt,
                                         const SamplingParams& params) {
  check_request(prompt, params, local_->vocab_size());
  // A constraint is an object of this process: its request runs here.
  const int r = params.constraint != nullptr ? 0 : router_.least_loaded();
  const auto tokens = static_cast<int64_t>(prompt.size());
  RequestId id = 0;
  if (r == 0) {
    id = local_->add_request(std::move(prompt), params);
  } else {
    std::lock_guard lock(mu_);
    id = next_id_[static_cast<size_t>(r)];
    next_id_[static_cast<size_t>(r)] += static_cast<RequestId>(size_);
    pending_.adds.push_back(AddOrder{r, id, std::move(prompt), params});
  }
  router_.assigned(r, id, tokens);
  return id;
}

void ProcessGroupFront::abort(RequestId id) {
  const int r = rank_of_request(id, size_);
  if (r == 0) {
    local_->abort(id);
  } else if (r > 0) {
    std::lock_guard lock(mu_);
    pending_.aborts.push_back(id);
  }
}

void ProcessGroupFront::set_drafter(std::shared_ptr<Drafter> drafter) {
  (void)drafter;
  throw Error(ErrorCode::kUnsupported,
              "set_drafter: speculative decoding does not run with data_parallel_size > 1 yet");
}

std::vector<RequestOutput> ProcessGroupFront::step() {
  if (!failure_.empty()) {
    throw Error(ErrorCode::kInternal, "the data-parallel group failed earlier: " + failure_);
  }
  StepOrder order;
  {
    std::lock_guard lock(mu_);
    std::swap(order, pending_);
  }
  std::vector<RequestOutput> merged;
  try {
    dist::broadcast_bytes(*comm_, encode(order), 0);
    merged = local_->step();
    RankReport mine;
    mine.stats = local_->stats();
    const std::vector<std::vector<uint8_t>> reports = dist::gather_bytes(*comm_, encode(mine));
    for (int r = 1; r < size_; ++r) {
      RankReport report = decode_rank_report(reports[static_cast<size_t>(r)]);
      remote_stats_[static_cast<size_t>(r)] = report.stats;
      merged.insert(merged.end(), std::make_move_iterator(report.outputs.begin()),
                    std::make_move_iterator(report.outputs.end()));
    }
  } catch (const std::exception& e) {
    failure_ = e.what();
    comm_->abort(std::string("rank 0 failed: ") + e.what());
    throw;
  }
  router_.account(merged, rank_of_request, size_);
  return merged;
}

int ProcessGroupFront::num_unfinished() const {
  return router_.unfinished();
}

EngineStats ProcessGroupFront::stats() const {
  EngineStats s = local_->stats();
  for (int r = 1; r < size_; ++r) accumulate_stats(s, remote_stats_[static_cast<size_t>(r)]);
  return s;
}

std::vector<std::string> ProcessGroupFront::load_notes() const {
  std::vector<std::string> notes = local_->load_notes();
  notes.push_back(std::to_string(size_) + " data-parallel ranks, one process each" +
                  (config().parallel.expert_parallel_size > 1
                       ? ", with the routed experts split across them (expert parallelism)"
                       : " (replicas)"));
  return notes;
}

KvCapacity ProcessGroupFront::kv_capacity() const {
  // The other ranks' caches as their last reports give them (before the first step, rank 0's
  // stands for each: every rank is made from the same config).
  KvCapacity k = local_->kv_capacity();
  const KvCapacity own = k;
  for (int r = 1; r < size_; ++r) {
    const int blocks = remote_stats_[static_cast<size_t>(r)].num_blocks_total;
    const int64_t n = blocks > 0 ? blocks : own.num_blocks;
    k.num_blocks += static_cast<int>(n);
    k.max_tokens += n * own.block_size;
    k.max_seqs_at_max_model_len +=
        own.num_blocks > 0 ? static_cast<int>(n * own.max_seqs_at_max_model_len / own.num_blocks)
                           : 0;
  }
  return k;
}

void serve_rank(Engine& engine, dist::Communicator& comm) {
  const int me = comm.rank();
  DEEPINFER_CHECK(me != 0, "serve_rank runs on ranks 1..N-1; rank 0 is the front");
  try {
    while (true) {
      const StepOrder order = decode_step_order(dist::broadcast_bytes(comm, {}, 0));
      if (order.shutdown) return;
      RankReport report;
      for (const AddOrder& a : order.adds) {
        if (a.rank != me) continue;
        RequestId id = 0;
        try {
          id = engine.add_request(a.prompt, a.params);
        } catch (const std::exception& e) {
          // Rank 0 checked the request already and handed out its id: this request alone fails
          // (e.g. no memory for its token buffer), as it would have on rank 0.
          RequestOutput rejected;
          rejected.id = a.id;
          rejected.finish = FinishReason::kRejected;
          rejected.finish_detail = std::string("rank ") + std::to_string(me) + ": " + e.what();
          report.outputs.push_back(std::move(rejected));
          continue;
        }
        if (id != a.id) {
          throw Error(ErrorCode::kInternal, "rank " + std::to_string(me) + " gave request id " +
                                                std::to_string(id) + " where rank 0 handed out " +
                                                std::to_string(a.id));
        }
      }
      for (RequestId id : order.aborts) {
        if (rank_of_request(id, comm.size()) == me) engine.abort(id);
      }
      std::vector<RequestOutput> stepped = engine.step();
      report.outputs.insert(report.outputs.end(), std::make_move_iterator(stepped.begin()),
                            std::make_move_iterator(stepped.end()));
      report.stats = engine.stats();
      dist::gather_bytes(comm, encode(report));
    }
  } catch (const std::exception& e) {
    comm.abort("rank " + std::to_string(me) + " failed: " + e.what());
    throw;
  }
}

}  // namespace deepinfer::engine
