// The messages between rank 0 of a group of processes and the other ranks (engine/process_group.h):
// each group step, rank 0 broadcasts a StepOrder (the requests and aborts that reached it since
// the last step, each naming its rank) and every rank answers with its RankReport (the step's
// outputs and its stats). Encoded as little-endian bytes by the same binary on every rank;
// decoding checks every length against what is left and throws Error(kInternal) naming the
// message on a short or malformed one.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::engine {

struct AddOrder {
  int rank = 0;
  RequestId id = 0;  // the id the rank will hand out (rank r: r + 1, r + 1 + size, ... in order)
  std::vector<int32_t> prompt;
  SamplingParams params;  // no constraint: constrained requests stay on rank 0
};

struct StepOrder {
  bool shutdown = false;  // the group is closing: the ranks leave their loop
  std::vector<AddOrder> adds;
  std::vector<RequestId> aborts;
};

struct RankReport {
  std::vector<RequestOutput> outputs;
  EngineStats stats;
};

std::vector<uint8_t> encode(const StepOrder& order);
StepOrder decode_step_order(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const RankReport& report);
RankReport decode_rank_report(const std::vector<uint8_t>& bytes);

}  // namespace deepinfer::engine
