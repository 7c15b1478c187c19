// Decode graphs that hold speculative verify rows (model/decode_graphs.h): the host side (which
// rows a recording takes, which shape it replays, how a padded verify step is packed and that
// every fitting call fits its layout), and the whole engine on the CPU backend, where a graph
// re-issues its recorded calls: the padding rows, the padded entries, the metadata staging and the
// logits buffer are the code the CUDA graphs replay, so greedy outputs with drafts verified through
// graphs must be the plain engine's bit for bit, and every verify step must have been replayed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/engine.h"
#include "error_message.h"
#include "kv/cache_geometry.h"
#include "model/batch_plan.h"
#include "model/decode_graphs.h"
#include "small_v4_model.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

using testing::error_message;

// Rows of the given token counts at the given start positions, each wanting all its logits
// (a verify row's shape), slots 0.., block tables of 4 blocks.
struct Rows {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int32_t>> tables;
  std::vector<ForwardRow> rows;

  Rows(const std::vector<int>& counts, const std::vector<int>& starts) {
    tokens.resize(counts.size());
    tables.resize(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) {
      for (int j = 0; j < counts[i]; ++j) tokens[i].push_back(static_cast<int32_t>(10 * i + j));
      for (int b = 0; b < 4; ++b) tables[i].push_back(static_cast<int32_t>(1 + 4 * i + b));
    }
    for (size_t i = 0; i < counts.size(); ++i) {
      rows.push_back({.slot = static_cast<int32_t>(i),
                      .start_pos = starts[i],
                      .num_tokens = counts[i],
                      .tokens = tokens[i],
                      .block_table = tables[i],
                      .num_logits = counts[i],
                      .history = {}});
    }
  }
};

std::vector<int32_t> read(Backend& be, const Tensor& t) {
  const Tensor host = be.to_host(t);
  return {host.data<int32_t>(), host.data<int32_t>() + host.numel()};
}

TEST(DecodeGraphsVerify, RowsFitTakesRowsThatWantEveryLogitOfUpToSixTokens) {
  Rows decode({1, 1, 1}, {5, 6, 7});
  EXPECT_TRUE(DecodeGraphs::rows_fit(decode.rows, LogitsMode::kLast, 3, 0));
  EXPECT_FALSE(DecodeGraphs::rows_fit(decode.rows, LogitsMode::kLast, 2, 8));
  Rows verify({1, 6, 2}, {5, 6, 7});
  EXPECT_TRUE(DecodeGraphs::rows_fit(verify.rows, LogitsMode::kLast, 8, 3));
  // A verify step counts against the verify limit, not the decode one; 0 turns it off.
  EXPECT_FALSE(DecodeGraphs::rows_fit(verify.rows, LogitsMode::kLast, 8, 2));
  EXPECT_FALSE(DecodeGraphs::rows_fit(verify.rows, LogitsMode::kLast, 8, 0));
  // A row of 7 tokens is a prefill chunk, as is one wanting only its last logits (unless the
  // call wants every row's).
  Rows long_row({1, 7}, {5, 6});
  EXPECT_FALSE(DecodeGraphs::rows_fit(long_row.rows, LogitsMode::kLast, 8, 8));
  verify.rows[1].num_logits = 1;
  EXPECT_FALSE(DecodeGraphs::rows_fit(verify.rows, LogitsMode::kLast, 8, 8));
  EXPECT_TRUE(DecodeGraphs::rows_fit(verify.rows, LogitsMode::kAll, 8, 8));
  const std::vector<ForwardRow> none;
  EXPECT_FALSE(DecodeGraphs::rows_fit(none, LogitsMode::kLast, 8, 8));
}

TEST(DecodeGraphsVerify, ShapeForSizesTheTokensByTheRowsAndPadding) {
  const std::vector<int> buckets = DecodeGraphs::buckets_up_to(64);
  Rows decode({1, 1, 1}, {5, 6, 300});
  EXPECT_EQ(DecodeGraphs::shape_for(decode.rows, buckets, 3),
            (DecodeGraphs::Shape{.bucket = 4, .row_tokens = 1, .width = 16}));
  // Three rows of 1 + 4 + 6 tokens in a bucket of 4: 11 tokens and one padding row below the
  // bucket need 12 token rows, 3 per row.
  Rows verify({1, 4, 6}, {5, 6, 7});
  EXPECT_EQ(DecodeGraphs::shape_for(verify.rows, buckets, 17),
            (DecodeGraphs::Shape{.bucket = 4, .row_tokens = 3, .width = 32}));
  // 63 plain rows and one of 5 tokens: 68 tokens over 64 rows, 2 per row (129 token rows, not
  // 64 * 5).
  std::vector<int> counts(64, 1), starts(64, 9);
  counts[17] = 5;
  Rows mixed(counts, starts);
  EXPECT_EQ(DecodeGraphs::shape_for(mixed.rows, buckets, 1).row_tokens, 2);
  EXPECT_EQ(BatchGeometry::padded_verify(64, 2, 16, {4, 128}).num_tokens, 129);
}

TEST(DecodeGraphsVerify, APaddedVerifyStepPacksItsRowsAsAnEagerCallAndPadsTheRest) {
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  const std::vector<int> ratios = {4, 128};
  // Row 0: a carried decode row at 131 (closes window 32 of ratio 4). Row 1: a verify row at
  // 254..257 (closes window 63 of ratio 4 and window 1 of ratio 128 at 255).
  Rows rows({1, 4}, {131, 254});
  rows.rows[0].token_from_previous = 3;
  const DecodeGraphs::Shape shape =
      DecodeGraphs::shape_for(rows.rows, DecodeGraphs::buckets_up_to(8), 3);
  ASSERT_EQ(shape, (DecodeGraphs::Shape{.bucket = 2, .row_tokens = 3, .width = 16}));
  const BatchGeometry g = BatchGeometry::padded_verify(2, 3, 16, ratios);
  EXPECT_EQ(g.num_seqs, 3);
  EXPECT_EQ(g.num_tokens, 7);
  EXPECT_EQ(g.num_logit_rows, 7);
  // Ratio 4: two rows of at most 6 tokens close 2 each, but 6 tokens in 2 rows close 3 at most.
  EXPECT_EQ(g.num_entries, (std::vector<int>{3, 2}));
  std::vector<int32_t> host;
  pack_batch(rows.rows, g, ratios, 128, /*scratch_slot=*/9, host);
  ASSERT_EQ(static_cast<int64_t>(host.size()), g.size());
  const Tensor meta = be->upload(Tensor::from_vector(host, {g.size()}), DType::kI32);
  const BatchPlan p = plan_views(meta, g, ratios, 128);
  const BatchLayout& l = p.layout;
  // The real rows as an eager call packs them; the padding row takes the 2 token rows left, at
  // positions 0 and 1 of the scratch slot.
  EXPECT_EQ(read(*be, l.token_ids), (std::vector<int32_t>{0, 10, 11, 12, 13, 0, 0}));
  EXPECT_EQ(read(*be, l.positions), (std::vector<int32_t>{131, 254, 255, 256, 257, 0, 1}));
  EXPECT_EQ(read(*be, l.token_seq), (std::vector<int32_t>{0, 1, 1, 1, 1, 2, 2}));
  EXPECT_EQ(read(*be, l.seq_q_start), (std::vector<int32_t>{0, 1, 5, 7}));
  EXPECT_EQ(read(*be, l.seq_ctx_len), (std::vector<int32_t>{131, 254, 0}));
  EXPECT_EQ(read(*be, l.seq_slot), (std::vector<int32_t>{0, 1, 9}));
  EXPECT_EQ(read(*be, p.carry_remap), (std::vector<int32_t>{3, -1, -1, -1, -1, -1, -1}));
  EXPECT_FALSE(p.logit_rows.defined());
  EXPECT_EQ(read(*be, p.next_positions), (std::vector<int32_t>{132, 255, 256, 257, 258, 1, 2}));
  std::vector<int32_t> table(3 * 16, 0);
  for (int r = 0; r < 2; ++r)
    for (int b = 0; b < 4; ++b) table[static_cast<size_t>(16 * r + b)] = 1 + 4 * r + b;
  EXPECT_EQ(read(*be, l.block_table), table);
  // The entries that close, then padding entries of the padding row, which store nothing.
  const EntryBatch& e4 = p.entries.at(4);
  EXPECT_EQ(read(*be, e4.seq), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(read(*be, e4.window), (std::vector<int32_t>{32, 63, -1}));
  EXPECT_EQ(read(*be, e4.dest), (std::vector<int32_t>{2 * 32 + 0, 6 * 32 + 31, -1}));
  const EntryBatch& e128 = p.entries.at(128);
  EXPECT_EQ(read(*be, e128.window), (std::vector<int32_t>{1, -1}));
  EXPECT_EQ(read(*be, e128.dest), (std::vector<int32_t>{6, -1}));
}

TEST(DecodeGraphsVerify, EveryCallThatFitsItsShapeFitsItsLayout) {
  // Random rows of 1..6 tokens at random positions: the shape shape_for picks always holds
  // them (tokens, padding rows of at least one token each, the entries they close), and no
  // padding row gets more than bucket + 1 tokens (so it never wraps a window of 128).
  std::mt19937 rng(5);
  const std::vector<int> ratios = {4, 8, 128};
  const std::vector<int> buckets = DecodeGraphs::buckets_up_to(64);
  std::vector<int32_t> host;
  for (int trial = 0; trial < 3000; ++trial) {
    const int real = 1 + static_cast<int>(rng() % 64);
    std::vector<int> counts(real), starts(real);
    const int verify_rows = 1 + static_cast<int>(rng() % real);
    for (int i = 0; i < real; ++i) {
      counts[i] = i < verify_rows ? 1 + static_cast<int>(rng() % 6) : 1;
      starts[i] = static_cast<int>(rng() % 300);
    }
    Rows rows(counts, starts);
    const DecodeGraphs::Shape shape = DecodeGraphs::shape_for(rows.rows, buckets, 4);
    if (shape.row_tokens == 1) continue;  // every row drew one token
    ASSERT_LE(shape.row_tokens, BatchGeometry::kMaxPaddedRowTokens);
    const BatchGeometry g =
        BatchGeometry::padded_verify(shape.bucket, shape.row_tokens, shape.width, ratios);
    ASSERT_NO_THROW(pack_batch(rows.rows, g, ratios, 128, 99, host)) << "trial " << trial;
    const int32_t* q_start = host.data() + 3 * g.num_tokens;
    for (int s = real; s < g.num_seqs; ++s) {
      const int32_t n = q_start[s + 1] - q_start[s];
      ASSERT_GE(n, 1) << "trial " << trial;
      ASSERT_LE(n, shape.bucket + 1) << "trial " << trial;
    }
  }
}

TEST(DecodeGraphsVerify, PaddedVerifyEntriesBoundEveryMixOfRows) {
  // Brute force over small buckets: rows of 1..6 tokens (as many as the shape's tokens allow)
  // at every start phase close at most padded_verify_entries, and some mix reaches it.
  for (int ratio : {2, 4, 8, 128}) {
    for (int bucket : {1, 2, 3}) {
      for (int row_tokens = 1; row_tokens <= 6; ++row_tokens) {
        const int cap = BatchGeometry::padded_verify_entries(bucket, row_tokens, ratio);
        int most = 0;
        // Each row: a token count 1..6 and a start phase 0..ratio-1 (only the phase matters).
        const int per_row = 6 * std::min(ratio, 8);
        int combos = 1;
        for (int r = 0; r < bucket; ++r) combos *= per_row;
        for (int c = 0; c < combos; ++c) {
          int tokens = 0, closed = 0, code = c;
          for (int r = 0; r < bucket; ++r) {
            const int n = 1 + code % 6;
            const int start = (code / 6) % std::min(ratio, 8) + (ratio > 8 ? ratio - 8 : 0);
            code /= per_row;
            tokens += n;
            closed +=
                static_cast<int>(kv::num_entries(start + n, ratio) - kv::num_entries(start, ratio));
          }
          if (tokens > bucket * row_tokens) continue;
          most = std::max(most, closed);
        }
        EXPECT_LE(most, cap) << "ratio " << ratio << " bucket " << bucket << " row_tokens "
                             << row_tokens;
        // Tight enough not to waste much: within one entry per row of the most found.
        EXPECT_LE(cap, most + bucket) << "ratio " << ratio << " bucket " << bucket;
      }
    }
  }
}

TEST(DecodeGraphsVerify, PackingRefusesRowsThatDoNotFit) {
  const std::vector<int> ratios = {4};
  std::vector<int32_t> host;
  Rows rows({6, 6}, {1, 2});
  // Two rows of 6 tokens need 12 token rows and the padding row one more: row_tokens 6.
  EXPECT_EQ(error_message([&] {
              pack_batch(rows.rows, BatchGeometry::padded_verify(2, 5, 16, ratios), ratios, 128, 9,
                         host);
            }),
            "forward batch: 2 rows of 12 tokens do not fit a layout of 3 rows and 11 tokens");
  EXPECT_NO_THROW(
      pack_batch(rows.rows, BatchGeometry::padded_verify(2, 6, 16, ratios), ratios, 128, 9, host));
  // A padded decode layout takes one-token rows only.
  EXPECT_EQ(error_message([&] {
              pack_batch(rows.rows, BatchGeometry::padded(4, 16, 1), ratios, 128, 9, host);
            }),
            "forward batch: a padded decode batch holds one-token rows, got a row of 6");
  EXPECT_EQ(error_message([] {
              BatchGeometry::padded_verify(2, 3, 16, {1, 4});
            }),
            "padded verify batch: compression ratio 1 (DeepSeek-V4.1's C1) is not supported");
}

// ---- the engine over the small V4 model ----------------------------------------------------

// Proposes the plain engine's continuation of each prompt; draft j of a proposal is wrong when a
// hash of (context length, j) says so (probability about 1/3), so verify rows accept 0..all of
// their drafts, and every third request drafts nothing (plain rows next to verify rows).
class ScriptedDrafter final : public Drafter {
 public:
  explicit ScriptedDrafter(std::map<std::vector<int32_t>, std::vector<int32_t>> continuations)
      : continuations_(std::move(continuations)) {}
  void propose(RequestId id, std::span<const int32_t> tokens, int max_drafts,
               std::vector<int32_t>& drafts) override {
    if (id % 3 == 2) return;
    for (const auto& [prompt, out] : continuations_) {
      if (tokens.size() < prompt.size() ||
          !std::equal(prompt.begin(), prompt.end(), tokens.begin())) {
        continue;
      }
      const size_t done = tokens.size() - prompt.size();
      for (int j = 0; j < max_drafts && done + j < out.size(); ++j) {
        const bool wrong = (tokens.size() * 7 + static_cast<size_t>(j) * 13) % 3 == 0;
        drafts.push_back(wrong ? 2 + (out[done + j] + 1) % 250 : out[done + j]);
      }
      return;
    }
  }

 private:
  std::map<std::vector<int32_t>, std::vector<int32_t>> continuations_;
};

class DecodeGraphsVerifyEngine : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { test::write_small_v4(dir_.path()); }

  EngineConfig config(int graphs, int drafts) const {
    EngineConfig c = test::small_v4_engine(dir_.path());
    c.scheduler.max_num_seqs = 6;
    c.scheduler.max_num_batched_tokens = 1024;  // every prompt prefills in the first step
    c.scheduler.zero_overhead = GetParam();
    c.scheduler.speculative_zero_overhead = GetParam();
    c.scheduler.num_speculative_tokens = drafts;
    c.scheduler.speculative_method = "external";
    c.placement.decode_graph_max_batch = graphs;
    return c;
  }

  static std::vector<std::vector<int32_t>> run(Engine& engine,
                                               const std::vector<std::vector<int32_t>>& prompts) {
    SamplingParams s = test::greedy12();
    s.max_tokens = 20;
    std::vector<RequestId> ids;
    for (const auto& p : prompts) ids.push_back(engine.add_request(p, s));
    std::map<RequestId, std::vector<int32_t>> out;
    for (const RequestOutput& o : engine.run_until_idle())
      out[o.id].insert(out[o.id].end(), o.tokens.begin(), o.tokens.end());
    std::vector<std::vector<int32_t>> result;
    for (RequestId id : ids) result.push_back(out[id]);
    return result;
  }

  test::TempDir dir_;
};

TEST_P(DecodeGraphsVerifyEngine, VerifyStepsReplayGraphsAndGiveThePlainTokens) {
  const std::vector<std::vector<int32_t>> prompts = test::small_v4_prompts();
  std::unique_ptr<Engine> plain_engine = Engine::create(config(/*graphs=*/0, /*drafts=*/0));
  const std::vector<std::vector<int32_t>> plain = run(*plain_engine, prompts);
  std::map<std::vector<int32_t>, std::vector<int32_t>> continuations;
  for (size_t i = 0; i < prompts.size(); ++i) continuations[prompts[i]] = plain[i];

  for (int graphs : {0, 8}) {
    SCOPED_TRACE("decode_graph_max_batch " + std::to_string(graphs));
    std::unique_ptr<Engine> engine = Engine::create(config(graphs, /*drafts=*/4));
    engine->set_drafter(std::make_shared<ScriptedDrafter>(continuations));
    EXPECT_EQ(run(*engine, prompts), plain);
    const EngineStats s = engine->stats();
    EXPECT_GT(s.verify_steps, 0u);
    EXPECT_GT(s.accepted_draft_tokens, 0u);
    EXPECT_LT(s.accepted_draft_tokens, s.draft_tokens);  // some drafts were rejected
    if (graphs == 0) {
      EXPECT_EQ(s.num_graph_steps, 0u);
      EXPECT_EQ(s.num_graph_verify_steps, 0u);
    } else {
      // Every verify step (none has a prefill row: the prompts all prefill in the first step)
      // replayed a recording.
      EXPECT_EQ(s.num_graph_verify_steps, s.verify_steps);
      EXPECT_GE(s.num_graph_steps, s.num_graph_verify_steps);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ZeroOverhead, DecodeGraphsVerifyEngine, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param_info) {
                           return param_info.param ? std::string("Zos") : std::string("Sync");
                         });

}  // namespace
}  // namespace deepinfer
