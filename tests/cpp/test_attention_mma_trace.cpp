// The small-batch attention's trace summary (cuda/attention/sm80/attention_mma_trace.h) on
// synthetic records: the phases it reports are the intervals the records were built from, and
// the timeline is the blocks' timer stamps after the first split block's entry.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/attention/sm80/attention_mma_trace.h"

namespace deepinfer::cuda {
namespace {

// A split block's record: thread 0's stamps `step` cycles apart from `start` (the wait `wait`
// cycles), on a 2 GHz clock, its timer from `timer_start`; `keys`: false for a block without keys
// (no stamps from the top-k's to tile 0's values: zeros, as the recorder leaves them).
std::vector<int64_t> split_record(int64_t start, int64_t step, int64_t wait, int64_t timer_start,
                                  bool keys = true) {
  std::vector<int64_t> r(kMmaTraceWords, 0);
  int64_t t = start;
  r[kMmaTraceEntry] = t;
  r[kMmaTraceTable] = t += step;
  r[kMmaTraceWaited] = t += wait;
  const int64_t waited = t;
  if (keys) {
    for (int w = kMmaTraceTopk; w <= kMmaTraceValues; ++w) r[static_cast<size_t>(w)] = t += step;
  }
  r[kMmaTraceLoop] = t += step;
  r[kMmaTraceStored] = t += step;
  r[kMmaTraceTimerEntry] = timer_start;
  r[kMmaTraceTimerWaited] = timer_start + (waited - start) / 2;
  r[kMmaTraceTimerEnd] = timer_start + (r[kMmaTraceStored] - start) / 2;
  r[kMmaTraceSm] = 3;
  r[kMmaTraceTiles] = keys ? 1 : 0;
  r[kMmaTraceProbe] = waited + 3 * step;  // back three steps after the wait (past the top-k's)
  return r;
}

// A combine block's record: entry at `start` cycles and `timer_start` ns, then the wait, the
// statistics and the sums.
std::vector<int64_t> combine_record(int64_t start, int64_t wait, int64_t load, int64_t sum,
                                    int64_t timer_start) {
  std::vector<int64_t> r(kCombineTraceWords, 0);
  r[kCombineTraceEntry] = start;
  r[kCombineTraceWaited] = start + wait;
  r[kCombineTraceLoaded] = start + wait + load;
  r[kCombineTraceEnd] = start + wait + load + sum;
  r[kCombineTraceTimerEntry] = timer_start;
  r[kCombineTraceTimerWaited] = timer_start + wait / 2;
  r[kCombineTraceTimerEnd] = timer_start + (wait + load + sum) / 2;
  r[kCombineTraceSm] = 5;
  return r;
}

std::vector<int64_t> join(const std::vector<std::vector<int64_t>>& records) {
  std::vector<int64_t> out;
  for (const auto& r : records) out.insert(out.end(), r.begin(), r.end());
  return out;
}

TEST(AttentionMmaTrace, PhasesAndTimelineAreTheRecords) {
  // Split blocks: 0 and 1 traced (1 starts 100 ns later, waits longer, with longer steps), 2 never
  // traced (zeros: skipped). Combine blocks: two traced, the third never.
  const std::vector<int64_t> untraced_split(kMmaTraceWords, 0);
  const std::vector<int64_t> untraced_combine(kCombineTraceWords, 0);
  const std::vector<int64_t> words =
      join({split_record(1'000, 100, 2'000, 10'000), split_record(5'000, 300, 4'000, 10'100),
            untraced_split, combine_record(700, 6'000, 1'000, 400, 10'050),
            combine_record(900, 8'000, 1'400, 600, 10'060), untraced_combine});
  ASSERT_EQ(std::ssize(words), mma_trace_words(3, 3));
  const MmaTraceSummary s = summarize_mma_trace(words, 3, 3);
  EXPECT_EQ(s.blocks, 2);
  EXPECT_EQ(s.combines, 2);
  EXPECT_DOUBLE_EQ(s.clock_ghz, 2.0);
  const auto& ph = s.phases;
  EXPECT_EQ(ph[kMmaPhaseWait].blocks, 2);
  EXPECT_DOUBLE_EQ(ph[kMmaPhaseWait].mean, 3'000);
  EXPECT_EQ(ph[kMmaPhaseWait].max, 4'000);
  EXPECT_EQ(ph[kMmaPhaseWait].max_block, 1);
  for (int p : {kMmaPhaseTable, kMmaPhaseTopk, kMmaPhaseIssue, kMmaPhaseQuery, kMmaPhaseFirstTile,
                kMmaPhaseScores, kMmaPhaseGathered, kMmaPhaseSoftmax, kMmaPhaseValues,
                kMmaPhaseLoop, kMmaPhaseStore}) {
    SCOPED_TRACE(mma_trace_phase_name(p));
    EXPECT_EQ(ph[static_cast<size_t>(p)].blocks, 2);
    EXPECT_DOUBLE_EQ(ph[static_cast<size_t>(p)].mean, 200);
    EXPECT_EQ(ph[static_cast<size_t>(p)].max, 300);
    EXPECT_EQ(ph[static_cast<size_t>(p)].max_block, 1);
  }
  // The probe: 3 x 100 and 3 x 300 cycles after the waits.
  EXPECT_EQ(s.probe.blocks, 2);
  EXPECT_DOUBLE_EQ(s.probe.mean, 600);
  EXPECT_EQ(s.probe.max, 900);
  EXPECT_EQ(s.probe.max_block, 1);
  // After the wait: ten steps.
  EXPECT_DOUBLE_EQ(ph[kMmaPhaseAfterWait].mean, 2'000);
  EXPECT_EQ(ph[kMmaPhaseAfterWait].max, 3'000);
  const auto& cph = s.combine_phases;
  EXPECT_DOUBLE_EQ(cph[kCombinePhaseWait].mean, 7'000);
  EXPECT_EQ(cph[kCombinePhaseWait].max_block, 1);
  EXPECT_DOUBLE_EQ(cph[kCombinePhaseLoad].mean, 1'200);
  EXPECT_DOUBLE_EQ(cph[kCombinePhaseSum].mean, 500);
  EXPECT_EQ(cph[kCombinePhaseSum].max, 600);
  // The timeline, ns after block 0's entry (10,000).
  EXPECT_EQ(s.entry.first, 0);
  EXPECT_EQ(s.entry.last, 100);
  EXPECT_EQ(s.waited.first, 1'050);  // block 0: 2,100 cycles to its wait's end
  EXPECT_EQ(s.waited.last, 100 + 2'150);
  EXPECT_EQ(s.end.first, 1'550);  // (100 + 2,000 + 10 x 100) / 2
  EXPECT_EQ(s.end.last, 100 + 3'650);
  EXPECT_EQ(s.combine_entry.first, 50);
  EXPECT_EQ(s.combine_entry.last, 60);
  EXPECT_EQ(s.combine_waited.first, 50 + 3'000);
  EXPECT_EQ(s.combine_waited.last, 60 + 4'000);
  EXPECT_EQ(s.combine_end.first, 50 + 3'700);
  EXPECT_EQ(s.combine_end.last, 60 + 5'000);
}

TEST(AttentionMmaTrace, PlacementCountsTheSmsAndSplitsTheLoadPhaseBySharing) {
  // Split blocks on SMs 3, 3 and 7; combine blocks on SMs 7 (load 1,000), 9 and 9 (2,000 and
  // 4,000) and 11 (1,500); one more combine block with a corrupt SM id counts in the phases only.
  auto split_on = [](int64_t sm) {
    std::vector<int64_t> r = split_record(1'000, 100, 500, 0);
    r[kMmaTraceSm] = sm;
    return r;
  };
  auto combine_on = [](int64_t sm, int64_t load) {
    std::vector<int64_t> r = combine_record(0, 100, load, 50, 0);
    r[kCombineTraceSm] = sm;
    return r;
  };
  const std::vector<int64_t> words =
      join({split_on(3), split_on(3), split_on(7), combine_on(7, 1'000), combine_on(9, 2'000),
            combine_on(9, 4'000), combine_on(11, 1'500), combine_on(-1, 9'000)});
  const MmaTraceSummary s = summarize_mma_trace(words, 3, 5);
  EXPECT_EQ(s.combines, 5);
  const TracePlacement& p = s.placement;
  EXPECT_EQ(p.split_sms, 2);
  EXPECT_EQ(p.combine_sms, 3);
  EXPECT_EQ(p.combine_max_per_sm, 2);
  EXPECT_EQ(p.combines_on_split_sms, 1);
  EXPECT_EQ(p.combines_alone, 2);
  EXPECT_DOUBLE_EQ(p.load_alone_mean, 1'250);
  EXPECT_DOUBLE_EQ(p.load_shared_mean, 3'000);
}

TEST(AttentionMmaTrace, BlocksWithoutKeysSkipOnlyTheirKeyPhases) {
  const std::vector<int64_t> words =
      join({split_record(1'000, 100, 500, 0), split_record(1'000, 100, 500, 0, /*keys=*/false)});
  const MmaTraceSummary s = summarize_mma_trace(words, 2, 0);
  EXPECT_EQ(s.blocks, 2);
  EXPECT_EQ(s.combines, 0);
  // The key phases (waited -> top-k -> ... -> tile 0's values -> loop) are block 0's only.
  for (int p : {kMmaPhaseTopk, kMmaPhaseIssue, kMmaPhaseQuery, kMmaPhaseFirstTile, kMmaPhaseScores,
                kMmaPhaseGathered, kMmaPhaseSoftmax, kMmaPhaseValues, kMmaPhaseLoop}) {
    SCOPED_TRACE(mma_trace_phase_name(p));
    EXPECT_EQ(s.phases[static_cast<size_t>(p)].blocks, 1);
    EXPECT_EQ(s.phases[static_cast<size_t>(p)].max_block, 0);
  }
  for (int p : {kMmaPhaseTable, kMmaPhaseWait, kMmaPhaseStore, kMmaPhaseAfterWait}) {
    SCOPED_TRACE(mma_trace_phase_name(p));
    EXPECT_EQ(s.phases[static_cast<size_t>(p)].blocks, 2);
  }
}

TEST(AttentionMmaTrace, ShortBufferOrNoRecordsGiveAnEmptySummary) {
  const std::vector<int64_t> short_buffer(static_cast<size_t>(mma_trace_words(2, 1) - 1), 1);
  EXPECT_EQ(summarize_mma_trace(short_buffer, 2, 1).blocks, 0);
  const std::vector<int64_t> zeros(static_cast<size_t>(mma_trace_words(2, 4)), 0);
  const MmaTraceSummary s = summarize_mma_trace(zeros, 2, 4);
  EXPECT_EQ(s.blocks, 0);
  EXPECT_EQ(s.combines, 0);
  EXPECT_DOUBLE_EQ(s.clock_ghz, 0.0);
  EXPECT_EQ(s.phases[kMmaPhaseWait].blocks, 0);
  EXPECT_EQ(s.probe.blocks, 0);
}

TEST(AttentionMmaTrace, PhaseNamesCoverEveryPhase) {
  for (int p = 0; p < kMmaPhases; ++p) EXPECT_STRNE(mma_trace_phase_name(p), "?");
  for (int p = 0; p < kCombinePhases; ++p) EXPECT_STRNE(combine_trace_phase_name(p), "?");
  EXPECT_STREQ(mma_trace_phase_name(kMmaPhases), "?");
  EXPECT_STREQ(combine_trace_phase_name(-1), "?");
}

}  // namespace
}  // namespace deepinfer::cuda
