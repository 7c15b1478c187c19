// The KV cache row formats on the device (docs/model.md#kv-cache-dtypes): the device twin of
// cpp/src/tensor/kv_record.h, which defines the bytes. Encoding here is bit-identical to the
// host's RowCodec::encode (same power-of-two scales, e4m3 and bf16 rounded to nearest even), and
// decoding is exact (e4m3 times a power of two, bf16 widened), so the CPU reference stays the
// oracle of every KV dtype.
//
// A row of the cache is `row_bytes` bytes in one of three formats:
//  - kF32:  dim floats;
//  - kBf16: dim bf16;
//  - kFp8:  the main record when rope_dim > 0 (e4m3 non-RoPE channels, bf16 RoPE channels, one
//           e8m0 scale per 64 non-RoPE channels), the index-key record when rope_dim == 0 (e4m3
//           channels, one f32 scale).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/fp8.cuh"
#include "cuda/common/reduce.cuh"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "tensor/kv_record.h"

namespace deepinfer::cuda {

enum class KvFormat : int { kF32 = 0, kBf16 = 1, kFp8 = 2 };

// The format of a cache tensor of `dtype` (the front checks admit only these three).
inline KvFormat kv_format_of(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return KvFormat::kBf16;
    case DType::kU8:
      return KvFormat::kFp8;
    default:
      return KvFormat::kF32;
  }
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
  return KvRowFormat{kv_format_of(dtype), static_cast<int>(dim), static_cast<int>(rope_dim),
                     codec.row_bytes()};
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

}  // namespace deepinfer::cuda
