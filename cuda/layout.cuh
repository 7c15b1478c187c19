// Shared by the CUDA cache, indexer and attention ops: host-side checks of the CUDA kernels'
// limits, the device view of a BatchLayout, and small warp / block / copy helpers. Everything has
// internal linkage (an anonymous namespace): each op file gets its own copy.
#pragma once

#include <cstdint>
#include <string>

#include "cuda_backend.h"
#include "cuda_common.cuh"

namespace deepinfer::cuda {
namespace {

// ---- host-side checks ---------------------------------------------------------------------------

// The float4 paths need 16-byte aligned rows: a width that is a multiple of 4 on an aligned base.
void check_vec4(const char* op, const char* arg, const Tensor& t) {
  if ((reinterpret_cast<uintptr_t>(t.raw_data()) & 15u) != 0) {
    throw Error(ErrorCode::kUnsupported, std::string(op) + ": argument " + arg + " " +
                                             t.describe() +
                                             " does not start on a 16-byte boundary");
  }
}

// Raises a kernel's dynamic shared memory limit when it needs more than the default 48 KiB.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    DEEPINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(bytes)));
  }
}

// ---- device-side layout -------------------------------------------------------------------------

struct DeviceLayout {
  const int32_t* positions;    // [T]
  const int32_t* q_start;      // [B + 1]
  const int32_t* ctx_len;      // [B]
  const int32_t* slot;         // [B]
  const int32_t* block_table;  // [B, max_blocks] or null
  int num_tokens;
  int num_seqs;
  int max_blocks;
};

DeviceLayout device_layout(const BatchLayout& layout) {
  return {layout.positions.data<int32_t>(),
          layout.seq_q_start.data<int32_t>(),
          layout.seq_ctx_len.data<int32_t>(),
          layout.seq_slot.data<int32_t>(),
          layout.block_table.defined() ? layout.block_table.data<int32_t>() : nullptr,
          layout.num_tokens,
          layout.num_seqs,
          layout.max_blocks_per_seq};
}

// Sequence of row t: the last b in [0, B) with q_start[b] <= t (the CPU's seq_of_rows). B >= 1.
__device__ int seq_of_row(const DeviceLayout& l, int t) {
  int lo = 0;
  int hi = l.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (l.q_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Entries visible at position p: (p + 1) / ratio, at most `bound` (the block table's reach).
__device__ int64_t visible_entries(int64_t pos, int ratio, int64_t bound) {
  const int64_t v = pos < 0 ? 0 : (pos + 1) / ratio;
  return v < bound ? v : bound;
}

// Row of entry j of sequence b in a paged cache of `rows` rows with `epb` entries per block, or
// -1 when the block table does not map it inside the cache.
__device__ int64_t entry_row(const DeviceLayout& l, int b, int64_t j, int epb, int64_t rows) {
  const int64_t logical = j / epb;
  if (j < 0 || logical >= l.max_blocks) return -1;
  const int64_t block = l.block_table[static_cast<int64_t>(b) * l.max_blocks + logical];
  const int64_t row = block * epb + j % epb;
  if (block < 0 || row >= rows) return -1;
  return row;
}

// The key list of query row t of attention (model.md A.5-A.8), shared by the f32 and the
// tensor-core kernels so that both read the same keys: the sliding keys max(0, p-W+1) .. p (this
// call's kv rows from ctx_len on, the ring before), then the compressed entries (dense: j <
// visible; sparse: the topk columns of row t, -1 masked). `Args` has the attention kernels' kv,
// ring, entries, topk, slots, ring_len, entry_rows, entry_bound, window, ratio, epb, topk_cols
// and sparse fields.
struct AttentionKeys {
  int t;
  int b;
  int64_t ctx, row0, slot, lo, n_sliding, visible, n_keys;

  template <typename Args>
  __device__ AttentionKeys(const Args& a, const DeviceLayout& l, int row) : t(row) {
    b = seq_of_row(l, t);
    const int64_t p = l.positions[t];
    ctx = l.ctx_len[b];
    row0 = l.q_start[b];
    slot = l.slot[b];
    lo = p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    n_sliding = p >= 0 ? p - lo + 1 : 0;
    visible = a.ratio > 0 ? visible_entries(p, a.ratio, a.entry_bound) : 0;
    const int64_t n_comp = a.ratio == 0 ? 0 : (a.sparse ? a.topk_cols : visible);
    n_keys = n_sliding + n_comp;
  }

  // Key i (< n_keys) of the list, rows of `dim` floats, or null when it is masked.
  template <typename Args>
  __device__ const float* key(const Args& a, const DeviceLayout& l, int64_t i, int64_t dim) const {
    if (i < n_sliding) {
      const int64_t j = lo + i;
      if (j >= ctx) {
        const int64_t row = row0 + j - ctx;
        return row >= 0 && row < l.num_tokens ? a.kv + row * dim : nullptr;
      }
      if (slot < 0 || slot >= a.slots || a.ring_len <= 0) return nullptr;
      return a.ring + (slot * a.ring_len + j % a.ring_len) * dim;
    }
    const int64_t c = i - n_sliding;
    const int64_t j = a.sparse ? a.topk[static_cast<int64_t>(t) * a.topk_cols + c] : c;
    if (j < 0 || j >= visible) return nullptr;
    const int64_t row = entry_row(l, b, j, a.epb, a.entry_rows);
    return row >= 0 ? a.entries + row * dim : nullptr;
  }
};

constexpr unsigned kFullMask = 0xffffffffu;

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ int warp_inclusive_scan(int v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += y;
  }
  return v;
}

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, at most 1024);
// `warp_sums` holds 32 ints. Contains block barriers: every thread must call it.
__device__ int block_exclusive_scan(int v, int* warp_sums) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  const int incl = warp_inclusive_scan(v);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int total = lane < num_warps ? warp_sums[lane] : 0;
    const int scanned = warp_inclusive_scan(total);
    if (lane < num_warps) warp_sums[lane] = scanned - total;
  }
  __syncthreads();
  const int result = warp_sums[warp] + incl - v;
  __syncthreads();  // warp_sums may be reused
  return result;
}

// Asynchronous global -> shared copies (cp.async): a thread issues all its copies back to back
// and waits once, so a tile's loads are in flight together instead of one latency each.
__device__ void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}

__device__ void cp_async4(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem));
}

// Waits for this thread's copies; a __syncthreads() after it publishes them to the block.
__device__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ float4 fma4(float a, float4 x, float4 acc) {
  acc.x = fmaf(a, x.x, acc.x);
  acc.y = fmaf(a, x.y, acc.y);
  acc.z = fmaf(a, x.z, acc.z);
  acc.w = fmaf(a, x.w, acc.w);
  return acc;
}

// acc + a * b, per component.
__device__ float4 fma4v(float4 a, float4 b, float4 acc) {
  acc.x = fmaf(a.x, b.x, acc.x);
  acc.y = fmaf(a.y, b.y, acc.y);
  acc.z = fmaf(a.z, b.z, acc.z);
  acc.w = fmaf(a.w, b.w, acc.w);
  return acc;
}

__device__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

}  // namespace
}  // namespace deepinfer::cuda
