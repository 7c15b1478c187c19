// The mHC op benchmark of the CUDA backend (cuda_hc_bench.cpp), run by cuda_op_bench --only hc.
#pragma once

#include <string>

#include "deepinfer/backend.h"

namespace deepinfer::bench {

// hc_pre, hc_head, hc_post_pre and hc_post at V4-Flash widths (n = 4, H = 4096) for T = 1, 7, 64
// and 256, as graph replays. `path` labels the rows with the backend's DEEPINFER_HC_PRE choice
// (fused, or legacy: the backend was created under it; legacy's hc_post_pre is hc_post then
// hc_pre). The ops with mix weights run twice: over one weight set (fn stays in L2 across the
// replayed calls) and rotating over enough sets that fn comes from HBM, as in a decode step that
// streams the layers' weights between two mHC ops.
void bench_mhc(Backend& be, int iters, const std::string& path);

// The fused mHC kernel's timing trace (cuda/hc/hc_fused_trace.h) at T = 1 and 8, as the model
// calls the ops (hc_pre and hc_post_pre with the sub-layer's norm, hc_head with the final one),
// each in two JSON lines: alone, and after V4-Flash's wo_b FP8 linear (hc_post_pre taking its
// output, as in the model) with the us it adds to a graph of those linears. Each line has the
// per-phase cycles of the last of `iters` calls replayed from a graph (mean over the CTAs, and
// the max with its CTA), the CTAs' clock, the spread of their ends, and us untraced and traced
// (what the stamps cost).
void bench_mhc_trace(Backend& be, int iters);

}  // namespace deepinfer::bench
