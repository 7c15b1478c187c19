// The A/B switch between the decode paths of FP8 linears (gemm_fp8_heuristics.h), apart from the
// heuristics so that the backend's header (which holds the choice) does not pull them in.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace deepinfer::cuda {

// Which FP8 path decode-sized linears take (the backend's DEEPINFER_FP8_LINEAR, read once at its
// creation; benchmarks and tests may set it per call).
// The default (kAuto) takes the Hopper weight stream (sm90/fp8_wgmma.cu) from
// kFp8WgmmaAutoMinTokens tokens where choose_fp8_wgmma applies, the legacy paths elsewhere. On an
// H100 the model step was faster on the stream at B = 4, 8 and 16 in every round (session
// 51: 2.9-3.6%, 3.6-6.5% and 10.9-11.5%; B = 8 also in both rounds of session 50), and no faster at
// B = 1 or 2 (rounds went either way by up to 5%; benchmarks/RESULTS.md, sessions 47-51); on an
// H200 6.1-6.4%, 7.2-7.5%, 13.0-13.2% and at B = 64 1.7-3.1% (session 52). Both
// paths sum the same exact products in f32 (the stream's maths are exact: Fp8WgmmaMath), so a
// token's result moves by summation order where its batch crosses the threshold, as it does between
// the GEMV and cuBLASLt at kFp8GemvMaxTokens.
enum class Fp8LinearChoice {
  kAuto,       // "auto" or unset: kWgmma from kFp8WgmmaAutoMinTokens tokens, else kLegacy
  kLegacy,     // "legacy": the FP8 GEMV up to kFp8GemvMaxTokens, cuBLASLt above (grouped
               // linears: the streaming kernel up to kFp8StreamMaxTokens first)
  kStream,     // "stream": fp8_stream.cu up to kFp8StreamMaxTokens tokens
  kStreamPdl,  // "stream_pdl": the same, its kernel a programmatic dependent launch
  kWgmma,      // "wgmma": the Hopper weight stream where choose_fp8_wgmma applies, else as
               // kLegacy
};

// kAuto's threshold (above).
constexpr int64_t kFp8WgmmaAutoMinTokens = 4;

// Whether a linear of m tokens tries the weight stream under `choice`.
constexpr bool fp8_choice_tries_wgmma(Fp8LinearChoice choice, int64_t m) {
  return choice == Fp8LinearChoice::kWgmma ||
         (choice == Fp8LinearChoice::kAuto && m >= kFp8WgmmaAutoMinTokens);
}

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

// The weight stream's math (DEEPINFER_FP8_WGMMA_MATH), both exact products summed in f32:
enum class Fp8WgmmaMath {
  kAuto,     // "auto" or unset: kF16 past kFp8WgmmaMaxTokens tokens on grouped linears and on
             // linears of at most kFp8WgmmaF16AutoMaxRows rows (choose_fp8_wgmma), else kMmaSync
  kMmaSync,  // "mma_sync": mma.sync m16n8k32 e4m3 (on sm_90 ptxas makes each two f16 HMMAs after
             // converting both operands), the activations e4m3 in shared memory
  kF16,      // "f16": wgmma m64nNk16 f16, the weights decoded to f16 in registers, the activations
             // f16 tiles in shared memory (fp8_wgmma_layout.h), streamed through the ring
};

// The math DEEPINFER_FP8_WGMMA_MATH names (nullptr or empty: kAuto); nullopt for an unknown name.
inline std::optional<Fp8WgmmaMath> parse_fp8_wgmma_math(const char* name) {
  const std::string_view v = name == nullptr ? "" : name;
  if (v.empty() || v == "auto") return Fp8WgmmaMath::kAuto;
  if (v == "mma_sync") return Fp8WgmmaMath::kMmaSync;
  if (v == "f16") return Fp8WgmmaMath::kF16;
  return std::nullopt;
}

// cuBLASLt's algorithm for a block-scaled FP8 GEMM (DEEPINFER_FP8_CUBLASLT_TUNE, on by default):
// at decode and verify widths (M padded to kLtRowPad, at most kLtTuneMaxRows) the shape's first
// call outside a graph capture times the heuristic's first kLtTuneHeuristics picks and their K
// splits (lt_tune_split_counts) and the backend keeps the fastest for the shape; wider problems,
// captures of an untimed shape and "off" take the heuristic's first pick. At 32-64 rows the
// heuristic's pick (one K split) streamed the K = 4096 weights at 0.04-0.17 of copy bandwidth
// (session 56's op rows: shared w13 2048 x 4096 17.1 us at 64 rows, 5.5 us of bytes; timed: 11.1
// us with 4 K splits). Decode widths are few (one per batch size, each recorded in a graph once),
// so each is timed once; prefill chunks have any length. Calls on the side branch (the shared
// expert, beside the routed experts) keep the heuristic's pick: with the timed K splits there the
// B = 64 step was 1.2% slower, the split GEMMs taking SMs from the routed experts. So the step at
// B <= 64 is unchanged (its main-stream cuBLASLt calls keep the heuristic's pick when timed); at
// B = 128 and 256, where wq_a and wkv take cuBLASLt, it is 2.1-2.5% and 1.3-1.9% faster (session
// 56, an H100).
constexpr int64_t kLtTuneMaxRows = 256;
constexpr int kLtTuneHeuristics = 8;

// The K splits timed beside an algorithm of one split, for K of k_blocks 128-column blocks: each
// split keeps at least two blocks.
inline std::vector<int32_t> lt_tune_split_counts(int64_t k_blocks) {
  std::vector<int32_t> splits;
  for (int32_t s : {2, 4, 8, 16}) {
    if (k_blocks >= 2 * int64_t{s}) splits.push_back(s);
  }
  return splits;
}

// The choice DEEPINFER_FP8_LINEAR names (nullptr: unset); nullopt for an unknown name.
inline std::optional<Fp8LinearChoice> parse_fp8_linear(const char* name) {
  const std::string_view v = name == nullptr ? "" : name;
  if (v.empty() || v == "auto") return Fp8LinearChoice::kAuto;
  if (v == "legacy") return Fp8LinearChoice::kLegacy;
  if (v == "wgmma") return Fp8LinearChoice::kWgmma;
  if (v == "stream") return Fp8LinearChoice::kStream;
  if (v == "stream_pdl") return Fp8LinearChoice::kStreamPdl;
  return std::nullopt;
}

}  // namespace deepinfer::cuda
