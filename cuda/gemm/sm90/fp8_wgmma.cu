// The Hopper weight stream of linear / grouped_linear / linear_pair on block-scaled FP8 weights
// for decode batches (gemm_fp8_heuristics.h: choose_fp8_wgmma): y[m, n] = sum over 128-column
// blocks kb of (sum_k q(x)[m, k] w[n, k]) * w_scale[n / block_rows, kb] * x_scale[m, kb].
//
// At these sizes every weight byte serves at most 64 tokens, so the kernel is bound by the bytes
// in flight. The weights go from HBM to shared memory by the copy engine, never through a
// register of the issuing thread:
//
//   the ring         one thread per CTA issues tensor copies (TMA, 128-byte swizzle) of its 64
//                    weight rows x 128 columns per stage into a ring of kFp8WgmmaStages stages,
//                    one mbarrier per stage; the first stages before the wait on the previous
//                    grid (weights depend on no kernel), so they stream while the activations are
//                    quantized.
//   activations      q(x): e4m3 with power-of-two scales per 128 columns. For small
//                    tiles (kFp8WgmmaFusedQuantMaxItems) each CTA quantizes its token tile of its
//                    K range itself, straight into shared memory; otherwise a launch before the
//                    kernel writes q(x) once (gemm_fp8.cu). Both with the same math: the same
//                    codes. A RowNorm of x (linear's, linear_pair's) is applied where x is
//                    quantized, in rms_norm's arithmetic (each CTA sums the squares of its
//                    tokens' rows).
//   the math         two (Fp8WgmmaConfig::math, DEEPINFER_FP8_WGMMA_MATH):
//                    mma.sync: each of the 4 warps takes 16 of the tile's 64 rows, mma.sync
//                    m16n8k32 e4m3 (f32 sums, as the FP8 GEMV; on sm_90 ptxas makes each two f16
//                    HMMAs after converting both operands), the operands read from the swizzled
//                    stages; the activations e4m3 (128-byte swizzle), copied by each CTA for its
//                    K range (cp.async) from quantize_rows_e4m3's output.
//                    f16: the warpgroup MMA, wgmma m64nTk16 f16 with A (the weights, decoded to
//                    f16 in registers) from registers and B (the activations as f16 tiles,
//                    fp8_wgmma_layout.h) from shared memory; the tiles come with each stage's
//                    weights (two bulk copies from quantize_rows_f16_tiles' output).
//                    Each stage's sum is folded into the total with its two scales.
//   reduce_splits    the `splits` CTAs of a row tile (one cluster, each a contiguous range of
//                    stages) put their partial tiles in shared memory and add them through
//                    distributed shared memory in split order (no atomics, no workspace).
//
// Every product is exact (e4m3 values are exact in f16) and summed in f32, so y differs from the
// CPU reference by summation order only, fixed by the math and the K split, which depends on N,
// K, G and the SM count only: a token's result does not depend on the other tokens of its batch
// (the default's math, auto, changes at 16 tokens: a token's result moves by summation order
// there, as it does where the GEMV hands over to cuBLASLt). FP8 wgmma (the first version's math,
// which gave the file its name) is not used: its tensor-core sums keep fewer bits than f32
// (DeepGEMM's observation); it differed from the GEMV by up to 5.7e-4 of max |y| on the
// real-format test checkpoints, enough to flip their top-k choices (session 48), where the
// mma.sync math matches the CPU emulation to ~3e-7 (session 49; benchmarks/RESULTS.md) and the
// f16 math the mma.sync math within 1e-5 of max |y| (session 55).
#include <cstdint>

#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/gemm/gemm_launch.h"
#include "cuda/gemm/sm90/fp8_wgmma_pieces.cuh"

namespace deepinfer::cuda {

namespace {

using namespace fp8_wgmma;  // NOLINT(google-build-using-namespace): this family's pieces

// The mma.sync math (Fp8WgmmaMath::kMmaSync).
template <int kTok>
__global__ void __launch_bounds__(kThreads) fp8_wgmma_kernel(WgmmaArgs a) {
  constexpr int kAcc = kTok / 2;  // a 64 x T f32 tile over 128 threads
  extern __shared__ uint8_t smem_raw[];
  // 1 KB aligned (the 128-byte swizzle's atoms) by an offset from the shared array itself: a
  // pointer rebuilt from an integer loses its address space, and every access through it would
  // be a generic load or store.
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint8_t* ring = smem;
  uint8_t* acts = ring + kStages * kWeightStageBytes;
  // After the 1 KB activation tiles: 8-byte aligned whatever kb_per_split is.
  uint64_t* full = reinterpret_cast<uint64_t*>(acts + a.kb_per_split * WgmmaSmem<kTok>::kActTile);
  float* act_scales = reinterpret_cast<float*>(full + kStages);
  float* weight_scales = act_scales + a.kb_per_split * kTok;

  const int tid = static_cast<int>(threadIdx.x);
  const auto [second, split, splits, g, kb_total, kb0, nk, row0, weight_row] = cta_tile(a);
  const WgmmaWeight& w = second ? a.second : a.first;
  init_ring_barriers(full);
  const uint32_t ring_addr = smem_addr(ring);
  const auto issue = [&](int i) {
    const int s = i % kStages;
    mbarrier_arrive_expect_tx(&full[s], kWeightStageBytes);
    tensor_copy_2d_to_shared_at(ring_addr + s * kWeightStageBytes, w.map, (kb0 + i) * kSliceK,
                                static_cast<int>(weight_row), smem_addr(&full[s]));
  };
  if (tid == 0) {
    for (int i = 0; i < kStages && i < nk; ++i) issue(i);
  }
  // The tile's 64 rows lie in one block of block_rows (a multiple of 64) rows.
  for (int i = tid; i < nk; i += kThreads) {
    weight_scales[i] = w.scales[(weight_row / a.block_rows) * w.scale_ld + kb0 + i];
  }

  enter_dependent_grid();  // x or q(x) is the output of the kernel before
  // The activation tiles: chunk c (16 bytes) of row r of a tile at (c ^ (r % 8)) * 16; chunks
  // past K are zeros (e4m3 garbage there could be NaN, which a zero weight would not cancel).
  if (a.x != nullptr) {
    __shared__ float row_inv[kTok];
    if (a.norm_w != nullptr) {
      block_rows_rms_inv(row_inv, a.x, static_cast<int>(a.m < kTok ? a.m : kTok), a.groups * a.k,
                         a.k, a.norm_eps);
    }
    quantize_tiles<kTok, false>(a, g, kb0, nk, acts, act_scales, row_inv);
  } else {
    const uint8_t* xq = a.xq + static_cast<int64_t>(g) * a.m_pad * a.k;
    for (int c = tid; c < nk * kTok * 8; c += kThreads) {
      const int kb = c / (kTok * 8);
      const int r = (c / 8) % kTok;
      const int chunk = c % 8;
      const int64_t col = static_cast<int64_t>(kb0 + kb) * kSliceK + chunk * 16;
      uint8_t* dst = acts + kb * WgmmaSmem<kTok>::kActTile + r * kSliceK + ((chunk ^ (r & 7)) << 4);
      if (r < a.m_pad && col < a.k) {
        cp_async_16(dst, xq + r * a.k + col);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_commit();
    const float* xs = a.xs + static_cast<int64_t>(g) * kb_total * a.m_pad;
    for (int i = tid; i < nk * kTok; i += kThreads) {
      const int kb = i / kTok, t = i % kTok;
      act_scales[i] = t < a.m_pad ? xs[static_cast<int64_t>(kb0 + kb) * a.m_pad + t] : 0.0f;
    }
    cp_async_wait_all();
  }
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  // Accumulator layout (the mma fragments of a warp's 16 rows): element 4j + 2h + e is row
  // 16 warp + lane / 4 + 8h, token 8j + 2 (lane % 4) + e.
  const auto promote = [&](const float(&part)[kAcc], int i) {
    const float ws = weight_scales[i];
    const float* s = act_scales + i * kTok;
#pragma unroll
    for (int j = 0; j < kTok / 8; ++j) {
      const int t = 8 * j + 2 * (lane & 3);
      const float s0 = ws * s[t], s1 = ws * s[t + 1];
      acc[4 * j + 0] += part[4 * j + 0] * s0;
      acc[4 * j + 1] += part[4 * j + 1] * s1;
      acc[4 * j + 2] += part[4 * j + 2] * s0;
      acc[4 * j + 3] += part[4 * j + 3] * s1;
    }
  };
  // Each warp's 16 rows by mma.sync: lane (g, q) holds 16-byte chunks 2q and 2q + 1 of rows g
  // and g + 8 and of token 8j + g; the same bytes of both operands at the same fragment slots,
  // so the k order is permuted alike for both. Banks: lanes 4g + q of a quarter warp read chunk
  // (2q + c) ^ g of two rows, eight distinct 16-byte columns.
  const int g8 = lane >> 2, q = lane & 3;
  for (int i = 0; i < nk; ++i) {
    const int s = i % kStages;
    mbarrier_wait(&full[s], static_cast<uint32_t>(i / kStages) & 1);
    const uint8_t* wst = ring + s * kWeightStageBytes + (16 * warp + g8) * kSliceK;
    const uint8_t* ast = acts + i * WgmmaSmem<kTok>::kActTile + g8 * kSliceK;
    float part[kAcc];
#pragma unroll
    for (int e = 0; e < kAcc; ++e) part[e] = 0.0f;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int pos = ((2 * q + c) ^ g8) << 4;
      const uint4 lo = *reinterpret_cast<const uint4*>(wst + pos);
      const uint4 hi = *reinterpret_cast<const uint4*>(wst + 8 * kSliceK + pos);
#pragma unroll
      for (int j = 0; j < kTok / 8; ++j) {
        const uint4 b = *reinterpret_cast<const uint4*>(ast + 8 * j * kSliceK + pos);
        float(&d)[4] = *reinterpret_cast<float(*)[4]>(part + 4 * j);
        mma_e4m3(d, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
        mma_e4m3(d, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
      }
    }
    promote(part, i);
    named_barrier<kThreads>(1);  // every warp is done with ring stage s
    if (tid == 0 && i + kStages < nk) issue(i + kStages);
  }

  // The ring is the partial tile's room: every warp is past its last read of it first.
  __syncthreads();
  store_tile<kTok>(acc, reinterpret_cast<float*>(ring), a, w, g, row0, split, splits);
}

template <int kTok>
void launch_tokens(const WgmmaArgs& a, const Fp8WgmmaConfig& c, KernelSmemLimits& smem_limits,
                   bool pdl, cudaStream_t stream) {
  launch_tiles(fp8_wgmma_kernel<kTok>, a, c, WgmmaSmem<kTok>::bytes(c.kb_per_split), smem_limits,
               pdl, stream);
}

}  // namespace

void launch_fp8_wgmma(const Fp8WgmmaLaunch& l, const Fp8Problem& p, const Fp8WgmmaConfig& c,
                      KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream) {
  WgmmaArgs a{};
  const auto weight = [](const Fp8WgmmaWeight& w) {
    return WgmmaWeight{static_cast<const CUtensorMap*>(w.map),
                       w.scales,
                       w.scale_ld,
                       w.y,
                       w.n,
                       (w.n + kRows - 1) / kRows};
  };
  a.first = weight(l.first);
  if (l.second.map != nullptr) a.second = weight(l.second);
  a.x = l.x;
  a.xq = l.xq;
  a.xt = l.xt;
  a.xs = l.xs;
  a.norm_w = l.x_norm_weight;
  a.norm_eps = l.x_norm_eps;
  a.m = p.m;
  a.m_pad = l.m_pad;
  a.k = p.k;
  a.groups = static_cast<int>(p.groups);
  a.block_rows = p.block_rows;
  a.kb_per_split = c.kb_per_split;
  if (c.math == Fp8WgmmaMath::kF16) {
    launch_f16(a, c, smem_limits, pdl, stream);
    return;
  }
  with_token_tile(c.tokens,
                  [&]<int kTok>() { launch_tokens<kTok>(a, c, smem_limits, pdl, stream); });
}

}  // namespace deepinfer::cuda
