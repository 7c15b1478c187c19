// Device helpers of DeepSeek's low-precision formats (docs/model.md#quantized-checkpoints): the
// e4m3 rounding and power-of-two group scale of dynamic activation quantization, and the e8m0
// and e2m1 decodes of block-scaled weights, each bit for bit its host twin in deepinfer/dtype.h
// and deepinfer/weight.h; and the e4m3 tensor-core product.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

// Nearest e4m3 value (ties to even), saturating at +-448, as f32 (host: round_to_f8e4m3).
__device__ __forceinline__ float round_to_e4m3(float v) {
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
}

// The scale of an activation group with max |x| `amax`: 2^ceil(log2(max(amax, 1e-4) / 448))
// (host: quantize_activation_rows). The ratio is a normal f32, so its exponent field decides.
__device__ __forceinline__ float act_group_scale(float amax) {
  const float ratio = fmaxf(amax, 1e-4f) / 448.0f;
  uint32_t bits = __float_as_uint(ratio);
  const uint32_t exponent = (bits >> 23) + ((bits & 0x7fffffu) != 0 ? 1u : 0u);
  return __uint_as_float(exponent << 23);
}

// v / scale (inv = 1 / scale) as four e4m3 codes, byte i from component i: the activation
// quantization's rounding (saturating at +-448, as the host's round_to_f8e4m3).
__device__ __forceinline__ uint32_t e4m3x4_of(float4 v, float inv) {
  const float f[4] = {v.x, v.y, v.z, v.w};
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    packed |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(f[i] * inv, __NV_SATFINITE, __NV_E4M3))
              << (8 * i);
  }
  return packed;
}

// The exact f16 values of codes 2 h and 2 h + 1 of `codes` (the lower half from the lower code).
__device__ __forceinline__ uint32_t f16x2_of_e4m3x2(uint32_t codes, int h) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>((codes >> (16 * h)) & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
}

// d = A (16 x 32 e4m3, rows g / g + 8) . B (32 x 8 e4m3) + d (sm_89+): exact products summed in
// f32, unlike FP8 wgmma, whose sums keep fewer bits (sm90/fp8_wgmma.cu's header).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 2^(e - 127) (e == 255, NaN, is rejected at load).
__device__ __forceinline__ float e8m0_to_float(uint8_t e) {
  return e == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(static_cast<uint32_t>(e) << 23);
}

// One e2m1 nibble: bit 3 sign, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
__device__ __forceinline__ float e2m1_to_float(uint32_t nibble) {
  // Magnitude m = code / 2 for codes 0..4 and 3, 4, 6 for 5..7: 0.5 * {0,1,2,3,4,6,8,12}.
  constexpr uint32_t kTwice = 0xc8643210u;  // 4-bit lanes: 0,1,2,3,4,6,8,12 (x2 of magnitude)
  const float m = 0.5f * static_cast<float>((kTwice >> (4 * (nibble & 7u))) & 0xfu);
  return (nibble & 8u) != 0 ? -m : m;
}

}  // namespace deepinfer::cuda
