// The fused mHC kernel's trace summary (cuda/hc/hc_fused_trace.h) on synthetic records: the
// phases it reports are the intervals the records were built from, per CTA and over them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/hc/hc_fused_trace.h"

namespace deepinfer::cuda {
namespace {

// One CTA's record: thread 0's stamps `step` cycles apart from `start` (the wait `wait` cycles),
// on a 2 GHz clock; `norm`: the norm stamp is there; `weights`: the Sinkhorn's end, that many
// cycles after pre (0: none).
std::vector<int64_t> record(int64_t start, int64_t step, int64_t wait, bool norm, int64_t weights,
                            int64_t timer_start) {
  std::vector<int64_t> r(kHcTraceWords, 0);
  int64_t t = start;
  r[kHcTraceEntry] = t;
  r[kHcTracePrefetched] = t += step;
  r[kHcTraceWaited] = t += wait;
  for (int w = kHcTraceStaged; w <= kHcTracePre; ++w) r[static_cast<size_t>(w)] = t += step;
  const int64_t pre = t;
  if (norm) r[kHcTraceNormed] = t += step;
  r[kHcTraceCollapsed] = t += step;
  if (weights > 0) r[kHcTraceWeights] = pre + weights;
  r[kHcTraceTimerEntry] = timer_start;
  r[kHcTraceTimerEnd] = timer_start + (r[kHcTraceCollapsed] - start) / 2;
  r[kHcTraceSm] = 7;
  return r;
}

TEST(HcFusedTrace, PhasesAreTheRecordsIntervals) {
  // CTA 0: split 0 of hc_pre, its Sinkhorn 5,000 cycles past pre (after its collapse); CTA 1:
  // a longer wait and steps; CTA 2: never traced (zeros), skipped.
  std::vector<int64_t> words = record(1'000, 100, 3'000, true, 5'000, 50'000);
  const std::vector<int64_t> second = record(9'000, 200, 1'000, true, 0, 50'100);
  words.insert(words.end(), second.begin(), second.end());
  words.resize(static_cast<size_t>(hc_fused_trace_words(3)), 0);
  const HcFusedTraceSummary s = summarize_hc_fused_trace(words, 3);
  EXPECT_EQ(s.ctas, 2);
  EXPECT_DOUBLE_EQ(s.clock_ghz, 2.0);
  const auto& ph = s.phases;
  EXPECT_EQ(ph[kHcPhasePrefetch].blocks, 2);
  EXPECT_DOUBLE_EQ(ph[kHcPhasePrefetch].mean, 150);
  EXPECT_EQ(ph[kHcPhaseWait].max, 3'000);
  EXPECT_EQ(ph[kHcPhaseWait].max_block, 0);
  EXPECT_DOUBLE_EQ(ph[kHcPhaseWait].mean, 2'000);
  for (int p : {kHcPhaseStage, kHcPhaseMix, kHcPhaseReduce, kHcPhasePartials, kHcPhaseCluster,
                kHcPhaseSum, kHcPhasePre, kHcPhaseNorm, kHcPhaseCollapse}) {
    SCOPED_TRACE(hc_fused_trace_phase_name(p));
    EXPECT_EQ(ph[static_cast<size_t>(p)].blocks, 2);
    EXPECT_DOUBLE_EQ(ph[static_cast<size_t>(p)].mean, 150);
    EXPECT_EQ(ph[static_cast<size_t>(p)].max, 200);
    EXPECT_EQ(ph[static_cast<size_t>(p)].max_block, 1);
  }
  // Only CTA 0 has the Sinkhorn; it ends its after-the-wait time (7 steps to pre, then 5,000).
  EXPECT_EQ(ph[kHcPhaseWeights].blocks, 1);
  EXPECT_DOUBLE_EQ(ph[kHcPhaseWeights].mean, 5'000);
  EXPECT_EQ(ph[kHcPhaseAfterWait].max, 700 + 5'000);
  EXPECT_EQ(ph[kHcPhaseAfterWait].max_block, 0);
  EXPECT_DOUBLE_EQ(ph[kHcPhaseAfterWait].mean, (5'700 + 9 * 200) / 2.0);
  // Ends on the timer: CTA 0 at 50,000 + 4,000 / 2, CTA 1 at 50,100 + 3,000 / 2.
  EXPECT_EQ(s.end_spread_ns, (50'000 + 2'000) - (50'100 + 1'500));
}

TEST(HcFusedTrace, WithoutTheNormTheCollapseStartsAtPre) {
  const std::vector<int64_t> words = record(0, 100, 0, false, 0, 0);
  const HcFusedTraceSummary s = summarize_hc_fused_trace(words, 1);
  EXPECT_EQ(s.ctas, 1);
  EXPECT_EQ(s.phases[kHcPhaseNorm].blocks, 0);
  EXPECT_DOUBLE_EQ(s.phases[kHcPhaseCollapse].mean, 100);
  EXPECT_EQ(s.phases[kHcPhaseWeights].blocks, 0);
  EXPECT_EQ(s.end_spread_ns, 0);
}

TEST(HcFusedTrace, AShortBufferOrNoTracedCtaGivesAnEmptySummary) {
  const HcFusedTraceSummary none = summarize_hc_fused_trace({}, 4);
  EXPECT_EQ(none.ctas, 0);
  EXPECT_DOUBLE_EQ(none.clock_ghz, 0);
  const std::vector<int64_t> zeros(static_cast<size_t>(hc_fused_trace_words(2)), 0);
  EXPECT_EQ(summarize_hc_fused_trace(zeros, 2).ctas, 0);
}

TEST(HcFusedTrace, PhaseNames) {
  EXPECT_EQ(std::string(hc_fused_trace_phase_name(kHcPhaseWait)), "wait");
  EXPECT_EQ(std::string(hc_fused_trace_phase_name(kHcPhaseAfterWait)), "after_wait");
  EXPECT_EQ(std::string(hc_fused_trace_phase_name(kHcPhases)), "?");
}

}  // namespace
}  // namespace deepinfer::cuda
