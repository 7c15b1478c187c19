// The KV cache row formats on the device (docs/model.md#kv-cache-dtypes): the device twin of
// cpp/src/tensor/kv_record.h, which defines the bytes. Encoding here is bit-identical to the
// host's RowCodec::encode (same power-of-two scales, e4m3 and bf16 rounded to nearest even), and
// decoding is exact (e4m3 times a power of two, bf16 widened), so the CPU reference stays the
// oracle of every KV dtype.
//
// A row of the cache is `row_bytes` bytes in one of these formats:
//  - kF32:  dim floats;
//  - kBf16: dim bf16;
//  - kFp8:  V4's main record when rope_dim > 0 (e4m3 non-RoPE channels, bf16 RoPE channels, one
//           e8m0 scale per 64 non-RoPE channels), V4's index-key record when rope_dim == 0 (e4m3
//           channels, one f32 scale);
//  - kV41Fp8:      V4.1's FP8 record (kF8E4M3 caches): dim e4m3, one UE8M0 scale per 32;
//  - kV41Fp4Main:  V4.1's FP4 main record (kE2M1x2, rope_dim > 0): e2m1 pairs, an e4m3 scale
//                  per 16 channels;
//  - kV41Fp4Index: V4.1's FP4 index-key record (kE2M1x2, rope_dim == 0): e2m1 pairs, a UE8M0
//                  scale per 32 channels.
// V4.1's records have no alignment (a tiny model's rows may be 9 or 33 bytes): they are read and
// written byte by byte.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/e4m3_bits.h"
#include "cuda/common/fp8.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "tensor/kv_record.h"

namespace deepinfer::cuda {

enum class KvFormat : int {
  kF32 = 0,
  kBf16 = 1,
  kFp8 = 2,
  kV41Fp8 = 3,
  kV41Fp4Main = 4,
  kV41Fp4Index = 5,
};

// The format of a cache tensor of `dtype` (the front checks admit only the KV cache dtypes).
inline KvFormat kv_format_of(DType dtype, int64_t rope_dim) {
  switch (dtype) {
    case DType::kBF16:
      return KvFormat::kBf16;
    case DType::kU8:
      return KvFormat::kFp8;
    case DType::kF8E4M3:
      return KvFormat::kV41Fp8;
    case DType::kE2M1x2:
      return rope_dim > 0 ? KvFormat::kV41Fp4Main : KvFormat::kV41Fp4Index;
    default:
      return KvFormat::kF32;
  }
}

// Whether f is one of V4.1's records (byte-wise, decoded by decode_kv4 only).
__host__ __device__ inline bool is_v41_format(KvFormat f) {
  return f == KvFormat::kV41Fp8 || f == KvFormat::kV41Fp4Main || f == KvFormat::kV41Fp4Index;
}

// One cache's row format, passed to kernels by value.
struct KvRowFormat {
  KvFormat format = KvFormat::kF32;
  int dim = 0;
  int rope_dim = 0;       // > 0: the fp8 main record; 0: the fp8 index-key record
  int64_t row_bytes = 0;  // bytes of one row in the cache

  __host__ __device__ int nope() const { return dim - rope_dim; }
};

inline KvRowFormat kv_row_format(DType dtype, int64_t dim, int64_t rope_dim) {
  const kv_record::RowCodec codec{dtype, dim, rope_dim};
  return KvRowFormat{kv_format_of(dtype, rope_dim), static_cast<int>(dim),
                     static_cast<int>(rope_dim), codec.row_bytes()};
}

// Refuses an fp8 main record with an odd number of non-RoPE channels: its bf16 RoPE channels
// would not be 2-byte aligned, and byte-wise stores of them measured wrong on the H200 (nvcc
// 13.0: the bytes read back as zero), so the device kernels take even counts only. V4 has 448.
inline void check_kv_row_format(const char* op, const KvRowFormat& f) {
  if (f.format == KvFormat::kFp8 && f.rope_dim > 0 && f.nope() % 2 != 0) {
    throw Error(ErrorCode::kUnsupported,
                std::string(op) +
                    ": an fp8 KV record needs an even number of non-RoPE channels "
                    "on CUDA, got dim " +
                    std::to_string(f.dim) + " with rope_dim " + std::to_string(f.rope_dim));
  }
}

// The e4m3 byte of v (|v| <= 448 by construction of the scale), nearest even.
__device__ __forceinline__ uint8_t kv_e4m3_byte(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float kv_e4m3_value(uint32_t byte) {
  return __half2float(
      __half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3)));
}

__device__ __forceinline__ uint16_t kv_bf16_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float kv_bf16_value(uint32_t bits) {
  return __uint_as_float(bits << 16);
}

// The UE8M0 power of two 2^ceil(log2(max(amax, 1e-4) / 6)) of an e2m1 group
// (kv_record::fp4_ue8m0_scale).
__device__ __forceinline__ float kv_fp4_ue8m0_scale(float amax) {
  const float ratio = __fdiv_rn(fmaxf(amax, 1e-4f), 6.0f);
  const uint32_t bits = __float_as_uint(ratio);
  const uint32_t exponent = (bits >> 23) + ((bits & 0x7fffffu) != 0 ? 1u : 0u);
  return __uint_as_float(exponent << 23);
}

// The e4m3 code of the smallest e4m3 value >= max(amax, 1e-4) / 6, at most 448
// (kv_record::fp4_e4m3_scale).
__device__ __forceinline__ uint32_t kv_fp4_e4m3_scale_code(float amax) {
  const float want = __fdiv_rn(fmaxf(amax, 1e-4f), 6.0f);
  uint32_t code = kv_e4m3_byte(want);
  if (kv_e4m3_value(code) < want && code < 0x7eu) ++code;
  return code;
}

// The e2m1 nibble nearest to v, ties to the even code, saturating (kv_record::f32_to_e2m1).
__device__ __forceinline__ uint32_t kv_e2m1_nibble(float v) {
  const float a = fabsf(v);
  uint32_t code = 7;
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
  return code | (v < 0.0f ? 8u : 0u);
}

// V4.1's records (kv_record.h) with the whole block: warp w encodes the scale groups w,
// w + warps, ..., one lane per channel; the even lane of a pair stores the byte of two e2m1s.
__device__ __forceinline__ void encode_v41_row(const float* __restrict__ x,
                                               uint8_t* __restrict__ dst, const KvRowFormat& f) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int dim = f.dim;
  const int group = f.format == KvFormat::kV41Fp4Main ? kv_record::kV41Fp4MainGroup : 32;
  const int groups = (dim + group - 1) / group;
  uint8_t* scales = dst + (f.format == KvFormat::kV41Fp8 ? dim : (dim + 1) / 2);
  for (int g = warp; g < groups; g += warps) {
    const int c = g * group + lane;
    const bool mine = lane < group && c < dim;
    const float v = mine ? x[c] : 0.0f;
    const float amax = warp_max(fabsf(v));
    if (f.format == KvFormat::kV41Fp8) {
      const float scale = act_group_scale(amax);
      if (mine) dst[c] = kv_e4m3_byte(__fdiv_rn(v, scale));
      if (lane == 0) scales[g] = static_cast<uint8_t>(__float_as_uint(scale) >> 23);
      continue;
    }
    float scale = 0.0f;
    uint32_t scale_byte = 0;
    if (f.format == KvFormat::kV41Fp4Main) {
      scale_byte = kv_fp4_e4m3_scale_code(amax);
      scale = kv_e4m3_value(scale_byte);
    } else {
      scale = kv_fp4_ue8m0_scale(amax);
      scale_byte = __float_as_uint(scale) >> 23;
    }
    const uint32_t nibble = mine ? kv_e2m1_nibble(__fdiv_rn(v, scale)) : 0u;
    const uint32_t high = __shfl_down_sync(0xffffffffu, nibble, 1);
    // Groups start at even channels: the even lane of a pair holds the low nibble.
    if (mine && (lane & 1) == 0) dst[c / 2] = static_cast<uint8_t>(nibble | (high << 4));
    if (lane == 0) scales[g] = static_cast<uint8_t>(scale_byte);
  }
}

// Encodes the row x (dim floats) into dst (f.row_bytes bytes) with the whole block (blockDim.x a
// multiple of 32). No barrier inside: the block's threads write disjoint bytes.
__device__ __forceinline__ void encode_kv_row(const float* __restrict__ x,
                                              uint8_t* __restrict__ dst, const KvRowFormat& f) {
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;
  switch (f.format) {
    case KvFormat::kF32: {
      float* out = reinterpret_cast<float*>(dst);
      for (int c = tid; c < f.dim; c += nthreads) out[c] = x[c];
      return;
    }
    case KvFormat::kBf16: {
      uint16_t* out = reinterpret_cast<uint16_t*>(dst);
      for (int c = tid; c < f.dim; c += nthreads) out[c] = kv_bf16_bits(x[c]);
      return;
    }
    case KvFormat::kFp8:
      break;
    case KvFormat::kV41Fp8:
    case KvFormat::kV41Fp4Main:
    case KvFormat::kV41Fp4Index:
      encode_v41_row(x, dst, f);
      return;
  }
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warps = nthreads >> 5;
  if (f.rope_dim == 0) {
    // Index-key record: one scale over all channels, computed by warp 0 alone.
    if (warp != 0) return;
    float amax = 0.0f;
    for (int c = lane; c < f.dim; c += 32) amax = fmaxf(amax, fabsf(x[c]));
    const float scale = act_group_scale(warp_max(amax));
    for (int c = lane; c < f.dim; c += 32) dst[c] = kv_e4m3_byte(__fdiv_rn(x[c], scale));
    if (lane == 0) {
      const uint32_t bits = __float_as_uint(scale);
      for (int i = 0; i < 4; ++i) dst[f.dim + i] = static_cast<uint8_t>(bits >> (8 * i));
    }
    return;
  }
  // Main record: warp w encodes the 64-channel groups w, w + warps, ...
  const int nope = f.nope();
  const int groups = (nope + kv_record::kFp8Group - 1) / kv_record::kFp8Group;
  uint8_t* scales = dst + nope + 2 * f.rope_dim;
  for (int g = warp; g < groups; g += warps) {
    const int c0 = g * kv_record::kFp8Group;
    const int c1 = min(nope, c0 + kv_record::kFp8Group);
    float amax = 0.0f;
    for (int c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(x[c]));
    const float scale = act_group_scale(warp_max(amax));
    for (int c = c0 + lane; c < c1; c += 32) dst[c] = kv_e4m3_byte(__fdiv_rn(x[c], scale));
    if (lane == 0) scales[g] = static_cast<uint8_t>(__float_as_uint(scale) >> 23);
  }
  // nope is even (check_kv_row_format): the bf16 RoPE channels are 2-byte aligned.
  uint16_t* rope = reinterpret_cast<uint16_t*>(dst + nope);
  for (int i = tid; i < f.rope_dim; i += nthreads) rope[i] = kv_bf16_bits(x[nope + i]);
  const int used = nope + 2 * f.rope_dim + groups;
  for (int i = used + tid; i < f.row_bytes; i += nthreads) dst[i] = 0;
}

// Channels c .. c+3 of a row (c a multiple of 4; dim, rope_dim and dim - rope_dim multiples of
// 4, which the callers check), decoded exactly.
__device__ __forceinline__ float4 decode_kv4(const uint8_t* __restrict__ row, const KvRowFormat& f,
                                             int c) {
  switch (f.format) {
    case KvFormat::kF32:
      return *reinterpret_cast<const float4*>(row + 4 * c);
    case KvFormat::kBf16: {
      const uint2 v = *reinterpret_cast<const uint2*>(row + 2 * c);
      return make_float4(kv_bf16_value(v.x & 0xffffu), kv_bf16_value(v.x >> 16),
                         kv_bf16_value(v.y & 0xffffu), kv_bf16_value(v.y >> 16));
    }
    case KvFormat::kFp8:
      break;
    case KvFormat::kV41Fp8: {
      const float scale = e8m0_to_float(row[f.dim + c / kv_record::kV41Fp8Group]);
      return make_float4(kv_e4m3_value(row[c]) * scale, kv_e4m3_value(row[c + 1]) * scale,
                         kv_e4m3_value(row[c + 2]) * scale, kv_e4m3_value(row[c + 3]) * scale);
    }
    case KvFormat::kV41Fp4Main:
    case KvFormat::kV41Fp4Index: {
      const uint8_t* scales = row + (f.dim + 1) / 2;
      const float scale = f.format == KvFormat::kV41Fp4Main
                              ? kv_e4m3_value(scales[c / kv_record::kV41Fp4MainGroup])
                              : e8m0_to_float(scales[c / kv_record::kV41Fp4IndexGroup]);
      const uint32_t lo = row[c / 2];
      const uint32_t hi = row[c / 2 + 1];
      return make_float4(e2m1_to_float(lo & 0xfu) * scale, e2m1_to_float(lo >> 4) * scale,
                         e2m1_to_float(hi & 0xfu) * scale, e2m1_to_float(hi >> 4) * scale);
    }
  }
  const int nope = f.nope();
  if (c >= nope) {  // RoPE channels, bf16
    const uint32_t* r = reinterpret_cast<const uint32_t*>(row + nope + 2 * (c - nope));
    const uint32_t a = r[0];
    const uint32_t b = r[1];
    return make_float4(kv_bf16_value(a & 0xffffu), kv_bf16_value(a >> 16),
                       kv_bf16_value(b & 0xffffu), kv_bf16_value(b >> 16));
  }
  const uint32_t q = *reinterpret_cast<const uint32_t*>(row + c);
  const float scale =
      f.rope_dim > 0
          ? e8m0_to_float(row[nope + 2 * f.rope_dim + c / kv_record::kFp8Group])
          : *reinterpret_cast<const float*>(row + f.dim);  // index record: 4-byte aligned
  return make_float4(kv_e4m3_value(q & 0xffu) * scale, kv_e4m3_value((q >> 8) & 0xffu) * scale,
                     kv_e4m3_value((q >> 16) & 0xffu) * scale, kv_e4m3_value(q >> 24) * scale);
}

// Eight e4m3 codes (bytes, in channel order) times `scale`, rounded to bf16 (exact products in
// f32, one rounding) through the conversion units: e4m3 -> f16 -> f32.
__device__ __forceinline__ uint4 e4m3_chunk_to_bf16(uint2 bytes, float scale) {
  uint32_t packed[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t word = k < 2 ? bytes.x : bytes.y;
    const uint32_t pair = (word >> (16 * (k & 1))) & 0xffffu;
    const __half2 h =
        __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3));
    const float2 f = __half22float2(h);
    packed[k] = pack_bf16(f.x * scale, f.y * scale);
  }
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// The bf16x2 bits of an e8m0 scale 2^(e - 127) in both halves (e8m0_to_float's value: 2^-127, a
// bf16 subnormal, for e = 0; infinity for e = 255).
__device__ __forceinline__ uint32_t e8m0_to_bf16x2(uint32_t e) {
  const uint32_t bits = e == 0 ? 0x0040u : e << 7;
  return bits | (bits << 16);
}

// e4m3_chunk_to_bf16 without conversion units, for `scale` = e8m0_to_bf16x2 of the group's byte:
// each pair of codes through the integer e4m3 -> bf16 form (cuda/common/e4m3_bits.h: a byte
// permute, a shift and a mask give the code times 2^-120), then two exact bf16 products, by 2^120
// and by the scale, which round once as the f32 product's rounding to bf16 does. Hopper runs
// e4m3 -> f16, f16 -> f32 and f32 -> bf16 at a quarter of the integer rate, and a key tile's
// decode is all conversions. tests/cpp/test_e4m3_bits.cpp checks every code and every scale the
// KV writer stores against the reference; NaN codes, which it never stores, decode to finite
// values here.
__device__ __forceinline__ uint4 decode_e4m3_chunk(uint2 bytes, uint32_t scale) {
  using e4m3_bits::e4m3x2_to_bf16x2_times_2m120;
  constexpr uint32_t kTwoPow120 = e4m3_bits::kBf16TwoPow120 * 0x10001u;
  const uint32_t pairs[4] = {
      e4m3x2_to_bf16x2_times_2m120<false>(bytes.x), e4m3x2_to_bf16x2_times_2m120<true>(bytes.x),
      e4m3x2_to_bf16x2_times_2m120<false>(bytes.y), e4m3x2_to_bf16x2_times_2m120<true>(bytes.y)};
  uint32_t packed[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) packed[k] = mul_bf16x2(mul_bf16x2(pairs[k], kTwoPow120), scale);
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// Channels c .. c+7 of V4's main fp8 record (rope_dim > 0; c a multiple of 8, nope a multiple of
// 8) as eight bf16 for a tensor-core tile: the bf16 RoPE channels as stored (8-byte aligned), the
// e4m3 codes times their group's e8m0 scale rounded to bf16 (the attention kernels' key tiles).
__device__ __forceinline__ uint4 fp8_record_chunk_bf16(const uint8_t* rec, int c, int nope,
                                                       int rope_dim) {
  if (c >= nope) {
    const uint2 lo = *reinterpret_cast<const uint2*>(rec + nope + 2 * (c - nope));
    const uint2 hi = *reinterpret_cast<const uint2*>(rec + nope + 2 * (c - nope) + 8);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
  return e4m3_chunk_to_bf16(*reinterpret_cast<const uint2*>(rec + c),
                            e8m0_to_float(rec[nope + 2 * rope_dim + c / kv_record::kFp8Group]));
}

}  // namespace deepinfer::cuda
