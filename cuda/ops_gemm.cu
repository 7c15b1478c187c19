// linear and grouped_linear. f32 weights run IEEE fp32 cuBLAS GEMMs (exact against the CPU
// reference up to summation order). bf16 weights: up to kGemvMaxTokens tokens a GEMV kernel on f32
// activations and exactly widened weights (f32 accumulation; see below); from there on bf16
// tensor-core cuBLAS GEMMs with f32 accumulation and f32 output, after casting the f32
// activations to bf16.
#include <algorithm>
#include <cstdint>

#include "cuda_backend.h"
#include "cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

// `vec4`: `in` is 16-byte aligned (a view of a tensor may not be; a float4 load would fault).
__global__ void cast_f32_to_bf16(const float* __restrict__ in, __nv_bfloat16* __restrict__ out,
                                 int64_t n, bool vec4) {
  int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (vec4 && i + 3 < n) {
    float4 v = *reinterpret_cast<const float4*>(in + i);
    out[i] = __float2bfloat16(v.x);
    out[i + 1] = __float2bfloat16(v.y);
    out[i + 2] = __float2bfloat16(v.z);
    out[i + 3] = __float2bfloat16(v.w);
  } else {
    const int64_t end = i + 4 < n ? i + 4 : n;
    for (; i < end; ++i) out[i] = __float2bfloat16(in[i]);
  }
}

void cublas_check(cublasStatus_t s, const char* op) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, std::string(op) + ": cuBLAS failed with status " +
                                          std::to_string(static_cast<int>(s)));
  }
}

// ---- decode GEMV: bf16 weights, f32 activations, few tokens -------------------------------------
//
// For M <= kGemvMaxTokens tokens and bf16 weights, one kernel reads the f32 activations as they
// are (no cast kernel, no bf16 rounding of x) and streams each weight row once: products of f32 x
// and the exactly widened bf16 weight, accumulated in f32 (as the CPU op on the bf16 weight's
// values, up to summation order).
//
// Layout: a warp is four 8-lane subgroups; lane l8 of a subgroup loads the 8 weights [k, k + 8),
// k = 64 b + 8 l8, of block b of its rows with one 16-byte load, so each load instruction of the
// warp reads 128 contiguous bytes of 4 rows, and the 4 subgroups read the same x (broadcast). A
// lane owns R rows (the warp 4 R; R = 2, or 1 when N is too small for 2 CTAs per SM) and all M
// tokens: every weight vector serves M tokens and every x vector R rows. x goes through L1
// (ld.global.nc; the weights bypass L1 allocation), the whole [M, K] slice being too large for
// shared memory at K = 8192, M = 16. A CTA has 8 warps: S of them (1, 2, 4, 8) split the K blocks
// of the same 4 R rows (for small N the CTAs would not fill the GPU otherwise), so a CTA covers 32
// R / S rows of one group; grid (row tiles, groups). Summation order of y[m, n], fixed by (N, K, G)
// alone (S and the split points are chosen without M, so a token's result does not depend on the
// other tokens): each lane over its k ascending (one f32 FMA chain), then the 8 lanes of the
// subgroup by an xor butterfly (4, 2, 1), then the S warps in ascending order through shared
// memory. No atomics: results are bitwise reproducible. Rows past N read row N - 1 and are not
// stored; tokens past M are skipped (warp-uniform).

// Up to this M bf16 linears take the GEMV (cuBLAS above). On the H200 the GEMV made a B = 1 decode
// step 7% faster but a B = 8 step 25% slower than cuBLAS (its FMA work grows with M), so it is
// kept for the smallest batches.
constexpr int kGemvMaxTokens = 2;
constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * 32;
constexpr int kGemvBlockK = 64;  // k per warp and step: 8 lanes x 8 bf16
constexpr int kGemvUnroll = 4;   // blocks whose loads are issued together (M <= 4)
// Weights above this size (the 1 GB lm_head) stay on cuBLAS, which streams them at roofline.
constexpr int64_t kGemvMaxWeightBytes = int64_t{256} << 20;

struct GemvArgs {
  const float* x;          // [M, ldx]; group g reads columns [g K, (g + 1) K)
  const __nv_bfloat16* w;  // [G N, K]
  float* y;                // [M, ldy]; group g writes columns [g N, (g + 1) N)
  int64_t ldx, ldy;
  int64_t n, k;  // per group
  int m;         // tokens, 1..MT
  int splits;    // S: warps sharing the rows of a CTA, each over a contiguous range of K blocks
};

// 16 bytes of weights, read-only, not allocated in L1 (which keeps x).
__device__ __forceinline__ uint4 load_weights16(const __nv_bfloat16* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// acc[r][m] += w_r[k + i] * x_m[k + i], i = 0..7 in order, for U consecutive blocks of the lane
// (k = k0 + 64 u); blocks with k >= K are skipped.
template <int MT, int R, int U>
__device__ __forceinline__ void gemv_blocks(const __nv_bfloat16* const (&w)[R], const float* x,
                                            int64_t ldx, int m_count, int64_t k0, int64_t K,
                                            float (&acc)[R][MT]) {
  uint4 raw[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t k = k0 + static_cast<int64_t>(u) * kGemvBlockK;
#pragma unroll
    for (int r = 0; r < R; ++r) raw[u][r] = k < K ? load_weights16(w[r] + k) : uint4{0, 0, 0, 0};
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t k = k0 + static_cast<int64_t>(u) * kGemvBlockK;
    if (k < K) {
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t words[4] = {raw[u][r].x, raw[u][r].y, raw[u][r].z, raw[u][r].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // bf16 -> f32 is exact: the bf16 bits are the high half
          wf[r][2 * i] = __uint_as_float(words[i] << 16);
          wf[r][2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < m_count) {
          const float4* xp = reinterpret_cast<const float4*>(x + m * ldx + k);
          const float4 a = __ldg(xp);
          const float4 b = __ldg(xp + 1);
          const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
          for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r][m] = fmaf(wf[r][i], xv[i], acc[r][m]);
          }
        }
      }
    }
  }
}

template <int MT, int R>
__global__ void __launch_bounds__(kGemvThreads, 2) gemv_bf16_kernel(GemvArgs a) {
  __shared__ float part[kGemvWarps][4][R][MT];
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int sub = lane >> 3;
  const int l8 = lane & 7;
  const int S = a.splits;
  const int s = warp % S;
  const int rows_cta = (kGemvWarps / S) * 4 * R;
  const int64_t g = blockIdx.y;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * rows_cta;
  const int64_t row0 = tile0 + (warp / S) * 4 * R + sub * R;
  const __nv_bfloat16* w[R];
#pragma unroll
  for (int r = 0; r < R; ++r) w[r] = a.w + (g * a.n + min(row0 + r, a.n - 1)) * a.k;
  const float* x = a.x + g * a.k;
  const int64_t nblk = (a.k + kGemvBlockK - 1) / kGemvBlockK;
  const int64_t b0 = s * nblk / S;
  const int64_t b1 = (s + 1) * nblk / S;
  float acc[R][MT] = {};
  const int64_t lane_k = static_cast<int64_t>(l8) * 8;
  // Fewer blocks in flight with more tokens (registers: their x vectors; more FMAs per load).
  constexpr int kU = MT >= 8 ? 2 : kGemvUnroll;
  int64_t b = b0;
  for (; b + kU <= b1; b += kU) {
    gemv_blocks<MT, R, kU>(w, x, a.ldx, a.m, b * kGemvBlockK + lane_k, a.k, acc);
  }
  for (; b < b1; ++b) {
    gemv_blocks<MT, R, 1>(w, x, a.ldx, a.m, b * kGemvBlockK + lane_k, a.k, acc);
  }
  // Subgroup sums by an xor butterfly: v + partner on both sides, so all 8 lanes end with the
  // same bits. Every lane of the warp takes part (no early exit above).
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float v = acc[r][m];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      if (((r * MT + m) & 7) == l8) part[warp][sub][r][m] = v;
    }
  }
  __syncthreads();
  // y[m, n]: the S warps of the row group in ascending order.
  for (int i = static_cast<int>(threadIdx.x); i < rows_cta * a.m; i += kGemvThreads) {
    const int m = i / rows_cta;
    const int lr = i % rows_cta;  // = row group * 4 R + sub * R + r
    const int rg = lr / (4 * R);
    const int sb = (lr / R) % 4;
    const int r = lr % R;
    float v = part[rg * S][sb][r][m];
    for (int j = 1; j < S; ++j) v += part[rg * S + j][sb][r][m];
    const int64_t n = tile0 + lr;
    if (n < a.n) a.y[m * a.ldy + g * a.n + n] = v;
  }
}

template <int R>
void launch_gemv_r(const GemvArgs& a, dim3 grid, cudaStream_t stream) {
  if (a.m <= 1) {
    gemv_bf16_kernel<1, R><<<grid, kGemvThreads, 0, stream>>>(a);
  } else if (a.m <= 2) {
    gemv_bf16_kernel<2, R><<<grid, kGemvThreads, 0, stream>>>(a);
  } else if (a.m <= 4) {
    gemv_bf16_kernel<4, R><<<grid, kGemvThreads, 0, stream>>>(a);
  } else if (a.m <= 8) {
    gemv_bf16_kernel<8, R><<<grid, kGemvThreads, 0, stream>>>(a);
  } else {
    gemv_bf16_kernel<16, R><<<grid, kGemvThreads, 0, stream>>>(a);
  }
}

// CTAs of the GEMV for R rows per lane and S splits.
int64_t gemv_ctas(int64_t n, int64_t groups, int r, int s) {
  const int64_t rows_cta = (kGemvWarps / s) * 4 * r;
  return groups * ((n + rows_cta - 1) / rows_cta);
}

// Launches the GEMV when it applies (bf16 w, 1 <= M <= kGemvMaxTokens, K % 8 == 0, 16-byte aligned
// x and w); returns false, launching nothing, otherwise. The tiling (R, S) depends on N, K, G and
// the SM count only, never on M.
bool try_gemv(CudaBackend& be, const Tensor& x, const Tensor& w, const Tensor& y, int64_t m,
              int64_t n, int64_t k, int64_t groups) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (w.dtype() != DType::kBF16 || m < 1 || m > kGemvMaxTokens || k < 8 || k % 8 != 0 ||
      !aligned(x.raw_data()) || !aligned(w.raw_data()) ||
      static_cast<int64_t>(w.nbytes()) > kGemvMaxWeightBytes || groups > 65535) {
    return false;
  }
  // Enough CTAs for two per SM: the fewest K splits (each warp keeping at least kGemvUnroll
  // blocks), 2 rows per lane unless even 8 splits leave too few CTAs.
  const int64_t target = 2 * static_cast<int64_t>(be.num_sms());
  const int64_t nblk = (k + kGemvBlockK - 1) / kGemvBlockK;
  const int max_s = static_cast<int>(std::clamp<int64_t>(nblk / kGemvUnroll, 1, kGemvWarps));
  const auto pick_s = [&](int r) {
    int s = 1;
    while (2 * s <= max_s && gemv_ctas(n, groups, r, s) < target) s *= 2;
    return s;
  };
  int r = 2;
  int s = pick_s(r);
  if (gemv_ctas(n, groups, r, s) < target) {
    r = 1;
    s = pick_s(r);
  }
  GemvArgs a;
  a.x = x.data<float>();
  a.w = w.data<__nv_bfloat16>();
  a.y = y.data<float>();
  a.ldx = groups * k;
  a.ldy = groups * n;
  a.n = n;
  a.k = k;
  a.m = static_cast<int>(m);
  a.splits = s;
  const int64_t rows_cta = (kGemvWarps / s) * 4 * r;
  const int64_t tiles = (n + rows_cta - 1) / rows_cta;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(groups));
  if (r == 2) {
    launch_gemv_r<2>(a, grid, be.stream());
  } else {
    launch_gemv_r<1>(a, grid, be.stream());
  }
  return true;
}

}  // namespace

// Y[M, G*N] = per group g: X[:, gK:(g+1)K] . W[gN:(g+1)N, :]^T. Row-major Y^T is column-major
// (G*N) x M, so each group is C_g = op(A_g) B_g with A = W (column-major K x N, transposed) and
// B = X (column-major view, leading dimension G*K). The front checked that x and w split into
// `groups` groups and that w is f32 or bf16.
static Tensor gemm(CudaBackend& be, const char* op, const Tensor& x, const Tensor& w, int groups) {
  const int64_t m = x.size(0);
  const int64_t gk = x.size(1);
  const int64_t k = w.size(1);
  const int64_t n = w.size(0) / groups;
  Tensor y = be.empty({m, groups * n}, DType::kF32);
  if (m == 0 || n == 0) return y;
  if (try_gemv(be, x, w, y, m, n, k, groups)) {
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
    return y;
  }
  const float alpha = 1.0f, beta = 0.0f;
  cublasHandle_t h = be.cublas();
  // Weights are whole allocations (aligned); a view that is not 16-byte aligned is copied so that
  // cuBLAS never sees an operand its vectorised kernels cannot load.
  Tensor aligned_w = w;
  if (reinterpret_cast<uintptr_t>(w.raw_data()) % 16 != 0) {
    aligned_w = be.empty(w.shape(), w.dtype());
    be.copy_into(aligned_w, w);
  }
  if (w.dtype() == DType::kF32) {
    cublas_check(cublasSgemmStridedBatched(
                     h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, aligned_w.data<float>(), static_cast<int>(k),
                     n * k, x.data<float>(), static_cast<int>(gk), k, &beta, y.data<float>(),
                     static_cast<int>(groups * n), n, groups),
                 op);
    return y;
  }
  Tensor xb = be.empty(x.shape(), DType::kBF16);
  const int64_t numel = x.numel();
  const bool vec4 = reinterpret_cast<uintptr_t>(x.raw_data()) % 16 == 0;
  cast_f32_to_bf16<<<ceil_div(numel, 4 * 256), 256, 0, be.stream()>>>(
      x.data<float>(), xb.data<__nv_bfloat16>(), numel, vec4);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  cublas_check(cublasGemmStridedBatchedEx(
                   h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                   static_cast<int>(k), &alpha, aligned_w.raw_data(), CUDA_R_16BF,
                   static_cast<int>(k), n * k, xb.raw_data(), CUDA_R_16BF, static_cast<int>(gk), k,
                   &beta, y.raw_data(), CUDA_R_32F, static_cast<int>(groups * n), n, groups,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               op);
  return y;
}

Tensor CudaBackend::linear_impl(const Tensor& x, const Tensor& w) {
  return gemm(*this, "linear", x, w, 1);
}

Tensor CudaBackend::grouped_linear_impl(const Tensor& x, const Tensor& w, int groups) {
  return gemm(*this, "grouped_linear", x, w, groups);
}

}  // namespace deepinfer::cuda
