// moe_experts of the CUDA backend (docs/model.md#mixture-of-experts), matching the CPU reference
// op (cpp/src/backend/cpu_ops_moe.cpp) on the same inputs. All on the device and in stream order
// (no host sync, no host-side routing), in passes of at most kMaxPassTokens tokens:
//  1. experts_group.cu (one CTA): the (token, slot) pairs are counted per expert, the counts
//     exclusive-scanned into row offsets, the pairs scattered into expert order, and the list of
//     row tiles (expert, first sorted row, rows) the GEMMs run over is written with its length.
//  2. gate/up GEMM + SwiGLU over the tile list -> act [pairs, I], rows in expert order.
//  3. down GEMM over the tile list -> y [pairs, H], rows in (token, slot) order.
//  4. experts_combine.cu: out[t] = sum_j weight[t, j] * y[t, j], summed in slot order j.
// The GEMM grids are sized from a host bound on the tile count (ceil(P / rows) + min(E, P));
// CTAs past the count the device wrote exit at once. Each output element depends only on its own
// row and weight column, reduced over K in a fixed order whatever else shares its tile, and step
// 4 sums in slot order: the result is deterministic even though the scatter of step 1 (shared
// atomics) puts the pairs of one expert in run-dependent order.
//
// The GEMM shapes, chosen per pass by moe_heuristics.h (each with its own tile size in the tile
// list): decode (experts_gemv.cu), prefill with bf16 weights on tensor cores
// (sm80/experts_mma.cu, 64- or 128-row tiles), prefill otherwise (experts_tiled.cu). Quantized
// experts (MXFP4, block-scaled FP8) stay in their shipped bytes and take sm80/experts_quant.cu
// (16-row tiles up to 16 pairs per expert on average, their weights streamed through shared
// memory by sm80/experts_quant_stream.cu; 64-row tiles above), with
// the weights' activation quantization (act_group) of x before gate/up and of the SwiGLU output
// before down, as the CPU op. Dense weights with an act_group (quantized checkpoints a backend
// dequantized) quantize x and act likewise and take the f32-activation kernels.
//
// Robustness where the CPU op throws (a device op cannot): a routing.expert_ids entry outside
// [0, E) is dropped (that slot contributes nothing to its token).
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/tensor_map.h"
#include "cuda/moe/moe_heuristics.h"
#include "cuda/moe/moe_launch.h"
#include "cuda/quant/quant_launch.h"

namespace deepinfer::cuda {

namespace {

// One pass of moe_experts over `tokens` rows (<= kMaxPassTokens).
template <typename W>
void run_experts_pass(CudaBackend& be, const float* x, const int32_t* ids, const float* weights,
                      int64_t tokens, int top_k, int64_t hidden, int64_t inter, int experts,
                      const W* const* w1s, const W* const* w3s, const W* const* w2s, bool vec,
                      float limit, int in_group, int down_group, float* out) {
  cudaStream_t stream = be.stream();
  const int64_t pairs = tokens * top_k;
  // With activation quantization (weights dequantized at upload), x is quantized first and act
  // in f32 between the GEMMs, so the f32-activation kernels (not the bf16 tensor cores) run.
  const bool quant_act = in_group > 0 || down_group > 0;
  const ExpertsPassConfig c = choose_experts_pass(
      {pairs, experts, hidden, inter, std::is_same_v<W, __nv_bfloat16> && !quant_act, vec},
      be.max_shared_memory_per_block());
  Tensor xq;
  if (in_group > 0) {
    xq = be.empty({tokens, hidden}, DType::kF32);
    launch_quantize_activations(x, xq.data<float>(), tokens, hidden, in_group, be.pdl(), stream);
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
    x = xq.data<float>();
  }
  const bool mma = c.kernel == ExpertsKernel::kMma64 || c.kernel == ExpertsKernel::kMma128;

  Tensor sorted = be.empty({pairs}, DType::kI32);
  Tensor tile_meta = be.empty({3 * c.max_tiles + 1}, DType::kI32);
  Tensor act = be.empty({pairs, inter}, mma ? DType::kBF16 : DType::kF32);
  Tensor y = be.empty({pairs, hidden}, DType::kF32);
  int32_t* meta = tile_meta.data<int32_t>();
  ExpertsPassArgs<W> p{};
  p.x = x;
  p.hidden = hidden;
  p.inter = inter;
  p.top_k = top_k;
  p.sorted_pair = sorted.data<int32_t>();
  p.tiles = {meta, meta + c.max_tiles, meta + 2 * c.max_tiles, meta + 3 * c.max_tiles};
  p.max_tiles = c.max_tiles;
  p.w1s = w1s;
  p.w3s = w3s;
  p.w2s = w2s;
  p.limit = limit;
  p.down_group = down_group;
  p.pairs = pairs;

  launch_group_pairs(ids, pairs, experts, c.tile_rows, c.max_tiles, sorted.data<int32_t>(), meta,
                     be.pdl(), stream);
  if (c.kernel == ExpertsKernel::kGemv) {
    launch_experts_gemv<W>(p, act.data<float>(), y.data<float>(), be.pdl(), stream);
  } else if (c.kernel == ExpertsKernel::kTiled) {
    launch_experts_tiled<W>(p, act.data<float>(), y.data<float>(), be.pdl(), stream);
  } else if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    Tensor xb = be.empty({tokens, hidden}, DType::kBF16);
    launch_experts_mma(p, c.kernel, tokens, static_cast<__nv_bfloat16*>(xb.raw_data()),
                       static_cast<__nv_bfloat16*>(act.raw_data()), y.data<float>(), stream);
  }
  launch_experts_combine(y.data<float>(), ids, weights, tokens, top_k, hidden, experts, out,
                         be.pdl(), stream);
}

// Activation planes of staged rows: 1 after activation quantization (group > 0), else 3.
int in_planes_of(int group) {
  return group > 0 ? 1 : 3;
}

// One pass of moe_experts on quantized weights (sm80/experts_quant.cu, or on sm_90 unless
// DEEPINFER_MOE_QUANT_PREFILL=mma_sync, sm90/experts_quant_wgmma.cu in the prefill shape).
void run_quant_experts_pass(CudaBackend& be, QuantExpertsArgs p, const float* x, const int32_t* ids,
                            const float* weights, int64_t tokens, int experts, float* out) {
  cudaStream_t stream = be.stream();
  const int64_t pairs = tokens * p.top_k;
  ExpertsPassProblem prob{pairs, experts, p.hidden, p.inter, false, true};
  prob.quantized = true;
  prob.mxfp4 = p.format == QuantFormat::kMxfp4;
  prob.quant_decode = be.moe_quant_decode();
  prob.quant_prefill = be.moe_quant_prefill();
  prob.tokens = tokens;
  prob.one_plane = p.in_group > 0 && p.down_group > 0;
  prob.quant_wgmma =
      quant_wgmma_fits(be.wgmma_device(), p.format == QuantFormat::kMxfp4 ? 1 : 2,
                       std::max(in_planes_of(p.in_group), in_planes_of(p.down_group)),
                       be.max_shared_memory_per_block());
  const ExpertsPassConfig c = choose_experts_pass(prob, be.max_shared_memory_per_block());
  be.set_last_quant_experts_kernel(c.kernel);
  Tensor sorted = be.empty({pairs}, DType::kI32);
  Tensor tile_meta = be.empty({3 * c.max_tiles + 1}, DType::kI32);
  const int in_planes = p.in_group > 0 ? 1 : 3;
  const int down_planes = p.down_group > 0 ? 1 : 3;
  Tensor xq = p.in_group > 0 ? be.empty({tokens, p.hidden}, DType::kF32) : Tensor();
  Tensor xs = be.empty({quant_staged_elems(tokens, p.hidden, in_planes)}, DType::kBF16);
  Tensor act = be.empty({pairs, p.inter}, DType::kF32);
  Tensor as = be.empty({quant_staged_elems(pairs, p.inter, down_planes)}, DType::kBF16);
  Tensor y = be.empty({pairs, p.hidden}, DType::kF32);
  int32_t* meta = tile_meta.data<int32_t>();
  p.sorted_pair = sorted.data<int32_t>();
  p.tiles = {meta, meta + c.max_tiles, meta + 2 * c.max_tiles, meta + 3 * c.max_tiles};
  p.max_tiles = c.max_tiles;
  p.tile_rows = c.tile_rows;
  p.num_sms = be.num_sms();
  launch_group_pairs(ids, pairs, experts, c.tile_rows, c.max_tiles, sorted.data<int32_t>(), meta,
                     be.pdl(), stream);
  launch_experts_quant(p, c.kernel, x, tokens, xq.defined() ? xq.data<float>() : nullptr,
                       static_cast<__nv_bfloat16*>(xs.raw_data()), act.data<float>(),
                       static_cast<__nv_bfloat16*>(as.raw_data()), y.data<float>(), be.pdl(),
                       stream);
  launch_experts_combine(y.data<float>(), ids, weights, tokens, p.top_k, p.hidden, experts, out,
                         be.pdl(), stream);
}

// The tensor maps of the MXFP4 experts' values [w1 | w3 | w2] (boxes of kExpertTensorBoxRows rows
// x one slice's bytes) by which the lean kernel copies them, built on the first use of the weight
// table `table` (pointer_table's) and kept by the backend; nullptr where K is not whole slices in
// both GEMMs (the lean kernel's) or the driver builds none.
const void* expert_value_maps(CudaBackend& be, const ExpertWeights& experts, const void* table,
                              int64_t hidden, int64_t inter) {
  if (hidden % kQuantSliceK != 0 || inter % kQuantSliceK != 0) return nullptr;
  const std::vector<int64_t> key = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(table)),
                                    hidden, inter};
  return be.tensor_map_table(key, [&] {
    std::vector<ByteMatrix> matrices;
    matrices.reserve(3 * experts.w1.size());
    for (const auto* mats : {&experts.w1, &experts.w3}) {
      for (const MatrixWeight& w : *mats) {
        matrices.push_back(
            {w.values.raw_data(), static_cast<uint64_t>(inter), static_cast<uint64_t>(hidden / 2)});
      }
    }
    for (const MatrixWeight& w : experts.w2) {
      matrices.push_back(
          {w.values.raw_data(), static_cast<uint64_t>(hidden), static_cast<uint64_t>(inter / 2)});
    }
    return encode_byte_matrix_maps(matrices, kQuantSliceK / 2, kExpertTensorBoxRows);
  });
}

// The quantized experts' operands, checked for what the kernels need beyond the front's checks.
QuantExpertsArgs quant_experts_args(CudaBackend& be, const char* op, const ExpertWeights& experts,
                                    int64_t hidden, int64_t inter, int top_k, float limit) {
  const MatrixWeight& first = experts.w1[0];
  QuantExpertsArgs p{};
  p.format = first.format == WeightFormat::kMxfp4 ? QuantFormat::kMxfp4 : QuantFormat::kFp8;
  p.hidden = hidden;
  p.inter = inter;
  p.top_k = top_k;
  p.in_group = first.act_group;
  p.down_group = experts.w2[0].act_group;
  p.limit = limit;
  if (p.format == QuantFormat::kFp8) {
    const int bc = first.block_cols;
    if (bc < 16 || (bc & (bc - 1)) != 0 || hidden % 16 != 0 || inter % 16 != 0) {
      fail(op, "fp8 experts need block_cols a power of two >= 16 and H, I multiples of 16, got " +
                   first.describe() + " with H " + std::to_string(hidden) + ", I " +
                   std::to_string(inter));
    }
    p.block_rows = first.block_rows;
    p.block_cols_log2 = __builtin_ctz(static_cast<unsigned>(bc));
  }
  // Per-expert pointer table [w1 | w3 | w2 values | w1 | w3 | w2 scales]: cached by the backend.
  const size_t num = experts.w1.size();
  std::vector<int64_t> ptrs(6 * num);
  for (size_t e = 0; e < num; ++e) {
    const MatrixWeight* mats[3] = {&experts.w1[e], &experts.w3[e], &experts.w2[e]};
    for (size_t m = 0; m < 3; ++m) {
      const void* v = mats[m]->values.raw_data();
      if (!aligned16(v)) fail(op, "quantized expert weights need 16-byte aligned values");
      ptrs[m * num + e] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(v));
      ptrs[(3 + m) * num + e] =
          static_cast<int64_t>(reinterpret_cast<uintptr_t>(mats[m]->scales.raw_data()));
    }
  }
  const auto* base = static_cast<const void* const*>(be.pointer_table(ptrs).raw_data());
  const auto* values = reinterpret_cast<const uint8_t* const*>(base);
  p.w1 = {values, base + 3 * num};
  p.w3 = {values + num, base + 4 * num};
  p.w2 = {values + 2 * num, base + 5 * num};
  if (p.format == QuantFormat::kMxfp4) {
    const auto* maps =
        static_cast<const uint8_t*>(expert_value_maps(be, experts, base, hidden, inter));
    if (maps != nullptr) {
      const size_t matrix = num * sizeof(CUtensorMap);
      p.w1.maps = maps;
      p.w3.maps = maps + matrix;
      p.w2.maps = maps + 2 * matrix;
    }
  }
  return p;
}

}  // namespace

Tensor CudaBackend::moe_experts_impl(const Tensor& x, const Routing& routing,
                                     const ExpertWeights& experts, float swiglu_limit) {
  const char* op = "moe_experts";
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t k = routing.expert_ids.size(1);
  const size_t num = experts.w1.size();
  if (num > static_cast<size_t>(kMaxExperts)) {  // group_pairs keeps two ints per expert in smem
    fail(op, "at most " + std::to_string(kMaxExperts) + " experts, got " + std::to_string(num));
  }
  const DType wdtype = experts.w1[0].values.dtype();
  const int64_t inter = experts.w1[0].rows();
  const int num_experts = static_cast<int>(num);
  const int in_group = experts.w1[0].act_group;
  const int down_group = experts.w2[0].act_group;
  if (experts.w1[0].quantized()) {
    const QuantExpertsArgs p =
        quant_experts_args(*this, op, experts, hidden, inter, static_cast<int>(k), swiglu_limit);
    Tensor out = empty({tokens, hidden}, DType::kF32);
    if (tokens == 0 || hidden == 0) return out;
    if (k == 0 || inter == 0) {
      DEEPINFER_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), stream()));
      return out;
    }
    for (int64_t t0 = 0; t0 < tokens; t0 += kMaxPassTokens) {
      const int64_t n = std::min(kMaxPassTokens, tokens - t0);
      run_quant_experts_pass(
          *this, p, x.data<float>() + t0 * hidden, routing.expert_ids.data<int32_t>() + t0 * k,
          routing.weights.data<float>() + t0 * k, n, num_experts, out.data<float>() + t0 * hidden);
    }
    return out;
  }

  // Per-expert pointer table [w1 | w3 | w2]: uploaded on first use, then cached by the backend.
  std::vector<int64_t> ptrs(3 * num);
  bool vec = aligned16(x.raw_data()) && hidden % 8 == 0 && inter % 8 == 0;
  for (size_t e = 0; e < num; ++e) {
    const Tensor* mats[3] = {&experts.w1[e].values, &experts.w3[e].values, &experts.w2[e].values};
    for (int m = 0; m < 3; ++m) {
      const void* p = mats[m]->raw_data();
      vec = vec && aligned16(p);
      ptrs[static_cast<size_t>(m) * num + e] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p));
    }
  }
  Tensor out = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0 || hidden == 0) return out;
  if (k == 0 || inter == 0) {
    DEEPINFER_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), stream()));
    return out;
  }
  const Tensor& dev_table = pointer_table(ptrs);
  const void* const* base = static_cast<const void* const*>(dev_table.raw_data());
  for (int64_t t0 = 0; t0 < tokens; t0 += kMaxPassTokens) {
    const int64_t n = std::min(kMaxPassTokens, tokens - t0);
    const float* xp = x.data<float>() + t0 * hidden;
    const int32_t* ids = routing.expert_ids.data<int32_t>() + t0 * k;
    const float* wts = routing.weights.data<float>() + t0 * k;
    float* dst = out.data<float>() + t0 * hidden;
    if (wdtype == DType::kBF16) {
      using W = __nv_bfloat16;
      const W* const* tab = reinterpret_cast<const W* const*>(base);
      run_experts_pass<W>(*this, xp, ids, wts, n, static_cast<int>(k), hidden, inter, num_experts,
                          tab, tab + num, tab + 2 * num, vec, swiglu_limit, in_group, down_group,
                          dst);
    } else {
      const float* const* tab = reinterpret_cast<const float* const*>(base);
      run_experts_pass<float>(*this, xp, ids, wts, n, static_cast<int>(k), hidden, inter,
                              num_experts, tab, tab + num, tab + 2 * num, vec, swiglu_limit,
                              in_group, down_group, dst);
    }
  }
  return out;
}

}  // namespace deepinfer::cuda
