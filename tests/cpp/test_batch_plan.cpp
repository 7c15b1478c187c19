// The forward's metadata packing (model/batch_plan.h): the one buffer an eager call uploads and a
// recorded decode graph refreshes, read back through the plan's views on the CPU backend.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "deepinfer/error.h"
#include "error_message.h"
#include "model/batch_plan.h"

namespace deepinfer {
namespace {

using testing::error_message;

std::vector<int32_t> read(Backend& be, const Tensor& t) {
  const Tensor host = be.to_host(t);
  return {host.data<int32_t>(), host.data<int32_t>() + host.numel()};
}

// Packs `rows` as `g`, uploads the buffer and returns the plan over it.
BatchPlan pack_and_view(Backend& be, RowSpan rows, const BatchGeometry& g,
                        const std::vector<int>& ratios, int32_t scratch_slot = 0) {
  std::vector<int32_t> host;
  pack_batch(rows, g, ratios, 128, scratch_slot, host);
  EXPECT_EQ(static_cast<int64_t>(host.size()), g.size());
  const Tensor meta = be.upload(Tensor::from_vector(host, {g.size()}), DType::kI32);
  return plan_views(meta, g, ratios, 128);
}

class BatchPlanTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = make_cpu_backend(1);
  const std::vector<int> ratios_ = {4, 128};
  // Row 0: a carried decode row at position 131 (its token closes window 32 of ratio 4).
  // Row 1: a prefill chunk of 6 tokens at positions 6..11 (closes windows 1 and 2 of ratio 4).
  // Row 2: two scored positions at 254..255 (closes window 63 of ratio 4, window 1 of 128).
  const std::vector<int32_t> tokens0_ = {0}, tokens1_ = {10, 11, 12, 13, 14, 15},
                             tokens2_ = {20, 21};
  const std::vector<int32_t> table0_ = {3, 4}, table1_ = {5}, table2_ = {6, 7};
  std::vector<ForwardRow> rows_ = {
      {.slot = 1,
       .start_pos = 131,
       .num_tokens = 1,
       .tokens = tokens0_,
       .block_table = table0_,
       .token_from_previous = 2,
       .num_logits = 1,
       .history = {}},
      {.slot = 2,
       .start_pos = 6,
       .num_tokens = 6,
       .tokens = tokens1_,
       .block_table = table1_,
       .num_logits = 0,
       .history = {}},
      {.slot = 3,
       .start_pos = 254,
       .num_tokens = 2,
       .tokens = tokens2_,
       .block_table = table2_,
       .num_logits = 2,
       .history = {}},
  };
};

TEST_F(BatchPlanTest, ExactGeometryPacksEveryArray) {
  const BatchGeometry g = BatchGeometry::exact(rows_, ratios_, 2, LogitsMode::kLast);
  EXPECT_EQ(g.num_tokens, 9);
  EXPECT_EQ(g.num_logit_rows, 3);
  EXPECT_TRUE(g.carry);
  EXPECT_EQ(g.num_entries, (std::vector<int>{1 + 2 + 1, 1}));
  const BatchPlan p = pack_and_view(*be_, rows_, g, ratios_);
  const BatchLayout& l = p.layout;
  EXPECT_EQ(read(*be_, l.token_ids), (std::vector<int32_t>{0, 10, 11, 12, 13, 14, 15, 20, 21}));
  EXPECT_EQ(read(*be_, l.positions), (std::vector<int32_t>{131, 6, 7, 8, 9, 10, 11, 254, 255}));
  EXPECT_EQ(read(*be_, l.token_seq), (std::vector<int32_t>{0, 1, 1, 1, 1, 1, 1, 2, 2}));
  EXPECT_EQ(read(*be_, l.seq_q_start), (std::vector<int32_t>{0, 1, 7, 9}));
  EXPECT_EQ(read(*be_, l.seq_ctx_len), (std::vector<int32_t>{131, 6, 254}));
  EXPECT_EQ(read(*be_, l.seq_slot), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(read(*be_, l.block_table), (std::vector<int32_t>{3, 4, 5, 0, 6, 7}));
  EXPECT_EQ(read(*be_, p.carry_remap), (std::vector<int32_t>{2, -1, -1, -1, -1, -1, -1, -1, -1}));
  // Logits of row 0's token and row 2's two tokens; none of row 1 (a chunk short of the end).
  EXPECT_EQ(read(*be_, p.logit_rows), (std::vector<int32_t>{0, 7, 8}));
  EXPECT_EQ(read(*be_, p.next_positions), (std::vector<int32_t>{132, 255, 256}));
  // Ratio 4: windows 32 (row 0), 1 and 2 (row 1: positions 4..7 and 8..11 close), 63 (row 2);
  // 32 entries per block, so entry j of a row is in its block table's block j / 32, slot j % 32.
  const EntryBatch& e4 = p.entries.at(4);
  EXPECT_EQ(read(*be_, e4.seq), (std::vector<int32_t>{0, 1, 1, 2}));
  EXPECT_EQ(read(*be_, e4.window), (std::vector<int32_t>{32, 1, 2, 63}));
  EXPECT_EQ(read(*be_, e4.rope_pos), (std::vector<int32_t>{128, 4, 8, 252}));
  EXPECT_EQ(read(*be_, e4.dest),
            (std::vector<int32_t>{4 * 32 + 0, 5 * 32 + 1, 5 * 32 + 2, 7 * 32 + 31}));
  const EntryBatch& e128 = p.entries.at(128);
  EXPECT_EQ(read(*be_, e128.window), (std::vector<int32_t>{1}));
  EXPECT_EQ(read(*be_, e128.dest), (std::vector<int32_t>{7}));
}

TEST_F(BatchPlanTest, AllLogitsModeHasNoLogitRowList) {
  const BatchGeometry g = BatchGeometry::exact(rows_, ratios_, 2, LogitsMode::kAll);
  const BatchPlan p = pack_and_view(*be_, rows_, g, ratios_);
  EXPECT_FALSE(p.logit_rows.defined());
  EXPECT_EQ(p.num_logit_rows, 9);
  EXPECT_EQ(read(*be_, p.next_positions),
            (std::vector<int32_t>{132, 7, 8, 9, 10, 11, 12, 255, 256}));
}

TEST_F(BatchPlanTest, APaddedDecodeBatchWritesOnlyTheScratchSlot) {
  const std::vector<ForwardRow> decode = {rows_[0]};
  const BatchGeometry g = BatchGeometry::padded(/*bucket=*/4, /*width=*/16, ratios_.size());
  const BatchPlan p = pack_and_view(*be_, decode, g, ratios_, /*scratch_slot=*/9);
  EXPECT_EQ(read(*be_, p.layout.seq_slot), (std::vector<int32_t>{1, 9, 9, 9}));
  EXPECT_EQ(read(*be_, p.layout.positions), (std::vector<int32_t>{131, 0, 0, 0}));
  EXPECT_EQ(read(*be_, p.carry_remap), (std::vector<int32_t>{2, -1, -1, -1}));
  std::vector<int32_t> table(64, 0);
  table[0] = 3;
  table[1] = 4;
  EXPECT_EQ(read(*be_, p.layout.block_table), table);
  // One entry slot per row: the real row closes window 32 of ratio 4; padding stores nothing.
  EXPECT_EQ(read(*be_, p.entries.at(4).window), (std::vector<int32_t>{32, -1, -1, -1}));
  EXPECT_EQ(read(*be_, p.entries.at(4).dest), (std::vector<int32_t>{128, -1, -1, -1}));
  EXPECT_EQ(read(*be_, p.entries.at(128).window), (std::vector<int32_t>{-1, -1, -1, -1}));
}

TEST_F(BatchPlanTest, StepRowsAreReadInPlaceThroughAStridedSpan) {
  struct Outer {
    int before = 7;
    ForwardRow forward;
    double after = 1.5;
  };
  std::vector<Outer> outer(3);
  for (size_t i = 0; i < 3; ++i) outer[i].forward = rows_[i];
  const RowSpan rows(std::span<const Outer>(outer), &Outer::forward);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(&rows[1], &outer[1].forward);
  const BatchGeometry g = BatchGeometry::exact(rows, ratios_, 2, LogitsMode::kLast);
  EXPECT_EQ(g.num_tokens, 9);
  EXPECT_EQ(read(*be_, pack_and_view(*be_, rows, g, ratios_).layout.positions),
            (std::vector<int32_t>{131, 6, 7, 8, 9, 10, 11, 254, 255}));
}

TEST_F(BatchPlanTest, AReplayedHitKeepsItsStoredEntriesAndCarriesItsWindowStart) {
  // A bounded-replay hit of 256 tokens replayed from 128: a chunk at 128..263. Windows closing by
  // 256 (ratio 4: 32..63; ratio 128: window 1) came from the tiers; only 64 and 65 are stored.
  std::vector<int32_t> tokens(136, 3);
  const std::vector<int32_t> table = {5, 6, 7};
  std::vector<ForwardRow> rows = {rows_[2],
                                  {.slot = 1,
                                   .start_pos = 128,
                                   .num_tokens = 136,
                                   .tokens = tokens,
                                   .block_table = table,
                                   .num_logits = 1,
                                   .history = {},
                                   .swa_valid_start = 128,
                                   .replay_end = 256}};
  const BatchGeometry g = BatchGeometry::exact(rows, ratios_, 3, LogitsMode::kLast);
  EXPECT_TRUE(g.swa_start);
  EXPECT_EQ(g.num_entries, (std::vector<int>{1 + 2, 1}));
  const BatchPlan p = pack_and_view(*be_, rows, g, ratios_);
  EXPECT_EQ(read(*be_, p.swa_start), (std::vector<int32_t>{0, 128}));
  const EntryBatch& e4 = p.entries.at(4);
  EXPECT_EQ(read(*be_, e4.seq), (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(read(*be_, e4.window), (std::vector<int32_t>{63, 64, 65}));
  EXPECT_EQ(read(*be_, e4.dest), (std::vector<int32_t>{7 * 32 + 31, 7 * 32 + 0, 7 * 32 + 1}));
  // Ratio 128: only row 0's window 1 (row 1's window 1 closes at 256 = replay_end: kept).
  EXPECT_EQ(read(*be_, p.entries.at(128).seq), (std::vector<int32_t>{0}));
  // Without a replay there is no swa_start array.
  const BatchGeometry plain = BatchGeometry::exact(rows_, ratios_, 2, LogitsMode::kLast);
  EXPECT_FALSE(plain.swa_start);
  EXPECT_FALSE(pack_and_view(*be_, rows_, plain, ratios_).swa_start.defined());
}

TEST_F(BatchPlanTest, AReplayedChunkListsTheTokenRowsOfItsPerTokenEntries) {
  // Ratio 1 (V4.1's C1): one entry per token. A replayed chunk at 120..135 with its hit ending at
  // 128 stores entries 128..135 only: token rows 2 + 8 .. 2 + 15, after row 0's two tokens.
  std::vector<int32_t> tokens(16, 3);
  const std::vector<int32_t> table = {5, 6};
  const std::vector<int> ratios = {1};
  std::vector<ForwardRow> rows = {rows_[2],
                                  {.slot = 1,
                                   .start_pos = 120,
                                   .num_tokens = 16,
                                   .tokens = tokens,
                                   .block_table = table,
                                   .num_logits = 1,
                                   .history = {},
                                   .swa_valid_start = 0,
                                   .replay_end = 128}};
  const BatchGeometry g = BatchGeometry::exact(rows, ratios, 2, LogitsMode::kLast);
  EXPECT_EQ(g.num_entries, (std::vector<int>{2 + 8}));
  EXPECT_EQ(g.entry_rows, 10);
  const BatchPlan p = pack_and_view(*be_, rows, g, ratios);
  EXPECT_EQ(read(*be_, p.entry_rows), (std::vector<int32_t>{0, 1, 10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(read(*be_, p.entries.at(1).window),
            (std::vector<int32_t>{254, 255, 128, 129, 130, 131, 132, 133, 134, 135}));
  // Without a replay the entries are the token rows themselves: no list.
  EXPECT_EQ(BatchGeometry::exact(rows_, ratios, 2, LogitsMode::kLast).entry_rows, 0);
}

TEST_F(BatchPlanTest, ValidateRowsNamesTheRowAndField) {
  ModelConfig c;
  c.vocab_size = 12;
  c.max_position_embeddings = 1024;
  CacheShape shape;
  shape.num_blocks = 8;
  shape.num_state_slots = 4;
  std::vector<ForwardRow> bad = {rows_[1]};
  EXPECT_EQ(validate_rows(bad, c, shape, /*check_tokens=*/false), 1u);
  EXPECT_EQ(error_message([&] { validate_rows(bad, c, shape, /*check_tokens=*/true); }),
            "forward batch: sequence 0: 'tokens'[2] = 12 is outside the vocabulary [0, 12)");
  bad[0].num_logits = 7;
  EXPECT_EQ(error_message([&] { validate_rows(bad, c, shape, false); }),
            "forward batch: sequence 0: 'num_logits' 7 is outside [0, 6]");
  bad[0].num_logits = 0;
  bad[0].swa_valid_start = 7;
  EXPECT_EQ(error_message([&] { validate_rows(bad, c, shape, false); }),
            "forward batch: sequence 0: 'swa_valid_start' 7 is outside [0, start_pos 6]: a replay "
            "computes every position from it on");
  std::vector<ForwardRow> twice = {rows_[0], rows_[0]};
  EXPECT_EQ(error_message([&] { validate_rows(twice, c, shape, false); }),
            "forward batch: sequence 1: 'slot' 1 is used by another sequence of the batch");
  bad[0].swa_valid_start = 0;
  bad[0].carried_tokens = 7;
  EXPECT_EQ(error_message([&] { validate_rows(bad, c, shape, false); }),
            "forward batch: sequence 0: 'carried_tokens' 7 with 'carried_stride' 0: expected 1 .. "
            "num_tokens (6) carried tokens, a stride >= 1 for more than one");
  bad[0].carried_tokens = 3;
  bad[0].carried_stride = 8;
  EXPECT_EQ(validate_rows(bad, c, shape, false), 1u);
}

// A row may carry all its tokens from the previous step (a carried verify row): its carry entries
// are token_from_previous + j * carried_stride for its first carried_tokens tokens.
TEST_F(BatchPlanTest, ARowCarriesSeveralTokensAtAStride) {
  std::vector<ForwardRow> rows = {rows_[1]};
  rows[0].token_from_previous = 5;
  rows[0].carried_tokens = 2;
  rows[0].carried_stride = 40;
  const BatchGeometry g = BatchGeometry::exact(rows, ratios_, 1, LogitsMode::kLast);
  std::vector<int32_t> host;
  pack_batch(rows, g, ratios_, 128, /*scratch_slot=*/0, host);
  const Tensor meta = be_->upload(Tensor::from_vector(host, {g.size()}), DType::kI32);
  const BatchPlan plan = plan_views(meta, g, ratios_, 128);
  const Tensor remap = be_->to_host(plan.carry_remap);
  const std::vector<int32_t> got(remap.data<int32_t>(), remap.data<int32_t>() + remap.numel());
  EXPECT_EQ(got, (std::vector<int32_t>{5, 45, -1, -1, -1, -1}));
}

}  // namespace
}  // namespace deepinfer
