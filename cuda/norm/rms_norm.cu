// rms_norm of the CUDA backend, matching the CPU reference op (cpp/src/backend/cpu_ops_dense.cpp):
// y = x * (1 / sqrt(float(mean(x^2)) + eps)) [* w], the sum of squares in double as on the CPU
// (each square is exact in double, so only the order of the additions differs). `w` may be null
// (unweighted). Three kernels, chosen by the row width and alignment in CudaBackend::rms_norm:
//   - rows of at most kNormWarpUnits float4s: one warp per row, several rows per block;
//   - rows of at most kNormBlockUnits float4s: one block per row, or, when there are few rows, a
//     cluster of blocks per row that add their partial sums through distributed shared memory;
//   - anything else (a width not a multiple of 4, an unaligned base, wider rows): the scalar
//     two-pass kernel.
// The vector kernels keep the row in registers between the sum and the scaling, so x is read once.
//
// rms_norm_rope (the model's q-norm + RoPE, kv-norm + RoPE) runs the warp kernel with the rotation
// of rope.cu applied to the normed values in registers before the store: one launch and one pass
// over x instead of two, bit for bit the two kernels' result. Rows the warp kernel does not take,
// or whose rotated channels do not start on a float4, run the two ops. Under bf16_output the warp
// kernel rounds its stores to bf16 (to nearest even: the f32 result rounded), the engine's q
// where its attention rounds q anyway (attention_rounds_query); the two ops' path returns f32.
// rms_norm_rope_kv (the model's kv-norm + RoPE where the SWA ring is bf16 or fp8) runs the same
// kernel encoding each row in registers: bf16 rows, V4's fp8 main records (Fp8MainRecords) or
// V4.1's FP8 records (V41Fp8Records), the bytes encode_kv_row writes for the f32 row; other
// formats, or rows the warp kernel does not take, run rms_norm_rope and then the encoding
// (cache/encode_rows.cuh).
#include <cooperative_groups.h>

#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/cache/encode_rows.cuh"
#include "cuda/cache/kv_record.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/norm/rms_norm_heuristics.h"
#include "cuda/norm/rms_norm_math.cuh"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;

// The forward RoPE rotation (rope.cu's arithmetic: cosf / sinf of float(pos) * inv_freq[i], the
// products rounded separately) of the two channel pairs of float4 `v`, whose first channel is
// rotated pair i.
__device__ __forceinline__ float4 rotate_pairs(float4 v, float pos, const float* inv_freq,
                                               int64_t i) {
  const float a0 = pos * inv_freq[i];
  const float a1 = pos * inv_freq[i + 1];
  const float c0 = cosf(a0), s0 = sinf(a0), c1 = cosf(a1), s1 = sinf(a1);
  return make_float4(__fsub_rn(__fmul_rn(v.x, c0), __fmul_rn(v.y, s0)),
                     __fadd_rn(__fmul_rn(v.y, c0), __fmul_rn(v.x, s0)),
                     __fsub_rn(__fmul_rn(v.z, c1), __fmul_rn(v.w, s1)),
                     __fadd_rn(__fmul_rn(v.w, c1), __fmul_rn(v.z, s1)));
}

// The rotation of rms_norm_rope: row r is token r / heads; float4 units from first_unit on are
// rotated (the rotated channels start on a float4).
struct RopeArgs {
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int64_t heads = 1;
  int64_t first_unit = 0;
};

// Unit u of a row of y: f32, or (rms_norm_rope under bf16_output) rounded to nearest even bf16.
__device__ __forceinline__ void store_unit(float4* y, int64_t u, float4 v) {
  y[u] = v;
}
__device__ __forceinline__ void store_unit(uint2* y, int64_t u, float4 v) {
  y[u] = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
}

// Where the warp kernel's rows go, unit by unit: every lane of the warp calls store for each of
// its units (in_row false past the row's end, v zero there), then finish once.
// Rows of `units` units of Out: float4 (f32) or uint2 (4 bf16: rms_norm_rope under bf16_output,
// rms_norm_rope_kv's bf16 rows).
template <typename Out>
struct UnitRows {
  Out* y;
  int64_t units;
  __device__ __forceinline__ void store(int64_t row, int64_t u, float4 v, bool in_row) const {
    if (in_row) store_unit(y + row * units, u, v);
  }
  __device__ __forceinline__ void finish(int64_t, int) const {}
};

// The largest |channel| of the float4s of kLanes consecutive lanes (an aligned group of them;
// every lane of the warp calls it). Max is exact in any order: the encoders' amax.
template <int kLanes>
__device__ __forceinline__ float group_amax(float4 v) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int m = kLanes / 2; m >= 1; m >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  }
  return amax;
}

// The e4m3 codes of v / scale (kv_e4m3_byte each, as the encoders round), channel x in the low
// byte.
__device__ __forceinline__ uint32_t e4m3_word(float4 v, float scale) {
  return static_cast<uint32_t>(kv_e4m3_byte(__fdiv_rn(v.x, scale))) |
         static_cast<uint32_t>(kv_e4m3_byte(__fdiv_rn(v.y, scale))) << 8 |
         static_cast<uint32_t>(kv_e4m3_byte(__fdiv_rn(v.z, scale))) << 16 |
         static_cast<uint32_t>(kv_e4m3_byte(__fdiv_rn(v.w, scale))) << 24;
}

// One unit's e4m3 codes at record + c (channel c = 4u) under its group's power-of-two scale, and
// the scale's UE8M0 byte at record[scales_at + c / kGroup] when the unit opens its group: the
// code and scale bytes both FP8 records write (encode_kv_row, encode_v41_row).
template <int kGroup>
__device__ __forceinline__ void store_e4m3_unit(uint8_t* record, int scales_at, int c, float4 v,
                                                float amax) {
  const float scale = act_group_scale(amax);
  *reinterpret_cast<uint32_t*>(record + c) = e4m3_word(v, scale);
  if (c % kGroup == 0) {
    record[scales_at + c / kGroup] = static_cast<uint8_t>(__float_as_uint(scale) >> 23);
  }
}

// rms_norm_rope_kv's V4 fp8 main records (kv_record.h), the bytes encode_kv_row writes for the
// f32 row: e4m3 codes of the nope channels with a power-of-two scale per 64, the RoPE channels in
// bf16, the scale bytes, zero padding. A 64-channel group is 16 units, the units of one
// half-warp at one k (nope is a multiple of 64), so its amax takes 4 shuffles within the half.
struct Fp8MainRecords {
  uint8_t* rows;
  int64_t row_bytes;  // a multiple of 8: the code words and bf16 pairs below are aligned
  int nope;
  int rope_dim;
  __device__ __forceinline__ void store(int64_t row, int64_t u, float4 v, bool in_row) const {
    const float amax = group_amax<16>(v);
    if (!in_row) return;
    uint8_t* dst = rows + row * row_bytes;
    const int c = 4 * static_cast<int>(u);
    if (c < nope) {
      store_e4m3_unit<kv_record::kFp8Group>(dst, nope + 2 * rope_dim, c, v, amax);
    } else {
      *reinterpret_cast<uint2*>(dst + nope + 2 * (c - nope)) =
          make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
  }
  __device__ __forceinline__ void finish(int64_t row, int lane) const {
    const int64_t used = nope + 2 * rope_dim + nope / kv_record::kFp8Group;
    for (int64_t i = used + lane; i < row_bytes; i += 32) rows[row * row_bytes + i] = 0;
  }
};

// rms_norm_rope_kv's V4.1 FP8 records (kv_record.h: every channel e4m3, a UE8M0 scale per 32
// after the codes), the bytes encode_v41_row writes for the f32 row. A 32-channel group is 8
// units, the units of 8 consecutive lanes at one k (dim a multiple of 32), so its amax takes 3
// shuffles within them.
struct V41Fp8Records {
  uint8_t* rows;
  int64_t row_bytes;  // dim + dim / 32: a multiple of 4 here (aligned code words)
  int dim;
  __device__ __forceinline__ void store(int64_t row, int64_t u, float4 v, bool in_row) const {
    const float amax = group_amax<8>(v);
    if (!in_row) return;
    uint8_t* dst = rows + row * row_bytes;
    store_e4m3_unit<kv_record::kV41Fp8Group>(dst, dim, 4 * static_cast<int>(u), v, amax);
  }
  __device__ __forceinline__ void finish(int64_t, int) const {}
};

// One warp per row of `units` float4s (at most 32 * kVec); lane l holds units l + 32k. The weight
// is loaded with the row so its latency overlaps the reduction. kRope: then rotated (RopeArgs).
// Sink: UnitRows<float4> (f32 y), UnitRows<uint2> (4 bf16) or Fp8MainRecords.
template <int kVec, bool kRope = false, typename Sink = UnitRows<float4>>
__global__ void __launch_bounds__(kNormWarpThreads)
    rms_norm_warp_kernel(const float4* __restrict__ x, const float4* __restrict__ w, Sink y,
                         int64_t rows, int64_t units, float eps, RopeArgs rope = {}) {
  enter_dependent_grid();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kNormWarpThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // uniform over the warp, so warp_sum below sees full warps
  const int lane = static_cast<int>(threadIdx.x % 32);
  const float4* xr = x + row * units;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 v[kVec];
  float4 g[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t u = lane + 32 * k;
    v[k] = u < units ? xr[u] : zero;
    g[k] = w != nullptr && u < units ? w[u] : zero;
  }
  double acc = 0.0;
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc = add_squares(acc, v[k]);  // padding adds exact zeros
  const float inv = rms_inv(warp_sum(acc), units * 4, eps);
  [[maybe_unused]] float pos = 0.0f;
  if constexpr (kRope) pos = static_cast<float>(rope.positions[row / rope.heads]);
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t u = lane + 32 * k;
    float4 o = zero;
    if (u < units) {
      o = w != nullptr ? norm_scale(v[k], inv, g[k]) : norm_scale(v[k], inv);
      if constexpr (kRope) {
        if (u >= rope.first_unit)
          o = rotate_pairs(o, pos, rope.inv_freq, 2 * (u - rope.first_unit));
      }
    }
    y.store(row, u, o, u < units);
  }
  y.finish(row, lane);
}

// One block per row (kCluster false), or a cluster of blocks per row (kCluster true; grid x =
// rows * cluster size, cluster dims (size, 1, 1)): block rank r of a row's cluster covers the
// float4s [r * per_block, (r + 1) * per_block) of it, thread t units begin + t + k * blockDim.x
// (k < kNormBlockVec). The blocks of a cluster add the partial sums of all ranks in rank order,
// so each computes the same total. kPreloadWeight loads w with x (few rows: the latency of the
// weight then overlaps the reduction); otherwise w is read in the store loop, which keeps the
// registers low enough for two blocks per SM when many rows stream through.
template <bool kCluster, bool kPreloadWeight>
__global__ void __launch_bounds__(kNormBlockMaxThreads)
    rms_norm_block_kernel(const float4* __restrict__ x, const float4* __restrict__ w,
                          float4* __restrict__ y, int64_t units, int64_t per_block, float eps) {
  enter_dependent_grid();
  int64_t row = blockIdx.x;
  int64_t begin = 0;
  if constexpr (kCluster) {
    const cg::cluster_group cluster = cg::this_cluster();
    row = blockIdx.x / cluster.num_blocks();
    begin = static_cast<int64_t>(cluster.block_rank()) * per_block;
  }
  const int64_t end = begin + per_block < units ? begin + per_block : units;
  const float4* xr = x + row * units;
  float4* yr = y + row * units;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 v[kNormBlockVec];
  [[maybe_unused]] float4 g[kNormBlockVec];  // unused without kPreloadWeight
#pragma unroll
  for (int k = 0; k < kNormBlockVec; ++k) {
    const int64_t u = begin + threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    v[k] = u < end ? xr[u] : zero;
    if constexpr (kPreloadWeight) g[k] = w != nullptr && u < end ? w[u] : zero;
  }
  double acc = 0.0;
#pragma unroll
  for (int k = 0; k < kNormBlockVec; ++k) acc = add_squares(acc, v[k]);
  acc = block_sum(acc);
  if constexpr (kCluster) {
    const cg::cluster_group cluster = cg::this_cluster();
    __shared__ double block_total;
    if (threadIdx.x == 0) block_total = acc;
    cluster.sync();  // every rank's block_total is written
    acc = 0.0;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r)
      acc += *cluster.map_shared_rank(&block_total, r);
  }
  const float inv = rms_inv(acc, units * 4, eps);
#pragma unroll
  for (int k = 0; k < kNormBlockVec; ++k) {
    const int64_t u = begin + threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (u < end) {
      if (w == nullptr) {
        yr[u] = norm_scale(v[k], inv);
      } else if constexpr (kPreloadWeight) {
        yr[u] = norm_scale(v[k], inv, g[k]);
      } else {
        yr[u] = norm_scale(v[k], inv, w[u]);
      }
    }
  }
  if constexpr (kCluster) {
    // No block may exit (releasing its shared memory) while another still reads its block_total.
    cg::this_cluster().sync();
  }
}

// Fallback for any row: one block per row, scalar loads, x read twice.
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                float* __restrict__ y, int64_t dim, float eps) {
  enter_dependent_grid();
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const double v = xr[i];
    acc += v * v;  // exact in double, so a fused multiply-add rounds the same
  }
  acc = block_sum(acc);
  const float inv = rms_inv(acc, dim, eps);
  if (w != nullptr) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] * inv) * w[i];
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv;
  }
}

// The warp kernel with kVec = warp_vec (1, 2, 4 or 8: choose_rms_norm's) over rows into `sink`.
template <bool kRope, typename Sink>
void launch_warp_kernel(int warp_vec, const float4* x, const float4* w, Sink sink, int64_t rows,
                        int64_t units, float eps, const RopeArgs& rope, const char* op, bool pdl,
                        cudaStream_t stream) {
  const dim3 grid(ceil_div(rows, kNormWarpThreads / 32));
  const dim3 block(kNormWarpThreads);
  if (warp_vec == 1) {
    launch_programmatic(op, grid, block, 0, stream, pdl, rms_norm_warp_kernel<1, kRope, Sink>, x, w,
                        sink, rows, units, eps, rope);
  } else if (warp_vec == 2) {
    launch_programmatic(op, grid, block, 0, stream, pdl, rms_norm_warp_kernel<2, kRope, Sink>, x, w,
                        sink, rows, units, eps, rope);
  } else if (warp_vec == 4) {
    launch_programmatic(op, grid, block, 0, stream, pdl, rms_norm_warp_kernel<4, kRope, Sink>, x, w,
                        sink, rows, units, eps, rope);
  } else {
    launch_programmatic(op, grid, block, 0, stream, pdl, rms_norm_warp_kernel<8, kRope, Sink>, x, w,
                        sink, rows, units, eps, rope);
  }
}

// What rms_norm_rope and rms_norm_rope_kv share: for x [T, d] or [T, heads, d], the kernel that
// choose_rms_norm picks and, where it is the warp kernel (rows whose rotated channels start on a
// float4), that kernel's arguments.
struct NormRopeCall {
  RmsNormConfig config;
  const float4* x = nullptr;
  const float4* w = nullptr;
  int64_t rows = 0;
  int64_t units = 0;
  RopeArgs rope;

  bool warp() const { return rows > 0 && config.kernel == RmsNormKernel::kWarp; }
  template <typename Sink>
  void launch(Sink sink, float eps, const char* op, bool pdl, cudaStream_t stream) const {
    launch_warp_kernel<true>(config.warp_vec, x, w, sink, rows, units, eps, rope, op, pdl, stream);
  }
};

NormRopeCall norm_rope_call(const Tensor& x, const Tensor& weight, const Tensor& positions,
                            const Tensor& inv_freq, int64_t sms) {
  NormRopeCall call;
  const int64_t dim = x.size(-1);
  call.rows = dim > 0 ? x.numel() / dim : 0;
  call.units = dim / 4;
  const int64_t first = dim - 2 * inv_freq.size(0);  // the rotated channels trail
  const float* xp = x.data<float>();
  const float* wp = weight.defined() ? weight.data<float>() : nullptr;
  const bool vec =
      dim % 4 == 0 && first % 4 == 0 && aligned16(xp) && (wp == nullptr || aligned16(wp));
  call.config = choose_rms_norm(call.rows, dim, vec, sms);
  call.x = reinterpret_cast<const float4*>(xp);
  call.w = reinterpret_cast<const float4*>(wp);
  call.rope.positions = positions.data<int32_t>();
  call.rope.inv_freq = inv_freq.data<float>();
  call.rope.heads = x.dim() == 3 ? x.size(1) : 1;
  call.rope.first_unit = first / 4;
  return call;
}

}  // namespace

Tensor CudaBackend::rms_norm_impl(const Tensor& x, const Tensor& weight, float eps) {
  const char* op = "rms_norm";
  const int64_t dim = x.size(-1);
  const int64_t rows = dim > 0 ? x.numel() / dim : 0;
  Tensor out = empty(x.shape(), DType::kF32);
  if (rows == 0) return out;
  const float* xp = x.data<float>();
  const float* wp = weight.defined() ? weight.data<float>() : nullptr;
  float* yp = out.data<float>();
  const int64_t units = dim / 4;
  const bool vec =
      dim % 4 == 0 && aligned16(xp) && aligned16(yp) && (wp == nullptr || aligned16(wp));
  const auto* x4 = reinterpret_cast<const float4*>(xp);
  const auto* w4 = reinterpret_cast<const float4*>(wp);
  auto* y4 = reinterpret_cast<float4*>(yp);
  const RmsNormConfig c = choose_rms_norm(rows, dim, vec, num_sms());
  switch (c.kernel) {
    case RmsNormKernel::kWarp: {
      launch_warp_kernel<false>(c.warp_vec, x4, w4, UnitRows<float4>{y4, units}, rows, units, eps,
                                RopeArgs{}, op, pdl(), stream());
      break;
    }
    case RmsNormKernel::kCluster: {
      ClusterLaunch l;
      l.grid = dim3(static_cast<unsigned>(rows * c.cluster));
      l.block = dim3(c.threads);
      l.cluster = dim3(static_cast<unsigned>(c.cluster), 1, 1);
      l.stream = stream();
      l.pdl = pdl();
      launch_clustered(op, l, rms_norm_block_kernel<true, true>, x4, w4, y4, units, c.per_block,
                       eps);
      break;
    }
    case RmsNormKernel::kBlock:
      if (c.preload_weight) {
        launch_programmatic(op, dim3(static_cast<unsigned>(rows)), dim3(c.threads), 0, stream(),
                            pdl(), rms_norm_block_kernel<false, true>, x4, w4, y4, units, units,
                            eps);
      } else {
        launch_programmatic(op, dim3(static_cast<unsigned>(rows)), dim3(c.threads), 0, stream(),
                            pdl(), rms_norm_block_kernel<false, false>, x4, w4, y4, units, units,
                            eps);
      }
      break;
    case RmsNormKernel::kScalar:
      launch_programmatic(op, dim3(static_cast<unsigned>(rows)), dim3(row_threads(dim)), 0,
                          stream(), pdl(), rms_norm_kernel, xp, wp, yp, dim, eps);
      break;
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::rms_norm_rope_impl(const Tensor& x, const Tensor& weight, float eps,
                                       const Tensor& positions, const Tensor& inv_freq,
                                       bool bf16_output) {
  const char* op = "rms_norm_rope";
  const NormRopeCall call = norm_rope_call(x, weight, positions, inv_freq, num_sms());
  if (!call.warp()) {
    // f32 (bf16_output permits, does not require, bf16).
    return Backend::rms_norm_rope_impl(x, weight, eps, positions, inv_freq, bf16_output);
  }
  // A fresh allocation: 16-byte aligned.
  Tensor out = empty(x.shape(), bf16_output ? DType::kBF16 : DType::kF32);
  if (bf16_output) {
    call.launch(UnitRows<uint2>{static_cast<uint2*>(out.raw_data()), call.units}, eps, op, pdl(),
                stream());
  } else {
    call.launch(UnitRows<float4>{reinterpret_cast<float4*>(out.data<float>()), call.units}, eps, op,
                pdl(), stream());
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::rms_norm_rope_kv_impl(const Tensor& x, const Tensor& weight, float eps,
                                          const Tensor& positions, const Tensor& inv_freq,
                                          DType kv_dtype, int rope_dim) {
  const char* op = "rms_norm_rope_kv";
  const KvRowFormat f = kv_row_format(kv_dtype, x.size(1), rope_dim);
  check_kv_row_format(op, f);
  if (f.format == KvFormat::kF32) {
    return rms_norm_rope_impl(x, weight, eps, positions, inv_freq, /*bf16_output=*/false);
  }
  // A fresh allocation: 16-byte aligned.
  Tensor out = empty({x.size(0), kv_record::row_width(kv_dtype, x.size(1), rope_dim)}, kv_dtype);
  if (x.size(0) == 0) return out;
  const NormRopeCall call = norm_rope_call(x, weight, positions, inv_freq, num_sms());
  // The fused kernel's records: bf16 rows, or V4's fp8 main record whose 64-channel groups are
  // whole half-warps and whose code words and bf16 pairs are aligned (V4: 448 + 64 in 584 bytes).
  const bool fused_bf16 = call.warp() && f.format == KvFormat::kBf16;
  const bool fused_fp8 = call.warp() && f.format == KvFormat::kFp8 && f.rope_dim > 0 &&
                         f.nope() % kv_record::kFp8Group == 0 && f.rope_dim % 4 == 0 &&
                         f.row_bytes % 8 == 0;
  // V4.1's FP8 record whose 32-channel groups are whole octets of lanes (V4.1: 528 bytes).
  const bool fused_v41 = call.warp() && f.format == KvFormat::kV41Fp8 &&
                         f.dim % kv_record::kV41Fp8Group == 0 && f.row_bytes % 4 == 0;
  if (fused_bf16) {
    call.launch(UnitRows<uint2>{static_cast<uint2*>(out.raw_data()), call.units}, eps, op, pdl(),
                stream());
  } else if (fused_fp8) {
    call.launch(
        Fp8MainRecords{static_cast<uint8_t*>(out.raw_data()), f.row_bytes, f.nope(), f.rope_dim},
        eps, op, pdl(), stream());
  } else if (fused_v41) {
    call.launch(V41Fp8Records{static_cast<uint8_t*>(out.raw_data()), f.row_bytes, f.dim}, eps, op,
                pdl(), stream());
  } else {
    // The two steps: the f32 rows, then encoded.
    const Tensor f32 = rms_norm_rope_impl(x, weight, eps, positions, inv_freq, false);
    launch_encode_kv_rows(f32.data<float>(), static_cast<uint8_t*>(out.raw_data()), x.size(0), f,
                          pdl(), stream(), op);
    return out;
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

}  // namespace deepinfer::cuda
