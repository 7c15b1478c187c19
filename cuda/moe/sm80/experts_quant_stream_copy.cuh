// The streaming expert kernels' copies into their shared-memory ring (experts_quant_stream.cu,
// whose header describes the ring): the lanes' weight chunks and scales, the activation pieces,
// and the lean kernel's loop-carried fill of one slot. In quant_tile with the tile's pieces.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/moe/sm80/experts_quant_config.h"
#include "cuda/moe/sm80/experts_quant_tile.cuh"

namespace deepinfer::cuda::quant_tile {

// The lane's chunk c = (2 mt + hr) kLoads + l of a slice, in slot `slot` of the weight ring
// [kStages][chunks][kThreads] (uint4): a warp's 16-byte reads of one chunk are contiguous.
template <class C>
__device__ __forceinline__ uint4* weight_chunk(uint4* ring, int slot, int chunks, int c, int tid) {
  return ring + (static_cast<int64_t>(slot) * chunks + c) * C::kThreads + tid;
}

// cp.async to a 32-bit shared-memory address (the lean kernel keeps its destinations as such):
// 16 bytes with the L2 prefetch of the weight stream, 16 bytes of which the source gives
// `src_bytes` (16 or 0: zeros without a branch; the source address must still be valid), and 4
// bytes through L1.
__device__ __forceinline__ void cp_async_16_to(uint32_t dst, const void* src) {
  static_assert(kExpertQuantStreamL2Prefetch == 128, "the prefetch size written below");
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_16_zfill_to(uint32_t dst, const void* src,
                                                     uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_4_to(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

// Copies the lane's weight chunks of slice `slice` into ring slot `slot`; chunks at or past K
// (wholly: K is a multiple of the chunk) are zeros, stored by the lane itself. k_lane: the
// lane's first input of slice 0 (q kChunk).
template <QuantFormat F, class C>
__device__ __forceinline__ void copy_weight_slice(uint4* ring, int slot,
                                                  const WeightRows<C::kMTiles>& rows, int slice,
                                                  int k_lane, int K, int tid) {
  using Tr = QuantTraits<F>;
  constexpr int kChunks = C::kMTiles * 2 * Tr::kLoads;
  constexpr int kSliceBytes = Tr::kMx ? kQuantSliceK / 2 : kQuantSliceK;  // per row
#pragma unroll
  for (int l = 0; l < Tr::kLoads; ++l) {
    const int k0 = slice * kQuantSliceK + l * 4 * Tr::kChunk + k_lane;
    const int off = slice * kSliceBytes + l * 64;
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        uint4* dst = weight_chunk<C>(ring, slot, kChunks, (2 * mt + hr) * Tr::kLoads + l, tid);
        if (k0 < K) {
          cp_async_16_prefetch<kExpertQuantStreamL2Prefetch>(dst, rows.values[mt][hr] + off);
        } else {
          *dst = make_uint4(0, 0, 0, 0);
        }
      }
    }
  }
}

// The lane's scales of slice `slice` (MXFP4: the e8m0 byte of each chunk; FP8: the f32 bits of
// the chunk's block), neutral past K. Read through L1, one slice ahead of their use.
template <QuantFormat F, int kMTiles, bool kLean>
__device__ __forceinline__ void load_scales(uint32_t (&sc)[kMTiles][2][QuantTraits<F>::kLoads],
                                            const WeightRows<kMTiles>& rows, int slice, int k_lane,
                                            int K, int block_cols_log2) {
  using Tr = QuantTraits<F>;
#pragma unroll
  for (int l = 0; l < Tr::kLoads; ++l) {
    const int k0 = slice * kQuantSliceK + l * 4 * Tr::kChunk + k_lane;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        if (!kLean && k0 >= K) {
          sc[mt][hr][l] = Tr::kMx ? 127u : __float_as_uint(1.0f);
        } else if constexpr (Tr::kMx) {
          // The lane's group q is folded into the pointer: slice s adds its 4 groups.
          sc[mt][hr][l] = __ldg(static_cast<const uint8_t*>(rows.scales[mt][hr]) + 4 * slice);
        } else {
          sc[mt][hr][l] = __float_as_uint(
              __ldg(static_cast<const float*>(rows.scales[mt][hr]) + (k0 >> block_cols_log2)));
        }
      }
    }
  }
}

// MXFP4 lean: the e8m0 scales of the CTA's weight row `tid` (rows in lane order: warp w's rows
// 32 w + 16 mt + 8 hr + g are its lanes' rows g, g + 8 of m16 tile mt), whose 4 bytes of each
// slice this thread copies into the scale ring (clamped to N - 1 as the weight rows).
template <bool kGateUp, class C>
__device__ __forceinline__ const uint8_t* thread_scale_row(const QuantMatrices& lo,
                                                           const QuantMatrices& hi, int e,
                                                           int64_t n_cta, int64_t N,
                                                           int64_t kblocks, int tid) {
  static_assert(C::kMTiles == 2 && C::kThreads == C::kWeightRows, "one scale row per thread");
  constexpr int kHalf = kGateUp ? C::kMTiles / 2 : C::kMTiles;
  const int i = tid & 31;
  const int mt = i >> 4;
  int64_t n = n_cta + static_cast<int64_t>(tid >> 5) * 16 * kHalf + 16 * (mt % kHalf) + (i & 15);
  n = n < N ? n : N - 1;
  const QuantMatrices& m = (kGateUp && mt >= kHalf) ? hi : lo;
  return static_cast<const uint8_t*>(m.scales[e]) + n * kblocks;
}

// The thread's share of every slice's activation copies, fixed for the CTA (C::kThreads ==
// 16 kTok: thread tid copies the 16-byte piece tid % 16 of token row tid / 16 of each plane,
// stage_slice's assignment): its source at slice 0 (nullptr: zeros, a row past the tile) and its
// word offset in a slot (-1: a row past the staged ones, never read).
struct ActivationPiece {
  const __nv_bfloat16* src;
  int dst;
  uint32_t src_bytes = 16;  // lean pieces: 0 for a row past the tile (src: the staged rows' start)
};

template <bool kGateUp, class C, int kPlanes>
__device__ __forceinline__ ActivationPiece activation_piece(const __nv_bfloat16* a,
                                                            const int32_t* sorted_pair, int top_k,
                                                            int start, int rows, int staged,
                                                            int64_t Kp, int tid) {
  static_assert(C::kThreads == 16 * C::kTok, "one piece of each plane per thread");
  const int pp = tid & 15;
  const int r = tid >> 4;
  ActivationPiece p{nullptr, -1};
  if (r >= staged) return p;
  p.dst = r * kQuantRowWords + piece_word(pp >> 2, pp & 3);
  if (r < rows) {
    const int64_t row = kGateUp ? sorted_pair[start + r] / top_k : start + r;
    p.src = a + row * kPlanes * Kp + pp * 8;
  }
  return p;
}

// activation_piece for the lean kernel: every thread's piece is copied (rows past the staged
// ones too: never read), a row past the tile as 16 zero bytes (its source, `a` itself, is a valid
// address at every plane and slice offset and is not read).
template <bool kGateUp, class C, int kPlanes>
__device__ __forceinline__ ActivationPiece activation_piece_lean(const __nv_bfloat16* a,
                                                                 const int32_t* sorted_pair,
                                                                 int top_k, int start, int rows,
                                                                 int64_t Kp, int tid) {
  static_assert(C::kThreads == 16 * C::kTok, "one piece of each plane per thread");
  const int pp = tid & 15;
  const int r = tid >> 4;
  ActivationPiece p{a, r * kQuantRowWords + piece_word(pp >> 2, pp & 3), 0u};
  if (r < rows) {
    const int64_t row = kGateUp ? sorted_pair[start + r] / top_k : start + r;
    p.src = a + row * kPlanes * Kp + pp * 8;
    p.src_bytes = 16;
  }
  return p;
}

// Copies the thread's activation pieces of slice `slice` into `buf`
// [kPlanes][kTok][kQuantRowWords].
template <class C, int kPlanes>
__device__ __forceinline__ void copy_activation_slice(uint32_t* buf, const ActivationPiece& p,
                                                      int slice, int64_t Kp) {
  if (p.dst < 0) return;
#pragma unroll
  for (int pl = 0; pl < kPlanes; ++pl) {
    uint32_t* d = buf + p.dst + pl * C::kTok * kQuantRowWords;
    if (p.src != nullptr) {
      cp_async_16(d, p.src + pl * Kp + slice * kQuantSliceK);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// The lean kernel's copies of one slice into a ring slot, from sources that advance by one slice
// per fill (loop-carried: kept in registers instead of recomputed from the thread index every
// slice): the lane's weight chunks, the thread's activation piece (activation_piece_lean) and,
// for MXFP4, the 4 scale bytes of weight row `tid` (thread_scale_row). Destinations are 32-bit
// shared addresses in slot 0; K is a multiple of kQuantSliceK (no bounds checks).
// kTensorWeights: the weights come by tensor copies (TensorWeightFill), not these threads.
template <QuantFormat F, class C, int kPlanes, bool kTensorWeights = false>
struct LeanFill {
  using Tr = QuantTraits<F>;
  static constexpr int kChunks = C::kMTiles * 2 * Tr::kLoads;
  static constexpr uint32_t kWeightSlot = kChunks * C::kThreads * 16;
  static constexpr uint32_t kActPlane = C::kTok * kQuantRowWords * 4;
  static constexpr uint32_t kActSlot = kPlanes * kActPlane;
  static constexpr uint32_t kScaleSlot = C::kWeightRows * 4;
  static constexpr int kRowSliceBytes = Tr::kMx ? kQuantSliceK / 2 : kQuantSliceK;

  const uint8_t* weights[C::kMTiles][2];  // the next slice's first chunk of each lane row
  const __nv_bfloat16* act;               // the next slice's activation piece, plane 0
  const uint8_t* scales;                  // MXFP4: the next slice's scale bytes of row tid
  int64_t plane_elems;                    // Kp: elements between activation planes
  uint32_t act_bytes;                     // 16, or 0 for a row past the tile
  uint32_t weight_dst, act_dst, scale_dst;

  __device__ __forceinline__ void fill(int slot) {
    if constexpr (!kTensorWeights) {
      const uint32_t w = weight_dst + slot * kWeightSlot;
#pragma unroll
      for (int l = 0; l < Tr::kLoads; ++l) {
#pragma unroll
        for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            cp_async_16_to(w + ((2 * mt + hr) * Tr::kLoads + l) * C::kThreads * 16,
                           weights[mt][hr] + l * 64);
            if (l == Tr::kLoads - 1) weights[mt][hr] += kRowSliceBytes;
          }
        }
      }
    }
    const uint32_t a = act_dst + slot * kActSlot;
#pragma unroll
    for (int pl = 0; pl < kPlanes; ++pl) {
      cp_async_16_zfill_to(a + pl * kActPlane, act + pl * plane_elems, act_bytes);
    }
    act += kQuantSliceK;
    if constexpr (Tr::kMx) {
      cp_async_4_to(scale_dst + slot * kScaleSlot, scales);
      scales += 4;
    }
  }
};

// The lean MXFP4 kernel's weight copies by the tensor memory accelerator (sm_90): one thread
// moves a slice's weight rows of the CTA, in boxes of kExpertTensorBoxRows rows x the slice's 64
// bytes of one matrix (gate/up: the CTA's rows of w1, then the same rows of w3), into a ring slot
// laid out row-major [rows][64 bytes], completing the slot's mbarrier; every thread waits on it
// before the barrier that publishes the slot. A quarter-warp's 16-byte reads then cover two
// consecutive rows, 128 contiguous bytes: no bank conflicts. On the H100 the B = 1 gate/up weight
// bytes alone (no math) moved in 24.0 us this way against 26.9 by the threads' cp.async (session
// 46, benchmarks/RESULTS.md).
template <bool kGateUp, class C>
struct TensorWeightFill {
  static constexpr int kRowBytes = kQuantSliceK / 2;
  static constexpr int kRows = kGateUp ? C::kWeightRows / 2 : C::kWeightRows;  // per matrix
  static constexpr uint32_t kSlotBytes = C::kWeightRows * kRowBytes;
  static_assert(kRows % kExpertTensorBoxRows == 0, "whole boxes per matrix");
  static_assert(kSlotBytes == C::kMTiles * 2 * C::kThreads * 16, "the MXFP4 cp.async slot's bytes");

  const uint8_t* lo_map;  // this expert's maps (CUtensorMap in global memory)
  const uint8_t* hi_map;
  int row0;             // the CTA's first row of each matrix
  uint32_t ring;        // shared address of slot 0 (128-byte aligned)
  uint64_t* full;       // [C::kStages] mbarriers, one per slot
  uint32_t phases = 0;  // bit i: the parity slot i's next wait waits on

  // Thread 0 sets up the barriers; every thread must pass a __syncthreads after this before a fill.
  __device__ __forceinline__ void init(int tid) const {
    if (tid == 0) {
#pragma unroll 1
      for (int i = 0; i < C::kStages; ++i) mbarrier_init(&full[i], 1);
      mbarrier_init_fence();
    }
  }
  // Slice `slice` of K into `slot`, issued by thread 0 only.
  __device__ __forceinline__ void fill(int slot, int slice, int tid) const {
    if (tid != 0) return;
    mbarrier_arrive_expect_tx(&full[slot], kSlotBytes);
    const uint32_t bar = smem_addr(&full[slot]);
    const uint32_t dst = ring + slot * kSlotBytes;
    const int x = slice * kRowBytes;
#pragma unroll
    for (int b = 0; b < kRows / kExpertTensorBoxRows; ++b) {
      const int y = row0 + b * kExpertTensorBoxRows;
      tensor_copy_2d_to_shared_at(dst + b * kExpertTensorBoxRows * kRowBytes, lo_map, x, y, bar);
      if constexpr (kGateUp) {
        tensor_copy_2d_to_shared_at(dst + (kRows + b * kExpertTensorBoxRows) * kRowBytes, hi_map, x,
                                    y, bar);
      }
    }
  }
  // Until slot `slot`'s copies have landed (every thread, once per fill of the slot).
  __device__ __forceinline__ void wait(int slot) {
    mbarrier_wait(&full[slot], (phases >> slot) & 1u);
    phases ^= 1u << slot;
  }
  // Offset in a slot of the 16 bytes at byte 16 q of row r of the CTA's rows.
  static constexpr int offset(int r, int q) {
    return r * kRowBytes + 16 * q;
  }
};

}  // namespace deepinfer::cuda::quant_tile
