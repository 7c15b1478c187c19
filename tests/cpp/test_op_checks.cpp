// The shared op argument checks (backend/op_checks.h): their messages, for this backend's device
// and for another, and the Backend front raising exactly them on the CPU backend (the CUDA
// backend's side is tests/gpu/cpp/test_cuda_dense.cpp).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/op_checks.h"
#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "deepinfer/weight.h"
#include "error_message.h"

namespace deepinfer {
namespace {

using checks::DTypeSet;
using checks::OpChecks;
using testing::error_message;

// A tensor whose metadata says it lives on a CUDA device (its bytes are host memory, never read):
// the checks look at metadata only, so this needs no GPU.
Tensor fake_cuda(DType dtype, const Shape& shape) {
  Tensor host = Tensor::zeros(shape, dtype);
  auto storage =
      Storage::borrow(host.raw_data(), host.nbytes(), Device{DeviceKind::kCuda, 0}, host.storage());
  return Tensor(std::move(storage), dtype, shape);
}

TEST(OpChecks, DTypeSetNamesItsMembers) {
  EXPECT_EQ(DTypeSet(DType::kF32).str(), "f32");
  EXPECT_EQ(DTypeSet({DType::kBF16, DType::kF32}).str(), "f32 or bf16");
  EXPECT_EQ(DTypeSet({DType::kF32, DType::kF32}).str(), "f32");
  EXPECT_TRUE(DTypeSet::any().contains(DType::kF8E4M3));
  EXPECT_FALSE(DTypeSet({DType::kF32, DType::kBF16}).contains(DType::kI32));
}

TEST(OpChecks, MessagesNameTheOpTheArgumentAndWhatWasExpected) {
  const OpChecks cuda("linear", DeviceKind::kCuda);
  const Tensor w = fake_cuda(DType::kI32, {2, 4});
  EXPECT_EQ(error_message([&] {
              cuda.tensor("w", w, {DType::kF32, DType::kBF16}, {-1, 3});
            }),
            "linear: argument w must be (f32 or bf16)[*, 3], got i32[2, 4] on cuda");
  EXPECT_EQ(
      error_message([&] { cuda.tensor("x", Tensor::zeros({2}, DType::kF32), DType::kF32, {-1}); }),
      "linear: argument x must be on the cuda device, got f32[2] on cpu");
  EXPECT_EQ(error_message([&] {
              cuda.tensor("x", Tensor(), DType::kF32, {-1, -1});
            }),
            "linear: argument x must be f32[*, *], got an undefined tensor");
  EXPECT_EQ(error_message([&] { cuda.rank("x", w.narrow(1, 0, 2), DType::kF32, 1, 8); }),
            "linear: argument x must be contiguous, got a strided view i32[2, 2] on cuda");
  EXPECT_EQ(error_message([&] { cuda.rank("x", w, DType::kF32, 1, 8); }),
            "linear: argument x must be f32 of rank 1-8, got i32[2, 4] on cuda");
  EXPECT_EQ(error_message([&] { cuda.dense("t", fake_cuda(DType::kF32, {}), DTypeSet::any(), 1); }),
            "linear: argument t must have at least one dimension, got f32[] on cuda");
  EXPECT_EQ(error_message([&] { cuda.host("host", w, /*contiguous=*/false); }),
            "linear: argument host must be in host memory, got i32[2, 4] on cuda");
  const OpChecks cpu("add", DeviceKind::kCpu);
  EXPECT_EQ(error_message([&] {
              cpu.tensor("b", w, DType::kF32, {2, 4});
            }),
            "add: argument b must be in host memory, got i32[2, 4] on cuda");
  cpu.optional("weight", Tensor(), DType::kF32, {4});  // an undefined optional argument is fine
  EXPECT_NO_THROW(cuda.on_device("w", w.narrow(1, 0, 2)));
}

// weight_ok is weight's passing case without its messages (the MoE front checks 768 expert
// matrices per call with it): every bad part weight names must fail it too, or a bad weight
// would pass unchecked.
TEST(OpChecks, WeightOkFailsWhereverWeightFails) {
  const OpChecks cuda("moe_experts", DeviceKind::kCuda);
  MatrixWeight fp8;
  fp8.format = WeightFormat::kFp8Block;
  fp8.block_rows = 2;
  fp8.block_cols = 2;
  fp8.values = fake_cuda(DType::kF8E4M3, {3, 4});
  fp8.scales = fake_cuda(DType::kF32, {2, 2});
  MatrixWeight fp4;
  fp4.format = WeightFormat::kMxfp4;
  fp4.block_rows = 1;
  fp4.block_cols = 32;
  fp4.values = fake_cuda(DType::kE2M1x2, {2, 32});  // logical [2, 64]
  fp4.scales = fake_cuda(DType::kE8M0, {2, 2});
  MatrixWeight dense(fake_cuda(DType::kBF16, {3, 4}));
  const std::vector<std::tuple<const char*, MatrixWeight, int64_t, int64_t>> good = {
      {"fp8", fp8, 3, 4}, {"fp4", fp4, 2, 64}, {"dense", dense, -1, 4}};
  std::vector<std::pair<std::string, std::function<void(MatrixWeight&)>>> breaks = {
      {"values undefined", [](MatrixWeight& w) { w.values = Tensor(); }},
      {"values on the host",
       [](MatrixWeight& w) { w.values = Tensor::zeros(w.values.shape(), w.values.dtype()); }},
      {"values strided",
       [](MatrixWeight& w) {
         w.values = w.values.reshape({1, -1}).narrow(1, 0, w.values.size(1));
       }},
      {"values of rank 1",
       [](MatrixWeight& w) { w.values = fake_cuda(w.values.dtype(), {w.values.numel()}); }},
      {"values dtype",
       [](MatrixWeight& w) { w.values = fake_cuda(DType::kI32, w.values.shape()); }},
      {"act_group", [](MatrixWeight& w) { w.act_group = -1; }},
      {"scales on a dense weight or undefined",
       [](MatrixWeight& w) {
         w.scales = w.quantized() ? Tensor() : fake_cuda(DType::kF32, {1, 1});
       }},
      {"scales dtype",
       [](MatrixWeight& w) {
         if (w.quantized()) w.scales = fake_cuda(DType::kI32, w.scales.shape());
       }},
      {"scales shape",
       [](MatrixWeight& w) {
         if (w.quantized()) w.scales = fake_cuda(w.scales.dtype(), {1, 1});
       }},
      {"blocks",
       [](MatrixWeight& w) {
         if (w.quantized()) w.block_cols = w.format == WeightFormat::kMxfp4 ? 16 : 0;
       }},
  };
  for (const auto& [name, weight, rows, cols] : good) {
    EXPECT_TRUE(cuda.weight_ok(weight, DType::kBF16, rows, cols)) << name;
    EXPECT_NO_THROW(cuda.weight("w", weight, DType::kBF16, rows, cols)) << name;
    EXPECT_FALSE(cuda.weight_ok(weight, DType::kBF16, rows + 1, cols)) << name;
    EXPECT_FALSE(cuda.weight_ok(weight, DType::kBF16, rows, cols + 32)) << name;
    for (const auto& [what, bend] : breaks) {
      MatrixWeight bad = weight;
      bend(bad);
      bool throws = false;
      try {
        cuda.weight("w", bad, DType::kBF16, rows, cols);
      } catch (const Error&) {
        throws = true;
      }
      EXPECT_EQ(cuda.weight_ok(bad, DType::kBF16, rows, cols), !throws) << name << ": " << what;
    }
  }
  // mxfp4 columns must be a multiple of its block: the logical width 2 * 20 = 40 is not.
  MatrixWeight ragged = fp4;
  ragged.values = fake_cuda(DType::kE2M1x2, {2, 20});
  ragged.scales = fake_cuda(DType::kE8M0, {2, 2});
  EXPECT_FALSE(cuda.weight_ok(ragged, DType::kBF16, 2, 40));
  EXPECT_THROW(cuda.weight("w", ragged, DType::kBF16, 2, 40), Error);
}

TEST(OpChecks, LayoutNeedsASequenceForItsRows) {
  const OpChecks c("attention", DeviceKind::kCpu);
  BatchLayout layout;
  layout.num_tokens = 2;
  layout.num_seqs = 0;
  EXPECT_NE(error_message([&] { c.layout(layout, false); }).find(">= 1 when there are tokens"),
            std::string::npos);
  layout.num_tokens = 0;
  EXPECT_EQ(error_message([&] { c.layout(layout, false); }),
            "attention: argument layout.positions must be i32[0], got an undefined tensor");
  EXPECT_EQ(error_message([&] { c.ratio(3, layout); }),
            "attention: compression ratio 3 must be >= 1 and divide block_size 128");
}

class CpuFrontTest : public testing::BackendTest {};

// The CPU backend raises the shared checker's own message, on the calling thread.
TEST_F(CpuFrontTest, ArgumentErrorsAreTheSharedCheckersMessages) {
  const OpChecks linear("linear", DeviceKind::kCpu);
  const Tensor x = up(rng.uniform(6), {2, 3});
  const Tensor w = up(rng.uniform(8), {2, 4});
  const std::string want = error_message([&] { linear.tensor("w", w, DType::kF32, {-1, 3}); });
  EXPECT_EQ(want, "linear: argument w must be f32[*, 3], got f32[2, 4] on cpu");
  EXPECT_EQ(error_message([&] { be->linear(x, w); }), want);

  // A bf16 matrix is a weight dtype of a device backend, not of the CPU reference
  // (weight_dtype(bf16) is f32 here).
  const Tensor w_bf16 = be->upload(testing::host_f32(rng.uniform(6), {2, 3}), DType::kBF16);
  EXPECT_EQ(error_message([&] { be->linear(x, w_bf16); }),
            "linear: argument w must be f32[*, 3], got bf16[2, 3] on cpu");
  EXPECT_EQ(error_message([&] { be->embedding(w_bf16, up_i({0}, {1})); }),
            "embedding: argument table must be f32[*, *], got bf16[2, 3] on cpu");

  // A tensor of another device.
  EXPECT_EQ(error_message([&] {
              be->add(x, fake_cuda(DType::kF32, {2, 3}));
            }),
            "add: argument b must be in host memory, got f32[2, 3] on cuda");
  EXPECT_EQ(error_message([&] { be->to_host(fake_cuda(DType::kF32, {2})); }),
            "to_host: argument device must be in host memory, got f32[2] on cuda");

  // Op-level rules are checked by the front too.
  EXPECT_EQ(error_message([&] {
              be->grouped_linear(x, up(rng.uniform(6), {2, 3}), 2);
            }),
            "grouped_linear: x f32[2, 3] on cpu and w f32[2, 3] on cpu do not split into 2 groups "
            "(expected x [M, G*K] and w [G*N, K])");
  EXPECT_EQ(error_message([&] { be->fill_random_normal(up_i({1}, {1}), 1, 0.0f, 1.0f); }),
            "fill_random_normal: argument t must be f32 or bf16, got i32[1] on cpu");
  EXPECT_EQ(error_message([&] { be->copy_into(x, w); }),
            "copy_into: needs tensors of one dtype and shape, got f32[2, 3] on cpu and f32[2, 4] "
            "on cpu");
  be->synchronize();
}

TEST_F(CpuFrontTest, HostSyncsAreRefusedByTheFront) {
  const Tensor t = be->zeros({2}, DType::kF32);
  HostSyncForbidden guard(*be);
  EXPECT_EQ(error_message([&] { be->to_host(t); }, ErrorCode::kInternal),
            "to_host: host sync while host syncs are forbidden (inside a forward or sampling "
            "launch)");
  EXPECT_EQ(error_message([&] { be->synchronize(); }, ErrorCode::kInternal),
            "synchronize: host sync while host syncs are forbidden (inside a forward or sampling "
            "launch)");
}

}  // namespace
}  // namespace deepinfer
