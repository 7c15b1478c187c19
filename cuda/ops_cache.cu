// Cache ops of the CUDA backend: ring_write (SWA keys and compressor rows into per-sequence
// rings), compress_pool (softmax-gated pooling of closed compression windows, model.md A.7/A.8)
// and scatter_rows (pooled entries into the paged entry caches, D.2/D.3). Each matches the CPU
// reference op in cpp/src/backend/cpu_ops_cache.cpp on the same inputs.
//
// compress_pool spreads one entry over many threads: blocks of (entry, channel chunk), each thread
// one channel and a strided share of the window's slots, folded with an online softmax and merged
// across the block. At decode there is usually a single entry (HCA: 128 slots of 2 x 512
// channels), so a one-thread-per-channel serial loop over the slots would leave the GPU idle,
// waiting one memory latency per slot.
//
// Every per-token quantity (sequence of a row, its position, context length and state slot) is
// read on the device from the BatchLayout; nothing here waits for the stream.
//
// Content errors cannot be raised without a host sync. Where the CPU op throws, these kernels
// stay inside their buffers and do the following instead:
//  - ring_write: rows of a sequence whose slot is outside [0, slots), or whose position is
//    negative, are not written.
//  - compress_pool: an entry whose sequence is outside [0, B), whose window is negative or not
//    yet closed, or whose sequence's slot is outside the ring, is written as zeros. A position
//    that fell out of the ring (the CPU's kInternal error) reads whatever its ring slot holds.
//  - scatter_rows: a destination outside [0, rows) is skipped (the other rows are stored; the
//    CPU op stores none). Duplicate destinations race (the CPU keeps the last); callers never
//    pass them.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda_backend.h"
#include "cuda_common.cuh"
#include "layout.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kRowThreads = 128;

// Copies `width` floats; 16-byte vectors when both rows allow it.
__device__ void copy_row(float* __restrict__ dst, const float* __restrict__ src, int64_t width,
                         bool vec4) {
  if (vec4) {
    float4* d4 = reinterpret_cast<float4*>(dst);
    const float4* s4 = reinterpret_cast<const float4*>(src);
    for (int64_t i = threadIdx.x; i < width / 4; i += blockDim.x) d4[i] = s4[i];
  } else {
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// ---- ring_write ---------------------------------------------------------------------------------

// One block per row t: the row is stored at ring[slot][pos % R] when it is among the last R rows
// of its sequence (earlier rows of a longer chunk would be overwritten by later ones anyway, and
// skipping them keeps the writes of one call disjoint).
__global__ void ring_write_kernel(float* __restrict__ ring, const float* __restrict__ rows,
                                  DeviceLayout l, int64_t slots, int64_t ring_len, int64_t width,
                                  bool vec4) {
  const int t = blockIdx.x;
  const int b = seq_of_row(l, t);
  if (t < l.q_start[b + 1] - ring_len) return;
  const int64_t slot = l.slot[b];
  const int64_t pos = l.positions[t];
  if (slot < 0 || slot >= slots || pos < 0) return;
  copy_row(ring + (slot * ring_len + pos % ring_len) * width, rows + t * width, width, vec4);
}

// ---- compress_pool ------------------------------------------------------------------------------

struct PoolArgs {
  const float* proj;      // [T, 2C]
  const float* ring;      // [slots, R, 2C]
  const float* ape;       // [m, C]
  const int32_t* seq;     // [E]
  const int32_t* window;  // [E]
  float* out;             // [E, D]
  int64_t slots;
  int64_t ring_len;
  int num_entries;
  int ratio;  // m
  int dim;    // D
  bool overlap;
};

// Launch geometry of compress_pool. A thread handles one channel and a strided share of the
// slots; within a share it loads kPoolBatch slots back to back before using any of them, so
// their loads are in flight together (a serial slot loop is one memory latency per slot).
constexpr int kPoolBatch = 8;
constexpr int kPoolMaxGroups = 16;
constexpr int kPoolMaxThreads = 512;  // 32 lanes x kPoolMaxGroups at most, see compress_pool

// Block (entry e, chunk of blockDim.x channels), blockDim.y slot groups: thread (lane, g) owns
// channel blockIdx.y * blockDim.x + lane and the slots g, g + G, g + 2G, ... (consecutive lanes
// read consecutive channels of one row: coalesced). Slot s of the pooled window is
//  - without overlap: token w*m + s, kv = row[ch], gate = row[D + ch], bias = ape[s][ch];
//  - with overlap (C = 2D): for w > 0 first the previous window's Ca series (token (w-1)*m + i,
//    kv = row[ch], gate = row[2D + ch], bias = ape[i][ch]), then this window's Cb series (token
//    w*m + i, kv = row[D + ch], gate = row[3D + ch], bias = ape[i][D + ch]). Window 0 has no Ca
//    slots (the reference's zero kv with a -inf gate, weight exactly 0).
// alpha = softmax over the slots of gate + bias; out = sum alpha * kv. Each thread keeps an online
// softmax of its slots (running max mx, den = sum exp(z - mx), num = sum exp(z - mx) * kv); group
// 0 merges the G partials of its channel through shared memory and writes num / den.
__global__ void __launch_bounds__(kPoolMaxThreads)
    compress_pool_kernel(PoolArgs a, DeviceLayout l) {
  __shared__ float part_mx[kPoolMaxThreads];
  __shared__ float part_den[kPoolMaxThreads];
  __shared__ float part_num[kPoolMaxThreads];
  const int e = blockIdx.x;
  const int lanes = blockDim.x;
  const int groups = blockDim.y;
  const int lane = threadIdx.x;
  const int group = threadIdx.y;
  const int ch = blockIdx.y * lanes + lane;
  const bool active = ch < a.dim;
  const int64_t m = a.ratio;
  const int64_t dim = a.dim;
  const int64_t c = a.overlap ? 2 * dim : dim;
  const int b = a.seq[e];
  const int64_t w = a.window[e];
  bool valid = b >= 0 && b < l.num_seqs && w >= 0;
  int64_t ctx = 0, q_start = 0, slot = 0;
  if (valid) {
    ctx = l.ctx_len[b];
    q_start = l.q_start[b];
    slot = l.slot[b];
    const int64_t q_len = l.q_start[b + 1] - q_start;
    valid = ctx >= 0 && q_start >= 0 && q_len >= 0 && q_start + q_len <= l.num_tokens &&
            (w + 1) * m <= ctx + q_len && slot >= 0 && slot < a.slots;
  }
  // `valid` depends on the entry only, so the whole block leaves here or none of it does (the
  // barrier below is reached by every thread of the block or by none).
  if (!valid) {
    if (group == 0 && active) a.out[static_cast<int64_t>(e) * dim + ch] = 0.0f;
    return;
  }
  // Row [kv | gate] of position p >= 0: this call's projection, or the ring for earlier tokens.
  // A ring position is below ctx (an int32), so p % R fits a 32-bit remainder (the 64-bit one is
  // a long subroutine call). Selects rather than branches, see the batch loop below.
  auto row_of = [&](int64_t p) -> const float* {
    const bool in_proj = p >= ctx;
    const int64_t r =
        p < a.ring_len
            ? p
            : static_cast<int64_t>(static_cast<uint32_t>(p) % static_cast<uint32_t>(a.ring_len));
    const int64_t row = in_proj ? q_start + p - ctx : slot * a.ring_len + r;
    return (in_proj ? a.proj : a.ring) + row * 2 * c;
  };
  const int64_t n_prev = a.overlap && w > 0 ? m : 0;
  const int64_t n = n_prev + m;
  const int64_t stride = static_cast<int64_t>(groups) * kPoolBatch;
  float mx = -INFINITY, den = 0.0f, num = 0.0f;
  if (active) {
    for (int64_t s0 = group; s0 < n; s0 += stride) {
      // Addresses first, then every load of the batch with no branch between them, then the
      // math: a load under a branch makes the branch's join wait for it, one latency per slot.
      // Slots past n load slot s0 (real, so in bounds) and are masked to z = -inf, kv = 0
      // afterwards: weight exp(-inf - bm) = 0, bm being finite as slot s0 is real.
      const float* kv_p[kPoolBatch];
      const float* gate_p[kPoolBatch];
      const float* bias_p[kPoolBatch];
#pragma unroll
      for (int u = 0; u < kPoolBatch; ++u) {
        const int64_t su = s0 + static_cast<int64_t>(u) * groups;
        const int64_t s = su < n ? su : s0;
        const bool prev = s < n_prev;
        const int64_t i = prev ? s : s - n_prev;
        const float* row = row_of((prev ? w - 1 : w) * m + i);
        const int64_t cb = a.overlap && !prev ? dim : 0;  // the Cb series' half
        kv_p[u] = row + cb + ch;
        gate_p[u] = row + (a.overlap ? 2 * dim : dim) + cb + ch;
        bias_p[u] = a.ape + i * c + cb + ch;
      }
      float gate[kPoolBatch], kv[kPoolBatch], bias[kPoolBatch];
#pragma unroll
      for (int u = 0; u < kPoolBatch; ++u) {
        gate[u] = *gate_p[u];
        kv[u] = *kv_p[u];
        bias[u] = *bias_p[u];
      }
      float z[kPoolBatch];
#pragma unroll
      for (int u = 0; u < kPoolBatch; ++u) {
        const bool real = s0 + static_cast<int64_t>(u) * groups < n;
        z[u] = real ? gate[u] + bias[u] : -INFINITY;
        kv[u] = real ? kv[u] : 0.0f;
      }
      float bm = mx;
#pragma unroll
      for (int u = 0; u < kPoolBatch; ++u) bm = fmaxf(bm, z[u]);
      const float scale = expf(mx - bm);  // 0 on the first batch (mx = -inf), 1 when bm == mx
      den *= scale;
      num *= scale;
#pragma unroll
      for (int u = 0; u < kPoolBatch; ++u) {
        const float p = expf(z[u] - bm);
        den += p;
        num = fmaf(p, kv[u], num);
      }
      mx = bm;
    }
  }
  const int idx = group * lanes + lane;
  part_mx[idx] = mx;
  part_den[idx] = den;
  part_num[idx] = num;
  __syncthreads();
  if (group != 0 || !active) return;
  // A group without slots has mx = -inf, den = num = 0 and adds exp(-inf) * 0 = 0.
  float gmx = -INFINITY;
  for (int g = 0; g < groups; ++g) gmx = fmaxf(gmx, part_mx[g * lanes + lane]);
  float gden = 0.0f, gnum = 0.0f;
  for (int g = 0; g < groups; ++g) {
    const float f = expf(part_mx[g * lanes + lane] - gmx);
    gden = fmaf(part_den[g * lanes + lane], f, gden);
    gnum = fmaf(part_num[g * lanes + lane], f, gnum);
  }
  a.out[static_cast<int64_t>(e) * dim + ch] = gnum / gden;
}

// ---- scatter_rows -------------------------------------------------------------------------------

__global__ void scatter_rows_kernel(float* __restrict__ cache, const float* __restrict__ rows,
                                    const int32_t* __restrict__ dest, int64_t cache_rows,
                                    int64_t width, bool vec4) {
  const int64_t i = blockIdx.x;
  const int64_t d = dest[i];
  if (d < 0 || d >= cache_rows) return;
  copy_row(cache + d * width, rows + i * width, width, vec4);
}

}  // namespace

void CudaBackend::ring_write_impl(const Tensor& ring, const Tensor& rows,
                                  const BatchLayout& layout) {
  const char* op = "ring_write";
  const int64_t slots = ring.size(0);
  const int64_t ring_len = ring.size(1);
  const int64_t width = ring.size(2);
  if (layout.num_tokens == 0 || width == 0) return;
  const bool vec4 = width % 4 == 0 && aligned16(ring.raw_data()) && aligned16(rows.raw_data());
  ring_write_kernel<<<static_cast<unsigned>(layout.num_tokens), kRowThreads, 0, stream()>>>(
      ring.data<float>(), rows.data<float>(), device_layout(layout), slots, ring_len, width, vec4);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

Tensor CudaBackend::compress_pool_impl(const Tensor& proj, const Tensor& ring, const Tensor& ape,
                                       const BatchLayout& layout, const EntryBatch& entries,
                                       const CompressSpec& spec) {
  const char* op = "compress_pool";
  const int64_t m = spec.ratio;
  const int64_t dim = spec.head_dim;
  const int64_t num_entries = entries.num_entries;
  Tensor out = empty({num_entries, dim}, DType::kF32);
  if (num_entries == 0) return out;
  PoolArgs a{};
  a.proj = proj.data<float>();
  a.ring = ring.data<float>();
  a.ape = ape.data<float>();
  a.seq = entries.seq.data<int32_t>();
  a.window = entries.window.data<int32_t>();
  a.out = out.data<float>();
  a.slots = ring.size(0);
  a.ring_len = ring.size(1);
  a.num_entries = static_cast<int>(num_entries);
  a.ratio = static_cast<int>(m);
  a.dim = static_cast<int>(dim);
  a.overlap = spec.overlap;
  // Slot groups: enough that a thread's share of the largest window (2m slots with overlap) is
  // about one load batch, so a decode step with a single entry still has all its loads in flight
  // at once; lanes: 32 (one 128-byte line of a row per warp) up to 128 channels per block.
  const int64_t max_slots = spec.overlap ? 2 * m : m;
  int groups = 1;
  while (groups < kPoolMaxGroups && groups * kPoolBatch < max_slots) groups *= 2;
  const int64_t lanes = std::min<int64_t>(std::max(32, 128 / groups), (dim + 31) / 32 * 32);
  const dim3 block(static_cast<unsigned>(lanes), static_cast<unsigned>(groups));
  const dim3 grid(static_cast<unsigned>(num_entries), ceil_div(dim, lanes));
  compress_pool_kernel<<<grid, block, 0, stream()>>>(a, device_layout(layout));
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

void CudaBackend::scatter_rows_impl(const Tensor& cache, const Tensor& rows, const Tensor& dest) {
  const char* op = "scatter_rows";
  const int64_t n = rows.size(0);
  const int64_t width = cache.size(1);
  if (n == 0 || width == 0) return;
  if (n > 0x7fffffff) fail(op, std::to_string(n) + " rows exceed one launch");  // gridDim.x
  const bool vec4 = width % 4 == 0 && aligned16(cache.raw_data()) && aligned16(rows.raw_data());
  scatter_rows_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, stream()>>>(
      cache.data<float>(), rows.data<float>(), dest.data<int32_t>(), cache.size(0), width, vec4);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace deepinfer::cuda
