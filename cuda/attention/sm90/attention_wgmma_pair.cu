// The paired variant of the prefetching Hopper attention kernel, for 128 heads or a multiple
// (DEEPINFER_ATTENTION_KERNEL=wgmma_pair, opt-in; sm_90a only; other head counts run the
// default kernel). At 128 heads (V4-Pro) the prefetching kernel's two blocks of a token each load
// and decode the same keys into their own tiles: twice the key bytes and the decode work of 64
// heads (H200: 1.94x the 64-head time, FlashMLA 1.43x). Here the two blocks of a token's
// 128 heads (blockIdx.y 2k and 2k + 1) are one thread-block cluster and share the work: each
// loads and decodes half of every 64-key tile (the block of cluster rank r keys 32r .. 32r + 31)
// and stores the decoded bf16 rows, and the keys' valid flags, into its own tile and through
// distributed shared memory into its peer's, so both blocks hold the whole tile.
//
// Pipeline: the prefetching kernel's fp8 one (attention_wgmma_prefetch.cu) for both formats:
// a thread holds its share of a key (8 threads per key: 7 8-byte e4m3 pieces, 2 RoPE pieces and
// the scales of V4's record, or 8 16-byte chunks of a bf16 row) in registers, loaded during tile
// i and stored while tile i + 1's scores run; keys' addresses resolved in two steps a tile ahead.
//
// Synchronisation. The block barrier that starts a tile is a cluster barrier (arrive.release,
// wait.acquire): past it, tile i's halves from both blocks are in both blocks' kb[i % 2] (each
// writer fenced its stores for the async proxy before arriving), and both blocks are done with
// tile i - 1, so the stores of tile i + 1 into kb[(i + 1) % 2], local and remote, overwrite
// nothing a block still reads. The maxima and probability barriers stay per block (each block has
// its own heads, P and exchange). Before the first remote store the blocks meet once (arrive at
// the start, wait before the first tile's stores): the peer must be running. Both blocks of a
// cluster have the same token and split (cluster dims (1, 2, 1)), so the same key range and the
// same number of tiles: every path executes 1 + tiles cluster barriers in both, including an
// empty range (1). A block's last remote store precedes the last tile's barrier, so no block
// exits while its peer may still write to it.
//
// Numerics and outputs: the prefetching kernel's bytes exactly (the same tile contents, the same
// products and softmax in the same order, the same plan), which
// tests/gpu/cpp/test_attention_wgmma_pair.cpp checks.
#include <cstdint>
#include <string>

#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm90/attention_wgmma_keys.cuh"
#include "cuda/attention/sm90/attention_wgmma_pair.h"
#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_cluster.cuh"
#include "cuda/common/smem_limits.h"

namespace deepinfer::cuda {

namespace attention_wgmma {
namespace {

constexpr int kPairBlocks = 2;                    // blocks of a cluster: a token's 128 heads
constexpr int kOwnKeys = kKeys / kPairBlocks;     // keys of a tile a block loads: 32
constexpr int kKeyThreads = kThreads / kOwnKeys;  // threads per loaded key: 8
constexpr int kV4Nope = kWgmmaPrefetchNope;
constexpr int kV4Rope = kWgmmaPrefetchRope;
constexpr int kSharePieces = kV4Nope / 8 / kKeyThreads;    // 7 8-byte e4m3 pieces (chunks)
constexpr int kShareRope = 2 * kV4Rope / 8 / kKeyThreads;  // 2 8-byte RoPE pieces
constexpr int kShareChunks = kChunks / kKeyThreads;        // 8 16-byte chunks of a bf16 row
static_assert(kThreads == kKeyThreads * kOwnKeys, "8 threads per key of the block's half");
static_assert(kSharePieces * 8 * kKeyThreads == kV4Nope && kShareRope * 4 * kKeyThreads == kV4Rope,
              "V4's record cut into equal shares");
static_assert(kV4Nope % kv_record::kFp8Group == 0 && kv_record::kFp8Group == 8 * kKeyThreads,
              "a share's e4m3 piece i is in scale group i");

// One thread's share of its key (part `part` of 8): fp8, pieces 8i + part of the record's e4m3
// bytes (tile chunk 8i + part) and of its RoPE bytes, and the scales; bf16, chunks 8j + part.
// The 8 threads of a key read 64 (fp8) or 128 (bf16) contiguous bytes per load.
template <KvFormat kFmt>
struct PairShare;
template <>
struct PairShare<KvFormat::kFp8> {
  uint2 nope[kSharePieces];
  uint2 rope[kShareRope];
  uint2 scales;  // the 7 e8m0 scales and the pad byte
};
template <>
struct PairShare<KvFormat::kBf16> {
  uint4 chunk[kShareChunks];
};

// Loads the share of the key at `src` (null: nothing, the key is masked) through L2 only.
__device__ __forceinline__ void load_share(PairShare<KvFormat::kFp8>& sh, const uint8_t* src,
                                           int part) {
  if (src == nullptr) return;
  const uint2* nope = reinterpret_cast<const uint2*>(src) + part;
#pragma unroll
  for (int i = 0; i < kSharePieces; ++i) sh.nope[i] = __ldcg(nope + kKeyThreads * i);
  const uint2* rope = reinterpret_cast<const uint2*>(src + kV4Nope) + part;
#pragma unroll
  for (int i = 0; i < kShareRope; ++i) sh.rope[i] = __ldcg(rope + kKeyThreads * i);
  sh.scales = __ldcg(reinterpret_cast<const uint2*>(src + kV4Nope + 2 * kV4Rope));
}

__device__ __forceinline__ void load_share(PairShare<KvFormat::kBf16>& sh, const uint8_t* src,
                                           int part) {
  if (src == nullptr) return;
  const uint4* row = reinterpret_cast<const uint4*>(src) + part;
#pragma unroll
  for (int j = 0; j < kShareChunks; ++j) sh.chunk[j] = __ldcg(row + kKeyThreads * j);
}

// A key buffer in both blocks of the cluster: this block's tile and valid flags, and the peer's
// (shared::cluster addresses of the same offsets). Every store goes to both.
struct PairBuffer {
  uint8_t* kb;
  int* valid;
  uint32_t kb_peer;
  uint32_t valid_peer;

  __device__ __forceinline__ void put16(int offset, uint4 v) const {
    *reinterpret_cast<uint4*>(kb + offset) = v;
    st_cluster_16(kb_peer + offset, v);
  }
  __device__ __forceinline__ void put8(int offset, uint2 v) const {
    *reinterpret_cast<uint2*>(kb + offset) = v;
    st_cluster_8(kb_peer + offset, v);
  }
  __device__ __forceinline__ void put_valid(int key, bool real) const {
    valid[key] = real ? 1 : 0;
    st_cluster_4(valid_peer + 4 * key, real ? 1u : 0u);
  }
};

// 8 e4m3 channels times their power-of-two scale, rounded to bf16: decode_fp8_share's
// arithmetic (attention_wgmma_prefetch.cu), so the tile is the same bits.
__device__ __forceinline__ uint4 e4m3x8_to_bf16(uint2 bytes, float scale) {
  uint32_t packed[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t word = k < 2 ? bytes.x : bytes.y;
    const uint32_t pair = (word >> (16 * (k & 1))) & 0xffffu;
    const __half2 h =
        __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3));
    const float2 f = __half22float2(h);
    packed[k] = pack_bf16(f.x * scale, f.y * scale);
  }
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// Stores the share into tile row `key` of both blocks (zeros for a masked key) and the key's
// valid flag: the prefetching kernel's tile contents (swizzled tiles).
__device__ __forceinline__ void store_share(const PairBuffer& buf,
                                            const PairShare<KvFormat::kFp8>& sh, bool real, int key,
                                            int part) {
  using T = Tiles<true>;
  const uint64_t scales = (static_cast<uint64_t>(sh.scales.y) << 32) | sh.scales.x;
#pragma unroll
  for (int i = 0; i < kSharePieces; ++i) {
    const int chunk = kKeyThreads * i + part;  // channels 8 chunk ..: scale group i
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (real)
      v = e4m3x8_to_bf16(sh.nope[i], e8m0_to_float(static_cast<uint8_t>(scales >> (8 * i))));
    buf.put16(T::offset(key, chunk), v);
  }
#pragma unroll
  for (int i = 0; i < kShareRope; ++i) {
    const int piece = kKeyThreads * i + part;  // RoPE channels 4 piece ..: half of chunk piece / 2
    buf.put8(T::offset(key, kV4Nope / 8 + piece / 2) + 8 * (piece & 1),
             real ? sh.rope[i] : make_uint2(0u, 0u));
  }
  if (part == 0) buf.put_valid(key, real);
}

__device__ __forceinline__ void store_share(const PairBuffer& buf,
                                            const PairShare<KvFormat::kBf16>& sh, bool real,
                                            int key, int part) {
  using T = Tiles<true>;
#pragma unroll
  for (int j = 0; j < kShareChunks; ++j) {
    buf.put16(T::offset(key, kKeyThreads * j + part),
              real ? sh.chunk[j] : make_uint4(0u, 0u, 0u, 0u));
  }
  if (part == 0) buf.put_valid(key, real);
}

// The cluster barrier that starts a tile: arrive (release) and wait (acquire).
__device__ __forceinline__ void cluster_sync_tiles() {
  cluster_arrive_release();
  cluster_wait_acquire();
}

// Grid (token, head group, split), cluster (1, 2, 1): head groups 2k and 2k + 1 of a token and
// split share the keys. Swizzled tiles only (the default's layout).
template <KvFormat kFmt>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_pair_kernel(AttentionArgs a, DeviceLayout l) {
  using T = Tiles<true>;
  static_assert(kFmt == KvFormat::kBf16 || kFmt == KvFormat::kFp8, "bf16 rows or fp8 records");
  extern __shared__ int4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  uint8_t* qs = smem + Layout::kQOff;
  uint8_t* kb_base = smem + Layout::kKbOff;  // buffer b at kb_base + b * kKbBytes
  uint8_t* ps = smem + Layout::kPOff;
  float* xchg = reinterpret_cast<float*>(smem + Layout::kXchgOff);
  int* valid_base = reinterpret_cast<int*>(smem + Layout::kValidOff);
  static_assert(Layout::kQOff % 1024 == 0 && Layout::kKbOff % 1024 == 0 &&
                    Layout::kKbBytes % 1024 == 0 && Layout::kPOff % 1024 == 0,
                "1 KB aligned tiles");
  if ((smem_addr(smem) & 1023u) != 0) __trap();

  // The start rendezvous: the peer must be running before this block stores into its shared
  // memory (the wait is right before the first tile's stores, on every path).
  cluster_arrive_relaxed();
  const uint32_t rank = cluster_block_rank();
  const uint32_t peer = rank ^ 1u;
  const uint32_t kb_peer_base = map_shared_to_rank(smem_addr(kb_base), peer);
  const uint32_t valid_peer_base = map_shared_to_rank(smem_addr(valid_base), peer);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int wg = tid >> 7;                               // warpgroup: keys of S, channels of O
  const int row0 = 16 * ((tid >> 5) & 3) + (lane >> 2);  // the thread's heads: row0, row0 + 8
  const int qd = lane & 3;
  const int t = blockIdx.x;
  const int h_first = blockIdx.y * kRows;
  // Copy role: key `ck` of each tile (of this block's half), share `part`.
  const int ck = static_cast<int>(rank) * kOwnKeys + tid / kKeyThreads;
  const int part = tid % kKeyThreads;
  float4 q_loads[kQueryLoads];
  issue_query_loads(a, t, h_first, tid, q_loads);

  // The same token and split in both blocks: the same range and number of tiles.
  const AttentionKeys keys(a, l, t, seq_of_row_warp(l, t));
  const KeyRange range = split_key_range<kKeys>(keys.n_keys, blockIdx.z, gridDim.z);
  auto pending_at = [&](int64_t i0) { return pending_key(a, l, keys, i0 + ck, range.end); };
  auto resolve = [&](PendingKey k) { return resolve_key(a, l, keys, k); };
  auto buffer = [&](int b) {
    return PairBuffer{kb_base + b * Layout::kKbBytes, valid_base + b * kKeys,
                      kb_peer_base + static_cast<uint32_t>(b * Layout::kKbBytes),
                      valid_peer_base + static_cast<uint32_t>(b * kKeys * sizeof(int))};
  };

  float o[kOAcc];
#pragma unroll
  for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float d_run[2] = {0.0f, 0.0f};  // over this warpgroup's keys only

  // The share the thread stores next (tile it + 1 during tile it) and whether its key is real;
  // the address of the key it loads next (tile it + 2 during tile it).
  PairShare<kFmt> share;
  bool share_real = false;
  const uint8_t* src_next = nullptr;

  const bool any_keys = range.begin < range.end;
  const uint8_t* src1 = nullptr;
  PendingKey k2{nullptr, -1};
  bool real0 = false;
  if (any_keys) {
    const PendingKey k0 = pending_at(range.begin);
    const PendingKey k1 = pending_at(range.begin + kKeys);
    k2 = pending_at(range.begin + 2 * kKeys);
    const uint8_t* src0 = resolve(k0);
    src1 = resolve(k1);
    store_query_tile<true>(qs, tid, q_loads);
    load_share(share, src0, part);
    real0 = src0 != nullptr;
  }
  cluster_wait_acquire();  // the start rendezvous: every path, both blocks
  if (any_keys) {
    store_share(buffer(0), share, real0, ck, part);
    fence_async_all();  // tile 0 (both blocks') and q, for wgmma
    load_share(share, src1, part);
    share_real = src1 != nullptr;
    src_next = resolve(k2);
  }

  const uint64_t q_desc = T::kmajor(qs);
  const uint64_t p_desc = T::kmajor(ps);
  int it = 0;
  for (int64_t i0 = range.begin; i0 < range.end; i0 += kKeys, ++it) {
    const int buf = it & 1;
    uint8_t* kb = kb_base + buf * Layout::kKbBytes;
    const bool more = i0 + kKeys < range.end;
    // Tile `it` whole in both blocks' kb[buf]; both blocks past tile it - 1 (the other buffer).
    cluster_sync_tiles();
    float s[16] = {};
    issue_scores<true>(s, q_desc, T::kmajor(kb + T::score_keys(wg)));
    const PendingKey pending = pending_at(i0 + 3 * kKeys);  // tile it + 3, loaded next tile
    // Tile it + 1, loaded during the previous tile, stored while the scores run; tile it + 2
    // loaded to land during the next one.
    if (more) store_share(buffer(buf ^ 1), share, share_real, ck, part);
    fence_async_all();  // both blocks' halves, for wgmma after the next barrier
    load_share(share, src_next, part);
    share_real = src_next != nullptr;
    wait_products(s);
    float alpha[2];
    softmax_tile<true>(s, valid_base + buf * kKeys, xchg, ps, a.scale, wg, row0, qd, m_run, d_run,
                       alpha);
    fence_async_shared();
    __syncthreads();  // P of both halves (this block's heads only)
    issue_values<true>(o, alpha, p_desc, T::nmajor(kb + T::value_channels(wg)));
    src_next = resolve(pending);  // the block-table load lands while the values run
    wait_products(o);
  }

  finish_rows(a, l, o, m_run, d_run, xchg, t, h_first, wg, row0, qd);
}

template <KvFormat kFmt>
void launch(const AttentionArgs& a, const DeviceLayout& l, const AttentionMmaPlan& p,
            int64_t tokens, KernelSmemLimits& smem_limits, cudaStream_t stream) {
  auto* kernel = attention_wgmma_pair_kernel<kFmt>;
  smem_limits.allow(kernel, Layout::kBytes);
  ClusterLaunch cl;
  cl.grid = dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(p.head_groups),
                 static_cast<unsigned>(p.splits));
  cl.block = dim3(kThreads);
  cl.cluster = dim3(1, kPairBlocks, 1);
  cl.smem = Layout::kBytes;
  cl.stream = stream;
  launch_clustered("attention (the paired wgmma kernel)", cl, kernel, a, l);
}

}  // namespace
}  // namespace attention_wgmma

void launch_attention_wgmma_pair(const AttentionArgs& a, const DeviceLayout& l,
                                 const AttentionMmaPlan& p, int64_t tokens,
                                 KernelSmemLimits& smem_limits, cudaStream_t stream) {
  if (a.heads % (2 * kWgmmaAttnRows) != 0 || p.head_groups % 2 != 0 ||
      !wgmma_prefetch_takes(a.kvf.format == KvFormat::kFp8, a.kvf.dim, a.kvf.rope_dim,
                            a.kvf.row_bytes)) {
    throw Error(
        ErrorCode::kUnsupported,
        "attention: the paired wgmma kernel takes a multiple of 128 heads over bf16 rows or "
        "V4's 584-byte fp8 record, got " +
            std::to_string(a.heads) + " heads and " + std::to_string(p.head_groups) +
            " head groups, rows of " + std::to_string(a.kvf.row_bytes) + " bytes");
  }
  if (a.kvf.format == KvFormat::kBf16) {
    return attention_wgmma::launch<KvFormat::kBf16>(a, l, p, tokens, smem_limits, stream);
  }
  return attention_wgmma::launch<KvFormat::kFp8>(a, l, p, tokens, smem_limits, stream);
}

}  // namespace deepinfer::cuda
