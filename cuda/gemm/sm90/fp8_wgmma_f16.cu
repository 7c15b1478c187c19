// The Hopper weight stream's f16 math (Fp8WgmmaMath::kF16): the kernel and its launch.
// sm90/fp8_wgmma.cu's head comment describes the stream; fp8_wgmma_layout.h the activation tiles.
#include <cstdint>

#include "cuda/common/e4m3_bits.h"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/wgmma_f16.cuh"
#include "cuda/gemm/fp8_wgmma_layout.h"
#include "cuda/gemm/sm90/fp8_wgmma_pieces.cuh"

namespace deepinfer::cuda::fp8_wgmma {

namespace {

// Shared memory of the f16 math: the ring (1 KB aligned stages: the weight tile, then, where the
// activations stream, the block's activation tile and its token scales), the resident activation
// tiles and scales of the CTA's K range where it quantizes x itself, the barriers and the weight's
// scales.
template <int kTok>
struct F16Smem {
  static constexpr uint32_t kActTile = static_cast<uint32_t>(fp8_wgmma_tile_bytes(kTok));
  static constexpr uint32_t kActScales = 4 * kTok;
  static constexpr uint32_t kStreamStage =
      (kWeightStageBytes + kActTile + kActScales + 1023) / 1024 * 1024;
  static_assert(kTok * kPartLd * 4 <= kStages * kWeightStageBytes,
                "the partial tile fits the ring");
  static constexpr uint32_t stage_bytes(bool fused) {
    return fused ? kWeightStageBytes : kStreamStage;
  }
  static size_t bytes(int kb_per_split, bool fused) {
    const size_t kb = static_cast<size_t>(kb_per_split);
    return 1024 + kStages * stage_bytes(fused) + (fused ? kb * (kActTile + kActScales) : 0) +
           kStages * 8 + kb * 4;
  }
};

// One k-step of the warpgroup: d (+)= its weight rows' A fragment `a` (the lane's decoded bytes of
// rows g and g + 8: bytes 0, 1 of a word at k 2q, 2q + 1, bytes 2, 3 at k 2q + 8, 2q + 9;
// fp8_wgmma_layout.h) x the activation tile's k-step at descriptor b.
template <int kTok>
__device__ __forceinline__ void wgmma_step(float (&d)[kTok / 2], const uint32_t (&a)[4], uint64_t b,
                                           bool accumulate) {
  if constexpr (kTok == 8) {
    wgmma_m64n8k16_f16(d, a, b, accumulate);
  } else if constexpr (kTok == 16) {
    wgmma_m64n16k16_f16(d, a, b, accumulate);
  } else if constexpr (kTok == 32) {
    wgmma_m64n32k16_f16(d, a, b, accumulate);
  } else {
    static_assert(kTok == 64, "token tiles of 8, 16, 32 or 64");
    wgmma_m64n64k16_f16(d, a, b, accumulate);
  }
}

// The weight stream on the f16 math: the ring and the reduce_splits epilogue as the mma.sync
// kernel, with per stage
//   - the weight tile by a tensor copy and, unless the CTA quantized x itself, the block's
//     activation tile and token scales by two bulk copies from quantize_rows_f16_tiles' output,
//     all on the stage's barrier;
//   - each lane's 32 weight bytes of its rows g and g + 8 read once (two 16-byte loads each),
//     decoded to f16 x 2^-8 by integer operations (e4m3_bits.h) into the 8 k-steps' A fragments;
//   - 8 wgmma m64nTk16 into the stage's sum (the first one overwriting it), one commit, one wait;
//   - the sum folded into the total with its two scales and 2^8, as the mma.sync kernel does.
template <int kTok>
__global__ void __launch_bounds__(kThreads)
    fp8_wgmma_f16_kernel(const __grid_constant__ WgmmaArgs a) {
  constexpr int kAcc = kTok / 2;  // a 64 x T f32 tile over 128 threads
  using Smem = F16Smem<kTok>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const bool fused = a.x != nullptr;
  const uint32_t stage_bytes = Smem::stage_bytes(fused);
  uint8_t* ring = smem;
  uint8_t* resident = ring + kStages * stage_bytes;  // fused: the K range's tiles, then scales
  float* resident_scales = reinterpret_cast<float*>(resident + a.kb_per_split * Smem::kActTile);
  uint64_t* full = reinterpret_cast<uint64_t*>(
      fused ? reinterpret_cast<uint8_t*>(resident_scales + a.kb_per_split * kTok) : resident);
  float* weight_scales = reinterpret_cast<float*>(full + kStages);

  const int tid = static_cast<int>(threadIdx.x);
  const auto [second, split, splits, g, kb_total, kb0, nk, row0, weight_row] = cta_tile(a);
  const WgmmaWeight& w = second ? a.second : a.first;
  init_ring_barriers(full);
  const uint32_t ring_addr = smem_addr(ring);
  const uint32_t stage_tx =
      fused ? kWeightStageBytes : kWeightStageBytes + Smem::kActTile + Smem::kActScales;
  const auto issue_weights = [&](int i) {
    const int s = i % kStages;
    mbarrier_arrive_expect_tx(&full[s], stage_tx);
    tensor_copy_2d_to_shared_at(ring_addr + s * stage_bytes, w.map, (kb0 + i) * kSliceK,
                                static_cast<int>(weight_row), smem_addr(&full[s]));
  };
  // The block's activation tile and scales (after the wait on the previous grid: they are the
  // output of quantize_rows_f16_tiles).
  const int64_t block0 = static_cast<int64_t>(g) * kb_total + kb0;
  const auto issue_acts = [&](int i) {
    const int s = i % kStages;
    const uint32_t dst = ring_addr + s * stage_bytes + kWeightStageBytes;
    bulk_copy_to_shared_at(dst, a.xt + (block0 + i) * Smem::kActTile, Smem::kActTile,
                           smem_addr(&full[s]));
    bulk_copy_to_shared_at(dst + Smem::kActTile, a.xs + (block0 + i) * kTok, Smem::kActScales,
                           smem_addr(&full[s]));
  };
  if (tid == 0) {
    for (int i = 0; i < kStages && i < nk; ++i) issue_weights(i);
  }
  for (int i = tid; i < nk; i += kThreads) {
    weight_scales[i] = w.scales[(weight_row / a.block_rows) * w.scale_ld + kb0 + i];
  }

  enter_dependent_grid();  // x or its tiles are the output of the kernel before
  if (fused) {
    __shared__ float row_inv[kTok];
    if (a.norm_w != nullptr) {
      block_rows_rms_inv(row_inv, a.x, static_cast<int>(a.m < kTok ? a.m : kTok), a.groups * a.k,
                         a.k, a.norm_eps);
    }
    quantize_tiles<kTok, true>(a, g, kb0, nk, resident, resident_scales, row_inv);
    fence_async_shared();  // the tiles are read by wgmma (the async proxy)
  } else if (tid == 0) {
    for (int i = 0; i < kStages && i < nk; ++i) issue_acts(i);
  }
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  const int g8 = lane >> 2, q = lane & 3;
  float acc[kAcc], part[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    acc[i] = 0.0f;
    part[i] = 0.0f;
  }
  for (int i = 0; i < nk; ++i) {
    const int s = i % kStages;
    mbarrier_wait(&full[s], static_cast<uint32_t>(i / kStages) & 1);
    uint8_t* stage = ring + s * stage_bytes;
    const uint8_t* act = fused ? resident + i * Smem::kActTile : stage + kWeightStageBytes;
    const float* act_scales =
        fused ? resident_scales + i * kTok
              : reinterpret_cast<const float*>(stage + kWeightStageBytes + Smem::kActTile);
    // Lane (g, q): chunks 2q, 2q + 1 of rows g and g + 8 of its warp's 16 (128-byte swizzle).
    const uint8_t* wrow = stage + (16 * warp + g8) * kSliceK;
    uint4 lo[2], hi[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int pos = ((2 * q + c) ^ g8) << 4;
      lo[c] = *reinterpret_cast<const uint4*>(wrow + pos);
      hi[c] = *reinterpret_cast<const uint4*>(wrow + 8 * kSliceK + pos);
    }
    uint32_t frag[8][4];
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      const uint4& l = lo[st >> 2];
      const uint4& h = hi[st >> 2];
      const uint32_t wl = (st & 3) == 0 ? l.x : (st & 3) == 1 ? l.y : (st & 3) == 2 ? l.z : l.w;
      const uint32_t wh = (st & 3) == 0 ? h.x : (st & 3) == 1 ? h.y : (st & 3) == 2 ? h.z : h.w;
      frag[st][0] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<false>(wl);
      frag[st][1] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<false>(wh);
      frag[st][2] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<true>(wl);
      frag[st][3] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<true>(wh);
    }
    const uint64_t desc0 = wgmma_desc(act, kFp8WgmmaTileLead, kFp8WgmmaTileStride);
    fence_accumulators(part);
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      // k-step st: core matrices 2 st, 2 st + 1 along k.
      wgmma_step<kTok>(part, frag[st], desc0 + ((2 * st * kFp8WgmmaTileLead) >> 4), st > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(part);
    // The decode left each product 2^-8 of its value: the scale takes it back (exactly).
    const float ws = weight_scales[i] * 256.0f;
#pragma unroll
    for (int j = 0; j < kTok / 8; ++j) {
      const int t = 8 * j + 2 * q;
      const float s0 = ws * act_scales[t], s1 = ws * act_scales[t + 1];
      acc[4 * j + 0] += part[4 * j + 0] * s0;
      acc[4 * j + 1] += part[4 * j + 1] * s1;
      acc[4 * j + 2] += part[4 * j + 2] * s0;
      acc[4 * j + 3] += part[4 * j + 3] * s1;
    }
    named_barrier<kThreads>(1);  // every warp is done with ring stage s
    if (tid == 0 && i + kStages < nk) {
      issue_weights(i + kStages);
      if (!fused) issue_acts(i + kStages);
    }
  }
  __syncthreads();
  store_tile<kTok>(acc, reinterpret_cast<float*>(ring), a, w, g, row0, split, splits);
}

template <int kTok>
void launch_tokens(const WgmmaArgs& a, const Fp8WgmmaConfig& c, KernelSmemLimits& smem_limits,
                   bool pdl, cudaStream_t stream) {
  launch_tiles(fp8_wgmma_f16_kernel<kTok>, a, c,
               F16Smem<kTok>::bytes(c.kb_per_split, a.x != nullptr), smem_limits, pdl, stream);
}

}  // namespace

void launch_f16(const WgmmaArgs& a, const Fp8WgmmaConfig& c, KernelSmemLimits& smem_limits,
                bool pdl, cudaStream_t stream) {
  with_token_tile(c.tokens,
                  [&]<int kTok>() { launch_tokens<kTok>(a, c, smem_limits, pdl, stream); });
}

}  // namespace deepinfer::cuda::fp8_wgmma
