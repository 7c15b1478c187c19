// The choices of the MoE ops, apart from their launches: which kernel computes the router
// logits, which one selects the experts, and which expert-GEMM shape a moe_experts pass runs.
// Host code on shapes, alignment and device limits only (never on the routing's contents).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

#include "cuda/moe/moe_config.h"
#include "cuda/moe/sm80/experts_mma_config.h"
#include "cuda/moe/sm80/experts_quant_config.h"

namespace deepinfer::cuda {

enum class RouterLogits {
  kGemvSmall,  // router_gemv_kernel, kRouteSmallE x kRouteSmallR tiles (T <= kRouteSmallTokens)
  kGemvWide,   // router_gemv_kernel, kRouteWideE x kRouteWideR tiles
  kSgemm,      // the backend's f32 linear (cuBLAS SGEMM), bf16 weights widened first
};

// H = 0 takes the GEMV, which writes zeros (cuBLAS rejects a zero leading dimension).
inline RouterLogits choose_router_logits(int64_t tokens, int64_t hidden) {
  if (tokens >= kRouteGemmTokens && hidden > 0) return RouterLogits::kSgemm;
  return tokens <= kRouteSmallTokens ? RouterLogits::kGemvSmall : RouterLogits::kGemvWide;
}

// route_select_warp_kernel holds a token's scores in registers; larger shapes take the generic
// route_select_kernel.
inline bool use_route_select_warp(int top_k, bool hashed, int64_t experts) {
  return top_k <= kSelectMaxK && (hashed || experts <= 32 * kSelectSlots);
}

enum class ExpertsKernel {
  kGemv,               // decode: experts_gemv.cu
  kMma64,              // prefill, bf16 weights: sm80/experts_mma.cu, 64-row tiles
  kMma128,             // the same, 128-row tiles
  kTiled,              // prefill otherwise: experts_tiled.cu (f32 FMA)
  kQuantStream,        // quantized weights, few pairs per expert: sm80/experts_quant_stream.cu
                       // (shared-memory weight ring), 16-row tiles
  kQuantStreamLean,    // its lean variant (the same bits in fewer instructions), for A/B runs
  kQuantDecode,        // the same shape on sm80/experts_quant.cu (register prefetch), for A/B runs
  kQuantPrefill,       // quantized weights otherwise: the same kernel, 64-row tiles
  kQuantPrefillWgmma,  // the same shape on Hopper's wgmma (sm90/experts_quant_wgmma.cu),
                       // 128-row tiles
};

// Name of a kernel choice, as the benchmarks print it.
inline const char* experts_kernel_name(ExpertsKernel k) {
  switch (k) {
    case ExpertsKernel::kGemv:
      return "gemv";
    case ExpertsKernel::kMma64:
      return "mma64";
    case ExpertsKernel::kMma128:
      return "mma128";
    case ExpertsKernel::kTiled:
      return "tiled";
    case ExpertsKernel::kQuantStream:
      return "streaming";
    case ExpertsKernel::kQuantStreamLean:
      return "streaming_lean";
    case ExpertsKernel::kQuantDecode:
      return "registers";
    case ExpertsKernel::kQuantPrefill:
      return "prefill";
    case ExpertsKernel::kQuantPrefillWgmma:
      return "prefill_wgmma";
  }
  return "?";
}

// Which kernel quantized experts take in the decode shape (an A/B switch for benchmarks and
// tests: the backend's DEEPINFER_MOE_QUANT_DECODE, read once at its creation).
// The default (auto) is the lean streaming kernel for MXFP4 and the streaming one for FP8: on the
// H200 the lean one (operands read a slice ahead, a loop for tiles of at most 8 rows) streamed
// the V4-Flash MXFP4 experts 1.08-1.13x faster at 1, 4 and 16 pairs per expert; on FP8 the two
// were within 3% either way (session 16, benchmarks/RESULTS.md).
enum class QuantDecodeChoice {
  kAuto,           // "auto" or unset: kStreamingLean for MXFP4, kStreaming for FP8
  kStreaming,      // "streaming": kQuantStream where the device has the shared memory
  kStreamingLean,  // "streaming_lean": kQuantStreamLean there (K whole slices; else kQuantStream)
  kRegisters,      // "registers": kQuantDecode
  kPrefill,        // "prefill": kQuantPrefill (64-row tiles) at every size
};

// The choice DEEPINFER_MOE_QUANT_DECODE names (nullptr: unset); nullopt for an unknown name.
inline std::optional<QuantDecodeChoice> parse_quant_decode(const char* name) {
  const std::string_view v = name == nullptr ? "" : name;
  if (v.empty() || v == "auto") return QuantDecodeChoice::kAuto;
  if (v == "streaming") return QuantDecodeChoice::kStreaming;
  if (v == "streaming_lean") return QuantDecodeChoice::kStreamingLean;
  if (v == "registers") return QuantDecodeChoice::kRegisters;
  if (v == "prefill") return QuantDecodeChoice::kPrefill;
  return std::nullopt;
}

// Which kernel quantized experts take in the prefill shape (an A/B switch for benchmarks and
// tests: the backend's DEEPINFER_MOE_QUANT_PREFILL, read once at its creation).
// The default is wgmma: on the H200 it ran the V4-Flash prefill passes 1.57x faster (239-243
// against 152-155 TFLOP/s at 4096-16384 tokens) with the same numerics (session 9,
// benchmarks/RESULTS.md).
enum class QuantPrefillChoice {
  kMmaSync,  // "mma_sync": kQuantPrefill
  kWgmma,    // "wgmma" or unset: kQuantPrefillWgmma where it runs (ExpertsPassProblem::quant_wgmma)
};

// The choice DEEPINFER_MOE_QUANT_PREFILL names (nullptr: unset); nullopt for an unknown name.
inline std::optional<QuantPrefillChoice> parse_quant_prefill(const char* name) {
  const std::string_view v = name == nullptr ? "" : name;
  if (v == "mma_sync") return QuantPrefillChoice::kMmaSync;
  if (v.empty() || v == "wgmma") return QuantPrefillChoice::kWgmma;
  return std::nullopt;
}

// Whether the wgmma prefill kernel runs a pass: a build with sm_90a code on an sm_90 device
// (`wgmma_device`), a ring of at least two slices for the format (16-byte weight loads per
// slice: MXFP4 1, FP8 2) and activation planes (1 quantized, 3 otherwise), and its shared memory
// on the device.
inline bool quant_wgmma_fits(bool wgmma_device, int weight_loads, int planes, size_t smem_max) {
  return wgmma_device && ExpertQuantWgmma::fits(planes, weight_loads) &&
         ExpertQuantWgmma::smem_bytes(planes, weight_loads) + 1024 <= smem_max;
}

struct ExpertsPassConfig {
  ExpertsKernel kernel;
  int tile_rows;      // rows of a tile of the tile list
  int64_t max_tiles;  // host bound on the tile count: sizes the tile list and the grids
};

struct ExpertsPassProblem {
  int64_t pairs;  // tokens of the pass x top_k
  int experts;
  int64_t hidden;
  int64_t inter;
  bool bf16_weights;
  bool vec;                // 16-byte aligned rows: H % 8 == 0, I % 8 == 0, aligned bases
  bool quantized = false;  // MXFP4 or FP8 weights: sm80/experts_quant*.cu in either shape
  bool mxfp4 = false;      // quantized as MXFP4 (else FP8): what kAuto decides by
  QuantDecodeChoice quant_decode = QuantDecodeChoice::kAuto;
  QuantPrefillChoice quant_prefill = QuantPrefillChoice::kWgmma;
  bool quant_wgmma = false;  // quant_wgmma_fits for this pass (both GEMMs)
  int64_t tokens = 0;        // tokens of the pass (top-k: the most pairs an expert gets)
  bool one_plane = false;    // both GEMMs' activations quantized: one staged bf16 plane each
};

inline ExpertsPassConfig choose_experts_pass(const ExpertsPassProblem& p, size_t smem_max) {
  const int64_t pairs = p.pairs;
  const int experts = p.experts;
  if (p.quantized) {
    // 16-row tiles while experts average at most kExpertQuantDecodeMaxPairs pairs, rounded down
    // (each touched expert's weights then stream about once), 64-row tiles above. Rounded down:
    // `pairs` counts every slot of the pass's tokens, and ceil(16 E / top_k) tokens, the smallest
    // count that gives every expert 16 pairs, carry up to top_k - 1 slots more. The decode shape
    // streams the weights through a shared-memory ring where the device has the shared memory.
    const bool decode = p.quant_decode != QuantDecodeChoice::kPrefill &&
                        pairs / std::max(experts, 1) <= kExpertQuantDecodeMaxPairs;
    const bool lean = p.quant_decode == QuantDecodeChoice::kStreamingLean ||
                      (p.quant_decode == QuantDecodeChoice::kAuto && p.mxfp4);
    const bool stream = (p.quant_decode == QuantDecodeChoice::kStreaming ||
                         p.quant_decode == QuantDecodeChoice::kAuto || lean) &&
                        smem_max >= kExpertQuantStreamMaxSmem;
    // The prefill shape on wgmma where asked for and where it runs (128-row tiles).
    const bool wgmma = !decode && p.quant_prefill == QuantPrefillChoice::kWgmma && p.quant_wgmma;
    ExpertsPassConfig c{};
    c.kernel = wgmma     ? ExpertsKernel::kQuantPrefillWgmma
               : !decode ? ExpertsKernel::kQuantPrefill
               : stream  ? (lean ? ExpertsKernel::kQuantStreamLean : ExpertsKernel::kQuantStream)
                         : ExpertsKernel::kQuantDecode;
    // Lean MXFP4 passes of a few tokens: 8-row tiles, which run on the narrow streaming shape.
    const bool narrow = c.kernel == ExpertsKernel::kQuantStreamLean && p.mxfp4 &&
                        expert_stream_narrow_tiles(p.tokens, p.one_plane, p.hidden, p.inter);
    c.tile_rows = narrow   ? ExpertQuantStreamMxNarrow::kTok
                  : decode ? ExpertQuantDecode::kTok
                  : wgmma  ? ExpertQuantWgmma::kTok
                           : ExpertQuantPrefill::kTok;
    c.max_tiles = (pairs + c.tile_rows - 1) / c.tile_rows + std::min<int64_t>(experts, pairs);
    return c;
  }
  // Decode shape while experts average at most kExpertGemvRows pairs (and the rows allow 16-byte
  // loads); the tiled kernel otherwise.
  const bool gemv = p.vec && pairs <= static_cast<int64_t>(kExpertGemvRows) * experts;
  // Tensor cores for bf16 weights in the prefill shape, when the rows allow 16-byte copies, the
  // device has the shared memory and the 1-D grid fits; 128-row tiles when experts average more
  // than kExpertMmaWideMinPairs pairs.
  auto mma_fits = [&](int rows, int weight_rows, size_t smem) {
    const int64_t tiles = (pairs + rows - 1) / rows + std::min<int64_t>(experts, pairs);
    const int64_t cols = std::max<int64_t>((p.inter + weight_rows / 2 - 1) / (weight_rows / 2),
                                           (p.hidden + weight_rows - 1) / weight_rows);
    return smem <= smem_max && tiles * cols <= std::numeric_limits<int32_t>::max();
  };
  using Wide = ExpertMmaTile<128>;
  using Narrow = ExpertMmaTile<64>;
  const bool mma_shape = p.bf16_weights && !gemv && p.vec;
  const bool wide = mma_shape && pairs > kExpertMmaWideMinPairs * experts &&
                    mma_fits(Wide::kM, Wide::kN, Wide::kSmemBytes);
  const bool mma = wide || (mma_shape && mma_fits(Narrow::kM, Narrow::kN, Narrow::kSmemBytes));
  ExpertsPassConfig c{};
  c.kernel = gemv   ? ExpertsKernel::kGemv
             : wide ? ExpertsKernel::kMma128
             : mma  ? ExpertsKernel::kMma64
                    : ExpertsKernel::kTiled;
  c.tile_rows = gemv ? kExpertGemvRows : wide ? Wide::kM : kTileM;
  // sum_e ceil(c_e / rows) <= ceil(P / rows) + (experts with a pair).
  c.max_tiles = (pairs + c.tile_rows - 1) / c.tile_rows + std::min<int64_t>(experts, pairs);
  return c;
}

}  // namespace deepinfer::cuda
