// The NCCL communicator (cuda/dist/nccl_communicator.cu) on real devices: every collective on one
// rank, then on 2 to 4 ranks of one process (one thread per rank) when the machine has the GPUs,
// through both factories (make_nccl_group, and make_nccl_rank as a multi-process launch would
// call it). Results are exact: the sums add small integers in f32. Skips without a GPU; without
// NCCL it skips too unless DEEPINFER_REQUIRE_NCCL is set (python -m pip install nvidia-nccl-cu13).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "device_backends.h"
#include "dist/communicator.h"
#include "dist/nccl_group.h"
#include "dist/nccl_loader.h"
#include "error_message.h"

namespace deepinfer {
namespace {

using backend_ops::device_required;
using backend_ops::shared_backend;
using Comms = std::vector<std::unique_ptr<dist::Communicator>>;

bool nccl_required() {
  const char* v = std::getenv("DEEPINFER_REQUIRE_NCCL");
  return v != nullptr && std::string(v) != "0";
}

// Runs fn(rank) on one thread per rank; a watchdog aborts every communicator when the ranks hang,
// so a broken collective fails the test instead of blocking the binary. Returns the errors.
std::vector<std::string> run_ranks(int n, Comms& comms, const std::function<void(int)>& fn,
                                   std::chrono::seconds timeout = std::chrono::seconds(120)) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::mutex mutex;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
      std::lock_guard lock(mutex);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mutex);
    if (!cv.wait_for(lock, timeout, [&] { return done == n; })) {
      ADD_FAILURE() << "ranks still running after the timeout: the group hangs";
      for (auto& c : comms) {
        if (c != nullptr) c->abort("watchdog");
      }
    }
  }
  for (auto& t : threads) t.join();
  return errors;
}

template <typename T>
std::vector<T> read(Backend& b, const Tensor& t) {
  Tensor host = b.to_host(t);
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

Tensor up_f32(Backend& b, const std::vector<float>& v, Shape shape) {
  return b.upload(Tensor::from_vector(v, std::move(shape)), DType::kF32);
}
Tensor up_i32(Backend& b, const std::vector<int32_t>& v, Shape shape) {
  return b.upload(Tensor::from_vector(v, std::move(shape)), DType::kI32);
}

std::vector<int64_t> i64_values(int r) {
  return {r + 1, -(r + 1), (int64_t{1} << r) | 0x100, std::numeric_limits<int64_t>::max() - r,
          std::numeric_limits<int64_t>::min() + r};
}
std::vector<uint64_t> u64_values(int r) {
  const auto u = static_cast<uint64_t>(r);
  return {u + 1, ~uint64_t{0} - u, (uint64_t{1} << r) | 0x100, (uint64_t{1} << 63) + u, u};
}

// The host all-reduce's expected result over ranks 0..n-1 holding values(r), folded in rank order
// with the interface's semantics.
template <typename T>
std::vector<T> fold(int n, std::vector<T> (*values)(int), dist::HostReduceOp op) {
  using U = std::make_unsigned_t<T>;
  std::vector<T> out = values(0);
  for (int r = 1; r < n; ++r) {
    const std::vector<T> x = values(r);
    for (size_t i = 0; i < out.size(); ++i) {
      switch (op) {
        case dist::HostReduceOp::kOr:
          out[i] = static_cast<T>(static_cast<U>(out[i]) | static_cast<U>(x[i]));
          break;
        case dist::HostReduceOp::kAnd:
          out[i] = static_cast<T>(static_cast<U>(out[i]) & static_cast<U>(x[i]));
          break;
        case dist::HostReduceOp::kSum:
          out[i] = static_cast<T>(static_cast<U>(out[i]) + static_cast<U>(x[i]));
          break;
        case dist::HostReduceOp::kMax:
          out[i] = std::max(out[i], x[i]);
          break;
      }
    }
  }
  return out;
}

// Rows rank p sends to rank q in all_to_all (zeros among them from 2 ranks on).
int64_t a2a_rows(int p, int q) {
  return (p + 2 * q + 1) % 3;
}

// Every collective on rank c.rank() of n, each result checked exactly.
void check_collectives(dist::Communicator& c, Backend& b) {
  const int n = c.size();
  const int r = c.rank();
  const int64_t tri = int64_t{n} * (n + 1) / 2;

  {  // all_reduce_sum: rank r holds (r + 1) * (i + 1)
    std::vector<float> v(15);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((r + 1) * (i + 1));
    Tensor t = up_f32(b, v, {3, 5});
    c.all_reduce_sum(t);
    const auto out = read<float>(b, t);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], static_cast<float>(tri * static_cast<int64_t>(i + 1)))
          << "all_reduce " << i;
    }
  }
  {  // all_gather (i32): rank r's rows hold r * 100 + i
    std::vector<int32_t> v(6);
    for (size_t i = 0; i < v.size(); ++i) v[i] = r * 100 + static_cast<int32_t>(i);
    Tensor out = b.empty({2 * n, 3}, DType::kI32);
    c.all_gather(up_i32(b, v, {2, 3}), out);
    const auto got = read<int32_t>(b, out);
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < 6; ++i) ASSERT_EQ(got[static_cast<size_t>(q * 6 + i)], q * 100 + i);
    }
  }
  {  // reduce_scatter_sum: rank q's input element i is (q + 1) * 1000 + i
    std::vector<float> v(static_cast<size_t>(n) * 8);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>((r + 1) * 1000 + static_cast<int>(i));
    Tensor out = b.empty({2, 4}, DType::kF32);
    c.reduce_scatter_sum(up_f32(b, v, {2 * n, 4}), out);
    const auto got = read<float>(b, out);
    for (int j = 0; j < 8; ++j) {
      const int64_t i = int64_t{r} * 8 + j;
      ASSERT_EQ(got[static_cast<size_t>(j)], static_cast<float>(1000 * tri + n * i)) << j;
    }
  }
  {  // all_to_all (i32, per-peer counts with zeros): row k for peer q holds r*1000 + q*100 + k*10
    std::vector<int64_t> send_rows;
    std::vector<int64_t> recv_rows;
    std::vector<int32_t> send;
    for (int q = 0; q < n; ++q) {
      send_rows.push_back(a2a_rows(r, q));
      recv_rows.push_back(a2a_rows(q, r));
      for (int64_t k = 0; k < send_rows.back(); ++k) {
        for (int col = 0; col < 4; ++col) {
          send.push_back(r * 1000 + q * 100 + static_cast<int32_t>(k) * 10 + col);
        }
      }
    }
    int64_t total_send = 0;
    int64_t total_recv = 0;
    for (int q = 0; q < n; ++q) total_send += send_rows[static_cast<size_t>(q)];
    for (int q = 0; q < n; ++q) total_recv += recv_rows[static_cast<size_t>(q)];
    Tensor send_t =
        total_send > 0 ? up_i32(b, send, {total_send, 4}) : b.empty({0, 4}, DType::kI32);
    Tensor recv_t = b.empty({total_recv, 4}, DType::kI32);
    c.all_to_all(send_t, send_rows, recv_t, recv_rows);
    const auto got = total_recv > 0 ? read<int32_t>(b, recv_t) : std::vector<int32_t>();
    size_t at = 0;
    for (int p = 0; p < n; ++p) {
      for (int64_t k = 0; k < recv_rows[static_cast<size_t>(p)]; ++k) {
        for (int col = 0; col < 4; ++col) {
          ASSERT_EQ(got[at++], p * 1000 + r * 100 + static_cast<int32_t>(k) * 10 + col)
              << "from " << p << " row " << k;
        }
      }
    }
  }
  {  // all_to_all (f32) where every count is zero
    const std::vector<int64_t> zeros(static_cast<size_t>(n), 0);
    c.all_to_all(b.empty({0, 8}, DType::kF32), zeros, b.empty({0, 8}, DType::kF32), zeros);
  }
  {  // broadcast from the last rank
    const int root = n - 1;
    std::vector<float> v(6);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r * 10 + static_cast<int>(i));
    Tensor t = up_f32(b, v, {6});
    c.broadcast(t, root);
    const auto got = read<float>(b, t);
    for (int i = 0; i < 6; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], static_cast<float>(root * 10 + i));
  }
  c.barrier();
  for (auto op : {dist::HostReduceOp::kOr, dist::HostReduceOp::kAnd, dist::HostReduceOp::kSum,
                  dist::HostReduceOp::kMax}) {
    const std::vector<int64_t> mine_i64 = i64_values(r);
    const std::vector<uint64_t> mine_u64 = u64_values(r);
    EXPECT_EQ(c.all_reduce_host(std::span<const int64_t>(mine_i64), op), fold(n, i64_values, op))
        << dist::host_reduce_op_name(op) << " i64";
    EXPECT_EQ(c.all_reduce_host(std::span<const uint64_t>(mine_u64), op), fold(n, u64_values, op))
        << dist::host_reduce_op_name(op) << " u64";
  }
  // A vote vector longer than the channel's first buffers: they grow.
  std::vector<uint64_t> many(300, static_cast<uint64_t>(r + 1));
  const auto sums = c.all_reduce_host(std::span<const uint64_t>(many), dist::HostReduceOp::kSum);
  EXPECT_EQ(sums, std::vector<uint64_t>(300, static_cast<uint64_t>(tri)));
  c.barrier();
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    gpu_ = shared_backend("cuda", &why);
    if (gpu_ == nullptr && device_required()) FAIL() << why;
    if (gpu_ == nullptr) GTEST_SKIP() << why;
    try {
      dist::nccl::api();
    } catch (const Error& e) {
      if (nccl_required()) FAIL() << e.what();
      GTEST_SKIP() << e.what();
    }
  }

  // n backends on devices 0..n-1 (device 0: the shared one); fewer GPUs skip the test.
  bool devices(int n) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    if (count < n) return false;
    ranks_.push_back(gpu_);
    for (int d = 1; d < n; ++d) {
      owned_.push_back(make_backend("cuda:" + std::to_string(d)));
      ranks_.push_back(owned_.back().get());
    }
    return true;
  }

  int max_ranks() const {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    return std::min(count, 4);
  }

  Backend* gpu_ = nullptr;
  std::vector<std::unique_ptr<Backend>> owned_;
  std::vector<Backend*> ranks_;
};

TEST_F(Nccl, OneRankEveryCollective) {
  Comms comms = dist::make_nccl_group({gpu_});
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_EQ(comms[0]->rank(), 0);
  EXPECT_EQ(comms[0]->size(), 1);
  check_collectives(*comms[0], *gpu_);
}

TEST_F(Nccl, OneRankThroughTheRankFactory) {
  auto comm = dist::make_nccl_rank(0, 1, dist::nccl_unique_id(), *gpu_);
  check_collectives(*comm, *gpu_);
}

TEST_F(Nccl, ArgumentErrorsNameTheCollectiveRankAndTensor) {
  Comms comms = dist::make_nccl_group({gpu_});
  dist::Communicator& c = *comms[0];
  const Tensor in = gpu_->zeros({2, 3}, DType::kF32);
  std::string m = testing::error_message([&] {
    c.all_gather(in, gpu_->zeros({3, 3}, DType::kF32));
  });
  EXPECT_NE(m.find("all_gather on rank 0: output is f32[3, 3] but must be f32[2, 3]"),
            std::string::npos)
      << m;
  m = testing::error_message([&] { c.all_reduce_sum(gpu_->zeros({4}, DType::kI32)); });
  EXPECT_NE(m.find("all_reduce_sum on rank 0: tensor is i32[4] but must be f32"), std::string::npos)
      << m;
  m = testing::error_message([&] { c.all_reduce_sum(Tensor::zeros({4}, DType::kF32)); });
  EXPECT_NE(m.find("all_reduce_sum on rank 0: tensor is f32[4] on cpu"), std::string::npos) << m;
  m = testing::error_message([&] { c.broadcast(in, 1); });
  EXPECT_NE(m.find("broadcast on rank 0: root 1 is not a rank"), std::string::npos) << m;
  const std::vector<int64_t> two = {1, 1};
  m = testing::error_message([&] { c.all_to_all(in, two, in, two); });
  EXPECT_NE(m.find("all_to_all on rank 0: send_rows has 2 counts for 1 ranks"), std::string::npos)
      << m;
  // The group is still usable after an argument error.
  c.barrier();
  auto cpu = make_cpu_backend(1);
  m = testing::error_message([&] { dist::make_nccl_group({cpu.get()}); });
  EXPECT_NE(m.find("needs a CUDA backend"), std::string::npos) << m;
}

TEST_F(Nccl, AbortMakesLaterCallsThrowNamingTheReason) {
  Comms comms = dist::make_nccl_group({gpu_});
  dist::Communicator& c = *comms[0];
  c.abort("the step threw");
  const Tensor t = gpu_->zeros({4}, DType::kF32);
  std::string m = testing::error_message([&] { c.all_reduce_sum(t); }, ErrorCode::kInternal);
  EXPECT_NE(
      m.find("all_reduce_sum on rank 0: the group was aborted: rank 0 aborted: the step threw"),
      std::string::npos)
      << m;
  const std::vector<uint64_t> v = {1};
  m = testing::error_message(
      [&] { c.all_reduce_host(std::span<const uint64_t>(v), dist::HostReduceOp::kOr); },
      ErrorCode::kInternal);
  EXPECT_NE(m.find("the step threw"), std::string::npos) << m;
  c.abort("again");  // stays aborted with the first reason
  m = testing::error_message([&] { c.barrier(); }, ErrorCode::kInternal);
  EXPECT_NE(m.find("the step threw"), std::string::npos) << m;
}

TEST_F(Nccl, ManyRanksInOneProcess) {
  const int n = max_ranks();
  if (n < 2 || !devices(n)) GTEST_SKIP() << "needs 2 or more GPUs, this machine has " << n;
  Comms comms = dist::make_nccl_group(ranks_);
  ASSERT_EQ(static_cast<int>(comms.size()), n);
  const auto errors = run_ranks(n, comms, [&](int r) {
    check_collectives(*comms[static_cast<size_t>(r)], *ranks_[static_cast<size_t>(r)]);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

TEST_F(Nccl, ManyRanksThroughTheRankFactory) {
  const int n = max_ranks();
  if (n < 2 || !devices(n)) GTEST_SKIP() << "needs 2 or more GPUs, this machine has " << n;
  const dist::NcclUniqueId id = dist::nccl_unique_id();
  Comms comms(static_cast<size_t>(n));
  const auto errors = run_ranks(n, comms, [&](int r) {
    const auto i = static_cast<size_t>(r);
    comms[i] = dist::make_nccl_rank(r, n, id, *ranks_[i]);
    check_collectives(*comms[i], *ranks_[i]);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

// A watchdog's abort from another thread ends a rank's wait in the host channel: after one vote
// together (the channel's connections are set up), rank 0 votes again and rank 1 never does.
TEST_F(Nccl, AbortFromAnotherThreadEndsAHostWait) {
  if (max_ranks() < 2 || !devices(2)) GTEST_SKIP() << "needs 2 GPUs";
  Comms comms = dist::make_nccl_group(ranks_);
  const auto warm = run_ranks(2, comms, [&](int r) {
    const std::vector<uint64_t> v = {1};
    comms[static_cast<size_t>(r)]->all_reduce_host(std::span<const uint64_t>(v),
                                                   dist::HostReduceOp::kSum);
  });
  ASSERT_EQ(warm, std::vector<std::string>(2));
  std::string error;
  std::thread voter([&] {
    try {
      const std::vector<uint64_t> v = {1};
      comms[0]->all_reduce_host(std::span<const uint64_t>(v), dist::HostReduceOp::kOr);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  comms[0]->abort("watchdog");
  voter.join();
  EXPECT_NE(
      error.find("all_reduce_host on rank 0: the group was aborted: rank 0 aborted: watchdog"),
      std::string::npos)
      << error;
  comms[1]->abort("test over");
}

}  // namespace
}  // namespace deepinfer
