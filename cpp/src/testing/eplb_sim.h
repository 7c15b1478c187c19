// A synthetic expert-parallel workload and the EPLB loop run over it, for the EPLB tests and the
// simulation benchmark (benchmarks/eplb_sim.cpp). Not part of the core.
//
// Traffic: each token picks top_k distinct experts from a Zipf(s) popularity over the experts; the
// popularity ranks map to experts through a permutation whose hot set (the first `hot_set` ranks)
// moves to other experts every `shift_every_steps` steps. One MoE layer is simulated.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "dist/load_window.h"

namespace deepinfer::testing {

struct SkewedTrafficOptions {
  int num_experts = 256;
  int top_k = 6;
  double zipf_s = 1.1;
  int tokens_per_step = 512;
  int hot_set = 16;
  int64_t shift_every_steps = 5000;  // 0 = never
  uint64_t seed = 1;
};

class SkewedTraffic {
 public:
  explicit SkewedTraffic(const SkewedTrafficOptions& options);
  // The next step's routing: [tokens_per_step * top_k] expert ids, token-major.
  const std::vector<int32_t>& next_step();

 private:
  void shift_hot_set();
  int draw_rank();

  SkewedTrafficOptions opt_;
  std::mt19937_64 gen_;
  std::vector<double> cdf_;    // over popularity ranks
  std::vector<int32_t> perm_;  // popularity rank -> expert
  std::vector<int32_t> ids_;
  int64_t step_ = 0;
};

struct EplbSimOptions {
  SkewedTrafficOptions traffic;
  int num_ranks = 64;
  dist::EplbOptions eplb;
  int64_t num_steps = 30000;
};

// One rebalance: max/mean rank load over the window before it under the live placement
// (measured), for the same window under the new placement (planned: each expert's tokens split
// evenly over its replicas), and over the next window_steps steps under the new placement
// (measured; -1 when the run ends first).
struct RebalanceRecord {
  int64_t step = 0;
  double before = 0;
  double planned = 0;
  double after = -1;
};

std::vector<RebalanceRecord> simulate_eplb(const EplbSimOptions& options);

}  // namespace deepinfer::testing
