// compress_pool of the CUDA backend (docs/model.md#pooling-a-window): softmax-gated pooling of
// closed compression windows, overlapping CSA windows included
// (docs/model.md#overlapping-csa-windows), as the CPU reference op
// (cpp/src/backend/cpu_ops_cache.cpp) on the same inputs.
//
// It spreads one entry over many threads: blocks of (entry, channel chunk), each thread one
// channel and a strided share of the window's slots, folded with an online softmax and merged
// across the block (compress_pool_heuristics.h sizes the block). At decode there is usually a
// single entry (HCA: 128 slots of 2 x 512 channels), so a one-thread-per-channel serial loop over
// the slots would leave the GPU idle, waiting one memory latency per slot.
//
// Every per-token quantity (sequence of a row, its position, context length and state slot) is
// read on the device from the BatchLayout; nothing here waits for the stream. Where the CPU op
// throws, the kernel stays inside its buffers instead: an entry whose sequence is outside [0, B),
// whose window is negative or not yet closed, or whose sequence's slot is outside the ring, is
// written as zeros. A position that fell out of the ring (the CPU's kInternal error) reads
// whatever its ring slot holds.
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/cache/compress_pool_heuristics.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/pdl.cuh"

namespace deepinfer::cuda {

namespace {

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
  enter_dependent_grid();
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

}  // namespace

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
  const PoolGeometry geo = choose_pool_geometry(m, dim, spec.overlap);
  const dim3 block(static_cast<unsigned>(geo.lanes), static_cast<unsigned>(geo.groups));
  const dim3 grid(static_cast<unsigned>(num_entries), ceil_div(dim, geo.lanes));
  launch_programmatic(op, grid, block, 0, stream(), pdl(), compress_pool_kernel, a,
                      device_layout(layout));
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

}  // namespace deepinfer::cuda
