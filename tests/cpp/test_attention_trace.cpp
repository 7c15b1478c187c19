// The overlap attention kernel's trace summary (cuda/attention/sm90/attention_wgmma_trace.h) on
// a synthetic record: the means it reports are the intervals the record was built from.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/attention/sm90/attention_wgmma_trace.h"

namespace deepinfer::cuda {
namespace {

// One block of `tiles` tiles, every role's period 1000 cycles, with fixed offsets inside it.
std::vector<int64_t> synthetic_record(int tiles, int64_t start) {
  std::vector<int64_t> w(static_cast<size_t>(overlap_trace_words(1)), 0);
  auto at = [&](int event, int tile) -> int64_t& {
    return w[static_cast<size_t>(kOverlapTraceHeaderWords + event * kOverlapTraceTiles + tile)];
  };
  w[kTraceTiles] = tiles;
  w[kTraceClockStart] = start;
  w[kTraceClockPrologue] = start + 500;
  w[kTraceClockLoopEnd] = start + 500 + 1000 * tiles;
  w[kTraceClockEnd] = start + 800 + 1000 * tiles;
  w[kTraceClockKeys] = start + 100;
  w[kTraceClockProducerAddresses] = start + 200;
  w[kTraceClockQuery] = start + 300;
  w[kTraceClockValuesDone] = start + 600 + 1000 * tiles;
  w[kTraceClockOutputReady] = start + 650 + 1000 * tiles;
  w[kTraceTimerStart] = 10'000;
  w[kTraceTimerEnd] = 10'000 + (800 + 1000 * tiles) / 2;  // a 2 GHz clock
  for (int i = 0; i < tiles; ++i) {
    const int64_t t0 = start + 500 + 1000 * i;
    at(kProducerTop, i) = t0;
    at(kProducerFree, i) = t0 + 100;
    at(kProducerLanded, i) = t0 + 150;
    at(kProducerPublished, i) = t0 + 750;
    at(kProducerIssued, i) = t0 + 800;
    at(kScorerTop, i) = t0;
    at(kScorerFull, i) = t0 + 200;
    at(kScorerPrevValues, i) = t0 + 300;
    at(kScorerScores, i) = t0 + 600;
    at(kScorerProbsFree, i) = t0 + 610;
    at(kScorerPublished, i) = t0 + 900;
    at(kScorerIssued, i) = t0 + 950;
    at(kValueTop, i) = t0;
    at(kValueReady, i) = t0 + 900;
    at(kValueDone, i) = t0 + 980;
  }
  return w;
}

TEST(AttentionTrace, SummaryMeansAreTheRecordsIntervals) {
  std::vector<int64_t> words = synthetic_record(10, 1'000'000);
  // A second, untraced block (all zeros) is skipped.
  words.resize(static_cast<size_t>(overlap_trace_words(2)), 0);
  const OverlapTraceSummary s = summarize_overlap_trace(words, 2);
  EXPECT_EQ(s.ctas, 1);
  EXPECT_DOUBLE_EQ(s.tiles, 10);
  EXPECT_DOUBLE_EQ(s.steady, 8);  // tiles 1 .. 8
  EXPECT_DOUBLE_EQ(s.clock_ghz, 2.0);
  EXPECT_DOUBLE_EQ(s.prologue_cycles, 500);
  EXPECT_DOUBLE_EQ(s.loop_cycles, 10'000);
  EXPECT_DOUBLE_EQ(s.epilogue_cycles, 300);
  EXPECT_DOUBLE_EQ(s.prologue_keys, 100);
  EXPECT_DOUBLE_EQ(s.first_addresses, 200);
  EXPECT_DOUBLE_EQ(s.prologue_query, 300);
  EXPECT_DOUBLE_EQ(s.first_landed, 650);  // tile 0's stamps: 500 + 150, + 750, + 200
  EXPECT_DOUBLE_EQ(s.first_published, 1250);
  EXPECT_DOUBLE_EQ(s.first_full, 700);
  EXPECT_DOUBLE_EQ(s.epilogue_values, 100);
  EXPECT_DOUBLE_EQ(s.epilogue_ready, 150);
  EXPECT_DOUBLE_EQ(s.producer_wait_free, 100);
  EXPECT_DOUBLE_EQ(s.producer_wait_landed, 50);
  EXPECT_DOUBLE_EQ(s.producer_decode, 600);
  EXPECT_DOUBLE_EQ(s.producer_issue, 50);
  EXPECT_DOUBLE_EQ(s.producer_period, 1000);
  EXPECT_DOUBLE_EQ(s.scorer_wait_full, 200);
  EXPECT_DOUBLE_EQ(s.scorer_wait_prev_values, 100);
  EXPECT_DOUBLE_EQ(s.scorer_wait_scores, 300);
  EXPECT_DOUBLE_EQ(s.scorer_wait_probs_free, 10);
  EXPECT_DOUBLE_EQ(s.scorer_softmax, 290);
  EXPECT_DOUBLE_EQ(s.scorer_issue_values, 50);
  EXPECT_DOUBLE_EQ(s.scorer_period, 1000);
  EXPECT_DOUBLE_EQ(s.value_wait_probs, 900);
  EXPECT_DOUBLE_EQ(s.value_products, 80);
  EXPECT_DOUBLE_EQ(s.value_release, 20);
  EXPECT_DOUBLE_EQ(s.value_period, 1000);
}

TEST(AttentionTrace, NoTracedBlockGivesAnEmptySummary) {
  const std::vector<int64_t> words(static_cast<size_t>(overlap_trace_words(3)), 0);
  const OverlapTraceSummary s = summarize_overlap_trace(words, 3);
  EXPECT_EQ(s.ctas, 0);
  EXPECT_DOUBLE_EQ(s.scorer_period, 0);
}

}  // namespace
}  // namespace deepinfer::cuda
