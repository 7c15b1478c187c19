// The consumer rows of DeepSeek-V4.1's YOCO prefill truncation (model/yoco_rows.h): which rows a
// call keeps, which sliding positions they see, and the compact layout uploaded for them.
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "model/yoco_rows.h"

namespace deepinfer {
namespace {

// Window 8, keep 12, boundary at layer 6 (tiny config A's values).
V41TextConfig yoco_config(YocoTruncation mode) {
  V41TextConfig c;
  c.sliding_window = 8;
  c.yoco_keep_tokens = 12;
  c.yoco_boundary = 6;
  c.yoco_truncation = mode;
  return c;
}

std::vector<int32_t> host_i32(Backend& be, const Tensor& t) {
  const Tensor h = be.to_host(t);
  return std::vector<int32_t>(h.data<int32_t>(), h.data<int32_t>() + h.numel());
}

// A 40-token prefill in two chunks of 20 (the first ends before the kept positions [28, 40),
// the second starts before them) and a decode row at 50.
struct Batch {
  std::vector<int32_t> tokens = std::vector<int32_t>(20, 5);
  std::vector<int32_t> table = {1};
  std::vector<ForwardRow> rows;
  Batch() {
    ForwardRow a;
    a.slot = 0;
    a.start_pos = 0;
    a.num_tokens = 20;
    a.tokens = tokens;
    a.block_table = table;
    a.prompt_end = 40;
    a.num_logits = 1;
    ForwardRow b = a;
    b.slot = 1;
    b.start_pos = 20;
    ForwardRow c = a;
    c.slot = 2;
    c.start_pos = 50;
    c.num_tokens = 1;
    c.tokens = std::span<const int32_t>(tokens).first(1);
    c.prompt_end = 0;
    rows = {a, b, c};
  }
};

TEST(YocoRows, RangesOfPrefillChunksAndDecodeRows) {
  Batch batch;
  std::vector<YocoRowRange> ranges;
  ASSERT_TRUE(yoco_row_ranges(batch.rows, yoco_config(YocoTruncation::kCompact), ranges));
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0].swa_start, 28);
  EXPECT_EQ(ranges[0].first_kept, 20);  // every row dropped
  EXPECT_EQ(ranges[1].first_kept, 28);
  EXPECT_EQ(ranges[2].swa_start, 39);  // its own end 51 - 12: inside its window (43..50) anyway
  EXPECT_EQ(ranges[2].first_kept, 50);
  ASSERT_TRUE(yoco_row_ranges(batch.rows, yoco_config(YocoTruncation::kMask), ranges));
  EXPECT_EQ(ranges[0].first_kept, 0);  // mask keeps every row
  EXPECT_EQ(ranges[1].first_kept, 20);
  EXPECT_EQ(ranges[1].swa_start, 28);
  EXPECT_FALSE(yoco_row_ranges(batch.rows, yoco_config(YocoTruncation::kOff), ranges));
  V41TextConfig no_boundary = yoco_config(YocoTruncation::kCompact);
  no_boundary.yoco_boundary = -1;
  EXPECT_FALSE(yoco_row_ranges(batch.rows, no_boundary, ranges));
  // Decode rows alone are never narrowed.
  EXPECT_FALSE(yoco_row_ranges(std::span<const ForwardRow>(batch.rows).subspan(2),
                               yoco_config(YocoTruncation::kCompact), ranges));
}

TEST(YocoRows, DroppedLogitRows) {
  Batch batch;
  const V41TextConfig compact = yoco_config(YocoTruncation::kCompact);
  // kLast: the first chunk's last row (logits row 0) lies before 28.
  EXPECT_EQ(yoco_dropped_logit_rows(batch.rows, compact, LogitsMode::kLast),
            std::vector<int32_t>{0});
  // kAll: the first chunk's 20 rows and the second chunk's rows at 20..27.
  std::vector<int32_t> want(28);
  for (int32_t i = 0; i < 28; ++i) want[static_cast<size_t>(i)] = i;
  EXPECT_EQ(yoco_dropped_logit_rows(batch.rows, compact, LogitsMode::kAll), want);
  EXPECT_TRUE(
      yoco_dropped_logit_rows(batch.rows, yoco_config(YocoTruncation::kMask), LogitsMode::kAll)
          .empty());
}

TEST(YocoRows, CompactLayoutOfTheKeptRows) {
  Batch batch;
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  BatchPlan plan;
  plan.layout.num_tokens = 41;
  plan.layout.num_seqs = 3;
  const YocoRows y = plan_yoco_rows(batch.rows, plan, yoco_config(YocoTruncation::kCompact),
                                    LogitsMode::kLast, *be);
  ASSERT_TRUE(y.narrows && y.drops);
  EXPECT_EQ(host_i32(*be, y.swa_start), (std::vector<int32_t>{28, 28, 39}));
  std::vector<int32_t> kept;
  for (int32_t r = 28; r < 40; ++r) kept.push_back(r);  // rows 28..39: the second chunk's 28..39
  kept.push_back(40);                                   // the decode row
  EXPECT_EQ(host_i32(*be, y.kept_rows), kept);
  EXPECT_EQ(y.layout.num_tokens, 13);
  EXPECT_EQ(host_i32(*be, y.layout.seq_q_start), (std::vector<int32_t>{0, 0, 12, 13}));
  EXPECT_EQ(host_i32(*be, y.layout.seq_ctx_len), (std::vector<int32_t>{20, 28, 50}));
  const std::vector<int32_t> positions = host_i32(*be, y.layout.positions);
  EXPECT_EQ(positions.front(), 28);
  EXPECT_EQ(positions.back(), 50);
  // The first chunk's logits row was dropped: the second's and the decode row's remain.
  EXPECT_EQ(y.num_logit_rows, 2);
  EXPECT_EQ(host_i32(*be, y.logit_rows), (std::vector<int32_t>{11, 12}));
  EXPECT_EQ(host_i32(*be, y.next_positions), (std::vector<int32_t>{40, 51}));
  // Mask: the bound only.
  const YocoRows m =
      plan_yoco_rows(batch.rows, plan, yoco_config(YocoTruncation::kMask), LogitsMode::kLast, *be);
  EXPECT_TRUE(m.narrows);
  EXPECT_FALSE(m.drops);
}

TEST(YocoRows, PromptEndBeforeTheRowsEndIsAnError) {
  Batch batch;
  batch.rows[1].prompt_end = 30;
  std::vector<YocoRowRange> ranges;
  try {
    yoco_row_ranges(batch.rows, yoco_config(YocoTruncation::kMask), ranges);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("sequence 1: 'prompt_end' 30"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
