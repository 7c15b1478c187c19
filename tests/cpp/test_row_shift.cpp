// Rows planned before the previous step's verification was known (ForwardRow::shift_from,
// Backend::shift_rows): packed at their optimistic positions and moved on the device by the
// drafts the previous step accepted, the metadata must be exactly what the host packs from the
// true positions, in every layout a forward uses (an eager call's exact batch, a recorded decode
// graph's one-token rows, a recorded verify step's rows of up to six tokens), rows that carry
// every token included. And the accepted
// counts themselves (Backend::accept_drafts) as the engine's host rule counts them.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "deepinfer/error.h"
#include "error_message.h"
#include "model/batch_plan.h"
#include "model/cache_tensors.h"
#include "model/decode_graphs.h"

namespace deepinfer {
namespace {

using testing::error_message;

std::vector<int32_t> read(Backend& be, const Tensor& t) {
  const Tensor host = be.to_host(t);
  return {host.data<int32_t>(), host.data<int32_t>() + host.numel()};
}

const std::vector<int> kRatios = {4, 128};

// A batch of decode / verify rows, some of which may move; `truth` holds the same rows at the
// positions the accepted drafts give them.
struct Batch {
  std::vector<std::vector<int32_t>> tokens, tables;
  std::vector<ForwardRow> planned, truth;
  std::vector<int32_t> accepted;  // per verify row k of the previous step
};

Batch random_batch(std::mt19937& rng, int num_rows, int max_tokens, int max_start) {
  Batch b;
  b.tokens.resize(static_cast<size_t>(num_rows));
  b.tables.resize(static_cast<size_t>(num_rows));
  int32_t next_block = 1;
  for (int s = 0; s < num_rows; ++s) {
    const int n = std::uniform_int_distribution<int>(1, max_tokens)(rng);
    const int start = std::uniform_int_distribution<int>(6, max_start)(rng);
    b.tokens[s].assign(static_cast<size_t>(n), 7 + s);
    const int blocks = (start + n + 127) / 128;
    for (int j = 0; j < blocks; ++j) b.tables[s].push_back(next_block++);
    std::shuffle(b.tables[s].begin(), b.tables[s].end(), rng);
    ForwardRow r{.slot = s + 1,
                 .start_pos = start,
                 .num_tokens = n,
                 .tokens = b.tokens[s],
                 .block_table = b.tables[s],
                 .num_logits = n,
                 .history = {}};
    ForwardRow t = r;
    if (rng() % 3 != 0) {  // a row carried after a verify row of the previous step
      const int k = static_cast<int>(b.accepted.size());
      const int max_shift = std::uniform_int_distribution<int>(1, 5)(rng);
      const int accepted = std::uniform_int_distribution<int>(0, max_shift)(rng);
      b.accepted.push_back(accepted);
      r.shift_from = t.shift_from = k;
      r.max_shift = t.max_shift = max_shift;
      r.token_from_previous = 6 * k + max_shift;  // where its final token is if all were accepted
      t.start_pos = start - (max_shift - accepted);
      t.token_from_previous = 6 * k + accepted;
      if (rng() % 2 == 0) {
        // A carried verify row: every token from the previous step, one region of its outputs
        // per token (the sample, then each draft, per logits row), so all of them move.
        r.carried_tokens = t.carried_tokens = n;
        r.carried_stride = t.carried_stride = 997;
      }
    } else if (rng() % 2 == 0) {
      r.token_from_previous = t.token_from_previous = 1000 + s;  // carried after a plain row
    }
    b.planned.push_back(r);
    b.truth.push_back(t);
  }
  if (b.accepted.empty()) b.accepted.push_back(0);
  return b;
}

// Packs `planned` as `g`, moves its rows on the backend and returns the buffer; and the buffer the
// true rows pack into the same geometry.
std::pair<std::vector<int32_t>, std::vector<int32_t>> shifted_and_true(Backend& be, const Batch& b,
                                                                       const BatchGeometry& g) {
  std::vector<int32_t> planned, truth;
  pack_batch(b.planned, g, kRatios, 128, /*scratch_slot=*/0, planned);
  pack_batch(b.truth, g, kRatios, 128, /*scratch_slot=*/0, truth);
  const Tensor meta = be.upload(Tensor::from_vector(planned, {g.size()}), DType::kI32);
  const BatchPlan plan = plan_views(meta, g, kRatios, 128);
  const Tensor accepted = be.upload(
      Tensor::from_vector(b.accepted, {static_cast<int64_t>(b.accepted.size())}), DType::kI32);
  shift_carried_rows(be, b.planned, plan, accepted);
  return {read(be, meta), truth};
}

size_t max_blocks(const Batch& b) {
  size_t m = 1;
  for (const auto& t : b.tables) m = std::max(m, t.size());
  return m;
}

// The engine's host rule (engine/model_executor.cpp, verify_result): draft j of a row (its token
// j + 1) is accepted while it equals sample j and every draft before it was.
std::vector<int32_t> host_accepted(const std::vector<int32_t>& samples,
                                   const std::vector<int32_t>& tokens,
                                   const std::vector<int32_t>& starts) {
  std::vector<int32_t> out;
  for (size_t r = 0; r + 1 < starts.size(); ++r) {
    const int32_t drafts = starts[r + 1] - starts[r] - 1;
    int32_t a = 0;
    while (a < drafts && samples[starts[r] + a] == tokens[starts[r] + a + 1]) ++a;
    out.push_back(a);
  }
  return out;
}

TEST(AcceptDrafts, CountsWhatTheHostRuleAccepts) {
  const std::unique_ptr<Backend> be = make_cpu_backend(1);
  std::mt19937 rng(8);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> starts = {0};
    const int rows = 1 + trial % 17;
    for (int r = 0; r < rows; ++r)
      starts.push_back(starts.back() + std::uniform_int_distribution<int>(1, 6)(rng));
    const int64_t n = starts.back();
    // Three token values, so that runs of matches of every length come up.
    std::vector<int32_t> samples(static_cast<size_t>(n)), tokens(static_cast<size_t>(n));
    for (auto& v : samples) v = static_cast<int32_t>(rng() % 3);
    for (auto& v : tokens) v = static_cast<int32_t>(rng() % 3);
    auto up = [&](const std::vector<int32_t>& v) {
      return be->upload(Tensor::from_vector(v, {static_cast<int64_t>(v.size())}), DType::kI32);
    };
    const Tensor got = be->accept_drafts(up(samples), up(tokens), up(starts));
    ASSERT_EQ(read(*be, got), host_accepted(samples, tokens, starts)) << "trial " << trial;
  }
}

TEST(AcceptDrafts, BadRowStartsAreErrors) {
  const std::unique_ptr<Backend> be = make_cpu_backend(1);
  const Tensor five = be->upload(Tensor::from_vector(std::vector<int32_t>(5, 1), {5}), DType::kI32);
  const Tensor starts =
      be->upload(Tensor::from_vector(std::vector<int32_t>{0, 3, 2, 5}, {4}), DType::kI32);
  const std::string msg =
      error_message([&] { (void)be->to_host(be->accept_drafts(five, five, starts)); });
  EXPECT_NE(msg.find("row_start[2]"), std::string::npos) << msg;
  const Tensor four = be->upload(Tensor::from_vector(std::vector<int32_t>(4, 1), {4}), DType::kI32);
  EXPECT_NE(error_message([&] { (void)be->accept_drafts(five, four, starts); }).find("tokens"),
            std::string::npos);
}

TEST(RowShift, AnExactBatchMovesToWhatTheTruePositionsPack) {
  const std::unique_ptr<Backend> be = make_cpu_backend(1);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const Batch b = random_batch(rng, 1 + trial % 12, 6, 700);
    const LogitsMode mode = trial % 2 == 0 ? LogitsMode::kLast : LogitsMode::kAll;
    const BatchGeometry g = BatchGeometry::exact(b.planned, kRatios, max_blocks(b), mode);
    const auto [shifted, truth] = shifted_and_true(*be, b, g);
    ASSERT_EQ(shifted, truth) << "trial " << trial;
  }
}

TEST(RowShift, ARecordedDecodeBatchMovesToWhatTheTruePositionsPack) {
  const std::unique_ptr<Backend> be = make_cpu_backend(1);
  std::mt19937 rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    const int rows = 1 + trial % 8;
    const Batch b = random_batch(rng, rows, 1, 1900);
    const BatchGeometry g = BatchGeometry::padded(/*bucket=*/8, /*width=*/16, kRatios.size());
    const auto [shifted, truth] = shifted_and_true(*be, b, g);
    ASSERT_EQ(shifted, truth) << "trial " << trial;
  }
}

TEST(RowShift, ARecordedVerifyBatchMovesToWhatTheTruePositionsPack) {
  const std::unique_ptr<Backend> be = make_cpu_backend(1);
  const std::vector<int> buckets = DecodeGraphs::buckets_up_to(64);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const Batch b = random_batch(rng, 1 + trial % 20, 6, 1900);
    const DecodeGraphs::Shape shape = DecodeGraphs::shape_for(b.planned, buckets, max_blocks(b));
    const BatchGeometry g =
        BatchGeometry::padded_verify(shape.bucket, shape.row_tokens, shape.width, kRatios);
    const auto [shifted, truth] = shifted_and_true(*be, b, g);
    ASSERT_EQ(shifted, truth) << "trial " << trial;
  }
}

TEST(RowShift, NothingMovesWithoutAShiftingRow) {
  const std::unique_ptr<Backend> be = make_cpu_backend(1);
  std::mt19937 rng(6);
  Batch b = random_batch(rng, 5, 4, 700);
  for (ForwardRow& r : b.planned) r.shift_from = -1, r.max_shift = 0;
  const BatchGeometry g = BatchGeometry::exact(b.planned, kRatios, max_blocks(b), LogitsMode::kAll);
  EXPECT_FALSE(g.shift);
  std::vector<int32_t> host;
  pack_batch(b.planned, g, kRatios, 128, 0, host);
  const Tensor meta = be->upload(Tensor::from_vector(host, {g.size()}), DType::kI32);
  const BatchPlan plan = plan_views(meta, g, kRatios, 128);
  EXPECT_FALSE(plan.shift_from.defined());
  shift_carried_rows(*be, b.planned, plan, Tensor());  // no row moves: nothing to do
  EXPECT_EQ(read(*be, meta), host);
}

TEST(RowShift, BadMovesAreErrorsThatNameTheRow) {
  const std::unique_ptr<Backend> be = make_cpu_backend(1);
  std::mt19937 rng(7);
  Batch b = random_batch(rng, 3, 2, 700);
  for (ForwardRow& r : b.planned) {
    r.shift_from = 0;
    r.max_shift = 2;
    r.token_from_previous = 2;
  }
  b.accepted = {3};  // more than the plan assumed
  const BatchGeometry g = BatchGeometry::exact(b.planned, kRatios, max_blocks(b), LogitsMode::kAll);
  std::vector<int32_t> host;
  pack_batch(b.planned, g, kRatios, 128, 0, host);
  const Tensor meta = be->upload(Tensor::from_vector(host, {g.size()}), DType::kI32);
  const BatchPlan plan = plan_views(meta, g, kRatios, 128);
  const Tensor accepted = be->upload(Tensor::from_vector(b.accepted, {1}), DType::kI32);
  const std::string msg = error_message([&] {
    shift_carried_rows(*be, b.planned, plan, accepted);
    be->synchronize();
  });
  EXPECT_NE(msg.find("shift_rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("row 0"), std::string::npos) << msg;
  // The metadata is untouched.
  EXPECT_EQ(read(*be, meta), host);

  // The host checks the fields before anything is packed.
  CacheShape caches;
  caches.num_blocks = 1024;
  caches.num_state_slots = 8;
  ModelConfig config;
  config.max_position_embeddings = 1 << 20;
  auto validation_error = [&](const ForwardRow& row) {
    const std::vector<ForwardRow> rows = {row};
    return error_message([&] { validate_rows(rows, config, caches, false); });
  };
  ForwardRow bad = b.planned[0];
  bad.max_shift = 0;
  EXPECT_NE(validation_error(bad).find("'max_shift'"), std::string::npos) << validation_error(bad);
  bad.max_shift = 2;
  bad.start_pos = 1;
  EXPECT_NE(validation_error(bad).find("'start_pos'"), std::string::npos) << validation_error(bad);
  bad.start_pos = 100;
  bad.replay_end = 64;
  EXPECT_NE(validation_error(bad).find("replay_end"), std::string::npos) << validation_error(bad);
}

}  // namespace
}  // namespace deepinfer
