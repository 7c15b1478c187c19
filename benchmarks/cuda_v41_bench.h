// The V4.1 op benchmark of the CUDA backend (cuda_v41_bench.cpp), run by cuda_op_bench --only v41.
#pragma once

#include "deepinfer/backend.h"

namespace deepinfer::bench {

// The six V4.1 ops at V4.1-Flash widths: hc_pre_shifted, hc_collapse, engram_hash and engram_gate
// at T = 1, 64, 256 (decode, timed as graph replays) and 4096 (prefill); indexer_candidates and
// indexer_topk_in_candidates (32 heads x 128, ratio 1, blocks of 8, top 2048 blocks then top 512)
// at index contexts of 32K and 128K entries, B = 1 and 64, over f32 and bf16 index keys.
void bench_v41(Backend& be, int iters);

}  // namespace deepinfer::bench
