// The prefetching variant of the Hopper attention kernel
// (DEEPINFER_ATTENTION_KERNEL=wgmma_prefetch, opt-in; sm_90a only): the same tiles, products,
// softmax and output as attention_wgmma.cu's kernel (bit-identical results), with the key loads
// moved off the tile's critical path. That kernel waits for memory several times per tile (the fp8
// stage holds half a tile, so each half is copied and then waited for within one tile; a key's
// address, a top-k column and then a block-table entry, is resolved right before its copy), and at
// B >= 64 its tiles took 7-9 us where the products take about 1.5. Here:
//  - fp8 records go to registers, not to a shared stage: thread tid holds a quarter of the
//    record of key tid / 4 (19 8-byte loads, Fp8Share; V4's 584-byte record only), loaded
//    during tile i and decoded while tile i + 1's scores run: each load has a tile to land;
//  - bf16 rows are copied with cp.async a tile ahead, as before;
//  - q's loads are all issued first, before the block resolves its first keys, and the row's
//    sequence is found by a warp-wide search (seq_of_row_warp: 2 dependent loads at B = 256);
//  - a key's address is resolved in two steps a tile before its loads are issued: the top-k
//    column loaded while the scores run, the block-table entry while the values run;
//  - with wgmma_prefetch_pdl (kPdl) it is a programmatic dependent launch of the kv rows'
//    encoding (attention.cu's first grid): a block resolves its first tiles' addresses while that
//    grid runs and waits for it (griddepcontrol.wait) before it reads a key; the split combine
//    after it likewise starts early and waits for this grid. At B = 1 (one tile per block) the
//    chain of dependent loads and the three launches are most of the time.
//  - with wgmma_prefetch_sw128(_pdl) (kSw128) the tiles are in wgmma's 128-byte swizzle
//    (Tiles) instead of the no-swizzle core matrices.
// Numerics and outputs: exactly attention_wgmma_kernel's (the same tile contents, products and
// softmax in the same order), which tests/gpu/cpp/test_attention_wgmma.cpp checks byte for byte.
#include <cstdint>

#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm90/attention_wgmma_keys.cuh"
#include "cuda/attention/sm90/attention_wgmma_prefetch.h"
#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/smem_limits.h"

namespace deepinfer::cuda {

namespace attention_wgmma {
namespace {

// V4's fp8 main record (attention_wgmma_config.h): the register shares are cut for it only.
constexpr int kV4Nope = kWgmmaPrefetchNope;
constexpr int kV4Rope = kWgmmaPrefetchRope;
constexpr int kV4RecordBytes = kWgmmaPrefetchRecordBytes;
constexpr int kPieces = 4;                             // threads (shares) per record
constexpr int kShareNope = kV4Nope / 8 / kPieces;      // 14 8-byte pieces of e4m3 channels
constexpr int kShareRope = 2 * kV4Rope / 8 / kPieces;  // 4 8-byte pieces of bf16 channels
static_assert(kV4Nope + 2 * kV4Rope + (kV4Nope + 63) / 64 <= kV4RecordBytes, "V4's record");
static_assert(kV4Nope + kV4Rope == kDim, "the record's channels are the tile's");
static_assert(kThreads == kPieces * kKeys, "a share per thread");

// One thread's share of an fp8 record (part `part` of key tid / 4): the record's 8-byte pieces
// kPieces i + part of its e4m3 bytes and of its bf16 RoPE bytes, so that the 4 threads of a key
// read 32 contiguous bytes per load, and the scale bytes.
struct Fp8Share {
  uint2 nope[kShareNope];  // channels 8 (4i + part) .. + 7: tile chunk 4i + part
  uint2 rope[kShareRope];  // RoPE channels 4 (4i + part) .. + 3: half a tile chunk
  uint2 scales;            // the 7 e8m0 scales and the pad byte
};

// Loads the thread's share of the record at `rec` (null: nothing, the key is masked), through
// L2 only (each byte is read once per block).
__device__ __forceinline__ void load_fp8_share(Fp8Share& sh, const uint8_t* rec, int part) {
  if (rec == nullptr) return;
  const uint2* nope = reinterpret_cast<const uint2*>(rec) + part;
#pragma unroll
  for (int i = 0; i < kShareNope; ++i) sh.nope[i] = __ldcg(nope + kPieces * i);
  const uint2* rope = reinterpret_cast<const uint2*>(rec + kV4Nope) + part;
#pragma unroll
  for (int i = 0; i < kShareRope; ++i) sh.rope[i] = __ldcg(rope + kPieces * i);
  sh.scales = __ldcg(reinterpret_cast<const uint2*>(rec + kV4Nope + 2 * kV4Rope));
}

// Decodes the share into tile row `key` (zeros for a masked key) and sets the key's valid flag:
// decode_fp8_key's arithmetic on the same bytes, so the tile is the same bits.
template <bool kSw128>
__device__ __forceinline__ void decode_fp8_share(uint8_t* kb, int* valid, const Fp8Share& sh,
                                                 bool real, int key, int part) {
  const uint64_t scales = (static_cast<uint64_t>(sh.scales.y) << 32) | sh.scales.x;
#pragma unroll
  for (int i = 0; i < kShareNope; ++i) {
    const int chunk = kPieces * i + part;  // channels 8 chunk ..: scale group 8 chunk / 64
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (real) {
      const float scale =
          e8m0_to_float(static_cast<uint8_t>(scales >> (8 * (8 * chunk / kv_record::kFp8Group))));
      uint32_t packed[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t word = k < 2 ? sh.nope[i].x : sh.nope[i].y;
        const uint32_t pair = (word >> (16 * (k & 1))) & 0xffffu;
        const __half2 h =
            __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3));
        const float2 f = __half22float2(h);
        packed[k] = pack_bf16(f.x * scale, f.y * scale);
      }
      v = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
    *reinterpret_cast<uint4*>(kb + Tiles<kSw128>::offset(key, chunk)) = v;
  }
#pragma unroll
  for (int i = 0; i < kShareRope; ++i) {
    const int piece = kPieces * i + part;  // RoPE channels 4 piece ..: half of chunk piece / 2
    *reinterpret_cast<uint2*>(kb + Tiles<kSw128>::offset(key, kV4Nope / 8 + piece / 2) +
                              8 * (piece & 1)) = real ? sh.rope[i] : make_uint2(0u, 0u);
  }
  if (part == 0) valid[key] = real ? 1 : 0;
}

// kPdl: launched as a programmatic dependent launch (the griddepcontrol instructions are only in
// that instantiation). kSw128: the tiles in wgmma's 128-byte swizzle (Tiles).
template <KvFormat kFmt, bool kPdl, bool kSw128>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_prefetch_kernel(AttentionArgs a, DeviceLayout l) {
  using T = Tiles<kSw128>;
  static_assert(kFmt == KvFormat::kBf16 || kFmt == KvFormat::kFp8, "bf16 rows or fp8 records");
  constexpr bool kFp8 = kFmt == KvFormat::kFp8;
  extern __shared__ int4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  uint8_t* qs = smem + Layout::kQOff;
  uint8_t* kb_base = smem + Layout::kKbOff;  // buffer b at kb_base + b * kKbBytes
  uint8_t* ps = smem + Layout::kPOff;
  float* xchg = reinterpret_cast<float*>(smem + Layout::kXchgOff);
  int* valid_base = reinterpret_cast<int*>(smem + Layout::kValidOff);
  if constexpr (kSw128) {
    // The swizzle is of absolute address bits: the tiles must start at multiples of 1 KB.
    static_assert(Layout::kQOff % 1024 == 0 && Layout::kKbOff % 1024 == 0 &&
                      Layout::kKbBytes % 1024 == 0 && Layout::kPOff % 1024 == 0,
                  "1 KB aligned tiles");
    if ((smem_addr(smem) & 1023u) != 0) __trap();
  }

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int wg = tid >> 7;                               // warpgroup: keys of S, channels of O
  const int row0 = 16 * ((tid >> 5) & 3) + (lane >> 2);  // the thread's heads: row0, row0 + 8
  const int qd = lane & 3;
  const int t = blockIdx.x;
  const int h_first = blockIdx.y * kRows;
  // Copy role (both formats): key `ck` of each tile; bf16 chunks `part` + 4j, fp8 share `part`.
  const int ck = tid >> 2;
  const int part = tid & 3;
  // The combine of the splits (a programmatic dependent launch of this grid) may start: it
  // waits for this grid's completion before it reads anything.
  if constexpr (kPdl) let_dependents_launch();
  // q first (the grids before the kv rows' encoding wrote it): it flies while the block resolves
  // its keys.
  float4 q_loads[kQueryLoads];
  issue_query_loads(a, t, h_first, tid, q_loads);

  const AttentionKeys keys(a, l, t, seq_of_row_warp(l, t));
  const KeyRange range = split_key_range<kKeys>(keys.n_keys, blockIdx.z, gridDim.z);
  auto pending_at = [&](int64_t i0) { return key_index(a, l, keys, i0 + ck, range.end); };
  auto resolve = [&](KeyIndex k) { return key_row(a, key_lookup(a, l, keys, k)); };
  auto kb_of = [&](int b) { return kb_base + b * Layout::kKbBytes; };
  auto valid_of = [&](int b) { return valid_base + b * kKeys; };

  float o[kOAcc];
#pragma unroll
  for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float d_run[2] = {0.0f, 0.0f};  // over this warpgroup's keys only

  // fp8: the share of the record the thread decodes next (tile it + 1 during tile it) and
  // whether its key is real. Both formats: the address of the key the thread loads next
  // (tile it + 2 during tile it for fp8, tile it + 1 for bf16).
  Fp8Share share;
  bool share_real = false;
  const uint8_t* src_next = nullptr;

  if (range.begin < range.end) {
    // The first tiles' addresses: top-k columns and block-table entries, which the grids before
    // the kv rows' encoding wrote (complete: that grid is an ordinary launch).
    const KeyIndex k0 = pending_at(range.begin);
    const KeyIndex k1 = pending_at(range.begin + kKeys);
    const KeyIndex k2 = pending_at(range.begin + 2 * kKeys);
    const uint8_t* src0 = resolve(k0);
    const uint8_t* src1 = resolve(k1);
    store_query_tile<kSw128>(qs, tid, q_loads);
    // A sliding key may be one of this call's kv rows: the previous grid's output (with a
    // programmatic dependent launch this kernel started while that grid ran).
    if constexpr (kPdl) wait_for_previous_grid();
    if constexpr (kFp8) {
      load_fp8_share(share, src0, part);
      decode_fp8_share<kSw128>(kb_of(0), valid_of(0), share, src0 != nullptr, ck, part);
      fence_async_shared();  // tile 0 and q, for wgmma
      load_fp8_share(share, src1, part);
      share_real = src1 != nullptr;
      src_next = resolve(k2);
    } else {
      copy_bf16_key<kSw128>(kb_of(0), valid_of(0), src0, ck, part);
      src_next = src1;
    }
  }

  const uint64_t q_desc = T::kmajor(qs);
  const uint64_t p_desc = T::kmajor(ps);
  int it = 0;
  for (int64_t i0 = range.begin; i0 < range.end; i0 += kKeys, ++it) {
    const int buf = it & 1;
    uint8_t* kb = kb_of(buf);
    const bool more = i0 + kKeys < range.end;
    if constexpr (!kFp8) {
      cp_async_wait_all();
      fence_async_shared();  // this thread's copies, zero rows and q, for wgmma
    }  // fp8: the decodes are fenced where they end, before the next loads are issued
    __syncthreads();  // tile `it` in kb; every thread past tile it - 1 (the other buffer)
    KeyIndex pending;
    if constexpr (!kFp8) {
      if (more) copy_bf16_key<kSw128>(kb_of(buf ^ 1), valid_of(buf ^ 1), src_next, ck, part);
      pending = pending_at(i0 + 2 * kKeys);  // tile it + 2, copied at the next tile
    }
    float s[16] = {};
    issue_scores<kSw128>(s, q_desc, T::kmajor(kb + T::score_keys(wg)));
    if constexpr (kFp8) {
      pending = pending_at(i0 + 3 * kKeys);  // tile it + 3, loaded at the next tile
      // Tile it + 1, loaded during the previous tile, decoded while the scores run; tile it + 2
      // loaded to land during the next one.
      if (more) {
        decode_fp8_share<kSw128>(kb_of(buf ^ 1), valid_of(buf ^ 1), share, share_real, ck, part);
      }
      fence_async_shared();  // the decoded tile, for wgmma after the next tile's barrier
      load_fp8_share(share, src_next, part);
      share_real = src_next != nullptr;
    }
    wait_products(s);
    float alpha[2];
    softmax_tile<kSw128>(s, valid_of(buf), xchg, ps, a.scale, wg, row0, qd, m_run, d_run, alpha);
    fence_async_shared();
    __syncthreads();  // P of both halves
    issue_values<kSw128>(o, alpha, p_desc, T::nmajor(kb + T::value_channels(wg)));
    src_next = resolve(pending);  // the block-table load lands while the values run
    wait_products(o);
  }

  finish_rows(a, l, o, m_run, d_run, xchg, t, h_first, wg, row0, qd);
}

// The prefetching kernel; with p.pdl a programmatic dependent launch of the grid before it (the kv
// rows' encoding): it resolves its first keys' addresses while that grid runs.
template <KvFormat kFmt>
void launch(const AttentionArgs& a, const DeviceLayout& l, const AttentionMmaPlan& p,
            int64_t tokens, KernelSmemLimits& smem_limits, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(p.head_groups),
                  static_cast<unsigned>(p.splits));
  auto* kernel = p.swizzle ? (p.pdl ? attention_wgmma_prefetch_kernel<kFmt, true, true>
                                    : attention_wgmma_prefetch_kernel<kFmt, false, true>)
                           : (p.pdl ? attention_wgmma_prefetch_kernel<kFmt, true, false>
                                    : attention_wgmma_prefetch_kernel<kFmt, false, false>);
  smem_limits.allow(kernel, Layout::kBytes);
  launch_programmatic("attention's prefetching wgmma kernel", grid, dim3(kThreads), Layout::kBytes,
                      stream, p.pdl, kernel, a, l);
}

}  // namespace
}  // namespace attention_wgmma

void launch_attention_wgmma_prefetch(const AttentionArgs& a, const DeviceLayout& l,
                                     const AttentionMmaPlan& p, int64_t tokens,
                                     KernelSmemLimits& smem_limits, cudaStream_t stream) {
  if (a.kvf.format == KvFormat::kBf16) {
    return attention_wgmma::launch<KvFormat::kBf16>(a, l, p, tokens, smem_limits, stream);
  }
  return attention_wgmma::launch<KvFormat::kFp8>(a, l, p, tokens, smem_limits, stream);
}

}  // namespace deepinfer::cuda
