// Sliding + compressed attention with sinks on the CUDA backend (model.md A.5-A.8), over the
// paged layout of D.2. It matches the CPU reference op in cpp/src/backend/cpu_ops_attention.cpp
// on the same inputs; f32 math throughout. The indexer is in ops_indexer.cu, helpers in
// layout.cuh. With AttentionSpec::bf16_math the op runs the tensor-core kernel of
// ops_attention_mma.cu instead (same key list and split format, bf16 operands) when the shape
// allows; the combine kernel below serves both.
//
// Every per-token quantity (sequence, position, context length, visible entries, which keys) is
// computed in the kernels from the device BatchLayout; the host only sizes grids and scratch from
// metadata it knows (shapes, layout.max_blocks_per_seq), so no op waits for the stream.
//
// attention runs one kernel, grid (token, head group, split), plus a combine kernel when the
// keys are split (flash-decoding: few tokens then still spread over the SMs). A block takes up
// to 8192 / D heads of one token (the MQA heads share every key tile in shared memory) and walks
// its range of the token's key list in tiles of 32 keys with an online softmax. The key list of
// token t at position p is: the sliding keys max(0, p-W+1) .. p (this call's kv rows from
// ctx_len on, the ring before), then the compressed entries (dense: j < (p+1)/ratio; sparse:
// the K columns of topk[t], -1 masked).
//
// Content errors cannot be raised without a host sync. Where the CPU op throws, these kernels
// stay inside their buffers and do the following instead:
//  - entries past the block table's columns (j >= max_blocks_per_seq * epb) are not visible.
//  - an entry whose block is negative or maps past the cache: the indexer scores it -inf (it
//    ranks last); attention masks it.
//  - a sparse topk index >= the visible count: masked (the CPU throws "not visible").
//  - a sliding key in the ring whose slot is outside the ring: masked. A position that fell out
//    of the ring (the CPU's kInternal error) reads whatever its ring slot holds.
#include <cstdint>
#include <string>

#include "cuda_backend.h"
#include "cuda_common.cuh"
#include "layout.cuh"

namespace deepinfer::cuda {

namespace {

// ================================================================================================
// attention
// ================================================================================================

constexpr int kAttnThreads = 256;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kAttnKeys = 32;           // keys per tile: one per lane in the score phase
constexpr int kAttnHeadsPerThread = 8;  // heads of one thread in the P.V phase
constexpr int kAttnQFloats = 8192;      // q floats per block: heads per block = 8192 / D
constexpr int kAttnMaxDim = 1024;       // D/4 column groups must fit the block's threads

struct AttnArgs {
  const float* q;        // [T, heads, dim]
  const float* kv;       // [T, dim]
  const float* ring;     // [slots, ring_len, dim]
  const float* entries;  // [entry_rows, dim] or null
  const int32_t* topk;   // [T, topk_cols] or null
  const float* sinks;    // [heads]
  float* out;            // [T, heads, dim] when there is one split
  float* part_acc;       // [splits, T, heads, dim] otherwise
  float* part_md;        // [splits, T, heads, 2]: running max, denominator
  int64_t slots;
  int64_t ring_len;
  int64_t entry_rows;
  int64_t entry_bound;  // max_blocks_per_seq * epb
  int heads;
  int dim;              // a multiple of 4, at most kAttnMaxDim
  int heads_per_block;  // HB
  int hb_stride;        // HB rounded up to a multiple of 8: row stride of the probability tile
  int window;
  int ratio;  // 0: sliding only
  int epb;
  int topk_cols;
  bool sparse;
  float scale;
};

size_t attn_smem_bytes(int64_t dim, int64_t hb, int64_t hb_stride) {
  const int64_t floats = hb * dim + kAttnKeys * (dim + 4) + kAttnKeys * hb_stride + 3 * hb_stride;
  return static_cast<size_t>(floats) * sizeof(float) + kAttnKeys * sizeof(const float*);
}

// Block (token t, head group, split). Shared memory: q of the group's heads [HB][D], the key tile
// [32][D+4], the tile's probabilities [32][hb_stride], key pointers [32], and per head the
// running max, denominator and the tile's rescale factor.
//  - score phase: warp w owns heads w, w+8, ...; lane = key. It computes the logits, updates the
//    head's online softmax with warp reductions and writes p = exp(logit - max) to the tile.
//  - P.V phase: thread (column group c4 = tid % (D/4), head subgroup tid / (D/4)) keeps acc for
//    8 heads x 4 channels in registers.
__global__ void __launch_bounds__(kAttnThreads, 2) attention_kernel(AttnArgs a, DeviceLayout l) {
  extern __shared__ float4 smem4[];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int t = blockIdx.x;
  const int h_first = blockIdx.y * a.heads_per_block;
  const int nhb = min(a.heads_per_block, a.heads - h_first);
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  const int dim = a.dim;
  const int d4 = dim / 4;
  const int kstride = dim + 4;
  const int hbs = a.hb_stride;

  float* qs = reinterpret_cast<float*>(smem4);                        // [HB][dim]
  float* ks = qs + static_cast<int64_t>(a.heads_per_block) * dim;     // [kAttnKeys][kstride]
  float* ps = ks + kAttnKeys * kstride;                               // [kAttnKeys][hbs]
  float* m_run = ps + kAttnKeys * hbs;                                // [hbs]
  float* d_run = m_run + hbs;                                         // [hbs]
  float* alpha = d_run + hbs;                                         // [hbs]
  const float** kptr = reinterpret_cast<const float**>(alpha + hbs);  // [kAttnKeys]

  // This token's key list.
  const AttentionKeys keys(a, l, t);
  const int64_t n_keys = keys.n_keys;
  // This split's range, whole tiles.
  const int64_t per_split =
      ((n_keys + splits - 1) / splits + kAttnKeys - 1) / kAttnKeys * kAttnKeys;
  const int64_t k_begin = min(n_keys, per_split * split);
  const int64_t k_end = min(n_keys, k_begin + per_split);

  // Key i of the list, or null when it is masked.
  auto key_at = [&](int64_t i) -> const float* {
    return i < k_end ? keys.key(a, l, i, dim) : nullptr;
  };

  const float4* q4 =
      reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(t) * a.heads + h_first) * dim);
  for (int i = tid; i < a.heads_per_block * d4; i += blockDim.x) {
    if (i < nhb * d4) {
      cp_async16(qs + 4 * i, q4 + i);
    } else {
      reinterpret_cast<float4*>(qs)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  for (int i = tid; i < kAttnKeys * hbs; i += blockDim.x) ps[i] = 0.0f;
  for (int h = tid; h < hbs; h += blockDim.x) {
    m_run[h] = -INFINITY;
    d_run[h] = 0.0f;
    alpha[h] = 1.0f;
  }
  // q lands with the first tile's copies; an empty key range must not exit with copies pending.
  if (k_begin >= k_end) cp_async_wait_all();
  __syncthreads();  // an empty key range reads m_run / d_run right away

  // P.V ownership.
  const int c4 = tid % d4;
  const int hsub = tid / d4;
  const bool pv_thread = hsub * kAttnHeadsPerThread < nhb;
  float4 acc[kAttnHeadsPerThread];
#pragma unroll
  for (int i = 0; i < kAttnHeadsPerThread; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);

  for (int64_t i0 = k_begin; i0 < k_end; i0 += kAttnKeys) {
    if (tid < kAttnKeys) kptr[tid] = key_at(i0 + tid);
    __syncthreads();
    for (int i = tid; i < kAttnKeys * d4; i += blockDim.x) {
      const int r = i / d4;
      const int c = i - r * d4;
      const float* src = kptr[r];
      float* dst = ks + r * kstride + c * 4;
      if (src != nullptr) {
        cp_async16(dst, src + 4 * c);
      } else {
        *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    cp_async_wait_all();
    __syncthreads();

    // Score phase: heads hA = warp + 16m and hB = hA + 8 share each key read.
    const bool key_valid = kptr[lane] != nullptr;
    const float4* key = reinterpret_cast<const float4*>(ks + lane * kstride);
    for (int ha = warp; ha < nhb; ha += 2 * kAttnWarps) {
      const int hb = ha + kAttnWarps;
      const bool has_b = hb < nhb;  // uniform over the warp
      const float4* qa = reinterpret_cast<const float4*>(qs + ha * dim);
      const float4* qb = reinterpret_cast<const float4*>(qs + (has_b ? hb : ha) * dim);
      // Four partial sums per head (one per float4 lane) keep the FMA chains short.
      float4 part_a = make_float4(0.f, 0.f, 0.f, 0.f), part_b = part_a;
      for (int c = 0; c < d4; ++c) {
        const float4 k = key[c];
        part_a = fma4v(qa[c], k, part_a);
        part_b = fma4v(qb[c], k, part_b);
      }
      const float sa = (part_a.x + part_a.y) + (part_a.z + part_a.w);
      const float sb = (part_b.x + part_b.y) + (part_b.z + part_b.w);
      for (int pass = 0; pass < (has_b ? 2 : 1); ++pass) {
        const int h = pass == 0 ? ha : hb;
        const float s = key_valid ? (pass == 0 ? sa : sb) * a.scale : -INFINITY;
        const float m_old = m_run[h];
        const float m_new = fmaxf(m_old, warp_max(s));
        float pr = 0.0f, al = 1.0f;
        if (m_new != -INFINITY) {  // else no valid key yet: nothing to add, nothing to rescale
          pr = expf(s - m_new);
          al = expf(m_old - m_new);
        }
        const float sum = warp_sum(pr);
        ps[lane * hbs + h] = pr;
        __syncwarp();  // every lane has read m_run[h]
        if (lane == 0) {
          d_run[h] = d_run[h] * al + sum;
          m_run[h] = m_new;
          alpha[h] = al;
        }
      }
    }
    __syncthreads();

    // P.V phase.
    if (pv_thread) {
      const int h0 = hsub * kAttnHeadsPerThread;
#pragma unroll
      for (int i = 0; i < kAttnHeadsPerThread; ++i) {
        const float al = alpha[h0 + i];
        acc[i].x *= al;
        acc[i].y *= al;
        acc[i].z *= al;
        acc[i].w *= al;
      }
      for (int k = 0; k < kAttnKeys; ++k) {
        const float4 v = *reinterpret_cast<const float4*>(ks + k * kstride + c4 * 4);
        const float4 pa = *reinterpret_cast<const float4*>(ps + k * hbs + h0);
        const float4 pb = *reinterpret_cast<const float4*>(ps + k * hbs + h0 + 4);
        acc[0] = fma4(pa.x, v, acc[0]);
        acc[1] = fma4(pa.y, v, acc[1]);
        acc[2] = fma4(pa.z, v, acc[2]);
        acc[3] = fma4(pa.w, v, acc[3]);
        acc[4] = fma4(pb.x, v, acc[4]);
        acc[5] = fma4(pb.y, v, acc[5]);
        acc[6] = fma4(pb.z, v, acc[6]);
        acc[7] = fma4(pb.w, v, acc[7]);
      }
    }
    __syncthreads();
  }

  if (!pv_thread) return;
  const int h0 = hsub * kAttnHeadsPerThread;
#pragma unroll
  for (int i = 0; i < kAttnHeadsPerThread; ++i) {
    const int h = h0 + i;
    if (h >= nhb) break;
    const int64_t head = h_first + h;
    const float m = m_run[h];
    const float d = d_run[h];
    if (splits == 1) {
      // softmax(logits ++ sink) without the sink column: divide by d e^(m-M) + e^(sink-M).
      const float sink = a.sinks[head];
      const float mx = fmaxf(m, sink);
      const float em = m == -INFINITY ? 0.0f : expf(m - mx);
      const float f = em / (d * em + expf(sink - mx));
      const float4 r = make_float4(acc[i].x * f, acc[i].y * f, acc[i].z * f, acc[i].w * f);
      reinterpret_cast<float4*>(a.out + (static_cast<int64_t>(t) * a.heads + head) * dim)[c4] = r;
    } else {
      const int64_t idx = (static_cast<int64_t>(split) * l.num_tokens + t) * a.heads + head;
      reinterpret_cast<float4*>(a.part_acc + idx * dim)[c4] = acc[i];
      if (c4 == 0) {
        a.part_md[2 * idx] = m;
        a.part_md[2 * idx + 1] = d;
      }
    }
  }
}

constexpr int kAttnMaxSplits = 64;

// Block (token, head): merges the splits' (max, denominator, unnormalised sum) with the sink.
// The splits' statistics are staged in shared memory so each is loaded once, and the sums are
// loaded a few splits at a time.
__global__ void attention_combine_kernel(const float* __restrict__ part_acc,
                                         const float* __restrict__ part_md,
                                         const float* __restrict__ sinks, float* __restrict__ out,
                                         int num_tokens, int heads, int dim, int splits) {
  __shared__ float m_s[kAttnMaxSplits];
  __shared__ float d_s[kAttnMaxSplits];
  __shared__ float w_s[kAttnMaxSplits];
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t stride = static_cast<int64_t>(num_tokens) * heads;  // between splits
  const int64_t idx = t * heads + h;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    m_s[s] = part_md[2 * (s * stride + idx)];
    d_s[s] = part_md[2 * (s * stride + idx) + 1];
  }
  __syncthreads();
  const float sink = sinks[h];
  float mx = sink;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, m_s[s]);
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    w_s[s] = m_s[s] == -INFINITY ? 0.0f : expf(m_s[s] - mx);  // an empty split weighs 0
  }
  __syncthreads();
  float den = expf(sink - mx);
  for (int s = 0; s < splits; ++s) den += d_s[s] * w_s[s];
  const float inv = 1.0f / den;
  for (int c4 = threadIdx.x; c4 < dim / 4; c4 += blockDim.x) {
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = 0; s < splits; ++s) {
      const float4 v = reinterpret_cast<const float4*>(part_acc + (s * stride + idx) * dim)[c4];
      r = fma4(w_s[s], v, r);
    }
    r.x *= inv;
    r.y *= inv;
    r.z *= inv;
    r.w *= inv;
    reinterpret_cast<float4*>(out + idx * dim)[c4] = r;
  }
}

void launch_attention_combine(cudaStream_t stream, const float* part_acc, const float* part_md,
                              const float* sinks, float* out, int64_t tokens, int64_t heads,
                              int64_t dim, int64_t splits) {
  attention_combine_kernel<<<dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(heads)), 128,
                             0, stream>>>(part_acc, part_md, sinks, out, static_cast<int>(tokens),
                                          static_cast<int>(heads), static_cast<int>(dim),
                                          static_cast<int>(splits));
  DEEPINFER_CUDA_LAUNCH_CHECK("attention");
}

}  // namespace

Tensor CudaBackend::attention_impl(const Tensor& q, const Tensor& kv, const Tensor& swa_ring,
                                   const Tensor& entries, const Tensor& topk, const Tensor& sinks,
                                   const BatchLayout& layout, const AttentionSpec& spec) {
  const char* op = "attention";
  const bool compressed = spec.ratio > 0;
  const int64_t tokens = layout.num_tokens;
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  const bool sparse = compressed && spec.sparse;
  Tensor out = empty({tokens, heads, dim}, DType::kF32);
  if (tokens == 0 || heads == 0 || dim == 0) return out;
  if (dim % 4 != 0 || dim > kAttnMaxDim) {
    throw Error(ErrorCode::kUnsupported, std::string(op) +
                                             ": the head dim must be a multiple of 4 up to " +
                                             std::to_string(kAttnMaxDim) + ", got " + q.describe());
  }
  check_vec4(op, "q", q);
  check_vec4(op, "kv", kv);
  check_vec4(op, "swa_ring", swa_ring);
  if (compressed) check_vec4(op, "entries", entries);
  check_vec4(op, "out", out);

  if (spec.bf16_math) {  // tensor cores (ops_attention_mma.cu) when the shape allows
    Tensor partials;
    const int64_t splits = attention_bf16(q, kv, swa_ring, entries, topk, sinks, layout, spec,
                                          kAttnMaxSplits, out, &partials);
    if (splits > 0) {
      if (splits > 1) {
        const float* part_acc = reinterpret_cast<const float*>(partials.raw_data());
        launch_attention_combine(stream(), part_acc, part_acc + splits * tokens * heads * dim,
                                 sinks.data<float>(), out.data<float>(), tokens, heads, dim,
                                 splits);
      }
      return out;
    }
  }

  // Heads per block: the most whose q fits kAttnQFloats, a multiple of 8 (so the P.V phase's
  // (D/4) x (HB/8) threads fit the block), or all heads when fewer.
  const int64_t hb_cap = std::max<int64_t>(
      kAttnHeadsPerThread, kAttnQFloats / dim / kAttnHeadsPerThread * kAttnHeadsPerThread);
  const int64_t hb = std::min(heads, hb_cap);
  const int64_t hb_stride = (hb + 7) / 8 * 8;
  const int64_t head_groups = (heads + hb - 1) / hb;
  const size_t smem = attn_smem_bytes(dim, hb, hb_stride);
  if (smem > max_shared_memory_per_block() || head_groups > 65535) {
    throw Error(ErrorCode::kUnsupported, std::string(op) + ": " + std::to_string(heads) +
                                             " heads of " + std::to_string(dim) +
                                             " channels do not fit the kernel's blocks");
  }
  allow_smem(attention_kernel, smem);

  const int64_t epb = compressed ? layout.block_size / spec.ratio : 0;
  const int64_t entry_bound = static_cast<int64_t>(layout.max_blocks_per_seq) * epb;
  const int64_t topk_cols = sparse ? topk.size(1) : 0;
  // Splits of each token's key list: enough blocks for two waves when tokens are few, at least
  // one tile of keys per split (by the host's bound on the list: W + entries).
  const int64_t max_keys = spec.window + (compressed ? (sparse ? topk_cols : entry_bound) : 0);
  const int64_t blocks = tokens * head_groups;
  const int64_t target = 2 * static_cast<int64_t>(num_sms());
  int64_t splits = 1;
  if (blocks < target) {
    splits = std::min({(target + blocks - 1) / blocks, (max_keys + kAttnKeys - 1) / kAttnKeys,
                       int64_t{kAttnMaxSplits}});
    splits = std::max<int64_t>(1, splits);
  }

  AttnArgs a{};
  a.q = q.data<float>();
  a.kv = kv.data<float>();
  a.ring = swa_ring.data<float>();
  a.entries = compressed ? entries.data<float>() : nullptr;
  a.topk = sparse ? topk.data<int32_t>() : nullptr;
  a.sinks = sinks.data<float>();
  a.out = out.data<float>();
  a.slots = swa_ring.size(0);
  a.ring_len = swa_ring.size(1);
  a.entry_rows = compressed ? entries.size(0) : 0;
  a.entry_bound = entry_bound;
  a.heads = static_cast<int>(heads);
  a.dim = static_cast<int>(dim);
  a.heads_per_block = static_cast<int>(hb);
  a.hb_stride = static_cast<int>(hb_stride);
  a.window = spec.window;
  a.ratio = compressed ? spec.ratio : 0;
  a.epb = static_cast<int>(epb);
  a.topk_cols = static_cast<int>(topk_cols);
  a.sparse = sparse;
  a.scale = spec.scale;
  Tensor partials;
  if (splits > 1) {
    const int64_t rows = splits * tokens * heads;
    partials = scratch(static_cast<size_t>(rows * (dim + 2)) * sizeof(float));
    a.part_acc = reinterpret_cast<float*>(partials.raw_data());
    a.part_md = a.part_acc + rows * dim;
  }
  const DeviceLayout dl = device_layout(layout);
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(head_groups),
                  static_cast<unsigned>(splits));
  attention_kernel<<<grid, kAttnThreads, smem, stream()>>>(a, dl);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  if (splits > 1) {
    launch_attention_combine(stream(), a.part_acc, a.part_md, a.sinks, a.out, tokens, heads, dim,
                             splits);
  }
  return out;
}

}  // namespace deepinfer::cuda
