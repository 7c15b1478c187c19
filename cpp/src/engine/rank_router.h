// What a group front keeps about its ranks (engine/dp_group.h, engine/process_group.h): the load
// each rank carries, to route a new request to the least-loaded one, and the group's stats.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::engine {

// Least-loaded routing: fewest unfinished requests, then the fewest tokens of context (prompt
// plus generated so far), then the lowest rank, as the seed's decode balancer weighs running
// requests and KV length. Thread-safe (add_request may come from another thread than step()).
class RankRouter {
 public:
  explicit RankRouter(int num_ranks) : loads_(static_cast<size_t>(num_ranks)) {}

  int least_loaded() const;
  // A request of `prompt_tokens` went to `rank` under `id`.
  void assigned(int rank, RequestId id, int64_t prompt_tokens);
  // Outputs of a step: generated tokens add to their rank's load, a finish removes the request.
  void account(const std::vector<RequestOutput>& outputs, int (*rank_of)(RequestId, int), int n);
  int unfinished() const;

 private:
  struct Load {
    int requests = 0;
    int64_t tokens = 0;
  };
  mutable std::mutex mu_;
  std::vector<Load> loads_;
  std::unordered_map<RequestId, int64_t> tokens_of_;  // unfinished requests' accounted tokens
  // Requests whose finish a step reported before their add_request got to assigned() (the
  // engine thread stepped in between): assigned() must not count them.
  std::unordered_set<RequestId> finished_early_;
};

// The rank of a request id in a group of n (rank r hands out r + 1, r + 1 + n, ...); -1 for an
// id no rank could have given.
int rank_of_request(RequestId id, int n);

// `into` += `from`: counters and sizes add (blocks, running requests), maxima stay maxima, and
// values every rank has alike (group steps) are taken once.
void accumulate_stats(EngineStats& into, const EngineStats& from);

}  // namespace deepinfer::engine
