// CUDA behaviour that is not a comparison with the CPU reference (those are rows of the backend
// op table, tests/backend_ops): what the device does where the CPU op throws (it cannot without a
// host sync), argument errors, kernel selection and run-to-run determinism. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "batch_layout.h"
#include "compare.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/gemm/fp8_linear_choice.h"
#include "cuda_test.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "error_message.h"
#include "inputs.h"
#include "sampling_rows.h"

namespace deepinfer::backend_ops {
namespace {

class CudaOnly : public CudaTest {
 protected:
  Tensor randn(const Shape& shape, float scale = 1.0f) { return random_f32(rng_, shape, scale); }
  Tensor f32(const Tensor& host) { return gpu().upload(host, DType::kF32); }
  Tensor ids(const std::vector<int32_t>& v) { return gpu().upload(i32(v), DType::kI32); }

  std::mt19937 rng_{20240611};
};

// ---- which attention reads q rounded to bf16 (so that the model may hand it q in bf16) ----------

// Under bf16_math the tensor-core kernels (head dims 64 .. 512 over f32, bf16 or V4's fp8 caches)
// round q; the f32 kernel (other head dims, V4.1's records) and f32 math read it as it is.
TEST_F(CudaOnly, AttentionRoundsQueryWhereATensorCoreKernelRuns) {
  AttentionSpec spec;
  spec.bf16_math = true;
  spec.rope_dim = 64;
  EXPECT_TRUE(gpu().attention_rounds_query(512, DType::kU8, spec));
  EXPECT_TRUE(gpu().attention_rounds_query(512, DType::kBF16, spec));
  EXPECT_TRUE(gpu().attention_rounds_query(128, DType::kF32, spec));
  EXPECT_TRUE(gpu().attention_rounds_query(64, DType::kBF16, spec));
  EXPECT_FALSE(gpu().attention_rounds_query(32, DType::kBF16, spec));  // the f32 kernel's
  EXPECT_FALSE(gpu().attention_rounds_query(96, DType::kF32, spec));
  EXPECT_FALSE(gpu().attention_rounds_query(512, DType::kF8E4M3, spec));  // V4.1's records
  spec.bf16_math = false;
  EXPECT_FALSE(gpu().attention_rounds_query(512, DType::kU8, spec));
}

// ---- out-of-range ids: the CPU op throws, the device cannot and does something harmless ---------

TEST_F(CudaOnly, EmbeddingOutOfRangeIdGivesZeroRow) {
  Tensor table = randn({10, 64});
  Tensor out = gpu().to_host(gpu().embedding(f32(table), ids({-1, 10, 3})));
  for (int64_t h = 0; h < 64; ++h) {
    EXPECT_EQ(out.item(h), 0.0);
    EXPECT_EQ(out.item(64 + h), 0.0);
    EXPECT_EQ(out.item(128 + h), table.item(3 * 64 + h));
  }
}

TEST_F(CudaOnly, GatherRowsOutOfRangeGivesZeroRow) {
  Tensor x = randn({4, 8});
  Tensor out = gpu().to_host(gpu().gather_rows(f32(x), ids({2, -1, 4})));
  for (int64_t h = 0; h < 8; ++h) {
    EXPECT_EQ(out.item(h), x.item(16 + h));
    EXPECT_EQ(out.item(8 + h), 0.0);
    EXPECT_EQ(out.item(16 + h), 0.0);
  }
}

TEST_F(CudaOnly, CopyRowsOutOfRangeIsSkipped) {
  Tensor host = randn({4, 8});
  Tensor t = f32(host);
  gpu().copy_rows(t, ids({0, 5, 1}), ids({2, 3, -1}));
  Tensor out = gpu().to_host(t);
  for (int64_t h = 0; h < 8; ++h) {
    EXPECT_EQ(out.item(16 + h), host.item(h));       // 0 -> 2 copied
    EXPECT_EQ(out.item(24 + h), host.item(24 + h));  // 5 -> 3 skipped
    EXPECT_EQ(out.item(8 + h), host.item(8 + h));    // 1 -> -1 skipped
  }
}

// In place; a remap past `previous` (the CPU op throws) leaves the token as it was.
TEST_F(CudaOnly, SelectTokensRemapPastPreviousKeepsHostToken) {
  Tensor tokens = ids({7, 8, 9});
  gpu().select_tokens(tokens, ids({0, 2, -1}), ids({42, 43}));
  Tensor out = gpu().to_host(tokens);
  EXPECT_EQ(out.item(0), 42);
  EXPECT_EQ(out.item(1), 8);
  EXPECT_EQ(out.item(2), 9);
}

// Out-of-range hash entries are clamped on the device.
TEST_F(CudaOnly, RouteHashClampsInvalidIds) {
  Tensor x = randn({3, 16});
  Tensor gate = gpu().upload_weight(randn({4, 16}), DType::kF32);
  Tensor table =
      gpu().upload(Tensor::from_vector(std::vector<int32_t>{7, -2, 1, 2}, {2, 2}), DType::kI32);
  Routing r = gpu().moe_route(f32(x), gate, Tensor(), table, ids({5, -1, 1}), 2, 1.0f);
  Tensor got = gpu().to_host(r.expert_ids);
  // token 5 -> row 1, token -1 -> row 0 (clamped to [0, 2)); entries clamped to [0, 4).
  const std::vector<int32_t> want = {1, 2, 3, 0, 1, 2};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got.data<int32_t>()[i], want[i]) << i;
}

// ---- argument errors ----------------------------------------------------------------------------

TEST_F(CudaOnly, MetadataErrorsThrowLikeTheCpu) {
  Tensor x = f32(randn({4, 64}));
  Tensor host_x = randn({4, 64});
  Tensor pos = ids({0, 1, 2, 3});
  Tensor freq66 = f32(Tensor::zeros({33}, DType::kF32));  // rope_dim 66 > head dim 64
  EXPECT_THROW(gpu().rms_norm(x, f32(randn({63})), 1e-6f), Error);
  EXPECT_THROW(gpu().rms_norm(host_x, Tensor(), 1e-6f), Error);
  EXPECT_THROW(gpu().add(x, f32(randn({4, 63}))), Error);
  EXPECT_THROW(gpu().rope(x, pos, freq66, false), Error);
  EXPECT_THROW(gpu().argmax(f32(randn({4, 0}))), Error);
  EXPECT_THROW(gpu().embedding(x, f32(randn({2}))), Error);
  EXPECT_THROW(gpu().hc_expand(x, 0), Error);
  HcParams p;
  Tensor X = f32(randn({2, 4, 16}));
  Tensor fn = f32(randn({24, 64}));
  Tensor base = f32(randn({24}));
  Tensor scale3 = f32(randn({3}));
  EXPECT_NO_THROW(gpu().hc_pre(X, fn, base, scale3, p));
  EXPECT_THROW(gpu().hc_pre(X, fn, base, f32(randn({2})), p), Error);
  p.sinkhorn_iters = 0;
  EXPECT_THROW(gpu().hc_pre(X, fn, base, scale3, p), Error);
  gpu().synchronize();
}

// The same bad call on both backends: the same Error(kInvalidArgument) message from the shared
// checker (backend/op_checks.h), up to the device each names.
TEST_F(CudaOnly, ArgumentErrorsAreTheSameOnBothBackends) {
  using testing::error_message;
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  const std::vector<std::function<void(Backend&)>> cases = {
      [](Backend& b) {  // b: [3, 2], a is [2, 3]
        b.add(b.upload(Tensor::zeros({2, 3}, DType::kF32), DType::kF32),
              b.upload(Tensor::zeros({3, 2}, DType::kF32), DType::kF32));
      },
      [](Backend& b) {  // ids must be i32
        b.embedding(b.upload(Tensor::zeros({4, 8}, DType::kF32), DType::kF32),
                    b.upload(Tensor::zeros({2}, DType::kF32), DType::kF32));
      },
      [](Backend& b) {  // a strided view
        Tensor t = b.upload(Tensor::zeros({4, 3}, DType::kF32), DType::kF32);
        b.copy_rows(t.narrow(1, 0, 2), b.upload(i32({0}), DType::kI32),
                    b.upload(i32({1}), DType::kI32));
      },
      [](Backend& b) {  // an undefined tensor
        Tensor tokens = b.upload(i32({1, 2}), DType::kI32);
        b.select_tokens(tokens, Tensor(), tokens);
      },
      [](Backend& b) {  // position is i32
        SamplingBatch s;
        s.num_rows = 1;
        s.temperature = b.upload(Tensor::zeros({1}, DType::kF32), DType::kF32);
        s.top_k = b.upload(i32({0}), DType::kI32);
        s.top_p = b.upload(Tensor::zeros({1}, DType::kF32), DType::kF32);
        s.seed = b.upload(Tensor::zeros({1}, DType::kI64), DType::kI64);
        s.position = b.upload(Tensor::zeros({1}, DType::kI64), DType::kI64);
        s.num_logprobs = b.upload(i32({0}), DType::kI32);
        b.sample(b.upload(Tensor::zeros({1, 8}, DType::kF32), DType::kF32), s);
      },
  };
  for (const auto& bad : cases) {
    const std::string on_cpu = error_message([&] { bad(*cpu); });
    std::string on_gpu = error_message([&] { bad(gpu()); });
    for (size_t at = on_gpu.find(" on cuda"); at != std::string::npos;
         at = on_gpu.find(" on cuda", at)) {
      on_gpu.replace(at, 8, " on cpu");
    }
    EXPECT_EQ(on_gpu, on_cpu);
  }
  // A host tensor given to the CUDA backend.
  EXPECT_EQ(error_message([&] { gpu().scale(randn({2}), 2.0f); }),
            "scale: argument x must be on the cuda device, got f32[2] on cpu");
  // bf16 is a matrix weight dtype of the CUDA backend (weight_dtype(bf16) == bf16), f16 is not.
  EXPECT_EQ(error_message([&] {
              gpu().linear(f32(randn({2, 3})), gpu().upload(randn({2, 3}), DType::kF16));
            }),
            "linear: argument w must be (f32 or bf16)[*, 3], got f16[2, 3] on cuda");
  gpu().synchronize();
}

// ---- kernel selection and determinism -----------------------------------------------------------

// The bf16 GEMV (1..2 tokens) sums every output in an order fixed by (N, K, groups): two runs
// agree bitwise, and a token's row does not depend on how many tokens share the call.
TEST_F(CudaOnly, GemmBf16GemvIsDeterministicAndPerToken) {
  constexpr int64_t kGemvMaxTokens = 2;
  struct Shape2 {
    int64_t n, k;
    int groups;  // 0: linear
  };
  for (const Shape2& s :
       {Shape2{64, 4096, 0}, Shape2{1024, 4096, 8}, Shape2{8192, 1024, 0}, Shape2{4096, 8192, 0}}) {
    const int g = s.groups ? s.groups : 1;
    Tensor w = gpu().upload(randn({g * s.n, s.k}), DType::kBF16);
    Tensor x = f32(randn({kGemvMaxTokens, g * s.k}));
    const auto run = [&](int64_t m) {
      const Tensor xm = x.narrow(0, 0, m);
      return gpu().to_host(s.groups ? gpu().grouped_linear(xm, w, s.groups) : gpu().linear(xm, w));
    };
    const std::string what = "n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " groups " +
                             std::to_string(s.groups);
    Tensor first = run(kGemvMaxTokens);
    EXPECT_TRUE(same_bytes(first, run(kGemvMaxTokens))) << what << ": two runs differ";
    for (int64_t m = 1; m < kGemvMaxTokens; ++m) {
      Tensor few = run(m);
      EXPECT_EQ(std::memcmp(first.raw_data(), few.raw_data(), few.nbytes()), 0)
          << what << ": the first " << m << " tokens differ when run alone";
    }
  }
}

// The FP8 decode paths up to 16 tokens with act_group > 0 (the backend's DEEPINFER_FP8_LINEAR: by
// default the tensor-core GEMV cuda/gemm/gemv_fp8.cu below kFp8WgmmaAutoMinTokens tokens and the
// weight stream sm90/fp8_wgmma.cu from there where it applies; "legacy" the GEMV throughout;
// "stream" fp8_stream.cu, test_fp8_stream.cpp's subject): the same bytes on a second run, and a
// token's row does not depend on the other tokens of the batch taking the same path (tilings and
// K splits are chosen without M; 8 and 9 tokens take the GEMV's one- and two-n8-tile kernels). A
// batch on the other side of the default's threshold sums in another order, as one past 16 does.
TEST_F(CudaOnly, GemmFp8GemvIsDeterministicAndPerToken) {
  constexpr int64_t kTokens = 16;
  struct Shape2 {
    int64_t n, k;
    int groups;  // 0: linear
    int block;
  };
  for (const Shape2& s : {Shape2{1024, 4096, 0, 128}, Shape2{1024, 4096, 8, 128},
                          Shape2{300, 8192, 0, 128}, Shape2{4096, 1024, 0, 32}}) {
    const int g = s.groups ? s.groups : 1;
    const MatrixWeight host = random_fp8_block_weight(rng_, g * s.n, s.k, s.block, 128);
    const MatrixWeight w = gpu().upload_matrix_weight(host);
    Tensor x = f32(randn({kTokens, g * s.k}));
    const auto run = [&](int64_t m) {
      const Tensor xm = x.narrow(0, 0, m);
      return gpu().to_host(s.groups ? gpu().grouped_linear(xm, w, s.groups) : gpu().linear(xm, w));
    };
    const std::string what = "n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " groups " +
                             std::to_string(s.groups) + " block " + std::to_string(s.block);
    Tensor first = run(kTokens);
    EXPECT_TRUE(same_bytes(first, run(kTokens))) << what << ": two runs differ";
    // Where the default changes path, the largest batch below the threshold is the reference.
    const cuda::Fp8LinearChoice choice = dynamic_cast<cuda::CudaBackend&>(gpu()).fp8_linear();
    const int64_t below = cuda::kFp8WgmmaAutoMinTokens - 1;
    const Tensor first_below = run(below);
    for (const int64_t m : {int64_t{1}, int64_t{2}, int64_t{8}, int64_t{9}}) {
      const bool like_first =
          cuda::fp8_choice_tries_wgmma(choice, m) == cuda::fp8_choice_tries_wgmma(choice, kTokens);
      const Tensor& want = like_first ? first : first_below;
      Tensor few = run(m);
      EXPECT_EQ(std::memcmp(want.raw_data(), few.raw_data(), few.nbytes()), 0)
          << what << ": the first " << m << " tokens differ from a batch of "
          << (like_first ? kTokens : below);
    }
  }
}

// rope's two kernels (cuda/rope/rope.cu): the quads kernel (16-byte aligned rows whose width is a
// multiple of 4) and the element kernel (here: the same values one float off a 16-byte boundary)
// compute the same angles, cos, sin and products, so their bytes agree, both directions.
TEST_F(CudaOnly, RopeQuadsMatchTheElementKernel) {
  const int64_t tokens = 37, heads = 64, dim = 512, half = 32;
  const Tensor host = randn({tokens, heads, dim});
  Tensor aligned = f32(host);
  Tensor padded = gpu().empty({tokens * heads * dim + 4}, DType::kF32);
  Tensor shifted = padded.narrow(0, 1, tokens * heads * dim).reshape({tokens, heads, dim});
  gpu().copy_into(shifted, aligned);
  std::vector<int32_t> pos(static_cast<size_t>(tokens));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(977 * i + 3);
  std::vector<float> freq(static_cast<size_t>(half));
  for (size_t i = 0; i < freq.size(); ++i) {
    freq[i] = std::pow(10000.0f, -static_cast<float>(i) / static_cast<float>(half));
  }
  const Tensor positions = ids(pos);
  const Tensor inv_freq = f32(Tensor::from_vector(freq, {half}));
  for (const bool inverse : {false, true}) {
    const Tensor quads = gpu().to_host(gpu().rope(aligned, positions, inv_freq, inverse));
    const Tensor elements = gpu().to_host(gpu().rope(shifted, positions, inv_freq, inverse));
    EXPECT_TRUE(same_bytes(quads, elements)) << (inverse ? "inverse" : "forward");
  }
}

// bf16_math really takes the tensor-core kernel at V4 widths (its result differs from the f32
// kernel's, within the bf16 tolerance), and without it the f32 kernel runs (bit-identical to an
// explicit bf16_math = false call).
TEST_F(CudaOnly, AttentionBf16MathSelectsTheKernel) {
  const int heads = 64, dim = 512, window = 128, ring_len = 134, block = 128;
  HostBatch hb(rng_, {{4096, 1, 0}, {3000, 2, 1}}, block);
  const int64_t t = hb.num_tokens();
  Tensor q = f32(randn({t, heads, dim}));
  Tensor kv = f32(randn({t, dim}));
  Tensor ring = f32(randn({2, ring_len, dim}));
  Tensor sinks = f32(randn({heads}));
  Tensor entries = f32(randn({int64_t{hb.num_blocks} * (block / 4), dim}));
  Tensor topk = gpu().upload(random_topk(rng_, hb, 4, 512), DType::kI32);
  const BatchLayout layout = hb.upload(gpu());
  AttentionSpec spec{window, 1.0f / std::sqrt(float(dim)), 4, true};
  auto run = [&](bool bf16) {
    spec.bf16_math = bf16;
    return gpu().to_host(gpu().attention(q, kv, ring, entries, topk, sinks, layout, spec));
  };
  const Tensor f32_out = run(false);
  const Tensor f32_again = run(false);
  const Tensor bf16_out = run(true);
  EXPECT_FALSE(same_bytes(f32_out, bf16_out)) << "bf16_math gave the f32 kernel's result";
  EXPECT_TRUE(bf16_close(f32_out, bf16_out));
  EXPECT_TRUE(same_bytes(f32_out, f32_again));
}

// One request's token must not depend on its batch: the same row alone and inside a batch.
TEST_F(CudaOnly, SampleRowIndependentOfBatch) {
  const int64_t vocab = 5000;
  Tensor logits = Tensor::zeros({16, vocab}, DType::kF32);
  for (int r = 0; r < 16; ++r) {
    fill_logits_row(logits.data<float>() + r * vocab, vocab, RowKind::kNormal, rng_);
  }
  SamplingRows all;
  for (int r = 0; r < 16; ++r) all.add(0.9f, 0, 0.9f, 1234, 77, 0);
  Tensor batched = gpu().to_host(gpu().sample(f32(logits), all.upload(gpu())).tokens);
  for (int r = 0; r < 16; r += 5) {
    SamplingRows one;
    one.add(0.9f, 0, 0.9f, 1234, 77, 0);
    Tensor row = logits.narrow(0, r, 1).contiguous();
    Tensor alone = gpu().to_host(gpu().sample(f32(row), one.upload(gpu())).tokens);
    EXPECT_EQ(alone.data<int32_t>()[0], batched.data<int32_t>()[r]) << "row " << r;
  }
}

// ---- graph capture --------------------------------------------------------------------------

// A captured free may only free the graph's own allocations. An output allocated before the
// capture and reassigned inside it (cuda_op_bench's pattern) once made the failed free's error
// surface at the next captured call's launch check; the graph now frees such buffers itself.
TEST_F(CudaOnly, CaptureMayDropABufferAllocatedBeforeIt) {
  const Tensor x = f32(randn({4, 256}));
  const Tensor want = gpu().to_host(gpu().rms_norm(x, Tensor(), 1e-6f));
  Tensor y = gpu().rms_norm(x, Tensor(), 1e-6f);
  std::unique_ptr<Graph> graph = gpu().capture([&] {
    for (int i = 0; i < 3; ++i) y = gpu().rms_norm(x, Tensor(), 1e-6f);
  });
  graph->replay();
  graph->replay();
  const Tensor got = gpu().to_host(y);
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_EQ(got.item(i), want.item(i)) << "element " << i;
  graph.reset();
  // Nothing was left for a later launch check to report.
  EXPECT_NO_THROW(gpu().to_host(gpu().rms_norm(x, Tensor(), 1e-6f)));
}

// A chain of dependent ops whose temporaries die inside the capture: eagerly, then as two graphs
// replayed in turns. Captures take their temporaries from the backend's capture arena, which
// reuses a dead tensor's block within the capture and across graphs, and the kernels may start
// before the one ahead of them finished (DEEPINFER_PDL): a block reused too early, or a kernel
// that read before its wait, would change the bits.
Tensor norm_chain(Backend& b, const Tensor& x, const Tensor& w, int links) {
  Tensor h = x;
  for (int i = 0; i < links; ++i) h = b.add(b.rms_norm(b.scale(h, 0.5f + i), w, 1e-6f), x);
  return h;
}

TEST_F(CudaOnly, GraphsThatShareTheCaptureArenaReplayTheEagerBits) {
  const Tensor x = f32(randn({3, 512}));
  const Tensor x2 = f32(randn({5, 512}));
  const Tensor w = f32(randn({512}));
  const Tensor want_a = gpu().to_host(norm_chain(gpu(), x, w, 6));
  const Tensor want_b = gpu().to_host(norm_chain(gpu(), x2, w, 9));
  Tensor out_a = gpu().empty({3, 512}, DType::kF32);
  Tensor out_b = gpu().empty({5, 512}, DType::kF32);
  std::unique_ptr<Graph> a =
      gpu().capture([&] { gpu().copy_into(out_a, norm_chain(gpu(), x, w, 6)); });
  std::unique_ptr<Graph> b =
      gpu().capture([&] { gpu().copy_into(out_b, norm_chain(gpu(), x2, w, 9)); });
  for (int round = 0; round < 3; ++round) {
    gpu().copy_into(out_a, gpu().zeros({3, 512}, DType::kF32));
    gpu().copy_into(out_b, gpu().zeros({5, 512}, DType::kF32));
    a->replay();
    b->replay();
    const Tensor got_a = gpu().to_host(out_a);
    const Tensor got_b = gpu().to_host(out_b);
    for (int64_t i = 0; i < want_a.numel(); ++i)
      ASSERT_EQ(got_a.item(i), want_a.item(i)) << "graph a, round " << round << ", element " << i;
    for (int64_t i = 0; i < want_b.numel(); ++i)
      ASSERT_EQ(got_b.item(i), want_b.item(i)) << "graph b, round " << round << ", element " << i;
  }
}

// A tensor of a capture that outlives it keeps its block for that graph; when the block is one
// another live graph uses for a temporary, the capture fails rather than let the two graphs
// overwrite each other. The odd size makes the block one only these captures take.
TEST_F(CudaOnly, ACaptureWhoseOutputSharesAnotherGraphsTemporaryFails) {
  constexpr int64_t kOdd = 77773;
  const Tensor x = f32(randn({kOdd}));
  std::unique_ptr<Graph> a = gpu().capture([&] {
    Tensor temporary = gpu().scale(x, 2.0f);
    gpu().copy_into(x, gpu().scale(temporary, 0.5f));
  });
  Tensor kept;
  try {
    std::unique_ptr<Graph> b = gpu().capture([&] { kept = gpu().scale(x, 3.0f); });
    ADD_FAILURE() << "the capture kept a block graph a replays into";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("outlives the capture"), std::string::npos) << e.what();
  }
  kept = Tensor();
  a.reset();
  // With graph a gone, the same capture keeps its output.
  const Tensor want = gpu().to_host(gpu().scale(x, 3.0f));
  std::unique_ptr<Graph> c = gpu().capture([&] { kept = gpu().scale(x, 3.0f); });
  c->replay();
  const Tensor got = gpu().to_host(kept);
  for (int64_t i = 0; i < kOdd; ++i) ASSERT_EQ(got.item(i), want.item(i)) << "element " << i;
}

}  // namespace
}  // namespace deepinfer::backend_ops
