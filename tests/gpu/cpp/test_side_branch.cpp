// Side branches on the CUDA backend (Backend::begin_branch; the second stream of
// cuda/backend/cuda_backend.cu): ops in a branch run alongside those enqueued after it until the
// join, so their results must be the bits of the same ops run in order, eagerly and as a graph;
// a tensor that dies before the join keeps its memory until then; an error inside a branch leaves
// the backend usable. Skips without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

class SideBranchTest : public CudaTest {
 protected:
  Tensor f32(const Shape& shape, float scale = 1.0f) {
    return gpu().upload(random_f32(rng_, shape, scale), DType::kF32);
  }

  std::mt19937 rng_{20261205};
};

// Dependent ops whose temporaries die along the way: f32 linears (cuBLAS, each stream with its
// own workspace), norms and adds.
Tensor chain(Backend& b, const Tensor& x, const Tensor& w, const Tensor& norm, int links) {
  Tensor h = x;
  for (int i = 0; i < links; ++i) {
    h = b.add(b.rms_norm(b.linear(b.scale(h, 0.5f + 0.1f * i), w), norm, 1e-6f), x);
  }
  return h;
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_EQ(got.item(i), want.item(i)) << what << ", element " << i;
}

TEST_F(SideBranchTest, TwoChainsGiveTheBitsOfTheOpsInOrder) {
  const Tensor x = f32({8, 512});
  const Tensor w = f32({512, 512}, 0.05f);
  const Tensor norm = f32({512});
  const Tensor want_side = gpu().to_host(chain(gpu(), x, w, norm, 12));
  const Tensor want_main = gpu().to_host(chain(gpu(), gpu().scale(x, -1.0f), w, norm, 7));
  for (int round = 0; round < 3; ++round) {
    Tensor side;
    {
      SideBranch branch(gpu());
      side = chain(gpu(), x, w, norm, 12);
    }
    const Tensor main = chain(gpu(), gpu().scale(x, -1.0f), w, norm, 7);
    gpu().join_branches();
    expect_same(gpu().to_host(side), want_side, "side, round " + std::to_string(round));
    expect_same(gpu().to_host(main), want_main, "main, round " + std::to_string(round));
  }
}

// to_host waits for all work enqueued so far, the side branch's included (it joins first).
TEST_F(SideBranchTest, ToHostJoinsAnOpenBranch) {
  const Tensor x = f32({8, 512});
  const Tensor w = f32({512, 512}, 0.05f);
  const Tensor norm = f32({512});
  const Tensor want = gpu().to_host(chain(gpu(), x, w, norm, 20));
  Tensor side;
  {
    SideBranch branch(gpu());
    side = chain(gpu(), x, w, norm, 20);
  }
  expect_same(gpu().to_host(side), want, "read without a join");
}

// A block whose tensor died inside the branch is not handed out before the join, not even to an
// allocation of the same size on the compute stream (the pool would reuse it at once otherwise).
TEST_F(SideBranchTest, BlocksThatDieBeforeTheJoinAreNotReused) {
  constexpr int64_t kOdd = 123457;
  const Tensor x = f32({kOdd});
  const void* died = nullptr;
  {
    SideBranch branch(gpu());
    Tensor t = gpu().scale(x, 2.0f);
    died = t.raw_data();
    Tensor u = gpu().scale(t, 0.5f);
  }
  std::vector<Tensor> after;
  for (int i = 0; i < 4; ++i) {
    after.push_back(gpu().empty({kOdd}, DType::kF32));
    EXPECT_NE(after.back().raw_data(), died) << "allocation " << i << " before the join";
  }
  gpu().join_branches();
  gpu().synchronize();
}

// A captured step with a branch replays the eager bits; the capture arena's blocks that die in
// the branch are reused only after the join.
TEST_F(SideBranchTest, CapturedBranchesReplayTheEagerBits) {
  const Tensor x = f32({4, 512});
  const Tensor w = f32({512, 512}, 0.05f);
  const Tensor norm = f32({512});
  const Tensor want_side = gpu().to_host(chain(gpu(), x, w, norm, 9));
  const Tensor want_main = gpu().to_host(chain(gpu(), gpu().scale(x, 3.0f), w, norm, 5));
  Tensor out_side = gpu().empty({4, 512}, DType::kF32);
  Tensor out_main = gpu().empty({4, 512}, DType::kF32);
  std::unique_ptr<Graph> graph = gpu().capture([&] {
    Tensor side;
    {
      SideBranch branch(gpu());
      side = chain(gpu(), x, w, norm, 9);
    }
    gpu().copy_into(out_main, chain(gpu(), gpu().scale(x, 3.0f), w, norm, 5));
    gpu().join_branches();
    gpu().copy_into(out_side, side);
  });
  for (int round = 0; round < 3; ++round) {
    gpu().copy_into(out_side, gpu().zeros({4, 512}, DType::kF32));
    gpu().copy_into(out_main, gpu().zeros({4, 512}, DType::kF32));
    graph->replay();
    expect_same(gpu().to_host(out_side), want_side, "side, round " + std::to_string(round));
    expect_same(gpu().to_host(out_main), want_main, "main, round " + std::to_string(round));
  }
}

// Uploads and copies inside a branch run on its stream, in order with its ops. A decode step
// makes a weight's tensor map table on the weight's first weight-stream call, which may be in a
// branch (the compressors', the shared expert's): its upload went to the compute stream, so the
// branch's kernel could read the table before its bytes landed. Here a long copy_into holds
// whichever stream it takes before the upload, so a read on the side stream sees the pool's stale
// bytes unless both run there.
TEST_F(SideBranchTest, UploadsAndCopiesInsideABranchRunInItsOrder) {
  const int64_t big = int64_t{64} << 20;  // 256 MiB: ~0.1 ms of copying
  const Tensor src = gpu().zeros({big}, DType::kF32);
  Tensor dst = gpu().empty({big}, DType::kF32);
  for (int round = 0; round < 4; ++round) {
    const Tensor host = random_f32(rng_, {4096}, 1.0f);
    Tensor uploaded, copied;
    Tensor scratch = gpu().empty({4096}, DType::kF32);
    {
      SideBranch branch(gpu());
      gpu().copy_into(dst, src);
      uploaded = gpu().scale(gpu().upload(host, DType::kF32), 1.0f);
      gpu().copy_into(dst, src);
      gpu().upload_into(scratch, host);
      copied = gpu().scale(scratch, 1.0f);
    }
    gpu().join_branches();
    expect_same(gpu().to_host(uploaded), host, "upload, round " + std::to_string(round));
    expect_same(gpu().to_host(copied), host, "upload_into, round " + std::to_string(round));
  }
}

// An op that throws inside a branch (an argument error here) ends the branch on the way out; the
// next ops run and the next branch joins it.
TEST_F(SideBranchTest, AnErrorInsideABranchLeavesTheBackendUsable) {
  const Tensor x = f32({4, 256});
  const Tensor want = gpu().to_host(gpu().scale(x, 2.0f));
  try {
    SideBranch branch(gpu());
    Tensor fine = gpu().scale(x, 2.0f);
    (void)gpu().add(x, f32({4, 128}));  // shapes differ
    ADD_FAILURE() << "add of [4, 256] and [4, 128] did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  expect_same(gpu().to_host(gpu().scale(x, 2.0f)), want, "after the error");
  Tensor side;
  {
    SideBranch branch(gpu());
    side = gpu().scale(x, 2.0f);
  }
  gpu().join_branches();
  expect_same(gpu().to_host(side), want, "the next branch");
}

}  // namespace
}  // namespace deepinfer::backend_ops
