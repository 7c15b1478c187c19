// linear / grouped_linear on block-scaled FP8 weights (gemm_fp8_heuristics.h has the paths):
// the choice between the streaming kernel, the GEMV and cuBLASLt, cuBLASLt's W8A8 GEMM with the
// activation quantization that feeds it, and the dequantization of the bf16 fallback.
//
// cuBLASLt computes Y^T = W . Xq^T in its column-major terms: A = W (K x N, transposed, the
// 128x128 block scales [ceil(N / 128), ceil(K / 128)] as stored), B = Xq (K x M, the 1x128
// scales M-major: scale(m, kb) at kb * M + m), D = Y^T (N x M, f32, leading dimension G N).
// Both scalings are applied by cuBLASLt per 128-column block in f32, products of e4m3 values are
// exact, and the activation scales are powers of two: the result matches the CPU reference up to
// the tensor cores' f32 summation.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/common/tensor_map.h"
#include "cuda/gemm/fp8_wgmma_layout.h"
#include "cuda/gemm/gemm_launch.h"
#include "cuda/norm/rms_norm_math.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kLtGroup =
    128;  // the 1x128 activation blocks of CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
constexpr int kQuantWarps = 8;
// cuBLASLt's heuristic finds no block-scaled algorithm (A BLK128x128, B VEC128) unless M is a
// multiple of 4: on the H200 (cuBLAS 13) it found one for M = 16, 20, 24, 64, 128, 1388, 1392 and
// none for 17, 18, 19, 33, 65, 127, 1387. The engine's prefill chunks have any length (a cache
// hit's suffix), and without an algorithm such a call fell back to dequantizing the whole weight
// to bf16. So B and D are padded to a multiple of this many rows; the pad rows are zeros and
// their outputs are dropped.
constexpr int64_t kLtRowPad = 4;

// The quantization of x's item (row, group g, 128-column block kb) as lane `lane` of its warp sees
// it: columns kb 128 + 4 lane .. + 3 (all in or all out: K % 16 == 0) as e4m3 codes (byte i
// from column 4 lane + i; zeros past K and for rows >= m) and the item's power-of-two scale, per
// (row, group, 128 columns) exactly as quantize_activations. norm_w (G = 1): x's RowNorm, each
// warp summing its row's squares (null: none).
struct QuantizedQuad {
  uint32_t codes;
  float scale;
};
__device__ __forceinline__ QuantizedQuad quantize_quad(const float* __restrict__ x, int64_t row,
                                                       int64_t g, int64_t kb, int lane, int64_t m,
                                                       int64_t k, int64_t groups,
                                                       const float* __restrict__ norm_w,
                                                       float norm_eps) {
  const int64_t c = kb * kLtGroup + 4 * lane;
  const float* src = x + row * groups * k + g * k + c;
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float row_inv =
      norm_w != nullptr && row < m ? warp_row_rms_inv(x + row * groups * k, k, norm_eps) : 1.0f;
  if (c < k && row < m) {
    v = make_float4(src[0], src[1], src[2], src[3]);
    if (norm_w != nullptr) {
      v = make_float4((v.x * row_inv) * norm_w[c], (v.y * row_inv) * norm_w[c + 1],
                      (v.z * row_inv) * norm_w[c + 2], (v.w * row_inv) * norm_w[c + 3]);
    }
  }
  const float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  const float scale = act_group_scale(warp_max(amax));
  return {e4m3x4_of(v, 1.0f / scale), scale};  // exact inverse: a power of two
}

// x [M, G K] f32 -> xq [G][M_pad][K] e4m3 and scales [G][ceil(K / 128)][M_pad] (M-major, as
// cuBLASLt's VEC128 scales of B); rows M..M_pad - 1 are zeros (their outputs are dropped). One
// warp per (row, group, block), quantize_quad's arithmetic.
__global__ void quantize_rows_e4m3(const float* __restrict__ x, uint8_t* __restrict__ xq,
                                   float* __restrict__ xs, int64_t m, int64_t m_pad, int64_t k,
                                   int64_t groups, const float* __restrict__ norm_w,
                                   float norm_eps) {
  enter_dependent_grid();
  const int64_t kb_count = (k + kLtGroup - 1) / kLtGroup;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kQuantWarps + (threadIdx.x >> 5);
  if (item >= m_pad * groups * kb_count) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t kb = item % kb_count;
  const int64_t g = (item / kb_count) % groups;
  const int64_t row = item / (kb_count * groups);
  const QuantizedQuad qq = quantize_quad(x, row, g, kb, lane, m, k, groups, norm_w, norm_eps);
  const int64_t c = kb * kLtGroup + 4 * lane;
  if (c < k) *reinterpret_cast<uint32_t*>(xq + (g * m_pad + row) * k + c) = qq.codes;
  if (lane == 0) xs[(g * kb_count + kb) * m_pad + row] = qq.scale;
}

// x [M, G K] f32 -> the weight stream's f16 tiles (fp8_wgmma_layout.h): xt [G][ceil(K / 128)]
// tiles of `tokens` tokens (a multiple of 8, >= M), each code's exact f16 value at its place,
// and scales xs [G][ceil(K / 128)][tokens]; columns past K and tokens M..tokens - 1 are zeros,
// the pad tokens' scales 0. One warp per (token, group, block), quantize_quad's arithmetic: the
// codes and scales of quantize_rows_e4m3.
__global__ void quantize_rows_f16_tiles(const float* __restrict__ x, uint8_t* __restrict__ xt,
                                        float* __restrict__ xs, int64_t m, int tokens, int64_t k,
                                        int64_t groups, const float* __restrict__ norm_w,
                                        float norm_eps) {
  enter_dependent_grid();
  const int64_t kb_count = (k + kLtGroup - 1) / kLtGroup;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kQuantWarps + (threadIdx.x >> 5);
  if (item >= tokens * groups * kb_count) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t kb = item % kb_count;
  const int64_t g = (item / kb_count) % groups;
  const int row = static_cast<int>(item / (kb_count * groups));
  const QuantizedQuad qq = quantize_quad(x, row, g, kb, lane, m, k, groups, norm_w, norm_eps);
  uint8_t* tile = xt + (g * kb_count + kb) * fp8_wgmma_tile_bytes(tokens);
  *reinterpret_cast<uint32_t*>(tile + fp8_wgmma_tile_offset(row, 4 * lane)) =
      f16x2_of_e4m3x2(qq.codes, 0);
  *reinterpret_cast<uint32_t*>(tile + fp8_wgmma_tile_offset(row, 4 * lane + 2)) =
      f16x2_of_e4m3x2(qq.codes, 1);
  if (lane == 0) xs[(g * kb_count + kb) * tokens + row] = row < m ? qq.scale : 0.0f;
}

// out[r][c] = Out(e4m3(values[r][c]) * scales[r / br][c / bc]) (Out: bf16 or f32).
template <typename Out>
__global__ void dequantize_e4m3(const uint8_t* __restrict__ values,
                                const float* __restrict__ scales, Out* __restrict__ out,
                                int64_t rows, int64_t cols, int64_t scale_ld, int br, int bc) {
  const int64_t total = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols;
    const int64_t c = i % cols;
    const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(values[i], __NV_E4M3)));
    const float d = v * scales[(r / br) * scale_ld + c / bc];
    if constexpr (std::is_same_v<Out, float>) {
      out[i] = d;
    } else {
      out[i] = __float2bfloat16_rn(d);
    }
  }
}

void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, std::string("linear (fp8): ") + what +
                                          " failed with cuBLAS status " +
                                          std::to_string(static_cast<int>(s)));
  }
}

struct LtDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
};
struct LtLayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct LtPrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using LtDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, LtDescDeleter>;
using LtLayout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtLayoutDeleter>;
using LtPref = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, LtPrefDeleter>;

LtLayout lt_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  lt_check(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows),
                                      static_cast<uint64_t>(cols), ld),
           "cublasLtMatrixLayoutCreate");
  return LtLayout(l);
}

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  lt_check(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)),
           "cublasLtMatmulDescSetAttribute");
}

// The largest power of two up to 256 that divides every address base + i * step (bytes).
uint32_t alignment_of(const void* base, int64_t step_bytes) {
  uint64_t bits = reinterpret_cast<uintptr_t>(base) | static_cast<uint64_t>(step_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

struct CudaEventDeleter {
  void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};
using TimingEvent = std::unique_ptr<CUevent_st, CudaEventDeleter>;

TimingEvent timing_event() {
  cudaEvent_t e = nullptr;
  DEEPINFER_CUDA_CHECK(cudaEventCreate(&e));
  return TimingEvent(e);
}

// The fastest of `candidates` when `run` calls each on the backend's stream (one untimed call,
// then kRuns timed together); candidates whose call fails are skipped, and the first wins where
// none runs. Synchronizes the stream: only outside graph captures.
using LtRun = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&)>;
LtAlgo fastest_lt_algo(CudaBackend& be, const std::vector<LtAlgo>& candidates, const LtRun& run) {
  constexpr int kRuns = 3;
  const TimingEvent start = timing_event(), stop = timing_event();
  LtAlgo best = candidates.front();
  float best_ms = 0.0f;
  bool timed_any = false;
  for (const LtAlgo& c : candidates) {
    if (run(c.algo) != CUBLAS_STATUS_SUCCESS) continue;
    DEEPINFER_CUDA_CHECK(cudaEventRecord(start.get(), be.stream()));
    bool ran = true;
    for (int r = 0; r < kRuns && ran; ++r) ran = run(c.algo) == CUBLAS_STATUS_SUCCESS;
    DEEPINFER_CUDA_CHECK(cudaEventRecord(stop.get(), be.stream()));
    DEEPINFER_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    DEEPINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    if (ran && (!timed_any || ms < best_ms)) {
      best = c;
      best_ms = ms;
      timed_any = true;
    }
  }
  return best;
}

// Y[M, G N] by cuBLASLt's block-scaled FP8 GEMM, one call per group: a view of the first M rows
// of a [M_pad, G N] result (kLtRowPad). Undefined (nothing enqueued) when cuBLASLt has no
// algorithm for the problem.
Tensor cublaslt_fp8(CudaBackend& be, const Tensor& x, const MatrixWeight& w, const Fp8Problem& p) {
  const int64_t m = p.m, n = p.n, k = p.k, groups = p.groups;
  const int64_t m_pad = ceil_div(m, kLtRowPad) * kLtRowPad;
  const int64_t kb_count = (k + kLtGroup - 1) / kLtGroup;
  const auto* wq = static_cast<const uint8_t*>(w.values.raw_data());
  const float* ws = w.scales.data<float>();
  Tensor y = be.empty({m_pad, groups * n}, DType::kF32);
  float* yp = y.data<float>();

  LtDesc desc;
  {
    cublasLtMatmulDesc_t d = nullptr;
    lt_check(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F),
             "cublasLtMatmulDescCreate");
    desc.reset(d);
  }
  set_desc(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_desc(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
           static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
  set_desc(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
           static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
  const LtLayout a = lt_layout(CUDA_R_8F_E4M3, k, n, k);
  const LtLayout b = lt_layout(CUDA_R_8F_E4M3, k, m_pad, k);
  const LtLayout d = lt_layout(CUDA_R_32F, n, m_pad, groups * n);

  Tensor xq = be.scratch(static_cast<size_t>(groups * m_pad * k));
  Tensor xs = be.empty({groups * kb_count * m_pad}, DType::kF32);
  auto* xqp = static_cast<uint8_t*>(xq.raw_data());

  LtPref pref;
  {
    cublasLtMatmulPreference_t pr = nullptr;
    lt_check(cublasLtMatmulPreferenceCreate(&pr), "cublasLtMatmulPreferenceCreate");
    pref.reset(pr);
  }
  const size_t ws_bytes = be.cublas_workspace_bytes();
  lt_check(cublasLtMatmulPreferenceSetAttribute(
               pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)),
           "cublasLtMatmulPreferenceSetAttribute");
  // The groups' operands start at these offsets: the algorithm must allow their alignment.
  const uint32_t align_a = alignment_of(wq, n * k);
  const uint32_t align_b = alignment_of(xqp, m_pad * k);
  const uint32_t align_d = alignment_of(yp, n * 4);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
  for (const auto& [attr, v] : aligns) {
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &v, sizeof(v)),
             "cublasLtMatmulPreferenceSetAttribute");
  }
  // The scale pointers are part of the problem cuBLASLt plans for: set group 0's first.
  set_desc(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(ws));
  set_desc(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
           static_cast<const void*>(xs.data<float>()));
  // The algorithm: the one timed fastest for this problem, else the heuristic's first pick (and
  // its next ones and their K splits as candidates where this call times them). Calls on the
  // side branch run beside the routed experts and keep the heuristic's pick (fp8_linear_choice.h).
  const std::vector<int64_t> key = {m_pad, n, k, groups, align_a, align_b, align_d};
  const bool tuning = be.cublaslt_tune() && !be.on_side_branch() && m_pad <= kLtTuneMaxRows;
  const LtAlgo* tuned = tuning ? be.tuned_lt_algo(key) : nullptr;
  const bool tune = tuning && tuned == nullptr && !be.capturing();
  cublasLtMatmulHeuristicResult_t heuristics[kLtTuneHeuristics] = {};
  int found = 0;
  if (tuned == nullptr) {
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        be.cublaslt(), desc.get(), a.get(), b.get(), d.get(), d.get(), pref.get(),
        tune ? kLtTuneHeuristics : 1, heuristics, &found);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0) return Tensor();
  }

  launch_programmatic("linear (fp8): activation quantization",
                      dim3(ceil_div(m_pad * groups * kb_count, kQuantWarps)),
                      dim3(32 * kQuantWarps), 0, be.stream(), be.pdl(), quantize_rows_e4m3,
                      x.data<float>(), xqp, xs.data<float>(), m, m_pad, k, groups, nullptr, 0.0f);
  DEEPINFER_CUDA_LAUNCH_CHECK("linear (fp8): activation quantization");
  const float alpha = 1.0f, beta = 0.0f;
  const int64_t scale_ld = w.scales.size(1);
  // Every group's GEMM by `algo`; the first failing status, else success.
  const LtRun run_groups = [&](const cublasLtMatmulAlgo_t& algo) {
    for (int64_t g = 0; g < groups; ++g) {
      set_desc(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
               static_cast<const void*>(ws + g * (n / 128) * scale_ld));
      set_desc(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
               static_cast<const void*>(xs.data<float>() + g * kb_count * m_pad));
      float* dst = yp + g * n;
      const cublasStatus_t s = cublasLtMatmul(
          be.cublaslt(), desc.get(), &alpha, wq + g * n * k, a.get(), xqp + g * m_pad * k, b.get(),
          &beta, dst, d.get(), dst, d.get(), &algo, be.cublas_workspace(), ws_bytes, be.stream());
      if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    return CUBLAS_STATUS_SUCCESS;
  };
  LtAlgo algo{tuned != nullptr ? tuned->algo : heuristics[0].algo};
  if (tune) {
    std::vector<LtAlgo> candidates;
    for (int i = 0; i < found; ++i) {
      candidates.push_back({heuristics[i].algo});
      int32_t own_splits = 1;
      lt_check(
          cublasLtMatmulAlgoConfigGetAttribute(&heuristics[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                               &own_splits, sizeof(own_splits), nullptr),
          "cublasLtMatmulAlgoConfigGetAttribute");
      if (own_splits > 1) continue;
      for (int32_t splits : lt_tune_split_counts(kb_count)) {
        cublasLtMatmulAlgo_t split = heuristics[i].algo;
        const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        cublasLtMatmulHeuristicResult_t check = {};
        if (cublasLtMatmulAlgoConfigSetAttribute(&split, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                 sizeof(splits)) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulAlgoConfigSetAttribute(&split, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                 &scheme,
                                                 sizeof(scheme)) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulAlgoCheck(be.cublaslt(), desc.get(), a.get(), b.get(), d.get(), d.get(),
                                    &split, &check) == CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= ws_bytes) {
          candidates.push_back({split});
        }
      }
    }
    algo = fastest_lt_algo(be, candidates, run_groups);
    be.keep_tuned_lt_algo(key, algo);
  }
  lt_check(run_groups(algo.algo), "cublasLtMatmul");
  be.set_last_cublaslt_algo(algo);
  return m_pad == m ? y : y.narrow(0, 0, m);
}

// The key of a weight's tensor map in the backend's table (CudaBackend::tensor_map_table): a tag
// apart from the routed experts' keys (3 entries), the weight's address and shape.
constexpr int64_t kWgmmaMapTag = -0x5747;  // "WG"

// The weight stream's tensor map of `w` (boxes of 64 rows x 128 bytes, 128-byte swizzle), built on
// upload (prepare_fp8_wgmma_map) or the weight's first use and kept by the backend; nullptr where
// the driver builds none, the weight is not 16-byte aligned (a view) or a graph capture meets it
// first, which then take the other paths.
const void* fp8_wgmma_weight_map(CudaBackend& be, const MatrixWeight& w) {
  if (reinterpret_cast<uintptr_t>(w.values.raw_data()) % 16 != 0) return nullptr;
  const std::vector<int64_t> key = {
      kWgmmaMapTag, static_cast<int64_t>(reinterpret_cast<uintptr_t>(w.values.raw_data())),
      w.rows(), w.cols()};
  if (be.capturing() && !be.has_tensor_map_table(key)) return nullptr;
  return be.tensor_map_table(key, [&] {
    const ByteMatrix m{w.values.raw_data(), static_cast<uint64_t>(w.rows()),
                       static_cast<uint64_t>(w.cols())};
    return encode_byte_matrix_maps({&m, 1}, kFp8WgmmaSliceK, kFp8WgmmaRows,
                                   TensorMapSwizzle::k128B);
  });
}

Fp8WgmmaWeight wgmma_weight(const MatrixWeight& w, const void* map, Tensor& y, int64_t n) {
  return Fp8WgmmaWeight{map, w.scales.data<float>(), w.scales.size(1), y.data<float>(), n};
}

// The weight stream's launch: on x itself where the kernel quantizes it (c.fused_quant), else
// after the activation quantization as its programmatic dependent: quantize_rows_e4m3 (mma.sync
// math; unpadded, xq [G][M][K] e4m3 and xs [G][ceil(K / 128)][M]) or quantize_rows_f16_tiles (f16
// math; tiles of c.tokens tokens), both into scratch. l.x_norm_weight: x's RowNorm, applied by
// whichever kernel quantizes x (x 16-byte aligned).
void run_fp8_wgmma(CudaBackend& be, const Tensor& x, const Fp8Problem& p, const Fp8WgmmaConfig& c,
                   Fp8WgmmaLaunch l) {
  if (c.fused_quant && reinterpret_cast<uintptr_t>(x.data<float>()) % 16 == 0) {
    l.x = x.data<float>();
    launch_fp8_wgmma(l, p, c, be.smem_limits(), be.pdl(), be.stream());
    DEEPINFER_CUDA_LAUNCH_CHECK("linear (fp8 wgmma)");
    be.set_last_fp8_linear_path(Fp8LinearPath::kWgmma);
    return;
  }
  const int64_t kb_count = (p.k + kLtGroup - 1) / kLtGroup;
  const bool f16 = c.math == Fp8WgmmaMath::kF16;
  const int64_t rows = f16 ? c.tokens : p.m;  // tokens per group and block
  Tensor xq = be.scratch(static_cast<size_t>(
      f16 ? p.groups * kb_count * fp8_wgmma_tile_bytes(c.tokens) : p.groups * p.m * p.k));
  Tensor xs = be.empty({p.groups * kb_count * rows}, DType::kF32);
  auto* xqp = static_cast<uint8_t*>(xq.raw_data());
  const dim3 grid(static_cast<unsigned>(ceil_div(rows * p.groups * kb_count, kQuantWarps)));
  if (f16) {
    launch_programmatic("linear (fp8 wgmma): activation quantization", grid, dim3(32 * kQuantWarps),
                        0, be.stream(), be.pdl(), quantize_rows_f16_tiles, x.data<float>(), xqp,
                        xs.data<float>(), p.m, c.tokens, p.k, p.groups, l.x_norm_weight,
                        l.x_norm_eps);
    l.xt = xqp;
  } else {
    launch_programmatic("linear (fp8 wgmma): activation quantization", grid, dim3(32 * kQuantWarps),
                        0, be.stream(), be.pdl(), quantize_rows_e4m3, x.data<float>(), xqp,
                        xs.data<float>(), p.m, p.m, p.k, p.groups, l.x_norm_weight, l.x_norm_eps);
    l.xq = xqp;
    l.m_pad = p.m;
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("linear (fp8 wgmma): activation quantization");
  l.xs = xs.data<float>();
  launch_fp8_wgmma(l, p, c, be.smem_limits(), be.pdl(), be.stream());
  DEEPINFER_CUDA_LAUNCH_CHECK("linear (fp8 wgmma)");
  be.set_last_fp8_linear_path(Fp8LinearPath::kWgmma);
}

}  // namespace

Tensor linear_fp8(CudaBackend& be, const char* op, const Tensor& x, const MatrixWeight& w,
                  int groups) {
  const Fp8Problem p{x.size(0),    w.rows() / groups, w.cols(),   groups,
                     w.block_rows, w.block_cols,      w.act_group};
  if (p.m == 0 || p.n == 0) return be.empty({p.m, groups * p.n}, DType::kF32);
  if (fp8_choice_tries_wgmma(be.fp8_linear(), p.m)) {
    const Fp8WgmmaConfig wgmma =
        choose_fp8_wgmma(p, be.num_sms(), be.wgmma_device(), be.fp8_wgmma_math());
    const void* map = wgmma.use ? fp8_wgmma_weight_map(be, w) : nullptr;
    if (map != nullptr) {
      Tensor y = be.empty({p.m, groups * p.n}, DType::kF32);
      Fp8WgmmaLaunch l;
      l.first = wgmma_weight(w, map, y, p.n);
      run_fp8_wgmma(be, x, p, wgmma, l);
      return y;
    }
  }
  const Fp8StreamConfig stream = choose_fp8_stream(p, be.num_sms());
  // Weights are whole allocations (aligned); a view that is not takes the other paths.
  const bool stream_ok = stream.use && reinterpret_cast<uintptr_t>(w.values.raw_data()) % 16 == 0;
  const auto run_stream = [&]() {
    Tensor xq = be.empty({static_cast<int64_t>(fp8_stream_scratch_elements(p))}, DType::kBF16);
    Tensor y = be.empty({p.m, groups * p.n}, DType::kF32);
    be.set_last_fp8_linear_path(Fp8LinearPath::kStream);
    launch_fp8_stream(
        x.data<float>(), xq.data<__nv_bfloat16>(), static_cast<const uint8_t*>(w.values.raw_data()),
        w.scales.data<float>(), w.scales.size(1), y.data<float>(), p, stream,
        be.fp8_linear() == Fp8LinearChoice::kStreamPdl, be.smem_limits(), be.stream());
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
    return y;
  };
  const bool stream_choice =
      be.fp8_linear() == Fp8LinearChoice::kStream || be.fp8_linear() == Fp8LinearChoice::kStreamPdl;
  if (stream_choice && stream_ok) return run_stream();
  const Fp8GemvConfig gemv = choose_fp8_gemv(p, be.num_sms());
  if (gemv.use) {
    Tensor y = be.empty({p.m, groups * p.n}, DType::kF32);
    be.set_last_fp8_linear_path(Fp8LinearPath::kGemv);
    launch_gemv_fp8(x.data<float>(), static_cast<const uint8_t*>(w.values.raw_data()),
                    w.scales.data<float>(), w.scales.size(1), y.data<float>(), p, gemv,
                    be.smem_limits(), be.pdl(), be.stream());
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
    return y;
  }
  if (stream_ok && fp8_grouped_takes_stream(p)) return run_stream();
  if (fp8_cublaslt_applies(p)) {
    Tensor lt = cublaslt_fp8(be, x, w, p);
    if (lt.defined()) {
      be.set_last_fp8_linear_path(Fp8LinearPath::kCublasLt);
      return lt;
    }
  }
  return Tensor();
}

void prepare_fp8_wgmma_map(CudaBackend& be, const MatrixWeight& w) {
  const bool pow2_rows = w.block_rows >= kFp8WgmmaRows && (w.block_rows & (w.block_rows - 1)) == 0;
  if (be.wgmma_device() && w.format == WeightFormat::kFp8Block && w.block_cols == kFp8WgmmaSliceK &&
      w.act_group == kFp8WgmmaSliceK && pow2_rows && w.cols() % 16 == 0 && w.rows() > 0) {
    fp8_wgmma_weight_map(be, w);
  }
}

bool linear_fp8_pair(CudaBackend& be, const Tensor& x, const MatrixWeight& a, const MatrixWeight* b,
                     const RowNorm& x_norm, Tensor& ya, Tensor& yb) {
  const float* norm_w = x_norm.weight.defined() ? x_norm.weight.data<float>() : nullptr;
  const bool same_blocks =
      b == nullptr || (b->format == WeightFormat::kFp8Block && a.block_rows == b->block_rows &&
                       a.block_cols == b->block_cols && a.act_group == b->act_group);
  if ((norm_w != nullptr && !aligned16(x.raw_data())) || a.format != WeightFormat::kFp8Block ||
      !same_blocks || be.fp8_linear() == Fp8LinearChoice::kStream ||
      be.fp8_linear() == Fp8LinearChoice::kStreamPdl) {
    return false;
  }
  const int64_t b_rows = b != nullptr ? b->rows() : 0;
  const Fp8Problem p{x.size(0),    a.rows() + b_rows, a.cols(),   1,
                     a.block_rows, a.block_cols,      a.act_group};
  if (fp8_choice_tries_wgmma(be.fp8_linear(), p.m) && p.m > 0) {
    const Fp8WgmmaConfig wgmma =
        choose_fp8_wgmma(p, be.num_sms(), be.wgmma_device(), be.fp8_wgmma_math());
    const void* map_a = wgmma.use ? fp8_wgmma_weight_map(be, a) : nullptr;
    const void* map_b = map_a != nullptr && b != nullptr ? fp8_wgmma_weight_map(be, *b) : nullptr;
    if (map_a != nullptr && (b == nullptr || map_b != nullptr)) {
      ya = be.empty({p.m, a.rows()}, DType::kF32);
      Fp8WgmmaLaunch l;
      l.first = wgmma_weight(a, map_a, ya, a.rows());
      if (b != nullptr) {
        yb = be.empty({p.m, b_rows}, DType::kF32);
        l.second = wgmma_weight(*b, map_b, yb, b_rows);
      }
      l.x_norm_weight = norm_w;
      l.x_norm_eps = x_norm.eps;
      run_fp8_wgmma(be, x, p, wgmma, l);
      return true;
    }
  }
  const Fp8GemvConfig gemv = choose_fp8_gemv(p, be.num_sms());
  if (!gemv.use || (b != nullptr && a.rows() % (16 * gemv.warps) != 0)) return false;
  ya = be.empty({p.m, a.rows()}, DType::kF32);
  be.set_last_fp8_linear_path(Fp8LinearPath::kGemv);
  Fp8GemvSecond second{};
  if (b != nullptr) {
    yb = be.empty({p.m, b_rows}, DType::kF32);
    second = Fp8GemvSecond{static_cast<const uint8_t*>(b->values.raw_data()),
                           b->scales.data<float>(), b->scales.size(1), yb.data<float>(), b_rows};
  }
  launch_gemv_fp8(x.data<float>(), static_cast<const uint8_t*>(a.values.raw_data()),
                  a.scales.data<float>(), a.scales.size(1), ya.data<float>(), p, gemv,
                  be.smem_limits(), be.pdl(), be.stream(), b != nullptr ? &second : nullptr, norm_w,
                  x_norm.eps);
  DEEPINFER_CUDA_LAUNCH_CHECK(b != nullptr ? "linear_pair (fp8 gemv)" : "linear (fp8 gemv)");
  return true;
}

Tensor dequantize_fp8(CudaBackend& be, const MatrixWeight& w, DType dtype) {
  const int64_t rows = w.rows(), cols = w.cols();
  Tensor out = be.empty({rows, cols}, dtype);
  if (rows * cols == 0) return out;
  const auto* values = static_cast<const uint8_t*>(w.values.raw_data());
  const unsigned blocks = elementwise_blocks(be.num_sms(), rows * cols);
  if (dtype == DType::kF32) {
    dequantize_e4m3<float><<<blocks, kElementwiseThreads, 0, be.stream()>>>(
        values, w.scales.data<float>(), out.data<float>(), rows, cols, w.scales.size(1),
        w.block_rows, w.block_cols);
  } else {
    dequantize_e4m3<__nv_bfloat16><<<blocks, kElementwiseThreads, 0, be.stream()>>>(
        values, w.scales.data<float>(), out.data<__nv_bfloat16>(), rows, cols, w.scales.size(1),
        w.block_rows, w.block_cols);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("linear (fp8): weight dequantization");
  return out;
}

}  // namespace deepinfer::cuda
