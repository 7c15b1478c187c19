#include "tensor/kv_record.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace deepinfer::kv_record {

namespace {

float amax_of(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

// The e8m0 code of the power of two `scale` (2^(code - 127)).
uint8_t e8m0_code(float scale) {
  int e = 0;
  std::frexp(scale, &e);  // scale = 0.5 * 2^e
  return static_cast<uint8_t>(std::clamp(e - 1 + 127, 0, 254));
}

}  // namespace

float fp8_scale(float amax) {
  // 2^ceil(log2(amax / 448)): the smallest power of two that keeps the group within e4m3.
  const float ratio = std::max(amax, 1e-4f) / 448.0f;
  int e = 0;
  const float m = std::frexp(ratio, &e);  // ratio = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, std::clamp(m == 0.5f ? e - 1 : e, -127, 127));
}

void encode_main(const float* x, int64_t dim, int64_t rope_dim, uint8_t* record) {
  const int64_t nope = dim - rope_dim;
  const int64_t groups = (nope + kFp8Group - 1) / kFp8Group;
  uint8_t* scales = record + nope + 2 * rope_dim;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = g * kFp8Group;
    const int64_t c1 = std::min(nope, c0 + kFp8Group);
    const float scale = fp8_scale(amax_of(x + c0, c1 - c0));
    for (int64_t c = c0; c < c1; ++c) record[c] = f32_to_f8e4m3(x[c] / scale);
    scales[g] = e8m0_code(scale);
  }
  for (int64_t i = 0; i < rope_dim; ++i) {
    const uint16_t b = f32_to_bf16(x[nope + i]);
    record[nope + 2 * i] = static_cast<uint8_t>(b & 0xff);
    record[nope + 2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  const int64_t used = nope + 2 * rope_dim + groups;
  std::fill(record + used, record + main_record_bytes(dim, rope_dim), uint8_t{0});
}

void decode_main(const uint8_t* record, int64_t dim, int64_t rope_dim, float* x) {
  const int64_t nope = dim - rope_dim;
  const uint8_t* scales = record + nope + 2 * rope_dim;
  for (int64_t c = 0; c < nope; ++c) {
    x[c] = f8e4m3_to_f32(record[c]) * e8m0_to_f32(scales[c / kFp8Group]);
  }
  for (int64_t i = 0; i < rope_dim; ++i) {
    const uint16_t b = static_cast<uint16_t>(
        record[nope + 2 * i] | (static_cast<uint16_t>(record[nope + 2 * i + 1]) << 8));
    x[nope + i] = bf16_to_f32(b);
  }
}

void encode_index(const float* x, int64_t dim, uint8_t* record) {
  const float scale = fp8_scale(amax_of(x, dim));
  for (int64_t c = 0; c < dim; ++c) record[c] = f32_to_f8e4m3(x[c] / scale);
  uint32_t bits = 0;
  std::memcpy(&bits, &scale, sizeof bits);
  for (int i = 0; i < 4; ++i) record[dim + i] = static_cast<uint8_t>(bits >> (8 * i));
}

void decode_index(const uint8_t* record, int64_t dim, float* x) {
  uint32_t bits = 0;
  for (int i = 0; i < 4; ++i) bits |= static_cast<uint32_t>(record[dim + i]) << (8 * i);
  float scale = 0.0f;
  std::memcpy(&scale, &bits, sizeof scale);
  for (int64_t c = 0; c < dim; ++c) x[c] = f8e4m3_to_f32(record[c]) * scale;
}

int64_t RowCodec::row_width() const {
  switch (dtype) {
    case DType::kU8:
      return rope_dim > 0 ? main_record_bytes(dim, rope_dim) : index_record_bytes(dim);
    default:
      return dim;
  }
}

void RowCodec::encode(const float* x, void* row) const {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(row, x, static_cast<size_t>(dim) * sizeof(float));
      return;
    case DType::kBF16: {
      auto* out = static_cast<uint16_t*>(row);
      for (int64_t c = 0; c < dim; ++c) out[c] = f32_to_bf16(x[c]);
      return;
    }
    default:
      if (rope_dim > 0) {
        encode_main(x, dim, rope_dim, static_cast<uint8_t*>(row));
      } else {
        encode_index(x, dim, static_cast<uint8_t*>(row));
      }
  }
}

void RowCodec::decode(const void* row, float* x) const {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(x, row, static_cast<size_t>(dim) * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* in = static_cast<const uint16_t*>(row);
      for (int64_t c = 0; c < dim; ++c) x[c] = bf16_to_f32(in[c]);
      return;
    }
    default:
      if (rope_dim > 0) {
        decode_main(static_cast<const uint8_t*>(row), dim, rope_dim, x);
      } else {
        decode_index(static_cast<const uint8_t*>(row), dim, x);
      }
  }
}

}  // namespace deepinfer::kv_record
