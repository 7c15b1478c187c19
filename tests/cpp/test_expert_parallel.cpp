// Expert-parallel routed experts (dist/expert_parallel.h) on N in-process ranks over CPU backends.
// Each test names the contract it protects:
//   MatchesSingleRankReferenceBitForBit  E = 8, 16; N = 1, 2, 4; with and without replicas: every
//                                        rank's output equals one rank computing each (token, j)
//                                        pair alone and combining in (token, j) order, bit for bit,
//                                        and the fused moe_experts to rounding
//   RanksWithZeroTokens                  a rank with no tokens still joins every collective
//   BadArgumentsFailOnEveryRank          one rank's wrong slot count or placement: every rank
//                                        throws kInvalidArgument instead of hanging
// The multi-rank runs go under a watchdog that aborts the group after a timeout.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "dist/eplb_policy.h"
#include "dist/expert_parallel.h"
#include "dist/inprocess_communicator.h"
#include "rank_threads.h"

namespace deepinfer::dist {
namespace {

using deepinfer::testing::sz;
using testing::Comms;
using testing::run_ranks;

// One MoE layer's logical experts and every rank's tokens and routing, as host vectors.
struct Problem {
  int64_t E, H, I, K;
  std::vector<int64_t> tokens;  // per rank
  std::vector<std::vector<float>> w1, w3, w2;
  std::vector<std::vector<float>> x, wts;  // per rank
  std::vector<std::vector<int32_t>> ids;   // per rank

  Problem(int64_t e, int64_t k, std::vector<int64_t> per_rank, uint32_t seed)
      : E(e), H(16), I(8), K(k), tokens(std::move(per_rank)) {
    deepinfer::testing::Rng rng(seed);
    for (int64_t i = 0; i < E; ++i) {
      w1.push_back(rng.uniform(sz(I * H)));
      w3.push_back(rng.uniform(sz(I * H)));
      w2.push_back(rng.uniform(sz(H * I)));
    }
    for (int64_t T : tokens) {
      x.push_back(rng.uniform(sz(T * H), -2, 2));
      wts.push_back(rng.uniform(sz(T * K), 0.1f, 1.0f));
      std::vector<int32_t> id;
      for (int64_t t = 0; t < T; ++t) {
        // Skewed: the first choice is one of experts 0-1 (hot), the rest distinct others.
        std::vector<int32_t> chosen{static_cast<int32_t>(rng.range(0, 1))};
        while (static_cast<int64_t>(chosen.size()) < K) {
          const auto pick = static_cast<int32_t>(rng.range(0, static_cast<int>(E) - 1));
          if (std::find(chosen.begin(), chosen.end(), pick) == chosen.end()) chosen.push_back(pick);
        }
        id.insert(id.end(), chosen.begin(), chosen.end());
      }
      ids.push_back(id);
    }
  }

  ExpertWeights weights(Backend& be, const std::vector<int32_t>& logical_of_slot) const {
    ExpertWeights w;
    for (int32_t e : logical_of_slot) {
      w.w1.push_back(be.upload(Tensor::from_vector(w1[sz(e)], {I, H}), DType::kF32));
      w.w3.push_back(be.upload(Tensor::from_vector(w3[sz(e)], {I, H}), DType::kF32));
      w.w2.push_back(be.upload(Tensor::from_vector(w2[sz(e)], {H, I}), DType::kF32));
    }
    return w;
  }
  std::vector<int32_t> all_experts() const {
    std::vector<int32_t> v(sz(E));
    std::iota(v.begin(), v.end(), 0);
    return v;
  }
};

constexpr float kLimit = 2.0f;

// Rank r's reference on one backend: each (token, j) pair's expert output alone (k = 1, weight
// 1), combined in (token, j) order.
std::vector<float> per_pair_reference(Backend& be, const Problem& pb, int r) {
  const int64_t T = pb.tokens[sz(r)], H = pb.H, K = pb.K;
  std::vector<float> out(sz(T * H), 0.0f);
  if (T == 0) return out;
  const ExpertWeights ew = pb.weights(be, pb.all_experts());
  const Tensor x = be.upload(Tensor::from_vector(pb.x[sz(r)], {T, H}), DType::kF32);
  for (int64_t j = 0; j < K; ++j) {
    std::vector<int32_t> col;
    for (int64_t t = 0; t < T; ++t) col.push_back(pb.ids[sz(r)][sz(t * K + j)]);
    const Routing one{
        be.upload(Tensor::from_vector(col, {T, 1}), DType::kI32),
        be.upload(Tensor::from_vector(std::vector<float>(sz(T), 1.0f), {T, 1}), DType::kF32)};
    const auto y = deepinfer::testing::fetch_f32(be, be.moe_experts(x, one, ew, kLimit));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        out[sz(t * H + h)] += pb.wts[sz(r)][sz(t * K + j)] * y[sz(t * H + h)];
      }
    }
  }
  return out;
}

std::vector<float> fused_reference(Backend& be, const Problem& pb, int r) {
  const int64_t T = pb.tokens[sz(r)];
  if (T == 0) return {};
  const Routing routing{be.upload(Tensor::from_vector(pb.ids[sz(r)], {T, pb.K}), DType::kI32),
                        be.upload(Tensor::from_vector(pb.wts[sz(r)], {T, pb.K}), DType::kF32)};
  return deepinfer::testing::fetch_f32(
      be, be.moe_experts(be.upload(Tensor::from_vector(pb.x[sz(r)], {T, pb.H}), DType::kF32),
                         routing, pb.weights(be, pb.all_experts()), kLimit));
}

using CpuGroup = testing::CpuRankGroup;

// Runs ep_moe_experts on every rank; returns each rank's output (host) and error.
struct EpResult {
  std::vector<std::vector<float>> out;
  std::vector<std::string> errors;
  std::vector<std::vector<int64_t>> slot_counts;  // per rank: 1 + the pairs it sent to each slot
};
EpResult run_ep(const Problem& pb, const std::vector<ExpertPlacement>& placement_of_rank,
                int bad_slots_rank = -1) {
  const int n = static_cast<int>(pb.tokens.size());
  CpuGroup g(n);
  EpResult res;
  res.out.resize(sz(n));
  res.slot_counts.resize(sz(n));
  res.errors = run_ranks(g.comms, [&](Communicator& comm) {
    const int r = comm.rank();
    Backend& be = *g.backends[sz(r)];
    const ExpertPlacement& p = placement_of_rank[sz(r)];
    const auto& p2l = p.physical_to_logical();
    const int base = std::min(r, p.num_ranks() - 1);  // a placement for fewer ranks: the last's
    std::vector<int32_t> mine(p2l.begin() + base * p.slots_per_rank(),
                              p2l.begin() + (base + 1) * p.slots_per_rank());
    if (r == bad_slots_rank) mine.pop_back();
    const int64_t T = pb.tokens[sz(r)];
    const Routing routing{be.upload(Tensor::from_vector(pb.ids[sz(r)], {T, pb.K}), DType::kI32),
                          be.upload(Tensor::from_vector(pb.wts[sz(r)], {T, pb.K}), DType::kF32)};
    const Tensor x = be.upload(Tensor::from_vector(pb.x[sz(r)], {T, pb.H}), DType::kF32);
    // Ones first: the counts are added to what the vector holds (EPLB accumulates a step).
    std::vector<int64_t>& counts = res.slot_counts[sz(r)];
    counts.assign(sz(p.num_slots()), 1);
    const Tensor out =
        ep_moe_experts(comm, be, x, routing, p, pb.weights(be, mine), kLimit, &counts);
    res.out[sz(r)] = deepinfer::testing::fetch_f32(be, out);
  });
  return res;
}

ExpertPlacement placement_for(const Problem& pb, int n, int redundant) {
  if (redundant == 0) return ExpertPlacement::initial(static_cast<int>(pb.E), n, 0);
  std::vector<int64_t> loads(sz(pb.E), 1);
  loads[0] = 60;  // the routing's hot experts
  loads[1] = 40;
  return plan_placement(loads, n, redundant);
}

void expect_matches_references(const Problem& pb, const ExpertPlacement& p) {
  const int n = static_cast<int>(pb.tokens.size());
  const EpResult res = run_ep(pb, std::vector<ExpertPlacement>(sz(n), p));
  auto ref_be = make_cpu_backend(1);
  uint64_t first_key = 0;
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(res.errors[sz(r)], "");
    // The EPLB counts: this rank's pairs per global slot, keyed as the dispatch keys them.
    std::vector<int64_t> want_counts(sz(p.num_slots()), 1);
    for (int32_t s : p.map_to_slots(pb.ids[sz(r)], static_cast<int>(pb.K), first_key))
      ++want_counts[sz(s)];
    first_key += static_cast<uint64_t>(pb.tokens[sz(r)]);
    EXPECT_EQ(res.slot_counts[sz(r)], want_counts);
    const auto want = per_pair_reference(*ref_be, pb, r);
    ASSERT_EQ(res.out[sz(r)].size(), want.size());
    EXPECT_TRUE(deepinfer::testing::same_bits(res.out[sz(r)], want));
    // The fused op adds a token's experts in expert-id order, not (token, j) order: equal to
    // rounding only.
    const auto fused = fused_reference(*ref_be, pb, r);
    float scale = 0.0f;
    for (float v : fused) scale = std::max(scale, std::fabs(v));
    deepinfer::testing::expect_close(
        res.out[sz(r)], std::vector<double>(fused.begin(), fused.end()), 1e-6, 1e-6 * scale);
  }
}

TEST(ExpertParallel, MatchesSingleRankReferenceBitForBit) {
  for (int64_t E : {8, 16}) {
    for (int n : {1, 2, 4}) {
      for (int redundant : {0, 2}) {
        SCOPED_TRACE("E " + std::to_string(E) + " ranks " + std::to_string(n) + " redundant " +
                     std::to_string(redundant));
        std::vector<int64_t> tokens;
        for (int r = 0; r < n; ++r) tokens.push_back(5 + 3 * r);
        const Problem pb(E, 3, tokens, static_cast<uint32_t>(E * 10 + n));
        const ExpertPlacement p = placement_for(pb, n, redundant);
        if (redundant > 0) {
          ASSERT_GT(p.num_replicas(0), 1);
        }
        expect_matches_references(pb, p);
      }
    }
  }
}

TEST(ExpertParallel, RanksWithZeroTokens) {
  const Problem pb(8, 2, {6, 0, 3, 0}, 5);
  expect_matches_references(pb, placement_for(pb, 4, 1));
  const Problem none(8, 2, {0, 0}, 6);
  expect_matches_references(none, placement_for(none, 2, 0));
}

TEST(ExpertParallel, BadArgumentsFailOnEveryRank) {
  const ExpertPlacement p = ExpertPlacement(8, 2, {0, 1, 2, 3, 4, 5, 6, 7});
  const Problem two(8, 2, {4, 4}, 7);
  {
    const EpResult res = run_ep(two, {p, p}, /*bad_slots_rank=*/1);
    EXPECT_NE(res.errors[0].find("rank 1 passed invalid arguments"), std::string::npos)
        << res.errors[0];
    EXPECT_NE(res.errors[1].find("local holds 3/3/3"), std::string::npos) << res.errors[1];
  }
  {
    const ExpertPlacement q(8, 2, {4, 5, 6, 7, 0, 1, 2, 3});
    const EpResult res = run_ep(two, {p, q});
    for (const auto& e : res.errors) {
      EXPECT_NE(e.find("rank 1's expert placement differs"), std::string::npos) << e;
    }
  }
  {
    const Problem three(8, 2, {4, 4, 4}, 7);
    const EpResult res = run_ep(three, {p, p, p});  // a 2-rank placement in a 3-rank group
    for (const auto& e : res.errors) {
      EXPECT_NE(e.find("placement is for 2 ranks but the group has 3"), std::string::npos) << e;
    }
  }
}

}  // namespace
}  // namespace deepinfer::dist
