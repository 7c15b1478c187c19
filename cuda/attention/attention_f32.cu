// The f32 attention kernel: sliding + compressed attention with sinks (docs/model.md#attention),
// f32 math throughout, matching the CPU reference op (cpp/src/backend/cpu_ops_attention.cpp) on
// the same inputs. It runs whenever AttentionSpec::bf16_math is off or the tensor-core kernel
// does not take the shape.
//
// Grid (token, head group, split), 256 threads. A block takes up to 8192 / D heads of one token
// (the MQA heads share every key tile in shared memory) and walks its range of the token's key
// list (attention_keys.cuh) in tiles of 32 keys with an online softmax. Shared memory: q of the
// group's heads [HB][D], the key tile [32][D+4], the tile's probabilities [32][hb_stride], key
// pointers [32], and per head the running max, denominator and the tile's rescale factor.
// The phases: load_query_group, then per tile
//  - the tile's key addresses (key_at), then load_key_tile: cp.async of its rows from an f32
//    cache, or the rows decoded to f32 from a bf16 / fp8 / V4.1 FP8 or FP4 cache (kv_record.cuh);
//    masked keys are zero rows.
//  - score_key_tile: warp w owns heads w, w+8, ...; lane = key. It computes the logits, updates
//    the head's online softmax with warp reductions and writes p = exp(logit - max) to the tile.
//  - accumulate values: thread (column group c4 = tid % (D/4), head subgroup tid / (D/4)) keeps
//    acc for 8 heads x 4 channels in registers: rescale_values, then the P V loop.
// and store_output, which applies the sink (one split) or writes the split's partial sums.
#include <cstdint>

#include "cuda/attention/attention_keys.cuh"
#include "cuda/attention/attention_launch.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"

namespace deepinfer::cuda {

namespace {

// q of the group's heads into qs (cp.async; rows past the heads are zero), and the softmax state
// of every head reset. The copies land with the first key tile's.
__device__ __forceinline__ void load_query_group(const AttentionArgs& a, float* qs, float* ps,
                                                 float* m_run, float* d_run, float* alpha, int t,
                                                 int h_first, int nhb, int dim, int d4, int hbs,
                                                 int tid) {
  const float4* q4 =
      reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(t) * a.heads + h_first) * dim);
  for (int i = tid; i < a.heads_per_block * d4; i += blockDim.x) {
    if (i < nhb * d4) {
      cp_async_16(qs + 4 * i, q4 + i);
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
}

// The rows of the tile's keys kptr (null: a masked key, a zero row) into ks as f32: cp.async
// from an f32 cache, decoded loads from a bf16 / fp8 one. Rows r < first_entry are sliding keys
// (format kvf), the others compressed entries (format entf). Ends with the tile visible to the
// whole block.
__device__ __forceinline__ void load_key_tile(float* ks, const uint8_t* const* kptr,
                                              const KvRowFormat& kvf, const KvRowFormat& entf,
                                              int64_t first_entry, int d4, int kstride, int tid) {
  for (int i = tid; i < kAttnKeys * d4; i += blockDim.x) {
    const int r = i / d4;
    const int c = i - r * d4;
    const uint8_t* src = kptr[r];
    const KvRowFormat& f = r < first_entry ? kvf : entf;
    float* dst = ks + r * kstride + c * 4;
    if (src == nullptr) {
      *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
    } else if (f.format == KvFormat::kF32) {
      cp_async_16(dst, src + 16 * c);
    } else {
      *reinterpret_cast<float4*>(dst) = decode_kv4(src, f, 4 * c);
    }
  }
  cp_async_wait_all();
  __syncthreads();
}

// Logits of the tile's keys for this warp's heads, the heads' online softmax, and the
// probabilities of the tile. Heads hA = warp + 16m and hB = hA + 8 share each key read.
__device__ __forceinline__ void score_key_tile(const AttentionArgs& a, const float* qs,
                                               const float* ks, float* ps, float* m_run,
                                               float* d_run, float* alpha,
                                               const uint8_t* const* kptr, int nhb, int dim, int d4,
                                               int kstride, int hbs, int lane, int warp) {
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
}

// acc *= alpha: the thread's 8 heads from h0 rescaled to the heads' new running max.
__device__ __forceinline__ void rescale_values(float4 (&acc)[kAttnHeadsPerThread],
                                               const float* alpha, int h0) {
#pragma unroll
  for (int i = 0; i < kAttnHeadsPerThread; ++i) {
    const float al = alpha[h0 + i];
    acc[i].x *= al;
    acc[i].y *= al;
    acc[i].z *= al;
    acc[i].w *= al;
  }
}

// With one split: out = acc / (d e^(m-M) + e^(sink-M)), the sink's softmax column dropped.
// Otherwise the split's unnormalised sums and (max, denominator) for attention_combine.
__device__ __forceinline__ void store_output(const AttentionArgs& a, const DeviceLayout& l,
                                             const float4 (&acc)[kAttnHeadsPerThread],
                                             const float* m_run, const float* d_run, int t,
                                             int h_first, int nhb, int h0, int c4, int dim,
                                             int split, int splits) {
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

__global__ void __launch_bounds__(kAttnThreads, 2)
    attention_kernel(AttentionArgs a, DeviceLayout l) {
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

  float* qs = reinterpret_cast<float*>(smem4);                            // [HB][dim]
  float* ks = qs + static_cast<int64_t>(a.heads_per_block) * dim;         // [kAttnKeys][kstride]
  float* ps = ks + kAttnKeys * kstride;                                   // [kAttnKeys][hbs]
  float* m_run = ps + kAttnKeys * hbs;                                    // [hbs]
  float* d_run = m_run + hbs;                                             // [hbs]
  float* alpha = d_run + hbs;                                             // [hbs]
  const uint8_t** kptr = reinterpret_cast<const uint8_t**>(alpha + hbs);  // [kAttnKeys]

  // This token's key list and this split's range of it, whole tiles.
  const AttentionKeys keys(a, l, t);
  const KeyRange range = split_key_range<kAttnKeys>(keys.n_keys, split, splits);
  // Key i of the list, or null when it is masked.
  auto key_at = [&](int64_t i) -> const uint8_t* {
    return i < range.end ? keys.key(a, l, i) : nullptr;
  };

  load_query_group(a, qs, ps, m_run, d_run, alpha, t, h_first, nhb, dim, d4, hbs, tid);
  // q lands with the first tile's copies; an empty key range must not exit with copies pending.
  if (range.begin >= range.end) cp_async_wait_all();
  __syncthreads();  // an empty key range reads m_run / d_run right away

  // P.V ownership.
  const int c4 = tid % d4;
  const int hsub = tid / d4;
  const bool pv_thread = hsub * kAttnHeadsPerThread < nhb;
  float4 acc[kAttnHeadsPerThread];
#pragma unroll
  for (int i = 0; i < kAttnHeadsPerThread; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);

  for (int64_t i0 = range.begin; i0 < range.end; i0 += kAttnKeys) {
    if (tid < kAttnKeys) kptr[tid] = key_at(i0 + tid);
    __syncthreads();
    load_key_tile(ks, kptr, a.kvf, a.entf, keys.n_sliding - i0, d4, kstride, tid);
    score_key_tile(a, qs, ks, ps, m_run, d_run, alpha, kptr, nhb, dim, d4, kstride, hbs, lane,
                   warp);
    __syncthreads();
    // accumulate_values: acc = acc * alpha + P V for the thread's 8 heads from h0 and its 4
    // channels from 4 c4. (The key loop stays in the kernel body: as a function of its own the
    // compiler unrolls it differently and spills more.)
    if (pv_thread) {
      const int h0 = hsub * kAttnHeadsPerThread;
      rescale_values(acc, alpha, h0);
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
  store_output(a, l, acc, m_run, d_run, t, h_first, nhb, hsub * kAttnHeadsPerThread, c4, dim, split,
               splits);
}

}  // namespace

void launch_attention_f32(const AttentionArgs& a, const DeviceLayout& l,
                          const AttentionF32Config& c, int64_t tokens, cudaStream_t stream) {
  allow_smem(attention_kernel, c.smem);
  AttentionArgs args = a;
  args.heads_per_block = static_cast<int>(c.heads_per_block);
  args.hb_stride = static_cast<int>(c.hb_stride);
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(c.head_groups),
                  static_cast<unsigned>(c.splits));
  attention_kernel<<<grid, kAttnThreads, c.smem, stream>>>(args, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("attention");
}

}  // namespace deepinfer::cuda
