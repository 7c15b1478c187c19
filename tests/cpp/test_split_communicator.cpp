// The split communicator (dist/split_communicator.h): host tensors and the host all-reduce go to
// the host communicator, device tensors to the device one; barrier and abort reach both.
//   HostTrafficStaysOnTheHostSide   CPU tensors and votes never touch the device communicator
//   AbortReachesBothSides           an abort makes either side's next collective throw
//   MismatchedRanksAreRefused       the two inner communicators must be the same rank
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "deepinfer/error.h"
#include "dist/inprocess_communicator.h"
#include "dist/split_communicator.h"
#include "rank_threads.h"

namespace deepinfer::dist {
namespace {

using testing::Comms;
using testing::run_ranks;

// Builds `n` split communicators over two in-process groups; `device_groups` keeps the device
// side's raw pointers so a test can look at it.
Comms split_group(int n, std::vector<Communicator*>& device_side) {
  Comms device = make_inprocess_group(n);
  Comms host = make_inprocess_group(n);
  Comms out;
  for (int r = 0; r < n; ++r) {
    device_side.push_back(device[static_cast<size_t>(r)].get());
    out.push_back(make_split_communicator(std::move(device[static_cast<size_t>(r)]),
                                          std::move(host[static_cast<size_t>(r)])));
  }
  return out;
}

TEST(SplitCommunicator, HostTrafficStaysOnTheHostSide) {
  std::vector<Communicator*> device_side;
  Comms comms = split_group(2, device_side);
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    Tensor t = Tensor::from_vector(std::vector<float>{1.0f + static_cast<float>(c.rank())}, {1});
    c.all_reduce_sum(t);
    EXPECT_EQ(t.data<float>()[0], 3.0f);
    const std::vector<uint64_t> vote = {static_cast<uint64_t>(c.rank())};
    EXPECT_EQ(c.all_reduce_host(vote, HostReduceOp::kSum)[0], 1u);
    c.barrier();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  // The device side took part in the barrier only: the same group is still in step, and a
  // host-side collective run on it now agrees on every rank.
  const auto after = run_ranks(comms, [&](Communicator& c) {
    const std::vector<uint64_t> one = {1};
    EXPECT_EQ(
        device_side[static_cast<size_t>(c.rank())]->all_reduce_host(one, HostReduceOp::kSum)[0],
        2u);
  });
  for (const auto& e : after) EXPECT_EQ(e, "");
}

TEST(SplitCommunicator, AbortReachesBothSides) {
  std::vector<Communicator*> device_side;
  Comms comms = split_group(2, device_side);
  comms[0]->abort("rank 0 stops");
  const std::vector<uint64_t> v = {1};
  EXPECT_THROW(device_side[1]->all_reduce_host(v, HostReduceOp::kSum), Error);
  EXPECT_THROW(comms[1]->all_reduce_host(v, HostReduceOp::kSum), Error);
}

TEST(SplitCommunicator, MismatchedRanksAreRefused) {
  Comms a = make_inprocess_group(2);
  Comms b = make_inprocess_group(2);
  EXPECT_THROW(make_split_communicator(std::move(a[0]), std::move(b[1])), Error);
}

}  // namespace
}  // namespace deepinfer::dist
