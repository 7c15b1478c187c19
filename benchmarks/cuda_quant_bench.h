// The benchmarks of DeepSeek's quantized formats on CUDA (cuda_quant_bench.cpp), run by
// cuda_op_bench.
#pragma once

#include "deepinfer/backend.h"

namespace deepinfer::bench {

// FP8 block-scaled linears at V4-Flash shapes next to the memcpy and cuBLASLt FP8 rooflines.
void bench_fp8(Backend& be, int iters);
// MXFP4 routed experts at V4-Flash shapes next to the copy roofline.
void bench_moe_experts_mxfp4(Backend& be, int iters);
// FP8 (128 x 128 block-scaled) routed experts at decode widths, likewise.
void bench_moe_experts_fp8(Backend& be, int iters);

}  // namespace deepinfer::bench
