// The wgmma_overlap_ilp variant's output (sm90/attention_wgmma_overlap.cu): store_output's
// values, staged through a free key buffer so that the global stores are whole rows. Stored from
// the accumulators, each warp instruction writes 8 heads' 32 bytes (8 lines for 256 bytes; a
// warpgroup's 64 KB is 4,096 such instructions); staged, it writes 512 contiguous bytes of one
// head (4 lines), and 64 KB takes 128 instructions plus the shared-memory round trip.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"

namespace deepinfer::cuda::attention_wgmma {

// A row's output factor with one split: the softmax's 1 / (d + e^(sink - m)), computed about
// max(m, sink) so that neither exponential overflows; 0 for a row with no real key (m = -inf).
__device__ __forceinline__ float output_row_factor(float m, float d, float sink) {
  const float mx = fmaxf(m, sink);
  const float em = m == -INFINITY ? 0.0f : expf(m - mx);
  return em / (d * em + expf(sink - mx));
}

// The stage: warpgroup wg's 64 rows x 256 f32 channels, a row 1 KB, its 16-byte units XOR-ed
// with row % 8 so that the accumulators' stores (8 rows x 32 bytes per warp instruction) and the
// rows' loads (512 contiguous bytes) are both free of bank conflicts.
__device__ __forceinline__ uint32_t staged_offset(int row, int unit) {
  return static_cast<uint32_t>(row * 1024 + ((unit ^ (row & 7)) << 4));
}

// Split `split` of `splits`: the block's unless a persistent launch walks other units.
// store_output's writes (out with one split, else part_acc and part_md), the same values:
// every thread of warpgroup wg stages its accumulators (times the rows' factor with one split,
// as store_output multiplies them) into `stage` (64 KB, free: no product reads it any more),
// syncs the warpgroup on named barrier `barrier` (128 threads), then each warp copies 16 rows.
// With a.out_bf16 (one split) the rows are rounded to bf16 as they are copied: 512 bytes of a
// row per warp instruction instead of 1 KB, the f32 values' nearest-even bf16s.
__device__ __forceinline__ void store_output_staged(const AttentionArgs& a, const DeviceLayout& l,
                                                    const float (&o)[kOAcc],
                                                    const float (&m_run)[2], const float (&d)[2],
                                                    int t, int h_first, int wg, int row0, int qd,
                                                    int split, int splits, uint8_t* stage,
                                                    int barrier) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const int64_t head = h_first + row;
    const int64_t idx = static_cast<int64_t>(t) * a.heads + head;
    float f = 1.0f;
    if (splits == 1) {
      f = output_row_factor(m_run[r], d[r], a.sinks[head]);
    } else if (wg == 0 && qd == 0) {
      const int64_t pidx = static_cast<int64_t>(split) * l.num_tokens * a.heads + idx;
      a.part_md[2 * pidx] = m_run[r];
      a.part_md[2 * pidx + 1] = d[r];
    }
#pragma unroll
    for (int j = 0; j < kOAcc / 4; ++j) {
      // Channels 8j + 2qd, + 1: unit 2j + qd / 2, bytes 8 (qd % 2) of it.
      const float x = o[4 * j + 2 * r], y = o[4 * j + 2 * r + 1];
      const float2 v = splits == 1 ? make_float2(x * f, y * f) : make_float2(x, y);
      *reinterpret_cast<float2*>(stage + staged_offset(row, 2 * j + (qd >> 1)) + 8 * (qd & 1)) = v;
    }
  }
  named_barrier<kRows * 2>(barrier);  // the warpgroup's 128 threads: all rows staged
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x >> 5) & 3;
  if (splits == 1 && a.out_bf16 != nullptr) {
#pragma unroll 4
    for (int k = 0; k < kRows / 4; ++k) {
      const int row = 16 * warp + k;
      const int64_t idx = static_cast<int64_t>(t) * a.heads + h_first + row;
      __nv_bfloat16* dst = a.out_bf16 + idx * kDim + kHalfDim * wg;
#pragma unroll
      for (int u = lane; u < kHalfDim / 4; u += 32) {
        const float4 v = *reinterpret_cast<const float4*>(stage + staged_offset(row, u));
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 packed;
        memcpy(&packed.x, &lo, 4);
        memcpy(&packed.y, &hi, 4);
        *reinterpret_cast<uint2*>(dst + 4 * u) = packed;
      }
    }
    return;
  }
#pragma unroll 4
  for (int k = 0; k < kRows / 4; ++k) {
    const int row = 16 * warp + k;
    const int64_t idx = static_cast<int64_t>(t) * a.heads + h_first + row;
    float* dst =
        splits == 1
            ? a.out + idx * kDim
            : a.part_acc + (static_cast<int64_t>(split) * l.num_tokens * a.heads + idx) * kDim;
    dst += kHalfDim * wg;
#pragma unroll
    for (int u = lane; u < kHalfDim / 4; u += 32) {
      *reinterpret_cast<float4*>(dst + 4 * u) =
          *reinterpret_cast<const float4*>(stage + staged_offset(row, u));
    }
  }
}

// The persistent pairs' output (one split, bf16 out): store_output_staged's bf16 rows, staged
// in bf16 through warpgroup wg's half of q's tile (32 KB at `stage`: free once the block's
// scores are done, while the key buffers may already hold the next unit's tiles). A row is
// 512 bytes, its 16-byte units XOR-ed with row % 8 (the accumulators' stores, 8 rows x 16 bytes
// per warp instruction, and a row's loads are free of bank conflicts). stage_output_bf16 stages
// the rows and syncs the warpgroup on `barrier`; copy_output_bf16 then writes them, a row per
// warp instruction (16 bytes a lane).
__device__ __forceinline__ uint32_t staged_bf16_offset(int row, int unit) {
  return static_cast<uint32_t>(row * 512 + ((unit ^ (row & 7)) << 4));
}

__device__ __forceinline__ void stage_output_bf16(const AttentionArgs& a, const float (&o)[kOAcc],
                                                  const float (&m_run)[2], const float (&d)[2],
                                                  int h_first, int row0, int qd, uint8_t* stage,
                                                  int barrier) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const float f = output_row_factor(m_run[r], d[r], a.sinks[h_first + row]);
#pragma unroll
    for (int j = 0; j < kOAcc / 4; ++j) {
      // Channels 8j + 2qd, + 1: unit j, bytes 4 qd of it (rounded as store_output_staged does).
      const __nv_bfloat162 v =
          __floats2bfloat162_rn(o[4 * j + 2 * r] * f, o[4 * j + 2 * r + 1] * f);
      memcpy(stage + staged_bf16_offset(row, j) + 4 * qd, &v, 4);
    }
  }
  named_barrier<kRows * 2>(barrier);  // the warpgroup's 128 threads: all rows staged
}

__device__ __forceinline__ void copy_output_bf16(const AttentionArgs& a, int t, int h_first, int wg,
                                                 const uint8_t* stage) {
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x >> 5) & 3;
#pragma unroll 4
  for (int k = 0; k < kRows / 4; ++k) {
    const int row = 16 * warp + k;
    const int64_t idx = static_cast<int64_t>(t) * a.heads + h_first + row;
    __nv_bfloat16* dst = a.out_bf16 + idx * kDim + kHalfDim * wg;
    *reinterpret_cast<int4*>(dst + 8 * lane) =
        *reinterpret_cast<const int4*>(stage + staged_bf16_offset(row, lane));
  }
}

}  // namespace deepinfer::cuda::attention_wgmma
