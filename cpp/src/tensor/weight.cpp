#include "deepinfer/weight.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "deepinfer/dtype.h"
#include "deepinfer/error.h"

namespace deepinfer {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kDense:
      return "dense";
    case WeightFormat::kFp8Block:
      return "fp8_block";
    case WeightFormat::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

std::string MatrixWeight::describe() const {
  if (!defined()) return "undefined weight";
  // A dense weight reads as its tensor, like the plain matrix it is.
  std::string s = values.describe();
  if (quantized()) {
    s = std::string(weight_format_name(format)) + "[" + std::to_string(block_rows) + "x" +
        std::to_string(block_cols) + "] " + values.describe() + " + " +
        (scales.defined() ? scales.describe() : "no") + " scales";
  }
  if (act_group > 0) s += ", activations fp8 per " + std::to_string(act_group);
  return s;
}

Shape weight_scale_shape(int64_t n, int64_t k, int block_rows, int block_cols) {
  return {(n + block_rows - 1) / block_rows, (k + block_cols - 1) / block_cols};
}

Tensor dequantize_weight(const MatrixWeight& w, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    throw Error(
        ErrorCode::kInvalidArgument,
        std::string("dequantize_weight: output must be f32 or bf16, got ") + dtype_name(dtype));
  }
  if (!w.quantized()) return w.values.to(dtype);
  const int64_t n = w.rows();
  const int64_t k = w.cols();
  const Tensor values = w.values.contiguous();
  const Tensor scales = w.scales.to(DType::kF32);
  const int64_t scale_cols = scales.size(1);
  const float* s = scales.data<float>();
  const auto* bytes = values.data<uint8_t>();
  Tensor out = Tensor::zeros({n, k}, dtype);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    const float* srow = s + (r / w.block_rows) * scale_cols;
    for (int64_t c = 0; c < k; ++c) {
      const float v =
          w.format == WeightFormat::kFp8Block
              ? f8e4m3_to_f32(bytes[r * k + c])
              : e2m1_to_f32(static_cast<uint8_t>(bytes[r * (k / 2) + c / 2] >> (4 * (c & 1))));
      row[static_cast<size_t>(c)] = v * srow[c / w.block_cols];
    }
    convert_elements(
        row.data(), DType::kF32,
        static_cast<char*>(out.raw_data()) + r * k * static_cast<int64_t>(dtype_size(dtype)), dtype,
        static_cast<size_t>(k));
  }
  return out;
}

void quantize_activation_rows(const float* x, float* out, int64_t rows, int64_t cols, int group) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += group) {
      const int64_t c1 = std::min(cols, c0 + group);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
      // 2^ceil(log2(amax / 448)): the smallest power of two that keeps the group within e4m3.
      const float ratio = std::max(amax, 1e-4f) / 448.0f;
      int e = 0;
      const float m = std::frexp(ratio, &e);  // ratio = m * 2^e, m in [0.5, 1)
      const float scale = std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
      for (int64_t c = c0; c < c1; ++c) {
        out[r * cols + c] = round_to_f8e4m3(x[r * cols + c] / scale) * scale;
      }
    }
  }
}

}  // namespace deepinfer
