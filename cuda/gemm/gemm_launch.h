// The launches and helpers of the gemm family that linear.cu composes: the bf16 GEMV and the
// dense GEMM (linear.cu), and the FP8 paths (fp8_stream.cu, gemv_fp8.cu, gemm_fp8.cu; the choice
// is gemm_fp8_heuristics.h's).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/smem_limits.h"
#include "cuda/gemm/gemm_fp8_heuristics.h"
#include "cuda/gemm/gemv_heuristics.h"
#include "deepinfer/weight.h"

namespace deepinfer::cuda {

class CudaBackend;

// y = x . w^T per group by the bf16 GEMV (gemv_bf16.cu), for a config with c.use; `pdl`: a
// programmatic dependent launch (pdl.cuh).
void launch_gemv_bf16(const float* x, const __nv_bfloat16* w, float* y, const GemvProblem& p,
                      const GemvConfig& c, bool pdl, cudaStream_t stream);

// The second weight of a pair launch of the FP8 GEMV (linear_pair): w [n, K] e4m3, scales
// [ceil(n / block_rows), scale_ld] f32, y [M, n] f32.
struct Fp8GemvSecond {
  const uint8_t* w;
  const float* scales;
  int64_t scale_ld;
  float* y;
  int64_t n;
};

// y = q(x) . w^T per group by the FP8 tensor-core GEMV (gemv_fp8.cu), for a config with c.use:
// w [G N, K] e4m3, w_scales [ceil(G N / block_rows), scale_ld] f32, x [M, G K] f32 quantized
// inside the kernel per act_group columns. `pdl`: a programmatic dependent launch (pdl.cuh).
// `second` (G = 1): p.n counts both weights' rows, w has the first p.n - second->n (a multiple of
// the CTA's 16 * c.warps rows) and y [M, p.n - second->n]; second's rows take the CTAs after.
// x_norm_weight (G = 1, x 16-byte aligned): x's RowNorm, applied as x is quantized.
void launch_gemv_fp8(const float* x, const uint8_t* w, const float* w_scales, int64_t scale_ld,
                     float* y, const Fp8Problem& p, const Fp8GemvConfig& c,
                     KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream,
                     const Fp8GemvSecond* second = nullptr, const float* x_norm_weight = nullptr,
                     float x_norm_eps = 0.0f);

// The launch shape the FP8 decode kernels (gemv_fp8.cu, fp8_stream.cu) share: CTA (row tile,
// split, group) of 32 * c.warps threads, the splits of a row tile one cluster (they add their
// partial sums through distributed shared memory). `Config`: Fp8GemvConfig or Fp8StreamConfig.
template <typename Config>
ClusterLaunch fp8_split_cluster(const Config& c, int64_t groups, size_t smem, cudaStream_t stream) {
  ClusterLaunch l;
  l.grid = dim3(static_cast<unsigned>(c.row_tiles), static_cast<unsigned>(c.splits),
                static_cast<unsigned>(groups));
  l.block = dim3(static_cast<unsigned>(32 * c.warps));
  l.cluster = dim3(1, static_cast<unsigned>(c.splits), 1);
  l.smem = smem;
  l.stream = stream;
  return l;
}

// Elements of the bf16 scratch launch_fp8_stream stages the quantized activations in:
// [G][M][K rounded up to kFp8StreamSliceK].
size_t fp8_stream_scratch_elements(const Fp8Problem& p);

// y = q(x) . w^T per group by the streaming kernel (fp8_stream.cu), for a config with c.use:
// w [G N, K] e4m3 (16-byte aligned), w_scales [ceil(G N / block_rows), scale_ld] f32, x [M, G K]
// f32, quantized per act_group columns into xq (fp8_stream_scratch_elements(p) bf16) first.
// `pdl`: the streaming kernel is a programmatic dependent launch of the quantization (it starts
// streaming weights before the activations are staged).
void launch_fp8_stream(const float* x, __nv_bfloat16* xq, const uint8_t* w, const float* w_scales,
                       int64_t scale_ld, float* y, const Fp8Problem& p, const Fp8StreamConfig& c,
                       bool pdl, KernelSmemLimits& smem_limits, cudaStream_t stream);

// One weight of a launch of the Hopper weight stream: its tensor map (fp8_wgmma_weight_map),
// scales [ceil(rows / block_rows), scale_ld] f32, output y [M, G n] f32 and rows per group.
struct Fp8WgmmaWeight {
  const void* map = nullptr;
  const float* scales = nullptr;
  int64_t scale_ld = 0;
  float* y = nullptr;
  int64_t n = 0;
};

// A launch of the Hopper weight stream (sm90/fp8_wgmma.cu): `first` (G groups of p.n rows, or
// with `second` the pair's first weight, G = 1), `second` (map nullptr: none) and the
// activations: either x [M, G K] f32 (16-byte aligned), which each CTA quantizes itself
// (Fp8WgmmaConfig::fused_quant), or the quantized activations: for the mma.sync math those of
// quantize_rows_e4m3, xq [G][m_pad][K] e4m3 and xs [G][ceil(K / 128)][m_pad]; for the f16 math
// those of quantize_rows_f16_tiles, xt [G][ceil(K / 128)] tiles of c.tokens tokens
// (fp8_wgmma_layout.h) and xs [G][ceil(K / 128)][c.tokens].
struct Fp8WgmmaLaunch {
  Fp8WgmmaWeight first, second;
  const float* x = nullptr;
  // x's RowNorm (G = 1, with x): [K] f32, applied as each CTA quantizes x; null: none.
  const float* x_norm_weight = nullptr;
  float x_norm_eps = 0.0f;
  const uint8_t* xq = nullptr;
  const uint8_t* xt = nullptr;
  const float* xs = nullptr;
  int64_t m_pad = 0;
};

// y = q(x) . w^T by the weight stream, for a config with c.use (sm_90a code on an sm_90 device
// only). `pdl`: a programmatic dependent launch of the kernel before it (the weights stream while
// that kernel, the quantization or x's producer, finishes).
void launch_fp8_wgmma(const Fp8WgmmaLaunch& l, const Fp8Problem& p, const Fp8WgmmaConfig& c,
                      KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream);

// Builds the weight stream's tensor map of an uploaded kFp8Block weight that the stream may take
// (a wgmma device, DeepSeek's 128-column scaling), so that no first use falls in a graph capture
// (where a call without its map takes the other paths). The backend calls it on upload under
// DEEPINFER_FP8_LINEAR=wgmma; a benchmark that switches to wgmma later calls it itself.
void prepare_fp8_wgmma_map(CudaBackend& be, const MatrixWeight& w);

// linear / grouped_linear of a kFp8Block weight on the streaming kernel, the GEMV or cuBLASLt
// (gemm_fp8.cu). Returns an undefined tensor when neither applies (or cuBLASLt has no algorithm):
// the caller falls back to dequantize_fp8 and the dense path.
Tensor linear_fp8(CudaBackend& be, const char* op, const Tensor& x, const MatrixWeight& w,
                  int groups);

// linear_pair of two kFp8Block weights as one launch of the FP8 GEMV, where it applies: both of
// one block shape and act_group, the GEMV's tokens and shape for their rows together, the first
// weight's rows a multiple of the GEMV's CTA rows; or the weight stream's where the choice tries
// it (fp8_choice_tries_wgmma: the default from 4 tokens, wgmma always); never under stream or
// stream_pdl. b nullptr: linear(x, a) alone on those paths (yb stays undefined). x_norm (RowNorm,
// may be undefined) is applied where x is quantized. false leaves the call to the caller (x_norm
// not applied).
bool linear_fp8_pair(CudaBackend& be, const Tensor& x, const MatrixWeight& a, const MatrixWeight* b,
                     const RowNorm& x_norm, Tensor& ya, Tensor& yb);

// The values of a kFp8Block weight as a `dtype` (bf16 or f32) device tensor [N, K]
// (stream-ordered scratch). f32 is exact; bf16 is exact when the scales are powers of two
// (e4m3 times 2^e is a bf16 value), else each value is the bf16 rounding of e4m3 * scale.
Tensor dequantize_fp8(CudaBackend& be, const MatrixWeight& w, DType dtype);

}  // namespace deepinfer::cuda
