// The lightning indexer's benchmark of the CUDA backend (cuda_indexer_bench.cpp), run by
// cuda_op_bench.
#pragma once

#include <string>

#include "deepinfer/backend.h"

namespace deepinfer::bench {

// The lightning indexer (scores and top-512) at V4-Flash widths over f32, bf16 and fp8 index keys
// at context 32K and 128K, B = 1 and 64.
void bench_indexer(Backend& be, int iters, const std::string& match = "");

}  // namespace deepinfer::bench
