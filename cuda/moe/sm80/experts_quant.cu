// The expert GEMMs on weights kept in their shipped bytes: MXFP4 (e2m1 pairs + one e8m0 scale
// per 32 inputs) and block-scaled FP8 (e4m3 + f32 block scales). One kernel for the decode shape
// (16-row tiles) and the prefill shape (64-row tiles), on tensor cores: mma.sync m16n8k16
// bf16 x bf16 -> f32, sm_80+ instructions built for sm_90a and sm_100a. The decode shape runs by
// default on experts_quant_stream.cu, which streams the same weight chunks through a shared-
// memory ring and multiplies them with the same pieces (experts_quant_tile.cuh); this file's
// register-prefetch kernel stays selectable for it (moe_heuristics.h). The pass (activation
// quantization and staging, the two GEMMs) is written here for both.
//
// Why bf16 tensor cores reproduce the CPU reference (which multiplies dequantized f32 weights
// with f32 activations): e2m1 and e4m3 values times power-of-two scales are exact in bf16, and so
// are activations after DeepSeek's activation quantization (e4m3 values times a power-of-two
// group scale). Each product is then exact and sums are f32: the result differs from the CPU
// only by summation order. Without activation quantization (act_group 0) the f32 activations are
// split into three bf16 planes (hi + mid + lo == x exactly) and multiplied as three products, so
// the same holds. FP8 block scales that are not powers of two (not DeepSeek V4's, whose scales
// are ue8m0) are rounded to bf16 when folded into the weights.
//
// The layout is "swap AB": the weights are the A operand (M = weight rows), the tile's token
// rows the B operand (N = tokens), so even one token uses the tensor cores with 16 weight rows
// per mma, and the weights go from global memory straight into registers. A warp owns kMTiles
// m16 tiles of weight rows; lane (g, q) (g = lane / 4, q = lane % 4) loads 16 bytes of rows g and
// g + 8 of each: MXFP4 32 inputs (one scale group), FP8 16 inputs (two loads per 128-input
// slice). The 4 lanes of a row read 64 contiguous bytes. The bytes are decoded in registers to
// bf16 pairs (bit moves into a bf16's exponent and mantissa, then one bf16x2 multiply by
// 2^bias * scale, exact), and an m16n8k16 step uses 4 inputs of each lane's chunk: which input of
// the chunk feeds which k of the mma is free, as long as the activations use the same order. The
// activations are therefore staged (stage_activations_kernel, once per pass) as bf16 in that
// order, 128 inputs per slice, and a CTA copies one slice of its tile's rows into shared memory
// per step (cp.async, double-buffered) while its lanes hold the next slice's weight bytes in
// flight (register prefetch).
//
// Phases of a GEMM CTA: tile_rows (the tile's activation rows), load_weights (16-byte loads of a
// slice's weight bytes and scales), stage_slice (cp.async of a slice of activations), and per
// slice multiply_slice (decode + mma), then store_tile (SwiGLU into act, or y in pair order).
// Every output element is reduced over K in slice order with a fixed order inside a slice: it
// depends on its own weight row and token row only (deterministic).
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "cuda/common/activation.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/moe/moe_launch.h"
#include "cuda/moe/sm80/experts_quant_stream.h"
#include "cuda/moe/sm80/experts_quant_tile.cuh"
#include "cuda/moe/sm90/experts_quant_wgmma.h"
#include "cuda/quant/quant_launch.h"

namespace deepinfer::cuda {

namespace {

using namespace quant_tile;  // NOLINT(google-build-using-namespace): this family's pieces

// ---- staging: activations -> bf16 planes in mma order
// ---------------------------------------------

// dst [rows, kPlanes, Kp] (Kp = K rounded up to 128): 8 consecutive elements of a plane row are
// the inputs slice_input lists for lane q's piece t (the 16 pieces of a slice in order 4q + t);
// inputs past K are 0. kPlanes == 3: hi + mid + lo == x (exact for normal f32).
template <QuantFormat F, int kPlanes>
__global__ void stage_activations_kernel(const float* __restrict__ src, int64_t rows, int64_t K,
                                         int64_t Kp, __nv_bfloat16* __restrict__ dst) {
  enter_dependent_grid();
  const int64_t pieces = Kp / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * pieces) return;
  const int64_t row = idx / pieces;
  const int64_t pc = idx - row * pieces;
  const int64_t k0 = (pc / 16) * kQuantSliceK;
  const int pp = static_cast<int>(pc % 16);
  const int q = pp >> 2, t = pp & 3;
  const float* s = src + row * K;
  uint32_t out[kPlanes][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t k = k0 + slice_input<F>(q, 2 * t + (i >> 1), i & 1, h);
      v[h] = k < K ? s[k] : 0.0f;
    }
#pragma unroll
    for (int pl = 0; pl < kPlanes; ++pl) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(v[0], v[1]);
      memcpy(&out[pl][i], &b, sizeof(uint32_t));
      v[0] -= __low2float(b);  // exact: the rest of v beyond its bf16 rounding
      v[1] -= __high2float(b);
    }
  }
  __nv_bfloat16* d = dst + row * kPlanes * Kp + pc * 8;
#pragma unroll
  for (int pl = 0; pl < kPlanes; ++pl) {
    *reinterpret_cast<uint4*>(d + pl * Kp) =
        make_uint4(out[pl][0], out[pl][1], out[pl][2], out[pl][3]);
  }
}

// ---- weights: loads and in-register decode
// ---------------------------------------------------------

// 16 bytes of weights, read once: not allocated in L1 (which keeps the scales).
__device__ __forceinline__ uint4 load_weights16(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The lane's loads of slice `slice`; chunks at or past K (wholly, K being a multiple of the
// chunk) are zero and never read.

template <QuantFormat F, int kMTiles>
__device__ __forceinline__ void load_weights(SliceWeights<F, kMTiles>& w,
                                             const WeightRows<kMTiles>& rows, int slice, int q,
                                             int64_t K, int block_cols_log2) {
  using Tr = QuantTraits<F>;
#pragma unroll
  for (int l = 0; l < Tr::kLoads; ++l) {
    const int64_t k0 =
        static_cast<int64_t>(slice) * kQuantSliceK + l * 4 * Tr::kChunk + q * Tr::kChunk;
    const bool in = k0 < K;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        if (in) {
          if constexpr (Tr::kMx) {
            w.raw[mt][hr][l] = load_weights16(rows.values[mt][hr] + k0 / 2);
            w.scale[mt][hr][l] = __ldg(static_cast<const uint8_t*>(rows.scales[mt][hr]) + k0 / 32);
          } else {
            w.raw[mt][hr][l] = load_weights16(rows.values[mt][hr] + k0);
            w.scale[mt][hr][l] = __float_as_uint(
                __ldg(static_cast<const float*>(rows.scales[mt][hr]) + (k0 >> block_cols_log2)));
          }
        } else {
          w.raw[mt][hr][l] = make_uint4(0, 0, 0, 0);
          w.scale[mt][hr][l] = Tr::kMx ? 127u : __float_as_uint(1.0f);
        }
      }
    }
  }
}

template <QuantFormat F, bool kGateUp, class C, int kPlanes>
__global__ void __launch_bounds__(C::kThreads)
    expert_quant_kernel(const __nv_bfloat16* __restrict__ a, int64_t K, int64_t N, int top_k,
                        const int32_t* __restrict__ sorted_pair, TileList tiles, int max_tiles,
                        QuantMatrices lo, QuantMatrices hi, int block_rows, int block_cols_log2,
                        float limit, float* __restrict__ out) {
  enter_dependent_grid();
  constexpr int kM = C::kMTiles;
  constexpr int kHalf = kGateUp ? kM / 2 : kM;  // m16 tiles per matrix
  constexpr int kStageWords = kPlanes * C::kTok * kQuantRowWords;
  extern __shared__ int4 quant_smem_raw[];
  uint32_t* smem = reinterpret_cast<uint32_t*>(quant_smem_raw);
  __shared__ int64_t row_src[C::kTok];

  const int tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(max_tiles));
  const int col = static_cast<int>(blockIdx.x / static_cast<unsigned>(max_tiles));
  if (tile >= *tiles.count) return;  // uniform over the CTA: before any barrier
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const int n8 = (rows + 7) / 8;
  const int64_t Kp = (K + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int q = lane & 3;

  // tile_rows: where each token row's staged planes start.
  if (tid < C::kTok) {
    int64_t src = -1;
    if (tid < rows) {
      const int64_t row = kGateUp ? sorted_pair[start + tid] / top_k : start + tid;
      src = row * kPlanes * Kp;
    }
    row_src[tid] = src;
  }

  // The warp's first weight row, and the lane's rows (lane_weight_rows).
  const int64_t n_warp = static_cast<int64_t>(col) * (C::kWeightRows / (kGateUp ? 2 : 1)) +
                         static_cast<int64_t>(warp) * 16 * kHalf;
  const WeightRows<kM> wr =
      lane_weight_rows<F, kM, kGateUp>(lo, hi, e, n_warp, g, N, K, block_rows, block_cols_log2);

  float acc[kM][C::kTok / 8][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int j = 0; j < C::kTok / 8; ++j)
      acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  }

  const int slices = static_cast<int>(Kp / kQuantSliceK);
  SliceWeights<F, kM> cur, nxt;
  load_weights<F, kM>(cur, wr, 0, q, K, block_cols_log2);
  __syncthreads();  // row_src
  stage_slice<C, kPlanes>(smem, a, row_src, 8 * n8, 0, Kp);
  cp_async_commit();
#pragma unroll 1
  for (int s = 0; s < slices; ++s) {
    // Slice s + 1's weights in flight during slice s (zeros past the end: no load).
    load_weights<F, kM>(nxt, wr, s + 1, q, K, block_cols_log2);
    // Slice s landed for every thread; every warp is done with the buffer refilled below.
    cp_async_wait_all();
    __syncthreads();
    if (s + 1 < slices) {
      stage_slice<C, kPlanes>(smem + ((s + 1) & 1) * kStageWords, a, row_src, 8 * n8, s + 1, Kp);
    }
    cp_async_commit();
    multiply_slice<F, C, kPlanes>(
        acc, [&](int mt, int hr, int l) { return cur.raw[mt][hr][l]; }, cur.scale,
        smem + (s & 1) * kStageWords, n8, g, q);
    cur = nxt;
  }

  store_tile<kGateUp, C>(acc, N, n_warp, sorted_pair, start, rows, n8, limit, out, g, q);
}

template <QuantFormat F, int kPlanes>
void launch_stage(const float* src, int64_t rows, int64_t K, __nv_bfloat16* dst, bool pdl,
                  cudaStream_t stream) {
  const int64_t Kp = (K + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK;
  const int64_t n = rows * (Kp / 8);
  if (n == 0) return;
  launch_programmatic("moe_experts", dim3(ceil_div(n, 256)), dim3(256), 0, stream, pdl,
                      stage_activations_kernel<F, kPlanes>, src, rows, K, Kp, dst);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

// Activation quantization and the one-plane staging in one pass, for act groups that divide a
// slice (DeepSeek's 128 and 32): warp w of a block takes one (row, slice); lane l quantizes inputs
// [4 l, 4 l + 4) of the slice exactly as quantize_activations_kernel (the group's max over its
// group / 4 lanes, the same scale and rounding), puts them in shared memory, and lanes 0..15 write
// the slice's 16 staged pieces as stage_activations_kernel<F, 1> orders them (a quantized value,
// e4m3 times a power of two, is exact in bf16). So the staged bytes are those of the two kernels.
constexpr int kQuantStageWarps = 8;

template <QuantFormat F>
__global__ void quantize_stage_kernel(const float* __restrict__ src, int64_t rows, int64_t K,
                                      int64_t Kp, int group, __nv_bfloat16* __restrict__ dst) {
  __shared__ float slice[kQuantStageWarps][kQuantSliceK];
  enter_dependent_grid();
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t slices = Kp / kQuantSliceK;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kQuantStageWarps + warp;
  if (item >= rows * slices) return;  // uniform over the warp
  const int64_t row = item / slices;
  const int64_t k0 = (item - row * slices) * kQuantSliceK;
  const float* s = src + row * K;
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t k = k0 + 4 * lane + j;
    v[j] = k < K ? s[k] : 0.0f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  for (int offset = group / 8; offset >= 1; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  const float scale = act_group_scale(amax);
  const float inv = 1.0f / scale;  // exact: a power of two
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t k = k0 + 4 * lane + j;
    slice[warp][4 * lane + j] = k < K ? round_to_e4m3(v[j] * inv) * scale : 0.0f;
  }
  __syncwarp();
  if (lane >= 16) return;
  const int q = lane >> 2, t = lane & 3;
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float a = slice[warp][slice_input<F>(q, 2 * t + (i >> 1), i & 1, 0)];
    const float b = slice[warp][slice_input<F>(q, 2 * t + (i >> 1), i & 1, 1)];
    const __nv_bfloat162 pair = __floats2bfloat162_rn(a, b);
    memcpy(&out[i], &pair, sizeof(uint32_t));
  }
  *reinterpret_cast<uint4*>(dst + row * Kp + k0 + 8 * lane) =
      make_uint4(out[0], out[1], out[2], out[3]);
}

// Activation quantization (bit-identical to the CPU op) into `qbuf` (may be `src`), then staging;
// both in one kernel where the act group divides a slice (quantize_stage_kernel, which leaves
// `qbuf` unwritten: the GEMMs read the staged planes only).
template <QuantFormat F>
void quantize_and_stage(const float* src, float* qbuf, int64_t rows, int64_t K, int group,
                        __nv_bfloat16* dst, bool pdl, cudaStream_t stream) {
  if (group > 0 && group % 4 == 0 && kQuantSliceK % group == 0) {
    const int64_t Kp = (K + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK;
    const int64_t items = rows * (Kp / kQuantSliceK);
    if (items == 0) return;
    launch_programmatic("moe_experts", dim3(ceil_div(items, kQuantStageWarps)),
                        dim3(32 * kQuantStageWarps), 0, stream, pdl, quantize_stage_kernel<F>, src,
                        rows, K, Kp, group, dst);
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
    return;
  }
  if (group > 0) {
    launch_quantize_activations(src, qbuf, rows, K, group, pdl, stream);
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
    launch_stage<F, 1>(qbuf, rows, K, dst, pdl, stream);
  } else {
    launch_stage<F, 3>(src, rows, K, dst, pdl, stream);
  }
}

template <QuantFormat F, bool kGateUp, class C, int kPlanes>
void launch_gemm(const QuantExpertsArgs& p, const __nv_bfloat16* a, float* out, bool pdl,
                 cudaStream_t stream) {
  const int64_t K = kGateUp ? p.hidden : p.inter;
  const int64_t N = kGateUp ? p.inter : p.hidden;
  const int64_t cols =
      (N + C::kWeightRows / (kGateUp ? 2 : 1) - 1) / (C::kWeightRows / (kGateUp ? 2 : 1));
  const int smem = static_cast<int>(C::smem_bytes(kPlanes));
  auto kernel = expert_quant_kernel<F, kGateUp, C, kPlanes>;
  DEEPINFER_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Grid size: checked against gridDim.x's limit by the caller.
  launch_programmatic("moe_experts", dim3(static_cast<unsigned>(p.max_tiles * cols)),
                      dim3(C::kThreads), static_cast<size_t>(smem), stream, pdl, kernel, a, K, N,
                      p.top_k, p.sorted_pair, p.tiles, static_cast<int>(p.max_tiles),
                      kGateUp ? p.w1 : p.w2, kGateUp ? p.w3 : p.w2, p.block_rows, p.block_cols_log2,
                      p.limit, out);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

template <QuantFormat F, bool kGateUp, class C>
void launch_gemm_planes(const QuantExpertsArgs& p, int group, const __nv_bfloat16* a, float* out,
                        bool pdl, cudaStream_t stream) {
  if (group > 0) {
    launch_gemm<F, kGateUp, C, 1>(p, a, out, pdl, stream);
  } else {
    launch_gemm<F, kGateUp, C, 3>(p, a, out, pdl, stream);
  }
}

// One pass on tile shape C (register prefetch), or on the streaming kernel (`stream`, whose
// shapes experts_quant_stream.cu picks by format; `lean`: its lean variant).
template <QuantFormat F, class C>
void run_pass(const QuantExpertsArgs& p, bool stream_weights, bool lean, const float* x,
              int64_t tokens, float* xq, __nv_bfloat16* xs, float* act, __nv_bfloat16* as, float* y,
              bool pdl, cudaStream_t stream) {
  const int64_t pairs = tokens * p.top_k;
  quantize_and_stage<F>(x, xq, tokens, p.hidden, p.in_group, xs, pdl, stream);
  if (stream_weights) {
    launch_expert_quant_stream(p, true, p.in_group > 0 ? 1 : 3, lean, xs, act, pdl, stream);
  } else {
    launch_gemm_planes<F, true, C>(p, p.in_group, xs, act, pdl, stream);
  }
  quantize_and_stage<F>(act, act, pairs, p.inter, p.down_group, as, pdl, stream);
  if (stream_weights) {
    launch_expert_quant_stream(p, false, p.down_group > 0 ? 1 : 3, lean, as, y, pdl, stream);
  } else {
    launch_gemm_planes<F, false, C>(p, p.down_group, as, y, pdl, stream);
  }
}

}  // namespace

int64_t quant_staged_elems(int64_t rows, int64_t k, int planes) {
  return rows * planes * ((k + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK);
}

void launch_experts_quant(const QuantExpertsArgs& p, ExpertsKernel kernel, const float* x,
                          int64_t tokens, float* xq, __nv_bfloat16* xs, float* act,
                          __nv_bfloat16* as, float* y, bool pdl, cudaStream_t stream) {
  if (kernel == ExpertsKernel::kQuantPrefillWgmma) {
    launch_experts_quant_wgmma(p, x, tokens, xq, xs, act, as, y, stream);
    return;
  }
  const bool lean = kernel == ExpertsKernel::kQuantStreamLean;
  const bool stream_weights = lean || kernel == ExpertsKernel::kQuantStream;
  const bool decode = stream_weights || kernel == ExpertsKernel::kQuantDecode;
  if (p.format == QuantFormat::kMxfp4) {
    if (decode) {
      run_pass<QuantFormat::kMxfp4, ExpertQuantDecode>(p, stream_weights, lean, x, tokens, xq, xs,
                                                       act, as, y, pdl, stream);
    } else {
      run_pass<QuantFormat::kMxfp4, ExpertQuantPrefill>(p, false, false, x, tokens, xq, xs, act, as,
                                                        y, pdl, stream);
    }
  } else {
    if (decode) {
      run_pass<QuantFormat::kFp8, ExpertQuantDecodeFp8>(p, stream_weights, lean, x, tokens, xq, xs,
                                                        act, as, y, pdl, stream);
    } else {
      run_pass<QuantFormat::kFp8, ExpertQuantPrefill>(p, false, false, x, tokens, xq, xs, act, as,
                                                      y, pdl, stream);
    }
  }
}

}  // namespace deepinfer::cuda
