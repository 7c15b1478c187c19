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

namespace {

// 2^ceil(log2(max(amax, 1e-4) / qmax)): the smallest power of two that keeps the group within
// a format whose largest magnitude is qmax.
float pow2_scale(float amax, float qmax) {
  const float ratio = std::max(amax, 1e-4f) / qmax;
  int e = 0;
  const float m = std::frexp(ratio, &e);  // ratio = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, std::clamp(m == 0.5f ? e - 1 : e, -127, 127));
}

constexpr uint8_t kE4m3MaxCode = 0x7e;  // 448

// Byte i of a packed e2m1 row holds channels 2i (low nibble) and 2i + 1 (high nibble).
float e2m1_channel(const uint8_t* data, int64_t c) {
  return e2m1_to_f32(static_cast<uint8_t>((data[c / 2] >> (4 * (c % 2))) & 0xf));
}

// Packs x[0, dim) as e2m1 of x / scale_of_group(g), groups of `group` channels.
template <typename ScaleOf>
void pack_e2m1(const float* x, int64_t dim, int64_t group, ScaleOf scale_of_group, uint8_t* data) {
  std::fill(data, data + ceil_div(dim, 2), uint8_t{0});
  for (int64_t g = 0; g * group < dim; ++g) {
    const int64_t c0 = g * group;
    const int64_t c1 = std::min(dim, c0 + group);
    const float scale = scale_of_group(g, amax_of(x + c0, c1 - c0));
    for (int64_t c = c0; c < c1; ++c) {
      data[c / 2] |= static_cast<uint8_t>(f32_to_e2m1(x[c] / scale) << (4 * (c % 2)));
    }
  }
}

}  // namespace

float fp8_scale(float amax) {
  return pow2_scale(amax, 448.0f);
}

float fp4_ue8m0_scale(float amax) {
  return pow2_scale(amax, 6.0f);
}

float fp4_e4m3_scale(float amax) {
  const float want = std::max(amax, 1e-4f) / 6.0f;
  uint8_t code = f32_to_f8e4m3(want);  // nearest; positive codes increase with the value
  if (f8e4m3_to_f32(code) < want && code < kE4m3MaxCode) ++code;
  return f8e4m3_to_f32(code);
}

uint8_t f32_to_e2m1(float v) {
  // Midpoints between the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; a tie goes to the even code
  // (<= where the lower neighbour's code is even, < where the upper one's is).
  const float a = std::fabs(v);
  uint8_t code = 7;
  if (a <= 0.25f) {
    code = 0;
  } else if (a < 0.75f) {
    code = 1;
  } else if (a <= 1.25f) {
    code = 2;
  } else if (a < 1.75f) {
    code = 3;
  } else if (a <= 2.5f) {
    code = 4;
  } else if (a < 3.5f) {
    code = 5;
  } else if (a <= 5.0f) {
    code = 6;
  }
  return static_cast<uint8_t>(code | (v < 0.0f ? 8 : 0));
}

void encode_v41_fp8(const float* x, int64_t dim, uint8_t* record) {
  uint8_t* scales = record + dim;
  for (int64_t g = 0; g * kV41Fp8Group < dim; ++g) {
    const int64_t c0 = g * kV41Fp8Group;
    const int64_t c1 = std::min(dim, c0 + kV41Fp8Group);
    const float scale = fp8_scale(amax_of(x + c0, c1 - c0));
    for (int64_t c = c0; c < c1; ++c) record[c] = f32_to_f8e4m3(x[c] / scale);
    scales[g] = e8m0_code(scale);
  }
}

void decode_v41_fp8(const uint8_t* record, int64_t dim, float* x) {
  const uint8_t* scales = record + dim;
  for (int64_t c = 0; c < dim; ++c) {
    x[c] = f8e4m3_to_f32(record[c]) * e8m0_to_f32(scales[c / kV41Fp8Group]);
  }
}

void encode_v41_fp4_main(const float* x, int64_t dim, uint8_t* record) {
  uint8_t* scales = record + ceil_div(dim, 2);
  pack_e2m1(
      x, dim, kV41Fp4MainGroup,
      [&](int64_t g, float amax) {
        const float scale = fp4_e4m3_scale(amax);
        scales[g] = f32_to_f8e4m3(scale);  // exact: scale is an e4m3 value
        return scale;
      },
      record);
}

void decode_v41_fp4_main(const uint8_t* record, int64_t dim, float* x) {
  const uint8_t* scales = record + ceil_div(dim, 2);
  for (int64_t c = 0; c < dim; ++c) {
    x[c] = e2m1_channel(record, c) * f8e4m3_to_f32(scales[c / kV41Fp4MainGroup]);
  }
}

void encode_v41_fp4_index(const float* x, int64_t dim, uint8_t* record) {
  uint8_t* scales = record + ceil_div(dim, 2);
  pack_e2m1(
      x, dim, kV41Fp4IndexGroup,
      [&](int64_t g, float amax) {
        const float scale = fp4_ue8m0_scale(amax);
        scales[g] = e8m0_code(scale);
        return scale;
      },
      record);
}

void decode_v41_fp4_index(const uint8_t* record, int64_t dim, float* x) {
  const uint8_t* scales = record + ceil_div(dim, 2);
  for (int64_t c = 0; c < dim; ++c) {
    x[c] = e2m1_channel(record, c) * e8m0_to_f32(scales[c / kV41Fp4IndexGroup]);
  }
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

bool is_kv_cache_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kE2M1x2:
      return true;
    default:
      return false;
  }
}

int64_t RowCodec::row_width() const {
  switch (dtype) {
    case DType::kU8:
      return rope_dim > 0 ? main_record_bytes(dim, rope_dim) : index_record_bytes(dim);
    case DType::kF8E4M3:
      return v41_fp8_record_bytes(dim);
    case DType::kE2M1x2:
      return rope_dim > 0 ? v41_fp4_main_record_bytes(dim) : v41_fp4_index_record_bytes(dim);
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
    case DType::kF8E4M3:
      encode_v41_fp8(x, dim, static_cast<uint8_t*>(row));
      return;
    case DType::kE2M1x2:
      if (rope_dim > 0) {
        encode_v41_fp4_main(x, dim, static_cast<uint8_t*>(row));
      } else {
        encode_v41_fp4_index(x, dim, static_cast<uint8_t*>(row));
      }
      return;
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
    case DType::kF8E4M3:
      decode_v41_fp8(static_cast<const uint8_t*>(row), dim, x);
      return;
    case DType::kE2M1x2:
      if (rope_dim > 0) {
        decode_v41_fp4_main(static_cast<const uint8_t*>(row), dim, x);
      } else {
        decode_v41_fp4_index(static_cast<const uint8_t*>(row), dim, x);
      }
      return;
    default:
      if (rope_dim > 0) {
        decode_main(static_cast<const uint8_t*>(row), dim, rope_dim, x);
      } else {
        decode_index(static_cast<const uint8_t*>(row), dim, x);
      }
  }
}

}  // namespace deepinfer::kv_record
