// The in-process communicator (dist/inprocess_communicator.h): N ranks as std::threads over CPU
// backends. Each test names the contract it protects:
//   AllReduceSumIsRankOrderedAndBitIdentical  sums in rank order, same bits on every rank and run
//   AllGatherConcatenatesInRankOrder          rank r's rows at [r R, (r+1) R), f32 and i32
//   ReduceScatterSumsEachRanksBlock           rank r gets the rank-ordered sum of block r
//   BroadcastCopiesTheRoot                    every rank ends with the root's tensor
//   AllToAllUnevenCountsWithZeros             grouped by destination, received in source order
//   HostAllReduceOps                          or/and/sum/max, signed and unsigned max differ
//   MismatchedShapesFailOnEveryRank           one rank's bad shape: every rank throws, naming it
//   MismatchedCountsAndCollectivesFail        all_to_all count disagreement, different calls
//   GroupStaysUsableAfterMismatch             an argument error does not poison the group
//   ThrowingRankAbortsTheOthers               abort(): the waiting ranks throw, no hang
//   DestroyedRankAbortsTheOthers              a communicator destroyed mid-run aborts the group
// Every multi-rank test runs under a watchdog that aborts the group after a timeout, so a hang
// fails the test instead of the suite.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "dist/inprocess_communicator.h"
#include "rank_threads.h"

namespace deepinfer::dist {
namespace {

using testing::Comms;
using testing::run_ranks;
using testing::same_bits;

using CpuGroup = testing::CpuRankGroup;

// Values whose float sum depends on the order: large and small magnitudes mixed per rank.
float value(int rank, int64_t i) {
  const float big = (i % 3 == 0) ? 1e8f : 1.0f;
  return ((rank + i) % 2 == 0 ? big : -big * 0.75f) + 0.1f * static_cast<float>(rank + 1) +
         1e-3f * static_cast<float>(i);
}

std::vector<float> rank_values(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(rank, i);
  return v;
}

// Uploads `v` and queues an op behind it, so the collective must wait for the stream.
Tensor on_stream(Backend& b, const std::vector<float>& v, const Shape& shape) {
  return b.scale(b.upload(Tensor::from_vector(v, shape), DType::kF32), 1.0f);
}

std::vector<float> host_floats(Backend& b, const Tensor& t) {
  const Tensor h = b.to_host(t);
  const float* p = h.data<float>();
  return {p, p + h.numel()};
}

// (ranks, staged): the in-process communicator, and the host-staged one over it (for ranks on
// devices; on CPU backends it waits for the stream and passes the tensors through).
class CommunicatorN : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  static int ranks() { return std::get<0>(GetParam()); }
  static bool staged() { return std::get<1>(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Ranks, CommunicatorN,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Bool()));

TEST_P(CommunicatorN, AllReduceSumIsRankOrderedAndBitIdentical) {
  const int n = ranks();
  const int64_t numel = 4 * 8;
  std::vector<float> expected = rank_values(0, numel);
  for (int r = 1; r < n; ++r) {
    const std::vector<float> x = rank_values(r, numel);
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += x[i];
  }
  for (int run = 0; run < 10; ++run) {
    CpuGroup g(n, staged());
    std::vector<std::vector<float>> results(static_cast<size_t>(n));
    const auto errors = run_ranks(g.comms, [&](Communicator& c) {
      Backend& b = g.backend(c);
      Tensor t = on_stream(b, rank_values(c.rank(), numel), {4, 8});
      c.all_reduce_sum(t);
      results[static_cast<size_t>(c.rank())] =
          host_floats(b, b.add(t, b.zeros({4, 8}, DType::kF32)));
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(errors[static_cast<size_t>(r)], "");
      EXPECT_TRUE(same_bits(results[static_cast<size_t>(r)], expected)) << "rank " << r;
    }
  }
}

TEST_P(CommunicatorN, AllGatherConcatenatesInRankOrder) {
  const int n = ranks();
  CpuGroup g(n, staged());
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    Backend& b = g.backend(c);
    const std::vector<float> mine = rank_values(c.rank(), 6);
    Tensor out = b.zeros({3 * n, 2}, DType::kF32);
    c.all_gather(on_stream(b, mine, {3, 2}), out);
    std::vector<float> want;
    for (int r = 0; r < n; ++r) {
      const auto v = rank_values(r, 6);
      want.insert(want.end(), v.begin(), v.end());
    }
    EXPECT_TRUE(same_bits(host_floats(b, out), want)) << "rank " << c.rank();
    // i32 data movement: each rank gathers its rank id.
    Tensor ids =
        b.upload(Tensor::from_vector(std::vector<int32_t>{c.rank() * 10}, {1}), DType::kI32);
    Tensor all = b.zeros({n}, DType::kI32);
    c.all_gather(ids, all);
    const Tensor h = b.to_host(all);
    for (int r = 0; r < n; ++r) EXPECT_EQ(h.data<int32_t>()[r], r * 10);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST_P(CommunicatorN, ReduceScatterSumsEachRanksBlock) {
  const int n = ranks();
  const int64_t block = 5;
  std::vector<float> total = rank_values(0, block * n);
  for (int r = 1; r < n; ++r) {
    const auto x = rank_values(r, block * n);
    for (size_t i = 0; i < total.size(); ++i) total[i] += x[i];
  }
  CpuGroup g(n, staged());
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    Backend& b = g.backend(c);
    Tensor out = b.zeros({block}, DType::kF32);
    c.reduce_scatter_sum(on_stream(b, rank_values(c.rank(), block * n), {block * n}), out);
    const std::vector<float> want(total.begin() + block * c.rank(),
                                  total.begin() + block * (c.rank() + 1));
    EXPECT_TRUE(same_bits(host_floats(b, out), want)) << "rank " << c.rank();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST_P(CommunicatorN, BroadcastCopiesTheRoot) {
  const int n = ranks();
  CpuGroup g(n, staged());
  const int root = n - 1;
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    Backend& b = g.backend(c);
    Tensor t = on_stream(b, rank_values(c.rank(), 12), {3, 4});
    c.broadcast(t, root);
    EXPECT_TRUE(same_bits(host_floats(b, t), rank_values(root, 12))) << "rank " << c.rank();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST_P(CommunicatorN, AllToAllUnevenCountsWithZeros) {
  const int n = ranks();
  // Rank s sends (s + d) % 3 rows to rank d (zero rows for some pairs); row values encode
  // (source, destination, index) so the test sees where each row went.
  auto count = [](int s, int d) { return static_cast<int64_t>((s + d) % 3); };
  auto row_value = [](int s, int d, int64_t i) { return 100.0f * s + 10.0f * d + i; };
  const int64_t width = 2;
  CpuGroup g(n, staged());
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    Backend& b = g.backend(c);
    const int me = c.rank();
    std::vector<int64_t> send_rows, recv_rows;
    std::vector<float> send;
    for (int d = 0; d < n; ++d) {
      send_rows.push_back(count(me, d));
      recv_rows.push_back(count(d, me));
      for (int64_t i = 0; i < count(me, d); ++i) {
        for (int64_t w = 0; w < width; ++w) send.push_back(row_value(me, d, i) + 0.5f * w);
      }
    }
    int64_t total_recv = 0;
    std::vector<float> want;
    for (int s = 0; s < n; ++s) {
      total_recv += count(s, me);
      for (int64_t i = 0; i < count(s, me); ++i) {
        for (int64_t w = 0; w < width; ++w) want.push_back(row_value(s, me, i) + 0.5f * w);
      }
    }
    const auto send_count = static_cast<int64_t>(send.size()) / width;
    Tensor send_t =
        send_count > 0 ? on_stream(b, send, {send_count, width}) : b.zeros({0, width}, DType::kF32);
    Tensor recv_t = b.zeros({total_recv, width}, DType::kF32);
    c.all_to_all(send_t, send_rows, recv_t, recv_rows);
    EXPECT_TRUE(same_bits(host_floats(b, recv_t), want)) << "rank " << me;
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST_P(CommunicatorN, HostAllReduceOps) {
  const int n = ranks();
  Comms comms = make_inprocess_group(n);
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    const int r = c.rank();
    const std::vector<uint64_t> bits{1ull << r, r == 0 ? ~0ull : ~(1ull << r)};
    const auto ors = c.all_reduce_host(std::span<const uint64_t>(bits), HostReduceOp::kOr);
    const auto ands = c.all_reduce_host(std::span<const uint64_t>(bits), HostReduceOp::kAnd);
    uint64_t all_bits = 0, and_bits = ~0ull;
    for (int q = 0; q < n; ++q) {
      all_bits |= 1ull << q;
      and_bits &= q == 0 ? ~0ull : ~(1ull << q);
    }
    EXPECT_EQ(ors[0], all_bits);
    EXPECT_EQ(ands[1], and_bits);
    // Signed vs unsigned max: -1 (i64) is the smallest, ~0 (u64) the largest.
    const std::vector<int64_t> s{r == 0 ? -1 : r, 5 * r};
    const auto smax = c.all_reduce_host(std::span<const int64_t>(s), HostReduceOp::kMax);
    const auto ssum = c.all_reduce_host(std::span<const int64_t>(s), HostReduceOp::kSum);
    EXPECT_EQ(smax[0], n == 1 ? -1 : n - 1);
    EXPECT_EQ(ssum[1], 5 * n * (n - 1) / 2);
    const std::vector<uint64_t> u{r == 0 ? ~0ull : static_cast<uint64_t>(r)};
    EXPECT_EQ(c.all_reduce_host(std::span<const uint64_t>(u), HostReduceOp::kMax)[0], ~0ull);
    c.barrier();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Communicator, MismatchedShapesFailOnEveryRank) {
  CpuGroup g(4);
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    Backend& b = g.backend(c);
    c.all_reduce_sum(b.zeros({4, c.rank() == 2 ? 9 : 8}, DType::kF32));
  });
  for (int r = 0; r < 4; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    EXPECT_NE(e.find("all_reduce_sum on rank " + std::to_string(r) + ": "), std::string::npos) << e;
    EXPECT_NE(e.find("rank 2 passed f32[4, 9] but rank 0 passed f32[4, 8]"), std::string::npos)
        << e;
  }
}

TEST(Communicator, MismatchedCountsAndCollectivesFail) {
  {
    CpuGroup g(2);
    // Rank 0 sends one row to rank 1; rank 1 expects two.
    const auto errors = run_ranks(g.comms, [&](Communicator& c) {
      Backend& b = g.backend(c);
      const std::vector<int64_t> send{0, c.rank() == 0 ? 1 : 0};
      const std::vector<int64_t> recv{c.rank() == 1 ? 2 : 0, 0};
      c.all_to_all(b.zeros({send[1], 3}, DType::kF32), send, b.zeros({recv[0], 3}, DType::kF32),
                   recv);
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(errors[static_cast<size_t>(r)].find(
                    "all_to_all on rank " + std::to_string(r) +
                    ": rank 0 sends 1 rows to rank 1 but rank 1 expects 2"),
                std::string::npos)
          << errors[static_cast<size_t>(r)];
    }
  }
  {
    CpuGroup g(2);
    const auto errors = run_ranks(g.comms, [&](Communicator& c) {
      if (c.rank() == 1) {
        c.broadcast(g.backend(c).zeros({2}, DType::kF32), 0);
      } else {
        c.barrier();
      }
    });
    EXPECT_NE(
        errors[0].find("barrier on rank 0: rank 1 called broadcast while rank 0 called barrier"),
        std::string::npos)
        << errors[0];
    EXPECT_NE(errors[1].find("broadcast on rank 1: rank 1 called broadcast"), std::string::npos)
        << errors[1];
  }
  {
    // A local argument error (wrong count vector length) reaches every rank too.
    CpuGroup g(2);
    const auto errors = run_ranks(g.comms, [&](Communicator& c) {
      Backend& b = g.backend(c);
      const std::vector<int64_t> zeros(c.rank() == 1 ? 3 : 2, 0);
      c.all_to_all(b.zeros({0, 1}, DType::kF32), zeros, b.zeros({0, 1}, DType::kF32), zeros);
    });
    for (const auto& e : errors) {
      EXPECT_NE(e.find("rank 1: send_rows has 3 counts for 2 ranks"), std::string::npos) << e;
    }
  }
}

TEST(Communicator, GroupStaysUsableAfterMismatch) {
  CpuGroup g(2);
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    Backend& b = g.backend(c);
    const std::vector<int64_t> len{c.rank() == 0 ? 1 : 2};
    EXPECT_THROW(c.all_reduce_host(
                     std::span<const int64_t>(std::vector<int64_t>(static_cast<size_t>(len[0]), 1)),
                     HostReduceOp::kSum),
                 Error);
    Tensor t = on_stream(b, {1.0f, 2.0f}, {2});
    c.all_reduce_sum(t);
    EXPECT_TRUE(same_bits(host_floats(b, t), {2.0f, 4.0f}));
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Communicator, ThrowingRankAbortsTheOthers) {
  CpuGroup g(4);
  const auto errors = run_ranks(
      g.comms,
      [&](Communicator& c) {
        Backend& b = g.backend(c);
        Tensor t = b.zeros({2}, DType::kF32);
        c.all_reduce_sum(t);  // one good collective first
        if (c.rank() == 3) {
          try {
            throw Error(ErrorCode::kIo, "the step of rank 3 failed");
          } catch (const Error& e) {
            c.abort(e.what());
            throw;
          }
        }
        c.all_reduce_sum(t);
      },
      std::chrono::seconds(20));
  EXPECT_EQ(errors[3], "the step of rank 3 failed");
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("all_reduce_sum on rank " + std::to_string(r) +
                                                  ": the group was aborted: rank 3 aborted: "
                                                  "the step of rank 3 failed"),
              std::string::npos)
        << errors[static_cast<size_t>(r)];
  }
  // An aborted group stays aborted.
  EXPECT_THROW(g.comms[0]->barrier(), Error);
}

TEST(Communicator, DestroyedRankAbortsTheOthers) {
  Comms comms = make_inprocess_group(3);
  std::unique_ptr<Communicator> leaver = std::move(comms[2]);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        comms[static_cast<size_t>(r)]->barrier();
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  leaver.reset();  // rank 2 never arrives
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    EXPECT_NE(e.find("the group was aborted: rank 2 left the group"), std::string::npos) << e;
  }
}

TEST(Communicator, GroupArguments) {
  EXPECT_THROW(make_inprocess_group(0), Error);
  Comms one = make_inprocess_group(1);
  EXPECT_EQ(one[0]->size(), 1);
  EXPECT_EQ(one[0]->rank(), 0);
  Tensor t = Tensor::from_vector(std::vector<float>{1.5f}, {1});
  one[0]->all_reduce_sum(t);
  EXPECT_EQ(t.data<float>()[0], 1.5f);
}

}  // namespace
}  // namespace deepinfer::dist
