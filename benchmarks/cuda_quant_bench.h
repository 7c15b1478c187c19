// The benchmarks of DeepSeek's quantized formats on CUDA (cuda_quant_bench.cpp), run by
// cuda_op_bench.
#pragma once

#include <string>

#include "deepinfer/backend.h"

namespace deepinfer::bench {

// FP8 block-scaled linears at V4-Flash shapes next to the memcpy and cuBLASLt FP8 rooflines.
// A non-empty `match` keeps the weights whose name contains it, at the decode token counts only
// (M <= 64: no cuBLASLt peaks measured).
void bench_fp8(Backend& be, int iters, const std::string& match = {});
// MXFP4 routed experts at V4-Flash shapes next to the copy roofline.
void bench_moe_experts_mxfp4(Backend& be, int iters);
// FP8 (128 x 128 block-scaled) routed experts at decode widths, likewise.
void bench_moe_experts_fp8(Backend& be, int iters);

}  // namespace deepinfer::bench
