// The A/B switch between the decode paths of FP8 linears (gemm_fp8_heuristics.h), apart from the
// heuristics so that the backend's header (which holds the choice) does not pull them in.
#pragma once

#include <optional>
#include <string_view>

namespace deepinfer::cuda {

// Which FP8 path decode-sized linears take (an A/B switch for benchmarks and tests: the backend's
// DEEPINFER_FP8_LINEAR, read once at its creation; benchmarks may set it per call).
enum class Fp8LinearChoice {
  kAuto,       // "auto" or unset: fp8_stream.cu where it measured faster (fp8_stream_wins)
  kStream,     // "stream": fp8_stream.cu up to kFp8StreamMaxTokens tokens
  kStreamPdl,  // "stream_pdl": the same, its kernel a programmatic dependent launch
  kLegacy,     // "legacy": the FP8 GEMV up to kFp8GemvMaxTokens, cuBLASLt above
};

// The choice DEEPINFER_FP8_LINEAR names (nullptr: unset); nullopt for an unknown name.
inline std::optional<Fp8LinearChoice> parse_fp8_linear(const char* name) {
  const std::string_view v = name == nullptr ? "" : name;
  if (v.empty() || v == "auto") return Fp8LinearChoice::kAuto;
  if (v == "stream") return Fp8LinearChoice::kStream;
  if (v == "stream_pdl") return Fp8LinearChoice::kStreamPdl;
  if (v == "legacy") return Fp8LinearChoice::kLegacy;
  return std::nullopt;
}

}  // namespace deepinfer::cuda
