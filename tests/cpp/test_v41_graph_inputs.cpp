// The host inputs of DeepSeek-V4.1's decode steps (model/deepseek_v41.h pack_engram_ngrams): the
// Engram n-grams built from each row's history, the cells a carried token is patched into, and a
// recorded decode graph's padding rows, which must leave the real rows exactly as eager packs them.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "model/deepseek_v41.h"

namespace deepinfer {
namespace {

V41TextConfig trigram_config() {
  V41TextConfig c;
  c.engram_max_ngram_size = 3;
  return c;
}

// Three decode rows: at position 7 (history ...,5,6), at position 1 (history 9, token carried
// from the previous step's entry 4) and at position 0 (no history).
struct DecodeBatch {
  std::vector<int32_t> tokens_a{70}, tokens_b{0}, tokens_c{30};
  std::vector<int32_t> history_a{1, 2, 3, 4, 5, 6, 7}, history_b{9};
  std::vector<int32_t> table{1};
  std::vector<ForwardRow> rows;
  DecodeBatch() {
    ForwardRow a;
    a.slot = 0;
    a.start_pos = 7;
    a.num_tokens = 1;
    a.tokens = tokens_a;
    a.block_table = table;
    a.history = history_a;
    ForwardRow b = a;
    b.slot = 1;
    b.start_pos = 1;
    b.tokens = tokens_b;
    b.history = history_b;
    b.token_from_previous = 4;
    ForwardRow c = a;
    c.slot = 2;
    c.start_pos = 0;
    c.tokens = tokens_c;
    c.history = {};
    rows = {a, b, c};
  }
  RowSpan span() const { return RowSpan(std::span<const ForwardRow>(rows)); }
};

TEST(V41GraphInputs, DecodeRowsTakeTheirHistoryTail) {
  DecodeBatch batch;
  std::vector<int32_t> ngram, remap;
  EXPECT_TRUE(pack_engram_ngrams(batch.span(), trigram_config(), 3, ngram, remap));
  // Row a: its token, then positions 6 and 5 (history[6], history[5]); row b: its (carried)
  // placeholder, then history[0], then -1 before the start; row c: its token only.
  EXPECT_EQ(ngram, (std::vector<int32_t>{70, 7, 6, 0, 9, -1, 30, -1, -1}));
  EXPECT_EQ(remap, (std::vector<int32_t>{-1, -1, -1, 4, -1, -1, -1, -1, -1}));
}

TEST(V41GraphInputs, PaddingRowsLeaveTheRealRowsAsEagerPacksThem) {
  DecodeBatch batch;
  std::vector<int32_t> exact, exact_remap, padded, padded_remap;
  pack_engram_ngrams(batch.span(), trigram_config(), 3, exact, exact_remap);
  // Bucket 4 with table padding: one padding row, token 0 at position 0 (pack_batch's).
  EXPECT_TRUE(pack_engram_ngrams(batch.span(), trigram_config(), 4, padded, padded_remap));
  ASSERT_EQ(padded.size(), 12u);
  EXPECT_EQ(std::vector<int32_t>(padded.begin(), padded.begin() + 9), exact);
  EXPECT_EQ(std::vector<int32_t>(padded.begin() + 9, padded.end()),
            (std::vector<int32_t>{0, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(padded_remap.begin(), padded_remap.begin() + 9), exact_remap);
  EXPECT_EQ(std::vector<int32_t>(padded_remap.begin() + 9, padded_remap.end()),
            (std::vector<int32_t>{-1, -1, -1}));
}

TEST(V41GraphInputs, RestagingOverwritesEveryCell) {
  // A recording's staging vectors are reused step after step: a smaller batch in the same bucket
  // must not keep the previous step's n-grams or carries in its padding rows.
  DecodeBatch batch;
  std::vector<int32_t> ngram, remap;
  pack_engram_ngrams(batch.span(), trigram_config(), 4, ngram, remap);
  const RowSpan first(std::span<const ForwardRow>(batch.rows).first(1));
  EXPECT_FALSE(pack_engram_ngrams(first, trigram_config(), 4, ngram, remap));
  EXPECT_EQ(ngram, (std::vector<int32_t>{70, 7, 6, 0, -1, -1, 0, -1, -1, 0, -1, -1}));
  EXPECT_EQ(remap, std::vector<int32_t>(12, -1));
}

TEST(V41GraphInputs, ChunkRowsMixTheirTokensAndHistory) {
  // A 3-token chunk at position 2: each position reaches back into the chunk, then the history.
  const std::vector<int32_t> tokens{11, 12, 13}, history{1, 2}, table{1};
  ForwardRow r;
  r.start_pos = 2;
  r.num_tokens = 3;
  r.tokens = tokens;
  r.block_table = table;
  r.history = history;
  const std::vector<ForwardRow> rows{r};
  std::vector<int32_t> ngram, remap;
  EXPECT_FALSE(pack_engram_ngrams(RowSpan(std::span<const ForwardRow>(rows)), trigram_config(), 3,
                                  ngram, remap));
  EXPECT_EQ(ngram, (std::vector<int32_t>{11, 2, 1, 12, 11, 2, 13, 12, 11}));
}

TEST(V41GraphInputs, ErrorsNameTheRowAndTheCount) {
  DecodeBatch batch;
  batch.rows[0].history = std::span<const int32_t>(batch.history_a).first(1);
  std::vector<int32_t> ngram, remap;
  try {
    pack_engram_ngrams(batch.span(), trigram_config(), 3, ngram, remap);
    FAIL() << "a history of 1 token at start_pos 7 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("sequence 0: 'history' has 1 tokens"), std::string::npos)
        << e.what();
  }
  DecodeBatch ok;
  try {
    pack_engram_ngrams(ok.span(), trigram_config(), 2, ngram, remap);
    FAIL() << "2 token rows were accepted for 3 tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 token rows asked for 3 tokens"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
