// The attention benchmarks of the CUDA backend (cuda_attention_bench.cpp), run by cuda_op_bench.
#pragma once

#include <string>

#include "deepinfer/backend.h"

namespace deepinfer::bench {

// Decode attention at the V4-Flash CSA shape (64 heads x 512, window 128 + top-k selected
// entries, sinks) over f32, bf16 and fp8 KV caches, at top-k 512 and 1024 and at 128 heads (the
// V4-Pro shape). Each row is timed eagerly and as graph replays.
// Only shapes whose label contains `match` run (all for ""): one shape under a profiler.
void bench_attention_decode(Backend& be, int iters, const std::string& match = "");
// The overlap attention kernel's timing trace (cuda/attention/sm90/attention_wgmma_trace.h),
// default and ilp variant, at fp8 KV, top-k 512: h=64 B=256 and B=64, h=128 B=64 and B=256 (those
// whose label contains `match`). One JSON line per shape and kernel: mean cycles per tile each
// role waits and works, the loop periods, the blocks' prologue and epilogue. ablate != 0: the ilp
// variant only, traced as it is and with the OverlapAblation bits `ablate` (an "ablate" field).
void bench_attention_trace(Backend& be, const std::string& match = "", int ablate = 0);
// The small-batch decode attention's timing trace (cuda/attention/sm80/attention_mma_trace.h):
// the engine's call at B = 1 (fp8 and bf16 KV), B = 2 and s_q = 2 (fp8), top-k 512, 64 heads, as
// graph replays of `iters` calls, untraced and traced. One JSON line per shape: the last call's
// split-block phases and combine phases (mean and max cycles) and its timeline (ns after the
// first split block's entry: the first and last block's entry, wait and end, of both kernels).
void bench_attention_mma_trace(Backend& be, int iters, const std::string& match = "");

}  // namespace deepinfer::bench
