// The CUDA backend's A/B switches, read from the environment once, when a backend is created:
// which kernel family an op takes where two can (benchmarks and device runs compare them; the
// defaults are what the H200 measured faster). An unknown value is an error that names the
// variable, the values it takes and the value it got.
#pragma once

#include "cuda/attention/attention_plan.h"
#include "cuda/gemm/fp8_linear_choice.h"
#include "cuda/hc/hc_heuristics.h"
#include "cuda/indexer/indexer_options.h"
#include "cuda/moe/moe_heuristics.h"

namespace deepinfer::cuda {

struct BackendSwitches {
  QuantDecodeChoice moe_quant_decode = QuantDecodeChoice::kAuto;      // DEEPINFER_MOE_QUANT_DECODE
  QuantPrefillChoice moe_quant_prefill = QuantPrefillChoice::kWgmma;  // _MOE_QUANT_PREFILL
  Fp8LinearChoice fp8_linear = Fp8LinearChoice::kAuto;                // DEEPINFER_FP8_LINEAR
  Fp8WgmmaMath fp8_wgmma_math = Fp8WgmmaMath::kAuto;                  // _FP8_WGMMA_MATH
  bool cublaslt_tune = true;                                          // _FP8_CUBLASLT_TUNE
  HcPreChoice hc_pre = HcPreChoice::kAuto;                            // DEEPINFER_HC_PRE
  HcClusterChoice hc_cluster = HcClusterChoice::kAuto;                // DEEPINFER_HC_CLUSTER
  bool pdl = true;                                                    // DEEPINFER_PDL
  bool branches = true;                                               // DEEPINFER_BRANCHES
  AttentionMmaChoice attention_mma;  // DEEPINFER_ATTENTION_COMBINE / _ROWS / _SPLITS
  AttentionKernelChoice attention_kernel =
      AttentionKernelChoice::kWgmmaOverlapAuto;  // DEEPINFER_ATTENTION_KERNEL
  IndexerFp8Scores indexer_fp8_scores =
      IndexerFp8Scores::kWgmmaPersistentFp8;  // DEEPINFER_INDEXER_FP8_SCORES
};

// The switches as the environment sets them now; throws Error(kInvalidArgument) on a bad value.
BackendSwitches read_backend_switches();

}  // namespace deepinfer::cuda
