// Reading the CUDA backend's A/B switches (backend_switches.h). Host code only.
#include <cstdlib>
#include <optional>
#include <string>

#include "cuda/backend/backend_switches.h"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

namespace {

// The environment variable `name` through `parse` (unset: parse(nullptr), the default).
template <typename T>
T read_switch(const char* name, std::optional<T> (*parse)(const char*), const char* expected) {
  const char* value = std::getenv(name);
  const std::optional<T> choice = parse(value);
  if (!choice) {
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + ": expected " + expected +
                                                 ", got '" + (value ? value : "") + "'");
  }
  return *choice;
}

std::optional<HcPreChoice> parse_hc_pre(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "auto") return HcPreChoice::kAuto;
  if (v == "fused") return HcPreChoice::kFused;
  if (v == "split") return HcPreChoice::kSplit;
  if (v == "legacy") return HcPreChoice::kLegacy;
  return std::nullopt;
}

std::optional<HcClusterChoice> parse_hc_cluster(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "auto") return HcClusterChoice::kAuto;
  if (v == "widest") return HcClusterChoice::kWidest;
  if (v == "portable") return HcClusterChoice::kPortable;
  return std::nullopt;
}

// "on" (the default when unset or empty) or "off".
std::optional<bool> parse_on_off(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "on") return true;
  if (v == "off") return false;
  return std::nullopt;
}

}  // namespace

BackendSwitches read_backend_switches() {
  BackendSwitches s;
  s.moe_quant_decode = read_switch("DEEPINFER_MOE_QUANT_DECODE", parse_quant_decode,
                                   "auto, streaming, streaming_lean, registers or prefill");
  s.moe_quant_prefill =
      read_switch("DEEPINFER_MOE_QUANT_PREFILL", parse_quant_prefill, "wgmma or mma_sync");
  s.fp8_linear = read_switch("DEEPINFER_FP8_LINEAR", parse_fp8_linear,
                             "auto, legacy, stream, stream_pdl or wgmma");
  s.fp8_wgmma_math =
      read_switch("DEEPINFER_FP8_WGMMA_MATH", parse_fp8_wgmma_math, "auto, mma_sync or f16");
  s.cublaslt_tune = read_switch("DEEPINFER_FP8_CUBLASLT_TUNE", parse_on_off, "on or off");
  s.hc_pre = read_switch("DEEPINFER_HC_PRE", parse_hc_pre, "auto, fused, split or legacy");
  s.hc_cluster = read_switch("DEEPINFER_HC_CLUSTER", parse_hc_cluster, "auto, widest or portable");
  s.pdl = read_switch("DEEPINFER_PDL", parse_on_off, "on or off");
  s.branches = read_switch("DEEPINFER_BRANCHES", parse_on_off, "on or off");
  s.indexer_fp8_scores =
      read_switch("DEEPINFER_INDEXER_FP8_SCORES", parse_indexer_fp8_scores,
                  "wgmma_pipelined, wgmma, mma_sync, wgmma_persistent, wgmma_persistent_cvt or "
                  "wgmma_persistent_fp8");
  // The attention's parsers name the variable themselves (three variables make one choice).
  std::string bad;
  const std::optional<AttentionMmaChoice> mma = parse_attention_mma_choice(
      std::getenv("DEEPINFER_ATTENTION_COMBINE"), std::getenv("DEEPINFER_ATTENTION_ROWS"),
      std::getenv("DEEPINFER_ATTENTION_SPLITS"), &bad);
  if (!mma) throw Error(ErrorCode::kInvalidArgument, bad);
  s.attention_mma = *mma;
  const std::optional<AttentionKernelChoice> kernel =
      parse_attention_kernel(std::getenv("DEEPINFER_ATTENTION_KERNEL"), &bad);
  if (!kernel) throw Error(ErrorCode::kInvalidArgument, bad);
  s.attention_kernel = *kernel;
  return s;
}

}  // namespace deepinfer::cuda
