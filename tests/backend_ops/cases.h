// The rows of the backend op table, one function per op family (cases_*.cpp).
#pragma once

#include <vector>

#include "op_case.h"

namespace deepinfer::backend_ops {

// DeepSeek-V4-Flash widths.
constexpr int64_t kHidden = 4096;
constexpr int kHcMult = 4;
constexpr int64_t kHeads = 64;
constexpr int64_t kHeadDim = 512;
constexpr int64_t kRopeDim = 64;
constexpr int64_t kVocab = 129280;

// Ops whose only differences from the reference are summation order or expf/cosf/sinf ulps.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

std::vector<OpCase> dense_cases();          // embedding, rms_norm, elementwise, rows, rope, argmax
std::vector<OpCase> select_tokens_cases();  // select_tokens
std::vector<OpCase> shift_rows_cases();     // accept_drafts, shift_rows
std::vector<OpCase> adjust_logits_cases();  // adjust_logits
std::vector<OpCase> hc_cases();             // hc_expand, hc_pre, hc_post, hc_post_pre, hc_head
std::vector<OpCase> gemm_cases();           // linear, grouped_linear
std::vector<OpCase> moe_cases();            // moe_route, moe_experts
std::vector<OpCase> moe_quant_cases();      // moe_experts on MXFP4 / FP8 experts
std::vector<OpCase> cache_cases();          // ring_write, compress_pool, scatter_rows
std::vector<OpCase> indexer_cases();        // indexer_topk
std::vector<OpCase> attention_cases();      // attention
std::vector<OpCase> kv_dtype_cases();       // indexer_topk over bf16 and fp8 index caches
std::vector<OpCase> sample_cases();         // sample
std::vector<OpCase> v41_cases();            // hc_pre_shifted, hc_collapse, engram_*, embedding_fp8
std::vector<OpCase> v41_indexer_cases();    // indexer_candidates, indexer_topk_in_candidates

}  // namespace deepinfer::backend_ops
