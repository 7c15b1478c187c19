// The TCP communicator (dist/tcp_communicator.h) with its ranks as threads of this process over
// loopback, and the byte collectives (dist/byte_collectives.h) over it and over the in-process
// communicator. Each test names the contract it protects:
//   AllReduceSumIsRankOrderedAndBitIdentical  the in-process communicator's sum order and bits
//   AllGatherConcatenatesInRankOrder          rank r's rows at [r R, (r+1) R), f32 and i32
//   ReduceScatterSumsEachRanksBlock           rank r gets the rank-ordered sum of block r
//   BroadcastCopiesTheRoot                    every rank ends with the root's tensor
//   AllToAllUnevenCountsWithZeros             grouped by destination, received in source order
//   HostAllReduceOps                          or/and/sum/max, signed and unsigned max differ
//   ByteCollectivesN.OverTcp / .InProcess     broadcast_bytes, gather_bytes, empty payloads
//   MismatchFailsOnEveryRankAndGroupStaysUsable  the in-process messages, then a good collective
//   AbortOnOneRankReachesTheOthers            abort() on rank 3 or rank 0: the others throw it
//   DestroyedRankDisconnects                  a destroyed rank reads as "rank R disconnected"
//   SetupErrors                               nobody listening, nobody connecting, a duplicate
//   ASilentConnectionDoesNotHoldUpTheSetup    a stray connection is dropped, the rank joins
// Every multi-rank test runs under run_ranks' watchdog, so a hang fails instead of blocking.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/unique_fd.h"
#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "dist/byte_collectives.h"
#include "dist/inprocess_communicator.h"
#include "dist/tcp_communicator.h"
#include "rank_threads.h"

namespace deepinfer::dist {
namespace {

using namespace std::chrono_literals;
using testing::Comms;
using testing::run_ranks;
using testing::same_bits;

constexpr const char* kLoopback = "127.0.0.1";

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

// N TCP ranks over loopback, set up concurrently (rank 0 waits for the others), each over its own
// one-thread CPU backend or without a backend (plain host tensors).
struct TcpGroup {
  std::vector<std::unique_ptr<Backend>> backends;
  Comms comms;

  TcpGroup(int n, bool with_backend) {
    for (int r = 0; r < n && with_backend; ++r) backends.push_back(make_cpu_backend(1));
    TcpListener listener(kLoopback, 0);
    const int port = listener.port();
    comms.resize(static_cast<size_t>(n));
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          comms[static_cast<size_t>(r)] =
              r == 0 ? make_tcp_rank0(std::move(listener), n, backend(r), 10s)
                     : make_tcp_rank(r, n, kLoopback, port, backend(r), 10s);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& e : errors) {
      if (!e.empty()) throw Error(ErrorCode::kInternal, "TcpGroup setup: " + e);
    }
  }
  Backend* backend(int r) {
    return backends.empty() ? nullptr : backends[static_cast<size_t>(r)].get();
  }

  // A tensor of the rank: on its backend behind a queued op (so the collective must wait for the
  // stream), or a plain host tensor.
  Tensor make(const Communicator& c, const std::vector<float>& v, const Shape& shape) {
    Backend* b = backend(c.rank());
    if (b == nullptr) return Tensor::from_vector(v, shape);
    return b->scale(b->upload(Tensor::from_vector(v, shape), DType::kF32), 1.0f);
  }
  Tensor zeros(const Communicator& c, const Shape& shape, DType dtype) {
    Backend* b = backend(c.rank());
    return b == nullptr ? Tensor::zeros(shape, dtype) : b->zeros(shape, dtype);
  }
  std::vector<float> floats(const Communicator& c, const Tensor& t) {
    Backend* b = backend(c.rank());
    const Tensor h = b == nullptr ? t : b->to_host(t);
    return {h.data<float>(), h.data<float>() + h.numel()};
  }
};

class TcpCommunicatorN : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  static int ranks() { return std::get<0>(GetParam()); }
  static bool with_backend() { return std::get<1>(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Ranks, TcpCommunicatorN,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Bool()));

TEST_P(TcpCommunicatorN, AllReduceSumIsRankOrderedAndBitIdentical) {
  const int n = ranks();
  const int64_t numel = 4 * 8;
  std::vector<float> expected = rank_values(0, numel);
  for (int r = 1; r < n; ++r) {
    const std::vector<float> x = rank_values(r, numel);
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += x[i];
  }
  TcpGroup g(n, with_backend());
  for (int run = 0; run < 5; ++run) {
    std::vector<std::vector<float>> results(static_cast<size_t>(n));
    const auto errors = run_ranks(g.comms, [&](Communicator& c) {
      Tensor t = g.make(c, rank_values(c.rank(), numel), {4, 8});
      c.all_reduce_sum(t);
      results[static_cast<size_t>(c.rank())] = g.floats(c, t);
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(errors[static_cast<size_t>(r)], "");
      EXPECT_TRUE(same_bits(results[static_cast<size_t>(r)], expected)) << "rank " << r;
    }
  }
}

TEST_P(TcpCommunicatorN, AllGatherConcatenatesInRankOrder) {
  const int n = ranks();
  TcpGroup g(n, with_backend());
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    Tensor out = g.zeros(c, {3 * n, 2}, DType::kF32);
    c.all_gather(g.make(c, rank_values(c.rank(), 6), {3, 2}), out);
    std::vector<float> want;
    for (int r = 0; r < n; ++r) {
      const auto v = rank_values(r, 6);
      want.insert(want.end(), v.begin(), v.end());
    }
    EXPECT_TRUE(same_bits(g.floats(c, out), want)) << "rank " << c.rank();
    // i32 data movement: each rank gathers its rank id.
    Tensor ids = Tensor::from_vector(std::vector<int32_t>{c.rank() * 10}, {1});
    if (Backend* b = g.backend(c.rank())) ids = b->upload(ids, DType::kI32);
    Tensor all = g.zeros(c, {n}, DType::kI32);
    c.all_gather(ids, all);
    Backend* b = g.backend(c.rank());
    const Tensor h = b == nullptr ? all : b->to_host(all);
    for (int r = 0; r < n; ++r) EXPECT_EQ(h.data<int32_t>()[r], r * 10);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST_P(TcpCommunicatorN, ReduceScatterSumsEachRanksBlock) {
  const int n = ranks();
  const int64_t block = 5;
  std::vector<float> total = rank_values(0, block * n);
  for (int r = 1; r < n; ++r) {
    const auto x = rank_values(r, block * n);
    for (size_t i = 0; i < total.size(); ++i) total[i] += x[i];
  }
  TcpGroup g(n, with_backend());
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    Tensor out = g.zeros(c, {block}, DType::kF32);
    c.reduce_scatter_sum(g.make(c, rank_values(c.rank(), block * n), {block * n}), out);
    const std::vector<float> want(total.begin() + block * c.rank(),
                                  total.begin() + block * (c.rank() + 1));
    EXPECT_TRUE(same_bits(g.floats(c, out), want)) << "rank " << c.rank();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST_P(TcpCommunicatorN, BroadcastCopiesTheRoot) {
  const int n = ranks();
  TcpGroup g(n, with_backend());
  const int root = n - 1;
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    Tensor t = g.make(c, rank_values(c.rank(), 12), {3, 4});
    c.broadcast(t, root);
    EXPECT_TRUE(same_bits(g.floats(c, t), rank_values(root, 12))) << "rank " << c.rank();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST_P(TcpCommunicatorN, AllToAllUnevenCountsWithZeros) {
  const int n = ranks();
  // Rank s sends (s + d) % 3 rows to rank d (zero rows for some pairs); row values encode
  // (source, destination, index) so the test sees where each row went.
  auto count = [](int s, int d) { return static_cast<int64_t>((s + d) % 3); };
  auto row_value = [](int s, int d, int64_t i) {
    return 100.0f * static_cast<float>(s) + 10.0f * static_cast<float>(d) + static_cast<float>(i);
  };
  const int64_t width = 2;
  TcpGroup g(n, with_backend());
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    const int me = c.rank();
    std::vector<int64_t> send_rows, recv_rows;
    std::vector<float> send;
    for (int d = 0; d < n; ++d) {
      send_rows.push_back(count(me, d));
      recv_rows.push_back(count(d, me));
      for (int64_t i = 0; i < count(me, d); ++i) {
        for (int64_t w = 0; w < width; ++w) {
          send.push_back(row_value(me, d, i) + 0.5f * static_cast<float>(w));
        }
      }
    }
    int64_t total_recv = 0;
    std::vector<float> want;
    for (int s = 0; s < n; ++s) {
      total_recv += count(s, me);
      for (int64_t i = 0; i < count(s, me); ++i) {
        for (int64_t w = 0; w < width; ++w) {
          want.push_back(row_value(s, me, i) + 0.5f * static_cast<float>(w));
        }
      }
    }
    const auto send_count = static_cast<int64_t>(send.size()) / width;
    Tensor send_t =
        send_count > 0 ? g.make(c, send, {send_count, width}) : g.zeros(c, {0, width}, DType::kF32);
    Tensor recv_t = g.zeros(c, {total_recv, width}, DType::kF32);
    c.all_to_all(send_t, send_rows, recv_t, recv_rows);
    EXPECT_TRUE(same_bits(g.floats(c, recv_t), want)) << "rank " << me;
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST_P(TcpCommunicatorN, HostAllReduceOps) {
  const int n = ranks();
  TcpGroup g(n, with_backend());
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
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
    EXPECT_TRUE(c.all_reduce_host(std::span<const int64_t>(), HostReduceOp::kSum).empty());
    c.barrier();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

std::vector<uint8_t> pattern(int rank, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(rank * 37 + static_cast<int>(i) * 11);
  return v;
}

// broadcast_bytes and gather_bytes over `comms`: lengths that are not whole words, zero, and
// differing between ranks.
void check_byte_collectives(Comms& comms) {
  const int n = static_cast<int>(comms.size());
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    const int root = n - 1;
    for (size_t len : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}}) {
      const std::vector<uint8_t> got =
          broadcast_bytes(c, c.rank() == root ? pattern(root, len) : std::vector<uint8_t>{}, root);
      EXPECT_EQ(got, pattern(root, len)) << "rank " << c.rank() << ", " << len << " bytes";
    }
    // Rank r contributes 3 r bytes: rank 0's is empty.
    const auto all = gather_bytes(c, pattern(c.rank(), static_cast<size_t>(3 * c.rank())));
    ASSERT_EQ(static_cast<int>(all.size()), n);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(all[static_cast<size_t>(r)], pattern(r, static_cast<size_t>(3 * r)))
          << "rank " << c.rank() << " from " << r;
    }
    const auto none = gather_bytes(c, {});
    ASSERT_EQ(static_cast<int>(none.size()), n);
    for (const auto& b : none) EXPECT_TRUE(b.empty());
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

class ByteCollectivesN : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Ranks, ByteCollectivesN, ::testing::Values(1, 2, 4));

// Over TCP with backend null: the byte collectives use plain host tensors.
TEST_P(ByteCollectivesN, OverTcp) {
  TcpGroup g(GetParam(), false);
  check_byte_collectives(g.comms);
}

TEST_P(ByteCollectivesN, InProcess) {
  Comms comms = make_inprocess_group(GetParam());
  check_byte_collectives(comms);
}

TEST(TcpCommunicator, MismatchFailsOnEveryRankAndGroupStaysUsable) {
  TcpGroup g(4, true);
  const auto errors = run_ranks(g.comms, [&](Communicator& c) {
    try {
      c.all_reduce_sum(g.zeros(c, {4, c.rank() == 2 ? 9 : 8}, DType::kF32));
      ADD_FAILURE() << "rank " << c.rank() << ": the mismatch did not throw";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << m;
      EXPECT_NE(m.find("all_reduce_sum on rank " + std::to_string(c.rank()) + ": "),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("rank 2 passed f32[4, 9] but rank 0 passed f32[4, 8]"), std::string::npos)
          << m;
    }
    // A different collective on one rank, and an all_to_all count disagreement.
    try {
      if (c.rank() == 1) {
        c.broadcast(g.zeros(c, {2}, DType::kF32), 0);
      } else {
        c.barrier();
      }
      ADD_FAILURE() << "rank " << c.rank() << ": the collective mismatch did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 called broadcast while rank 0 called barrier"),
                std::string::npos)
          << e.what();
    }
    {
      std::vector<int64_t> send(4, 0), recv(4, 0);
      if (c.rank() == 0) send[1] = 1;
      if (c.rank() == 1) recv[0] = 2;
      EXPECT_THROW(c.all_to_all(g.zeros(c, {c.rank() == 0 ? 1 : 0, 3}, DType::kF32), send,
                                g.zeros(c, {c.rank() == 1 ? 2 : 0, 3}, DType::kF32), recv),
                   Error);
    }
    // The group is still usable.
    Tensor t = g.make(c, {1.0f, 2.0f}, {2});
    c.all_reduce_sum(t);
    EXPECT_TRUE(same_bits(g.floats(c, t), {4.0f, 8.0f})) << "rank " << c.rank();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TcpCommunicator, AbortOnOneRankReachesTheOthers) {
  for (int aborter : {3, 0}) {
    TcpGroup g(4, false);
    const auto errors = run_ranks(
        g.comms,
        [&](Communicator& c) {
          Tensor t = Tensor::zeros({2}, DType::kF32);
          c.all_reduce_sum(t);  // one good collective first
          if (c.rank() == aborter) {
            c.abort("the step of rank " + std::to_string(aborter) + " failed");
            throw Error(ErrorCode::kIo, "gave up");
          }
          c.all_reduce_sum(t);
        },
        20s);
    const std::string reason = "the group was aborted: rank " + std::to_string(aborter) +
                               " aborted: the step of rank " + std::to_string(aborter) + " failed";
    for (int r = 0; r < 4; ++r) {
      const std::string& e = errors[static_cast<size_t>(r)];
      if (r == aborter) {
        EXPECT_EQ(e, "gave up");
      } else {
        EXPECT_NE(e.find("all_reduce_sum on rank " + std::to_string(r) + ": " + reason),
                  std::string::npos)
            << e;
      }
    }
    // An aborted group stays aborted, on every rank.
    for (auto& c : g.comms) {
      try {
        c->barrier();
        ADD_FAILURE() << "rank " << c->rank() << ": barrier after the abort did not throw";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInternal);
        EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
      }
    }
  }
}

TEST(TcpCommunicator, DestroyedRankDisconnects) {
  for (int leaver_rank : {2, 0}) {
    TcpGroup g(3, false);
    std::unique_ptr<Communicator> leaver = std::move(g.comms[static_cast<size_t>(leaver_rank)]);
    std::vector<std::string> errors(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      if (r == leaver_rank) continue;
      threads.emplace_back([&, r] {
        try {
          g.comms[static_cast<size_t>(r)]->barrier();
        } catch (const Error& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    std::this_thread::sleep_for(50ms);
    leaver.reset();  // the rank never arrives and its sockets close
    for (auto& t : threads) t.join();
    for (int r = 0; r < 3; ++r) {
      if (r == leaver_rank) continue;
      const std::string& e = errors[static_cast<size_t>(r)];
      EXPECT_NE(e.find("barrier on rank " + std::to_string(r) + ": the group was aborted: rank " +
                       std::to_string(leaver_rank) + " disconnected"),
                std::string::npos)
          << e;
    }
  }
}

TEST(TcpCommunicator, SetupErrors) {
  // Nobody listens on a port that was free a moment ago: the connect fails within the timeout,
  // naming the rank and the address.
  int port = 0;
  {
    TcpListener probe(kLoopback, 0);
    port = probe.port();
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    make_tcp_rank(1, 2, kLoopback, port, nullptr, 1s);
    ADD_FAILURE() << "connecting to a closed port succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("rank 1 could not connect to rank 0 at 127.0.0.1:" +
                                         std::to_string(port)),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);

  // Rank 0 waits in vain: it names the ranks that did not come.
  try {
    make_tcp_rank0(TcpListener(kLoopback, 0), 3, nullptr, 1s);
    ADD_FAILURE() << "rank 0 formed a group nobody joined";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 did not connect within 1 s"),
              std::string::npos)
        << e.what();
  }

  // Two processes claim rank 1 (or one claims the wrong group size): every party fails, naming it.
  for (bool duplicate : {true, false}) {
    TcpListener listener(kLoopback, 0);
    const int p = listener.port();
    std::vector<std::string> errors(3);
    std::vector<std::thread> threads;
    threads.emplace_back([&] {
      try {
        make_tcp_rank0(std::move(listener), 3, nullptr, 10s);
      } catch (const Error& e) {
        errors[0] = e.what();
      }
    });
    for (int i = 1; i < 3; ++i) {
      threads.emplace_back([&, i] {
        // Stagger the two so that the first is the one accepted.
        std::this_thread::sleep_for(std::chrono::milliseconds(100 * (i - 1)));
        try {
          if (duplicate || i == 1) {
            make_tcp_rank(1, 3, kLoopback, p, nullptr, 10s);
          } else {
            make_tcp_rank(2, 4, kLoopback, p, nullptr, 10s);
          }
        } catch (const Error& e) {
          errors[static_cast<size_t>(i)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    const std::string want =
        duplicate ? "rank 1 connected twice" : "rank 2 joined a group of 4 ranks but rank 0's";
    for (const auto& e : errors) EXPECT_NE(e.find(want), std::string::npos) << e;
  }
}

// A connection that never says hello (a port scan, a health check) is dropped after a few
// seconds; the real rank, connecting behind it, still joins well within the setup timeout.
TEST(TcpCommunicator, ASilentConnectionDoesNotHoldUpTheSetup) {
  TcpListener listener(kLoopback, 0);
  const int port = listener.port();
  // Connects before any rank and sends nothing.
  UniqueFd stray(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(stray.valid());
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::inet_pton(AF_INET, kLoopback, &to.sin_addr), 1);
  ASSERT_EQ(::connect(stray.get(), reinterpret_cast<const sockaddr*>(&to), sizeof(to)), 0);
  std::string error;
  std::thread rank1([&] {
    try {
      make_tcp_rank(1, 2, kLoopback, port, nullptr, 30s);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Communicator> rank0;
  EXPECT_NO_THROW(rank0 = make_tcp_rank0(std::move(listener), 2, nullptr, 30s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  rank1.join();
  EXPECT_EQ(error, "");
}

}  // namespace
}  // namespace deepinfer::dist
