// The streaming kernel of linear / grouped_linear on block-scaled FP8 weights for decode batches
// (1..kFp8StreamMaxTokens tokens, act_group > 0): y[m, n] = sum_k q(x)[m, k] * w[n, k] per group.
// At these sizes every weight byte serves at most 64 tokens, so the kernel is bound by the weight
// bytes the SMs keep in flight (Little's law: ~32 KiB per SM at the very least). It is the routed
// experts' streaming kernel (moe/sm80/experts_quant_stream.cu) applied to a dense weight, with
// the same pieces (moe/sm80/experts_quant_tile.cuh):
//
//   stage_quantized   one small kernel: x [M, G K] f32 -> xq [G][M][Kp] bf16, quantized per
//                     act_group columns exactly as quantize_activations (e4m3 value times a
//                     power-of-two scale, exact in bf16) and stored in the mma order of the
//                     weight decode (fp8_stream_layout.h), zeros past K; every CTA then copies
//                     only its own slices of it.
//   the ring          every lane copies its own 16-byte weight chunks (rows g, g + 8 of its
//                     warp's two m16 tiles, 2 x 16 bytes per 128-input slice) into a ring of
//                     kStages slices in shared memory with cp.async, kStages - 1 slices ahead of
//                     the one it multiplies; the activation slices share the ring.
//   multiply_slice    e4m3 -> bf16 in registers, the block scale folded into a bf16 multiplier
//                     (exact for power-of-two scales), bf16 mma.sync m16n8k16 with f32
//                     accumulation: weights as A (16 rows per mma, so one token uses the tensor
//                     cores), tokens as B.
//   (optionally, DEEPINFER_FP8_LINEAR=stream_pdl) the kernel is launched as a programmatic
//                     dependent of stage_quantized: its CTAs start their weight copies while the
//                     activations are still being staged, and wait for them before their first
//                     activation copy.
//   reduce_splits     the `splits` CTAs of a row tile (one cluster, each a contiguous range of
//                     slices) put their partial tiles in shared memory and add them through
//                     distributed shared memory in split order (no atomics, no workspace).
//
// Every product is exact, so y differs from the CPU reference by the f32 summation order only,
// and that order is fixed by the K split, which depends on N, K, G and the SM count (never on M,
// the token tile or the run): a token's result does not depend on the batch, and runs repeat.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/gemm/fp8_stream_layout.h"
#include "cuda/gemm/gemm_launch.h"
#include "cuda/moe/sm80/experts_quant_config.h"
#include "cuda/moe/sm80/experts_quant_tile.cuh"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;
using quant_tile::multiply_slice;
using quant_tile::piece_word;
using quant_tile::slice_input;

constexpr QuantFormat kFp8 = QuantFormat::kFp8;
using Fp8Traits = quant_tile::QuantTraits<kFp8>;
static_assert(kFp8StreamSliceK == kQuantSliceK && kFp8StreamRowWords == kQuantRowWords,
              "the streaming linear stages slices as the expert kernels do");
static_assert(Fp8Traits::kLoads == 2 && Fp8Traits::kChunk == 16, "two 16-byte chunks per slice");

// The shape multiply_slice reads: two m16 tiles per warp, kTok token rows per slice; a ring of
// kStages slices (fp8_stream_stages).
template <int kTokT, int kStagesT>
struct StreamShape {
  static constexpr int kMTiles = kFp8StreamRowsPerWarp / 16;
  static constexpr int kTok = kTokT;
  static constexpr int kStages = kStagesT;
  // 16 tokens: two CTAs of 8 warps per SM (128 registers); 64 tokens: one (64 accumulators).
  static constexpr int kMinBlocks = kTokT <= 16 ? 2 : 1;
};

constexpr int kStageWarps = 8;

// fp8_stream_staged_index inverts slice_input: the staged activations meet the weights they
// were quantized against.
constexpr bool staged_index_inverts_slice_input() {
  for (int q = 0; q < 4; ++q) {
    for (int s = 0; s < 8; ++s) {
      for (int w = 0; w < 2; ++w) {
        for (int h = 0; h < 2; ++h) {
          const int i = 2 * (s & 1) + w;
          const int staged = 8 * (4 * q + (s >> 1)) + 2 * i + h;
          if (fp8_stream_staged_index(slice_input<kFp8>(q, s, w, h)) != staged) return false;
        }
      }
    }
  }
  return true;
}
static_assert(staged_index_inverts_slice_input(), "the staging order is the decode's");

// xq[g][row][Kp] in fp8_stream_staged_index's order, zeros past K: one warp per (row, group, act
// group), quantized exactly as quantize_activations (e4m3 value times a power-of-two scale: a
// bf16 value). The warp of a row's last act group also writes the zeros.
__global__ void __launch_bounds__(kStageWarps * 32)
    stage_quantized(const float* __restrict__ x, __nv_bfloat16* __restrict__ xq, int64_t m,
                    int64_t k, int64_t kp, int64_t groups, int act_group) {
  // With programmatic dependent launch the streaming kernel may start now: it waits for this
  // grid's completion (griddepcontrol.wait) before it reads xq.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int64_t per_row = (k + act_group - 1) / act_group;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kStageWarps + (threadIdx.x >> 5);
  if (item >= m * groups * per_row) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t gi = item % per_row;
  const int64_t g = (item / per_row) % groups;
  const int64_t row = item / (per_row * groups);
  const float* src = x + row * groups * k + g * k;
  __nv_bfloat16* dst = xq + (g * m + row) * kp;
  const int64_t c0 = gi * act_group;
  const int64_t c1 = c0 + act_group < k ? c0 + act_group : k;
  float amax = 0.0f;
  for (int64_t c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(src[c]));
  const float scale = act_group_scale(warp_max(amax));
  const float inv = 1.0f / scale;  // exact: a power of two
  for (int64_t c = c0 + lane; c < c1; c += 32) {
    dst[fp8_stream_staged_index(c)] = __float2bfloat16_rn(round_to_e4m3(src[c] * inv) * scale);
  }
  if (gi == per_row - 1) {
    for (int64_t c = k + lane; c < kp; c += 32) {
      dst[fp8_stream_staged_index(c)] = __float2bfloat16_rn(0.0f);
    }
  }
}

struct StreamArgs {
  const __nv_bfloat16* xq;  // [G][M][kp], stage_quantized's
  const uint8_t* w;         // [G N, K] e4m3
  const float* ws;          // [ceil(G N / br), ws_ld] f32 weight scales
  float* y;                 // [M, G N]; group g writes columns [g N, (g + 1) N)
  int64_t n, k, kp, ws_ld;
  int m, br, bc_log2;
  int slab;  // slices per split
};

// The lane's weight rows: rows g and g + 8 of its warp's two m16 tiles (clamped to N - 1: tail
// rows copy valid bytes and are never stored), its 16 q bytes folded into the values.
struct StreamRows {
  const uint8_t* values[2][2];
  const float* scales[2][2];  // the row's row of blocks
};

// The lane's chunk c = 2 (2 mt + hr) + l of slot `slot` in the weight ring [kStages][8][threads]
// (uint4): a warp's reads of one chunk are contiguous.
__device__ __forceinline__ uint4* ring_chunk(uint4* ring, int slot, int c, int threads, int tid) {
  return ring + (slot * 8 + c) * threads + tid;
}

// Copies the lane's weight chunks of `slice` into ring slot `slot`; chunks at or past K (wholly:
// K % 16 == 0) are zeros, stored by the lane itself.
__device__ __forceinline__ void copy_weight_slice(uint4* ring, int slot, const StreamRows& r,
                                                  int slice, int q, int64_t k, int threads,
                                                  int tid) {
#pragma unroll
  for (int l = 0; l < 2; ++l) {
    const int64_t off = static_cast<int64_t>(slice) * kFp8StreamSliceK + l * 64;
    const bool in = off + 16 * q < k;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        uint4* dst = ring_chunk(ring, slot, 2 * (2 * mt + hr) + l, threads, tid);
        if (in) {
          cp_async_16_prefetch<kExpertQuantStreamL2Prefetch>(dst, r.values[mt][hr] + off);
        } else {
          *dst = make_uint4(0, 0, 0, 0);
        }
      }
    }
  }
}

// The lane's block scales of `slice` (f32 bits), 1 past K.
__device__ __forceinline__ void load_scales(uint32_t (&sc)[2][2][2], const StreamRows& r, int slice,
                                            int q, int64_t k, int bc_log2) {
#pragma unroll
  for (int l = 0; l < 2; ++l) {
    const int64_t k0 = static_cast<int64_t>(slice) * kFp8StreamSliceK + l * 64 + 16 * q;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        sc[mt][hr][l] = __float_as_uint(k0 < k ? __ldg(r.scales[mt][hr] + (k0 >> bc_log2)) : 1.0f);
      }
    }
  }
}

// Copies the staged token rows (8 n8 of them; rows past M are zeros) of `slice` into `buf`
// [kTok][kFp8StreamRowWords], piece pp of a row to piece_word(pp / 4, pp % 4).
__device__ __forceinline__ void copy_activation_slice(uint32_t* buf, const __nv_bfloat16* xg,
                                                      const StreamArgs& a, int slice, int n8,
                                                      int threads, int tid) {
  const int pieces = 16 * 8 * n8;
  for (int idx = tid; idx < pieces; idx += threads) {
    const int pp = idx & 15;
    const int r = idx >> 4;
    uint32_t* d = buf + r * kFp8StreamRowWords + piece_word(pp >> 2, pp & 3);
    if (r < a.m) {
      cp_async_16(d, xg + r * a.kp + static_cast<int64_t>(slice) * kFp8StreamSliceK + pp * 8);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Grid (row tiles, splits, groups), cluster (1, splits, 1), 32 x warps threads.
template <class C>
__global__ void __launch_bounds__(kFp8StreamMaxWarps * 32, C::kMinBlocks)
    fp8_stream_kernel(StreamArgs a) {
  constexpr int kActWords = C::kTok * kFp8StreamRowWords;
  extern __shared__ int4 fp8_stream_smem_raw[];
  uint32_t* act_ring = reinterpret_cast<uint32_t*>(fp8_stream_smem_raw);  // [kStages][kActWords]
  uint4* weight_ring = reinterpret_cast<uint4*>(act_ring + C::kStages * kActWords);

  const int threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g8 = lane >> 2;
  const int q = lane & 3;
  const int rows_cta = (threads >> 5) * kFp8StreamRowsPerWarp;
  const int64_t grp = blockIdx.z;
  const int split = static_cast<int>(blockIdx.y);
  const int splits = static_cast<int>(gridDim.y);
  const int slices = static_cast<int>(a.kp / kFp8StreamSliceK);
  const int s0 = split * a.slab;
  const int count = (s0 + a.slab < slices ? s0 + a.slab : slices) - s0;
  const int n8 = (a.m + 7) / 8;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * rows_cta;
  const int64_t n_warp = tile0 + warp * kFp8StreamRowsPerWarp;
  const __nv_bfloat16* xg = a.xq + grp * a.m * a.kp;

  StreamRows wr;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      int64_t n = n_warp + 16 * mt + g8 + 8 * hr;
      n = n < a.n ? n : a.n - 1;
      const int64_t row = grp * a.n + n;
      wr.values[mt][hr] = a.w + row * a.k + 16 * q;
      wr.scales[mt][hr] = a.ws + (row / a.br) * a.ws_ld;
    }
  }

  float acc[2][C::kTok / 8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < C::kTok / 8; ++j)
      acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  }

  // Prologue: the weights of the first kStages - 1 slices, then (once stage_quantized is done:
  // a no-op unless launched as its programmatic dependent) their activations, all in one
  // cp.async group followed by kStages - 2 empty ones, so that group i of the loop below still
  // holds slice i: the loop's wait_group<kStages - 2> at slice i completes groups 0..i.
#pragma unroll 1
  for (int i = 0; i < C::kStages - 1; ++i) {
    if (i < count) copy_weight_slice(weight_ring, i, wr, s0 + i, q, a.k, threads, tid);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll 1
  for (int i = 0; i < C::kStages - 1; ++i) {
    if (i < count) copy_activation_slice(act_ring + i * kActWords, xg, a, s0 + i, n8, threads, tid);
  }
#pragma unroll 1
  for (int i = 0; i < C::kStages - 1; ++i) cp_async_commit();
  uint32_t sc[2][2][2];
  load_scales(sc, wr, s0, q, a.k, a.bc_log2);

  int read_slot = 0;
  int fill_slot = C::kStages - 1;
#pragma unroll 1
  for (int i = 0; i < count; ++i) {
    uint32_t sc_next[2][2][2];
    load_scales(sc_next, wr, s0 + i + 1, q, a.k, a.bc_log2);
    // Slice i landed (groups 0..i of this thread); after the barrier every thread's activation
    // pieces of it are visible, and every warp is done with slice i - 1, whose slot is refilled.
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    const int fill = i + C::kStages - 1;
    if (fill < count) {
      copy_weight_slice(weight_ring, fill_slot, wr, s0 + fill, q, a.k, threads, tid);
      copy_activation_slice(act_ring + fill_slot * kActWords, xg, a, s0 + fill, n8, threads, tid);
    }
    cp_async_commit();
    // The lane reads back only the chunks it copied: its own wait above ordered them.
    const uint4* slot = ring_chunk(weight_ring, read_slot, 0, threads, tid);
    multiply_slice<kFp8, C, 1>(
        acc, [&](int mt, int hr, int l) { return slot[(2 * (2 * mt + hr) + l) * threads]; }, sc,
        act_ring + read_slot * kActWords, n8, g8, q);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
        for (int l = 0; l < 2; ++l) sc[mt][hr][l] = sc_next[mt][hr][l];
      }
    }
    read_slot = read_slot + 1 == C::kStages ? 0 : read_slot + 1;
    fill_slot = fill_slot + 1 == C::kStages ? 0 : fill_slot + 1;
  }
  cp_async_wait_all();
  __syncthreads();  // every warp is done with the ring: the partial tile reuses it

  // The partial tile [token][row of the CTA] (c0, c1: row g, tokens 2q, 2q + 1 of the n8 group;
  // c2, c3: row g + 8).
  float* part = reinterpret_cast<float*>(fp8_stream_smem_raw);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < C::kTok / 8; ++j) {
      if (j >= n8) break;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int t = 8 * j + 2 * q + (c & 1);
        const int r = warp * kFp8StreamRowsPerWarp + 16 * mt + g8 + 8 * (c >> 1);
        if (t < a.m) part[t * rows_cta + r] = acc[mt][j][c];
      }
    }
  }
  const int entries = a.m * rows_cta;
  const int64_t ldy = (gridDim.z) * a.n;
  if (splits == 1) {
    __syncthreads();
    for (int e = tid; e < entries; e += threads) {
      const int64_t n = tile0 + e % rows_cta;
      if (n < a.n) a.y[(e / rows_cta) * ldy + grp * a.n + n] = part[e];
    }
    return;
  }
  // reduce_splits: CTA `split` of the cluster stores its share of the tile, adding the partials
  // of splits 0..S-1 in order (the same order whichever CTA adds them).
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int begin = split * entries / splits;
  const int end = (split + 1) * entries / splits;
  for (int e = begin + tid; e < end; e += threads) {
    float v = *cluster.map_shared_rank(part + e, 0);
    for (int r = 1; r < splits; ++r) v += *cluster.map_shared_rank(part + e, r);
    const int64_t n = tile0 + e % rows_cta;
    if (n < a.n) a.y[(e / rows_cta) * ldy + grp * a.n + n] = v;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

template <int kTok, int kStages>
void launch_shape(const StreamArgs& a, const Fp8StreamConfig& c, int64_t groups, bool pdl,
                  KernelSmemLimits& smem_limits, cudaStream_t stream) {
  using C = StreamShape<kTok, kStages>;
  const size_t smem = fp8_stream_smem(c.warps, kTok);
  // The kernel's limit is raised to the most any CTA width of this ring depth takes, once per
  // kernel (the registry never lowers a limit, so a captured graph's launch keeps what it needs).
  constexpr size_t kMaxSmem =
      static_cast<size_t>(kStages) *
      (static_cast<size_t>(kFp8StreamMaxWarps) * kFp8StreamRowsPerWarp * kFp8StreamSliceK +
       static_cast<size_t>(kTok) * kFp8StreamRowWords * 4);
  static_assert(kMaxSmem <= 227 * 1024, "fits sm_90's opt-in");
  smem_limits.allow(fp8_stream_kernel<C>, kMaxSmem);
  ClusterLaunch l = fp8_split_cluster(c, groups, smem, stream);
  l.pdl = pdl;
  launch_clustered("linear (fp8 stream)", l, fp8_stream_kernel<C>, a);
}

}  // namespace

size_t fp8_stream_scratch_elements(const Fp8Problem& p) {
  const int64_t kp = (p.k + kFp8StreamSliceK - 1) / kFp8StreamSliceK * kFp8StreamSliceK;
  return static_cast<size_t>(p.groups * p.m * kp);
}

void launch_fp8_stream(const float* x, __nv_bfloat16* xq, const uint8_t* w, const float* w_scales,
                       int64_t scale_ld, float* y, const Fp8Problem& p, const Fp8StreamConfig& c,
                       bool pdl, KernelSmemLimits& smem_limits, cudaStream_t stream) {
  const int64_t kp = (p.k + kFp8StreamSliceK - 1) / kFp8StreamSliceK * kFp8StreamSliceK;
  const int64_t items = p.m * p.groups * ((p.k + p.act_group - 1) / p.act_group);
  stage_quantized<<<ceil_div(items, kStageWarps), kStageWarps * 32, 0, stream>>>(
      x, xq, p.m, p.k, kp, p.groups, p.act_group);
  DEEPINFER_CUDA_LAUNCH_CHECK("linear (fp8 stream): activation staging");

  StreamArgs a;
  a.xq = xq;
  a.w = w;
  a.ws = w_scales;
  a.y = y;
  a.n = p.n;
  a.k = p.k;
  a.kp = kp;
  a.ws_ld = scale_ld;
  a.m = static_cast<int>(p.m);
  a.br = p.block_rows;
  a.bc_log2 = 0;
  while ((1 << a.bc_log2) < p.block_cols) ++a.bc_log2;
  a.slab = c.slab;
  // The ring depths fp8_stream_stages gives: 3 or 5 slices at 16 tokens, 3 or 4 at 64.
  static_assert(fp8_stream_stages(16, 8) == 3 && fp8_stream_stages(16, 4) == 5 &&
                    fp8_stream_stages(16, 2) == 5 && fp8_stream_stages(64, 8) == 4 &&
                    fp8_stream_stages(64, 4) == 3 && fp8_stream_stages(64, 2) == 4,
                "one kernel per ring depth");
  const int stages = fp8_stream_stages(c.tokens, c.warps);
  if (c.tokens <= 16) {
    if (stages == 3) {
      launch_shape<16, 3>(a, c, p.groups, pdl, smem_limits, stream);
    } else {
      launch_shape<16, 5>(a, c, p.groups, pdl, smem_limits, stream);
    }
  } else if (stages == 4) {
    launch_shape<64, 4>(a, c, p.groups, pdl, smem_limits, stream);
  } else {
    launch_shape<64, 3>(a, c, p.groups, pdl, smem_limits, stream);
  }
}

}  // namespace deepinfer::cuda
