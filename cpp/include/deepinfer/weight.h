// A matrix weight as a backend keeps it: plain values, or DeepSeek's block-scaled formats (FP8
// e4m3 with one scale per block, MXFP4 e2m1 pairs with one power-of-two scale per 32 inputs),
// plus the activation quantization its GEMM applies. docs/model.md#quantized-checkpoints has
// the formats; a backend is free to keep a weight in another format of the same values (the CPU
// reference dequantizes at load, exactly).
#pragma once

#include <cstdint>
#include <utility>

#include "deepinfer/tensor.h"

namespace deepinfer {

enum class WeightFormat : uint8_t {
  kDense,     // values [N, K] f32 or bf16
  kFp8Block,  // values [N, K] e4m3; scales [ceil(N / block_rows), ceil(K / block_cols)] f32
  kMxfp4,     // values [N, K / 2] e2m1x2 (input k = 2j in the low nibble of byte j);
              // scales [N, K / 32] e8m0
};

const char* weight_format_name(WeightFormat format);  // "dense", "fp8_block", "mxfp4"

// Weight value w[n][k] = value(n, k) * scale(n / block_rows, k / block_cols).
struct MatrixWeight {
  Tensor values;
  Tensor scales;  // undefined for kDense
  WeightFormat format = WeightFormat::kDense;
  int block_rows = 1;  // rows of w sharing one scale (kMxfp4: 1)
  int block_cols = 1;  // columns sharing one scale (kMxfp4: 32)
  // Dynamic activation quantization in front of this weight's GEMM, as DeepSeek's W8A8 kernels do
  // it: each row of x is cut into groups of `act_group` columns (the last may be shorter); a
  // group's scale is the power of two 2^ceil(log2(amax / 448)) (amax clamped to >= 1e-4) and its
  // values become round_to_f8e4m3(x / scale) * scale. 0: x is used as it is.
  int act_group = 0;

  MatrixWeight() = default;
  // A dense weight (implicit, so plain tensors pass wherever a weight is taken).
  MatrixWeight(Tensor dense)  // NOLINT(google-explicit-constructor)
      : values(std::move(dense)) {}

  bool defined() const { return values.defined(); }
  bool quantized() const { return format != WeightFormat::kDense; }
  // The logical shape [N, K] (kMxfp4 packs two columns per byte).
  int64_t rows() const { return values.size(0); }
  int64_t cols() const {
    return format == WeightFormat::kMxfp4 ? 2 * values.size(1) : values.size(1);
  }
  std::string describe() const;  // "fp8_block[128x128] e4m3[N, K] + f32[n, k] scales, act 128"
};

// The scale-grid shape a weight of logical shape [n, k] in `format` with the given blocks has:
// [ceil(n / block_rows), ceil(k / block_cols)].
Shape weight_scale_shape(int64_t n, int64_t k, int block_rows, int block_cols);

// The weight's values as a dense host tensor [N, K] of `dtype` (f32 or bf16). Exact: e4m3 and
// e2m1 values times power-of-two scales are representable in both (fp8 with non-power-of-two f32
// scales is exact in f32 only). `w` lives on the host.
Tensor dequantize_weight(const MatrixWeight& w, DType dtype);

// The activation quantization of MatrixWeight::act_group on host rows: out[m][k] (may alias x)
// is x[m][k] rounded to its group's e4m3 grid, for m < rows, k < cols (row stride `cols`).
void quantize_activation_rows(const float* x, float* out, int64_t rows, int64_t cols, int group);

}  // namespace deepinfer
