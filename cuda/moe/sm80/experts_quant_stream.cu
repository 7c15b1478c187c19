// The decode shape (16-row tiles) of the quantized expert GEMMs, built to stream the weight bytes
// at HBM speed. At <= 16 tokens per expert each weight byte is used by at most 16 tokens, so the
// GEMM is bound by the weight bytes the SMs keep in flight (Little's law: ~4.3 TB/s x ~1 us of
// latency under load is ~32 KB per SM at the very least).
//
// The register-prefetch kernel (experts_quant.cu) holds one slice of weights ahead in registers:
// few bytes in flight, many registers, two CTAs of 4 warps per SM. Here every lane copies its own
// 16-byte weight chunks (the same chunks, in the same mma order) into a ring of kStages slices
// in shared memory with cp.async, kStages - 1 slices ahead of the one it multiplies: the bytes
// in flight are bounded by shared memory, not registers (ExpertQuantStreamMx: 2 CTAs of 8 warps
// and 128 KB of weights in flight per SM; 96 KB in the lean loop, which reads a slice ahead). A
// lane reads back only the chunks it copied itself, so its own cp.async.wait_group orders them;
// the activation slices share the ring and the one __syncthreads per slice that publishes them
// also frees the oldest slot for refilling.
//
// The ring's copies are experts_quant_stream_copy.cuh's. The decode, the mma order and the
// epilogue are experts_quant_tile.cuh's, as in the register kernel: every output element is
// reduced over K in slice order with the same fixed order inside a slice, so both kernels give
// bit-identical results.
//
// The lean variant (kLean, DEEPINFER_MOE_QUANT_DECODE=streaming_lean and the default for MXFP4,
// for K a multiple of the slice) issues fewer instructions per slice for the same bits: MXFP4
// words decoded by decode_mx_word (11 integer instructions per 8 values instead of 15) with
// one-instruction multipliers, no per-chunk bounds checks, and branch-free activation copies
// (zero rows by a zero-byte cp.async source). Its MXFP4 loop reads a slice's weight chunks and
// scale bytes from the ring into registers one slice ahead of their multiply, and has a copy for
// tiles of at most 8 rows (no predicated-off work for a second group of 8 tokens). On one
// activation plane, where the matrices have tensor maps, its MXFP4 weights come by tensor copies
// (kTensorCopies: TensorWeightFill, one thread per CTA, a row-major slot and an mbarrier per
// slot) instead of every lane's cp.async chunks: the same bytes read by the same lanes, so the
// bits do not change.
//
// The narrow shape (ExpertQuantStreamMxNarrow: 4 warps, 128 weight rows, 8 staged token rows, four
// CTAs per SM) runs the lean MXFP4 kernel for passes of at most 8 tokens on one activation plane,
// whose tile list then has 8-row tiles (expert_stream_narrow_tiles). At B = 1 on V4-Flash 192
// working CTAs of 256 rows put two CTAs on 60 SMs and one on the other 72, so the SMs holding two
// set the time; 384 CTAs of 128 rows put two or three on every SM. On the H100 the B = 1 gate/up
// pass went from ~37 to ~35 us and down from ~21.7 to ~20 (session 45, benchmarks/RESULTS.md).
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/moe/sm80/experts_quant_config.h"
#include "cuda/moe/sm80/experts_quant_stream.h"
#include "cuda/moe/sm80/experts_quant_stream_copy.cuh"
#include "cuda/moe/sm80/experts_quant_tile.cuh"

namespace deepinfer::cuda {

namespace {

using namespace quant_tile;  // NOLINT(google-build-using-namespace): this family's pieces
namespace cg = cooperative_groups;

// Split K (gridDim.y > 1; the splits of a tile and column block are one cluster): split 0 adds
// the other splits' partial tiles to its own in split order, through distributed shared memory
// (staged in `scratch`, the ring, free after the last slice: every copy into it has landed), and
// returns true: it stores the tile. The other splits return false. One split: true.
template <class C>
__device__ __forceinline__ bool gather_split_partials(float (&acc)[C::kMTiles][C::kTok / 8][4],
                                                      float* scratch) {
  if (gridDim.y == 1) return true;
  constexpr int kJ = C::kTok / 8;
  const int tid = static_cast<int>(threadIdx.x);
  __syncthreads();  // every warp is done with the ring
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        scratch[((mt * kJ + j) * 4 + i) * C::kThreads + tid] = acc[mt][j][i];
    }
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const bool first = blockIdx.y == 0;  // cluster (1, splits, 1): its rank
  if (first) {
    for (unsigned r = 1; r < gridDim.y; ++r) {
      const float* other = cluster.map_shared_rank(scratch, r);
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[mt][j][i] += other[((mt * kJ + j) * 4 + i) * C::kThreads + tid];
          }
        }
      }
    }
  }
  cluster.sync();  // no CTA leaves while split 0 still reads its shared memory
  return first;
}

// experts_quant.cu's expert_quant_kernel with the weights streamed through the ring. kGateUp:
// act[row, n] = swiglu(x[token] . w1_e[n], x[token] . w3_e[n]) for C::kWeightRows / 2 columns n
// per CTA; otherwise y[pair, n] = act[row] . w2_e[n] for C::kWeightRows columns. CTA blockIdx.x
// works on tile blockIdx.x % max_tiles and column block blockIdx.x / max_tiles, over split
// blockIdx.y of gridDim.y of K's slices (gather_split_partials). kExpertStreamThreadsPerSm
// threads per SM (two CTAs of the 8-warp shapes, four of the narrow one; 128 registers per thread
// at most). kLean: the lean variant (head comment), K a multiple of kQuantSliceK. kTensorCopies
// (lean MXFP4): its weights come by tensor copies through lo.maps / hi.maps (TensorWeightFill).
template <QuantFormat F, bool kGateUp, class C, int kPlanes, bool kLean, bool kTensorCopies>
__global__ void __launch_bounds__(C::kThreads, kExpertStreamThreadsPerSm / C::kThreads)
    expert_quant_stream_kernel(const __nv_bfloat16* __restrict__ a, int64_t K, int64_t N, int top_k,
                               const int32_t* __restrict__ sorted_pair, TileList tiles,
                               int max_tiles, QuantMatrices lo, QuantMatrices hi, int block_rows,
                               int block_cols_log2, float limit, float* __restrict__ out) {
  enter_dependent_grid();
  using Tr = QuantTraits<F>;
  constexpr int kM = C::kMTiles;
  constexpr int kHalf = kGateUp ? kM / 2 : kM;  // m16 tiles per matrix
  constexpr int kActWords = kPlanes * C::kTok * kQuantRowWords;
  constexpr int kChunks = kM * 2 * Tr::kLoads;  // 16-byte weight chunks per thread per slice
  // 128-byte aligned: the tensor copies' slots (their offsets are multiples of 128).
  extern __shared__ __align__(128) int4 stream_smem_raw[];
  uint32_t* act_ring = reinterpret_cast<uint32_t*>(stream_smem_raw);  // [kStages][kActWords]
  uint4* weight_ring = reinterpret_cast<uint4*>(act_ring + C::kStages * kActWords);
  // MXFP4 lean: the slices' scale bytes come through the ring too, 4 per weight row and slice
  // ([kStages][kWeightRows] words, each copied by one thread, read by the row's 4 lanes).
  constexpr bool kScaleRing = kLean && Tr::kMx;
  uint32_t* scale_ring =
      reinterpret_cast<uint32_t*>(weight_ring + C::kStages * kChunks * C::kThreads);

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
  const int k_lane = q * Tr::kChunk;
  const ActivationPiece piece = kLean ? activation_piece_lean<kGateUp, C, kPlanes>(
                                            a, sorted_pair, top_k, start, rows, Kp, tid)
                                      : activation_piece<kGateUp, C, kPlanes>(
                                            a, sorted_pair, top_k, start, rows, 8 * n8, Kp, tid);

  // The warp's first weight row, and the lane's rows (lane_weight_rows) with its own offsets
  // folded in, so a slice adds one 32-bit offset: values at the lane's first chunk of a slice
  // (16 q bytes in), MXFP4 scales at its group q.
  const int64_t n_warp = static_cast<int64_t>(col) * (C::kWeightRows / (kGateUp ? 2 : 1)) +
                         static_cast<int64_t>(warp) * 16 * kHalf;
  const WeightRows<kM> wr = lane_weight_rows<F, kM, kGateUp>(lo, hi, e, n_warp, g, N, K, block_rows,
                                                             block_cols_log2, 16 * q, q);
  const int64_t kblocks = Tr::kMx ? K / 32 : ((K - 1) >> block_cols_log2) + 1;

  const uint8_t* scale_src = nullptr;
  if constexpr (kScaleRing) {
    scale_src = thread_scale_row<kGateUp, C>(
        lo, hi, e, static_cast<int64_t>(col) * (C::kWeightRows / (kGateUp ? 2 : 1)), N, kblocks,
        tid);
  }

  float acc[kM][C::kTok / 8][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int j = 0; j < C::kTok / 8; ++j)
      acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  }

  // This CTA's slices of K: [s_begin, s_begin + slices) of split blockIdx.y (none empty:
  // expert_stream_splits keeps several slices per split).
  const int all_slices = static_cast<int>(Kp / kQuantSliceK);
  const int per_split =
      (all_slices + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int s_begin = static_cast<int>(blockIdx.y) * per_split;
  const int slices = min(per_split, all_slices - s_begin);
  const int k_end = static_cast<int>(K);
  uint32_t sc[kM][2][Tr::kLoads];
  if constexpr (kLean) {
    using Fill = LeanFill<F, C, kPlanes, kTensorCopies>;
    Fill lf;
    if constexpr (!kTensorCopies) {
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        lf.weights[mt][0] = wr.values[mt][0] + s_begin * Fill::kRowSliceBytes;
        lf.weights[mt][1] = wr.values[mt][1] + s_begin * Fill::kRowSliceBytes;
      }
    }
    static_assert(!kTensorCopies || kScaleRing, "tensor copies of MXFP4 weights only");
    using TensorFill = TensorWeightFill<kGateUp, C>;
    __shared__ uint64_t weight_full[kTensorCopies ? C::kStages : 1];
    TensorFill tf{nullptr, nullptr, col * TensorFill::kRows, smem_addr(weight_ring), weight_full};
    if constexpr (kTensorCopies) {
      tf.lo_map = static_cast<const uint8_t*>(lo.maps) + e * sizeof(CUtensorMap);
      tf.hi_map = static_cast<const uint8_t*>(hi.maps) + e * sizeof(CUtensorMap);
      tf.init(tid);
      __syncthreads();
    }
    // Rows past the tile read `a` itself with zero bytes: any slice offset stays a valid address.
    lf.act = piece.src + s_begin * kQuantSliceK;
    lf.act_bytes = piece.src_bytes;
    lf.plane_elems = Kp;
    lf.scales = scale_src != nullptr ? scale_src + 4 * s_begin : nullptr;
    lf.weight_dst = smem_addr(weight_ring) + tid * 16;
    lf.act_dst = smem_addr(act_ring) + piece.dst * 4;
    lf.scale_dst = smem_addr(scale_ring) + tid * 4;
    // One cp.async group per prologue slice.
#pragma unroll 1
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (s < slices) {
        lf.fill(s);
        if constexpr (kTensorCopies) tf.fill(s, s_begin + s, tid);
      }
      cp_async_commit();
    }
    if constexpr (kScaleRing) {
      // MXFP4: a slice's weight chunks and scale bytes are read from the ring into registers
      // one slice ahead of their multiply, so no shared-memory read latency sits between a
      // slice's barrier and its decode (waits on shared-memory reads were this loop's largest
      // stall in Nsight Compute). Slice s + 1 must then have landed at slice s's barrier: one
      // slice fewer in flight (96 KB per SM instead of 128).
      static_assert(C::kStages >= 3, "a slice in flight besides the two read");
      const uint4* weight_base = weight_chunk<C>(weight_ring, 0, kChunks, 0, tid);
      const uint8_t* scale_base = reinterpret_cast<const uint8_t*>(scale_ring + warp * 32 + g) + q;
      // kTensorCopies: the lane's rows of the slot (row-major; gate/up: w1 rows, then w3 rows).
      const uint8_t* row_base = reinterpret_cast<const uint8_t*>(weight_ring) +
                                TensorFill::offset(warp * 16 * kHalf + g, q);
      auto read_operands = [&](int slot, uint4(&chunk)[kM][2], uint32_t(&scale)[kM][2][1]) {
        const uint4* w = weight_base + slot * (kChunks * C::kThreads);
        const uint8_t* sr = scale_base + slot * (C::kWeightRows * 4);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            if constexpr (kTensorCopies) {
              const int r =
                  (kGateUp && mt >= kHalf ? TensorFill::kRows : 0) + 16 * (mt % kHalf) + 8 * hr;
              chunk[mt][hr] = *reinterpret_cast<const uint4*>(
                  row_base + slot * TensorFill::kSlotBytes + TensorFill::offset(r, 0));
            } else {
              chunk[mt][hr] = w[(2 * mt + hr) * C::kThreads];
            }
            scale[mt][hr][0] = sr[4 * (16 * mt + 8 * hr)];
          }
        }
      };
      cp_async_wait<C::kStages - 2>();  // slice 0
      if constexpr (kTensorCopies) tf.wait(0);
      __syncthreads();
      // The slice loop, compiled for tiles of at most 8 rows (kMaxN8 1: no predicated-off mma
      // for a second group of 8 tokens) and for full tiles; each CTA takes one (n8 is uniform).
      auto slice_loop = [&](auto max_n8) {
        constexpr int kMaxN8 = decltype(max_n8)::value;
        uint4 chunks[2][kM][2];  // ping-pong: slice s reads set s % 2 and fills the other
        uint32_t scales[2][kM][2][1];
        read_operands(0, chunks[0], scales[0]);
        int read_slot = 0;
        int fill_slot = C::kStages - 1;
        auto step = [&](int s, const uint4(&cur)[kM][2], const uint32_t(&cur_scales)[kM][2][1],
                        uint4(&nxt)[kM][2], uint32_t(&nxt_scales)[kM][2][1]) {
          // Slice s + 1 landed and is published; every warp is done with slice s - 1's slot
          // (its activations read in slice s - 1, its weights and scales in slice s - 2).
          const int next_slot = s + 1 < slices ? (read_slot + 1 == C::kStages ? 0 : read_slot + 1)
                                               : read_slot;  // past the last: re-read, unused
          cp_async_wait<C::kStages - 3>();
          if constexpr (kTensorCopies) {
            if (s + 1 < slices) tf.wait(next_slot);
          }
          __syncthreads();
          if (s + C::kStages - 1 < slices) {
            lf.fill(fill_slot);
            if constexpr (kTensorCopies) tf.fill(fill_slot, s_begin + s + C::kStages - 1, tid);
          }
          cp_async_commit();
          read_operands(next_slot, nxt, nxt_scales);
          multiply_slice<F, C, kPlanes, true, kMaxN8>(
              acc, [&](int mt, int hr, int) { return cur[mt][hr]; }, cur_scales,
              act_ring + read_slot * kActWords, n8, g, q);
          read_slot = next_slot;
          fill_slot = fill_slot + 1 == C::kStages ? 0 : fill_slot + 1;
        };
        // Two slices per iteration, so that the sets swap roles without register moves.
#pragma unroll 1
        for (int s = 0; s < slices; s += 2) {
          step(s, chunks[0], scales[0], chunks[1], scales[1]);
          if (s + 1 < slices) step(s + 1, chunks[1], scales[1], chunks[0], scales[0]);
        }
      };
      if (C::kTok == 8 || n8 == 1) {
        slice_loop(std::integral_constant<int, 1>{});
      } else {
        slice_loop(std::integral_constant<int, C::kTok / 8>{});
      }
      cp_async_wait_all();  // no copy outlives the CTA's shared memory
      if (gather_split_partials<C>(acc, reinterpret_cast<float*>(stream_smem_raw))) {
        store_tile<kGateUp, C>(acc, N, n_warp, sorted_pair, start, rows, n8, limit, out, g, q);
      }
      return;
    }
    load_scales<F, kM, true>(sc, wr, s_begin, k_lane, k_end, block_cols_log2);
    int read_slot = 0;
    int fill_slot = C::kStages - 1;
#pragma unroll 1
    for (int s = 0; s < slices; ++s) {
      // FP8 (MXFP4 returned above). In bounds only: past the last slice it reloads the last
      // slice's scales (never used).
      uint32_t sc_next[kM][2][Tr::kLoads];
      load_scales<F, kM, true>(sc_next, wr, s_begin + min(s + 1, slices - 1), k_lane, k_end,
                               block_cols_log2);
      // As the default loop below: slice s landed and is published, slice s - 1's slot is free.
      cp_async_wait<C::kStages - 2>();
      __syncthreads();
      if (s + C::kStages - 1 < slices) lf.fill(fill_slot);
      cp_async_commit();
      const uint4* slot = weight_chunk<C>(weight_ring, read_slot, kChunks, 0, tid);
      multiply_slice<F, C, kPlanes, true>(
          acc,
          [&](int mt, int hr, int l) {
            return slot[((2 * mt + hr) * Tr::kLoads + l) * C::kThreads];
          },
          sc, act_ring + read_slot * kActWords, n8, g, q);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
          for (int l = 0; l < Tr::kLoads; ++l) sc[mt][hr][l] = sc_next[mt][hr][l];
        }
      }
      read_slot = read_slot + 1 == C::kStages ? 0 : read_slot + 1;
      fill_slot = fill_slot + 1 == C::kStages ? 0 : fill_slot + 1;
    }
  } else {
    // One cp.async group per prologue slice.
#pragma unroll 1
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (s < slices) {
        copy_weight_slice<F, C>(weight_ring, s, wr, s_begin + s, k_lane, k_end, tid);
        copy_activation_slice<C, kPlanes>(act_ring + s * kActWords, piece, s_begin + s, Kp);
      }
      cp_async_commit();
    }
    load_scales<F, kM, false>(sc, wr, s_begin, k_lane, k_end, block_cols_log2);

    int read_slot = 0;
    int fill_slot = C::kStages - 1;
#pragma unroll 1
    for (int s = 0; s < slices; ++s) {
      uint32_t sc_next[kM][2][Tr::kLoads];
      load_scales<F, kM, false>(sc_next, wr, s_begin + s + 1, k_lane, k_end, block_cols_log2);
      // Slice s landed (groups 0..s of this thread); after the barrier every thread's activation
      // pieces of it are visible, and every warp is done with slice s - 1, whose slot is refilled.
      cp_async_wait<C::kStages - 2>();
      __syncthreads();
      const int fill = s + C::kStages - 1;
      if (fill < slices) {
        copy_weight_slice<F, C>(weight_ring, fill_slot, wr, s_begin + fill, k_lane, k_end, tid);
        copy_activation_slice<C, kPlanes>(act_ring + fill_slot * kActWords, piece, s_begin + fill,
                                          Kp);
      }
      cp_async_commit();
      // The lane reads back only the chunks it copied: its own wait above ordered them.
      const uint4* slot = weight_chunk<C>(weight_ring, read_slot, kChunks, 0, tid);
      multiply_slice<F, C, kPlanes>(
          acc,
          [&](int mt, int hr, int l) {
            return slot[((2 * mt + hr) * Tr::kLoads + l) * C::kThreads];
          },
          sc, act_ring + read_slot * kActWords, n8, g, q);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
          for (int l = 0; l < Tr::kLoads; ++l) sc[mt][hr][l] = sc_next[mt][hr][l];
        }
      }
      read_slot = read_slot + 1 == C::kStages ? 0 : read_slot + 1;
      fill_slot = fill_slot + 1 == C::kStages ? 0 : fill_slot + 1;
    }
  }
  cp_async_wait_all();  // no copy outlives the CTA's shared memory
  if (gather_split_partials<C>(acc, reinterpret_cast<float*>(stream_smem_raw))) {
    store_tile<kGateUp, C>(acc, N, n_warp, sorted_pair, start, rows, n8, limit, out, g, q);
  }
}

template <QuantFormat F, bool kGateUp, class C, int kPlanes>
void launch_stream_gemm(const QuantExpertsArgs& p, bool lean, const __nv_bfloat16* a, float* out,
                        bool pdl, cudaStream_t stream) {
  const int64_t K = kGateUp ? p.hidden : p.inter;
  const int64_t N = kGateUp ? p.inter : p.hidden;
  // Column blocks: gate/up CTAs take C::kWeightRows / 2 columns (of w1 and the same of w3), down
  // CTAs C::kWeightRows rows of w2.
  const int64_t cols_per_cta = C::kWeightRows / (kGateUp ? 2 : 1);
  const int64_t cols = (N + cols_per_cta - 1) / cols_per_cta;
  // The lean variant where asked for and K is whole slices (its copies check no bounds); MXFP4's
  // adds the scale ring.
  lean = lean && K % kQuantSliceK == 0;
  const size_t smem = C::smem_bytes(QuantTraits<F>::kLoads, kPlanes) +
                      (lean && QuantTraits<F>::kMx ? C::scale_ring_bytes() : 0);
  // The narrow shape (8 staged token rows) is compiled for the lean kernel only: its caller
  // takes it for lean passes over whole slices of K (launch_expert_quant_stream).
  auto kernel = expert_quant_stream_kernel<F, kGateUp, C, kPlanes, true, false>;
  if constexpr (C::kTok != 8) {
    if (!lean) kernel = expert_quant_stream_kernel<F, kGateUp, C, kPlanes, false, false>;
  }
  // Lean MXFP4 on one activation plane (the routed experts of V4 checkpoints) takes its weights by
  // tensor copies where the matrices have tensor maps (moe_experts.cu: expert_value_maps). On the
  // H100 the step ran 0.0-0.6% faster at B = 1, 1.1-1.3% at B = 8 and 2.9% at B = 64 (session 46).
  if constexpr (QuantTraits<F>::kMx && kPlanes == 1) {
    const QuantMatrices& lo = kGateUp ? p.w1 : p.w2;
    const QuantMatrices& hi = kGateUp ? p.w3 : p.w2;
    if (lean && lo.maps != nullptr && hi.maps != nullptr) {
      kernel = expert_quant_stream_kernel<F, kGateUp, C, kPlanes, true, true>;
    }
  }
  allow_smem(kernel, smem);
  // Grid size: checked against gridDim.x's limit by the caller. Too few CTAs for the SMs: K split
  // over clusters (expert_stream_splits).
  const int64_t slices = (K + kQuantSliceK - 1) / kQuantSliceK;
  const int splits = expert_stream_splits(p.max_tiles * cols, slices, p.num_sms,
                                          kExpertStreamThreadsPerSm / C::kThreads);
  ClusterLaunch l;
  l.grid = dim3(static_cast<unsigned>(p.max_tiles * cols), static_cast<unsigned>(splits));
  l.block = dim3(C::kThreads);
  l.cluster = dim3(1, static_cast<unsigned>(splits), 1);
  l.smem = smem;
  l.stream = stream;
  l.pdl = pdl;
  if (splits > 1) {
    launch_clustered("moe_experts", l, kernel, a, K, N, p.top_k, p.sorted_pair, p.tiles,
                     static_cast<int>(p.max_tiles), kGateUp ? p.w1 : p.w2, kGateUp ? p.w3 : p.w2,
                     p.block_rows, p.block_cols_log2, p.limit, out);
  } else {
    launch_programmatic("moe_experts", l.grid, l.block, smem, stream, pdl, kernel, a, K, N, p.top_k,
                        p.sorted_pair, p.tiles, static_cast<int>(p.max_tiles),
                        kGateUp ? p.w1 : p.w2, kGateUp ? p.w3 : p.w2, p.block_rows,
                        p.block_cols_log2, p.limit, out);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

template <QuantFormat F, class C>
void launch_stream_format(const QuantExpertsArgs& p, bool gate_up, int planes, bool lean,
                          const __nv_bfloat16* a, float* out, bool pdl, cudaStream_t stream) {
  if (gate_up) {
    if (planes == 1) {
      launch_stream_gemm<F, true, C, 1>(p, lean, a, out, pdl, stream);
    } else {
      launch_stream_gemm<F, true, C, 3>(p, lean, a, out, pdl, stream);
    }
  } else if (planes == 1) {
    launch_stream_gemm<F, false, C, 1>(p, lean, a, out, pdl, stream);
  } else {
    launch_stream_gemm<F, false, C, 3>(p, lean, a, out, pdl, stream);
  }
}

}  // namespace

void launch_expert_quant_stream(const QuantExpertsArgs& p, bool gate_up, int planes, bool lean,
                                const __nv_bfloat16* a, float* out, bool pdl, cudaStream_t stream) {
  const int64_t K = gate_up ? p.hidden : p.inter;
  // 8-row tiles (expert_stream_narrow_tiles) on the lean MXFP4 kernel: the narrow shape. The
  // 8-warp shapes below take any tile of at most 16 rows.
  if (p.tile_rows == ExpertQuantStreamMxNarrow::kTok && p.format == QuantFormat::kMxfp4 && lean &&
      planes == 1 && K % kQuantSliceK == 0) {
    if (gate_up) {
      launch_stream_gemm<QuantFormat::kMxfp4, true, ExpertQuantStreamMxNarrow, 1>(p, true, a, out,
                                                                                  pdl, stream);
    } else {
      launch_stream_gemm<QuantFormat::kMxfp4, false, ExpertQuantStreamMxNarrow, 1>(p, true, a, out,
                                                                                   pdl, stream);
    }
    return;
  }
  if (p.format == QuantFormat::kMxfp4) {
    launch_stream_format<QuantFormat::kMxfp4, ExpertQuantStreamMx>(p, gate_up, planes, lean, a, out,
                                                                   pdl, stream);
  } else {
    launch_stream_format<QuantFormat::kFp8, ExpertQuantStreamFp8>(p, gate_up, planes, lean, a, out,
                                                                  pdl, stream);
  }
}

}  // namespace deepinfer::cuda
