// The A/B switch between the decode paths of FP8 linears (gemm_fp8_heuristics.h), apart from the
// heuristics so that the backend's header (which holds the choice) does not pull them in.
#pragma once

#include <optional>
#include <string_view>

namespace deepinfer::cuda {

// Which FP8 path decode-sized linears take (an A/B switch for benchmarks and tests: the backend's
// DEEPINFER_FP8_LINEAR, read once at its creation; benchmarks may set it per call).
// The default is the GEMV and cuBLASLt: on the H200 the streaming kernel won only at 9..16 tokens
// (fp8_stream.cu's header has the table), and a per-M switch there would make a token's result
// depend on whether its batch has 8 or 9 rows. The Hopper weight stream (sm90/fp8_wgmma.cu)
// matches the CPU emulation as the GEMV does (its math is mma.sync since session 49) and is
// faster alone on the large weights at one token (wq_b 12.8 against 20.3 us on H100s). In the
// model step it was faster at B = 8 in both rounds of session 50 (2.2% and 8.0%) but not at B = 1
// or 64 (one round each way), and its RowNorm path has not run through the op table
// (benchmarks/RESULTS.md, sessions 47-50): opt-in until both do.
enum class Fp8LinearChoice {
  kLegacy,     // "legacy" or unset: the FP8 GEMV up to kFp8GemvMaxTokens, cuBLASLt above
               // (grouped linears: the streaming kernel up to kFp8StreamMaxTokens first)
  kStream,     // "stream": fp8_stream.cu up to kFp8StreamMaxTokens tokens
  kStreamPdl,  // "stream_pdl": the same, its kernel a programmatic dependent launch
  kWgmma,      // "wgmma": the Hopper weight stream where choose_fp8_wgmma applies, else as
               // kLegacy
};

// The path the latest FP8 linear took (CudaBackend::last_fp8_linear_path: benchmarks print it).
enum class Fp8LinearPath {
  kNone,      // no FP8 linear yet
  kStream,    // fp8_stream.cu
  kWgmma,     // sm90/fp8_wgmma.cu
  kGemv,      // gemv_fp8.cu
  kCublasLt,  // cuBLASLt's block-scaled FP8 GEMM
  kDequant,   // weights dequantized to bf16 (or f32) for the dense GEMM: cuBLASLt had no
              // algorithm, or the problem is outside fp8_cublaslt_applies
};

// The choice DEEPINFER_FP8_LINEAR names (nullptr: unset); nullopt for an unknown name.
inline std::optional<Fp8LinearChoice> parse_fp8_linear(const char* name) {
  const std::string_view v = name == nullptr ? "" : name;
  if (v.empty() || v == "legacy") return Fp8LinearChoice::kLegacy;
  if (v == "wgmma") return Fp8LinearChoice::kWgmma;
  if (v == "stream") return Fp8LinearChoice::kStream;
  if (v == "stream_pdl") return Fp8LinearChoice::kStreamPdl;
  return std::nullopt;
}

}  // namespace deepinfer::cuda
