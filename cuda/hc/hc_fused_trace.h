// Timing instrumentation of the fused mHC kernel (hc_fused.cu): where a call's time goes, per CTA
// and per phase of the kernel. Only the kernel's trace instantiations record (a template flag;
// the default instantiations have no trace code). A traced launch writes, for each of its first
// `ctas` CTAs, a record of kHcTraceWords int64 words: clock64 stamps taken by thread 0 at the
// phase boundaries below (the Sinkhorn's end by its warp), %globaltimer at entry and at the end,
// and %smid; the host turns them into per-phase cycles (summarize_hc_fused_trace). Plain C++: the
// layout is shared by the kernel, the backend and the host summary (tests/cpp checks the latter).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "cuda/common/trace_stats.h"

namespace deepinfer::cuda {

// Where a traced launch writes: `stamps` (device memory, hc_fused_trace_words(ctas) words, any
// content: every word of a traced CTA's record is written) for CTAs 0 .. ctas - 1 (blockIdx.x).
// stamps == nullptr: no trace (the ordinary kernels).
struct HcFusedTraceBuffer {
  int64_t* stamps = nullptr;
  int ctas = 0;
};

// A CTA's record, in the kernel's order (hc_fused_kernel's steps 0-4).
enum HcFusedTraceWord : int {
  kHcTraceEntry = 0,   // clock64 at entry
  kHcTracePrefetched,  // fn's L2 prefetches issued (before the PDL wait)
  kHcTraceWaited,      // the wait for the previous kernel returned
  kHcTraceStaged,      // hc_post_pre: post and comb staged (the same as kHcTraceWaited else)
  kHcTraceMixed,       // step 1's loads and products done (thread 0's units)
  kHcTraceReduced,     // the warp sums in shared memory (after the block barrier)
  kHcTracePartials,    // the CTA's partial sums written
  kHcTraceClusterMet,  // past the cluster's barrier (step 2)
  kHcTraceSummed,      // step 3: the group's partials summed (after the block barrier)
  kHcTracePre,         // pre computed (after the block barrier)
  kHcTraceNormed,      // y's sum of squares known (with the sub-layer's norm; 0 without)
  kHcTraceCollapsed,   // the CTA's own channels of y stored
  kHcTraceWeights,     // split 0 of hc_pre: the first weights warp's post and comb stored (0 else)
  kHcTraceTimerEntry,  // %globaltimer (ns) at entry
  kHcTraceTimerEnd,    // %globaltimer at kHcTraceCollapsed
  kHcTraceSm,          // %smid
  kHcTraceWords = 16,
};

constexpr int64_t hc_fused_trace_words(int ctas) {
  return int64_t{ctas} * kHcTraceWords;
}

// The phases a summary reports: the cycles between consecutive stamps of thread 0, and the
// Sinkhorn warp's time from pre to its end.
enum HcFusedTracePhase : int {
  kHcPhasePrefetch = 0,  // entry -> prefetched
  kHcPhaseWait,          // prefetched -> waited (how long the CTA sat before its inputs were ready)
  kHcPhaseStage,         // waited -> staged
  kHcPhaseMix,           // staged -> mixed
  kHcPhaseReduce,        // mixed -> reduced
  kHcPhasePartials,      // reduced -> partials
  kHcPhaseCluster,       // partials -> cluster met
  kHcPhaseSum,           // cluster met -> summed
  kHcPhasePre,           // summed -> pre
  kHcPhaseNorm,          // pre -> normed (CTAs with the norm only)
  kHcPhaseCollapse,      // normed (or pre) -> collapsed
  kHcPhaseWeights,       // pre -> weights (split 0 of hc_pre only)
  kHcPhaseAfterWait,     // waited -> the CTA's last stamp (collapsed or weights)
  kHcPhases,
};

// Phases prefetch .. pre are the intervals between consecutive words entry .. pre.
static_assert(int{kHcTracePre} == int{kHcTraceEntry} + int{kHcPhasePre} + 1,
              "the phases follow the words");

inline const char* hc_fused_trace_phase_name(int phase) {
  static constexpr std::array<const char*, kHcPhases> kNames = {
      "prefetch", "wait", "stage", "mix",      "reduce",  "partials",  "cluster",
      "sum",      "pre",  "norm",  "collapse", "weights", "after_wait"};
  return phase >= 0 && phase < kHcPhases ? kNames[static_cast<size_t>(phase)] : "?";
}

struct HcFusedTraceSummary {
  int ctas = 0;          // CTAs with a record
  double clock_ghz = 0;  // cycles per ns, thread 0's entry to collapsed against its timer
  std::array<TracePhaseStats, kHcPhases> phases{};
  // The spread of the CTAs' ends on the device timer: the last CTA's end minus the first's (ns).
  int64_t end_spread_ns = 0;
};

// `words`: the host copy of a traced launch's buffer (hc_fused_trace_words(ctas) words). A
// record whose collapse stamp does not follow its entry is not a traced CTA and is skipped.
inline HcFusedTraceSummary summarize_hc_fused_trace(const std::vector<int64_t>& words, int ctas) {
  HcFusedTraceSummary s;
  double ns = 0, cycles = 0;
  int64_t first_end = 0, last_end = 0;
  const auto add = [&](int phase, int cta, int64_t v) {
    s.phases[static_cast<size_t>(phase)].add(cta, v);
  };
  for (int c = 0; c < ctas && (c + 1) * int64_t{kHcTraceWords} <= std::ssize(words); ++c) {
    const int64_t* r = words.data() + c * int64_t{kHcTraceWords};
    if (r[kHcTraceCollapsed] <= r[kHcTraceEntry]) continue;
    ++s.ctas;
    cycles += static_cast<double>(r[kHcTraceCollapsed] - r[kHcTraceEntry]);
    ns += static_cast<double>(r[kHcTraceTimerEnd] - r[kHcTraceTimerEntry]);
    for (int p = kHcPhasePrefetch; p <= kHcPhasePre; ++p) {
      add(p, c, r[kHcTracePrefetched + p] - r[kHcTraceEntry + p]);
    }
    const bool normed = r[kHcTraceNormed] != 0;
    if (normed) add(kHcPhaseNorm, c, r[kHcTraceNormed] - r[kHcTracePre]);
    add(kHcPhaseCollapse, c, r[kHcTraceCollapsed] - (normed ? r[kHcTraceNormed] : r[kHcTracePre]));
    const bool weights = r[kHcTraceWeights] != 0;
    if (weights) add(kHcPhaseWeights, c, r[kHcTraceWeights] - r[kHcTracePre]);
    const int64_t last =
        weights ? std::max(r[kHcTraceCollapsed], r[kHcTraceWeights]) : r[kHcTraceCollapsed];
    add(kHcPhaseAfterWait, c, last - r[kHcTraceWaited]);
    const int64_t end = r[kHcTraceTimerEnd];
    first_end = s.ctas == 1 ? end : std::min(first_end, end);
    last_end = s.ctas == 1 ? end : std::max(last_end, end);
  }
  for (TracePhaseStats& p : s.phases) p.finish();
  s.clock_ghz = ns > 0 ? cycles / ns : 0.0;
  s.end_spread_ns = last_end - first_end;
  return s;
}

}  // namespace deepinfer::cuda
