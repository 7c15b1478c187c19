// CPU backend: sample (against sample::sample_row row by row, and independent of batch
// composition), select_tokens and copy_rows, including content errors surfacing at synchronize().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "sample/sampler.h"

namespace deepinfer {
namespace {

using testing::fetch_f32;
using testing::fetch_i32;
using testing::sz;

constexpr float kInf = std::numeric_limits<float>::infinity();

// One request's row of a sampling batch: its logits and its parameters.
struct Row {
  std::vector<float> logits;
  sample::RowParams params;
};

// A batch of rows on the device.
struct DeviceBatch {
  Tensor logits;  // [B, V]
  SamplingBatch params;
};

class CpuSampleOpsTest : public testing::BackendTest {
 protected:
  static constexpr int64_t kVocab = 3000;

  std::vector<Row> make_rows() {
    const float temperature[] = {0.0f, 0.5f, 1.0f, 1.3f, 0.8f, 1.0f, 2.0f};
    const int top_k[] = {0, 0, 20, 0, 5, 1, 0};
    const float top_p[] = {1.0f, 0.9f, 1.0f, 0.5f, 0.95f, 1.0f, 0.7f};
    const int num_logprobs[] = {0, 3, 5, 1, 0, 5, 2};
    std::vector<Row> rows;
    for (size_t b = 0; b < 7; ++b) {
      Row r;
      r.logits = rng.uniform(sz(kVocab), -4.0f, 4.0f);
      r.params.temperature = temperature[b];
      r.params.top_k = top_k[b];
      r.params.top_p = top_p[b];
      r.params.seed = 1000 + b * 7919;
      r.params.position = static_cast<int64_t>(b * 13 + 5);
      r.params.num_logprobs = num_logprobs[b];
      rows.push_back(std::move(r));
    }
    return rows;
  }

  DeviceBatch upload(const std::vector<Row>& rows, int max_logprobs) {
    const auto b = static_cast<int64_t>(rows.size());
    std::vector<float> logits, temperature, top_p;
    std::vector<int32_t> top_k, num_logprobs, position;
    std::vector<int64_t> seed;
    for (const Row& r : rows) {
      logits.insert(logits.end(), r.logits.begin(), r.logits.end());
      temperature.push_back(r.params.temperature);
      top_k.push_back(r.params.top_k);
      top_p.push_back(r.params.top_p);
      seed.push_back(static_cast<int64_t>(r.params.seed));
      position.push_back(static_cast<int32_t>(r.params.position));
      num_logprobs.push_back(r.params.num_logprobs);
    }
    SamplingBatch batch;
    batch.num_rows = static_cast<int>(b);
    batch.max_logprobs = max_logprobs;
    batch.temperature = up(temperature, {b});
    batch.top_k = up_i(top_k, {b});
    batch.top_p = up(top_p, {b});
    batch.seed = be->upload(Tensor::from_vector<int64_t>(seed, {b}), DType::kI64);
    batch.position = up_i(position, {b});
    batch.num_logprobs = up_i(num_logprobs, {b});
    return {up(logits, {b, kVocab}), batch};
  }
};

TEST_F(CpuSampleOpsTest, SampleMatchesSampleRowPerRow) {
  const std::vector<Row> rows = make_rows();
  constexpr int kCols = 6;
  const DeviceBatch in = upload(rows, kCols);
  const SampleResult out = be->sample(in.logits, in.params);
  const std::vector<int32_t> tokens = fetch_i32(*be, out.tokens);
  const std::vector<float> logprobs = fetch_f32(*be, out.logprobs);
  const std::vector<int32_t> top_ids = fetch_i32(*be, out.top_ids);
  const std::vector<float> top_lps = fetch_f32(*be, out.top_logprobs);
  ASSERT_EQ(top_ids.size(), rows.size() * kCols);
  for (size_t b = 0; b < rows.size(); ++b) {
    const sample::RowResult want = sample::sample_row(rows[b].logits, rows[b].params);
    EXPECT_EQ(tokens[b], want.token) << "row " << b;
    EXPECT_EQ(logprobs[b], want.logprob) << "row " << b;
    for (size_t c = 0; c < kCols; ++c) {
      if (c < want.top.size()) {
        EXPECT_EQ(top_ids[b * kCols + c], want.top[c].first) << "row " << b << " col " << c;
        EXPECT_EQ(top_lps[b * kCols + c], want.top[c].second) << "row " << b << " col " << c;
      } else {
        EXPECT_EQ(top_ids[b * kCols + c], -1) << "row " << b << " col " << c;
        EXPECT_EQ(top_lps[b * kCols + c], -kInf) << "row " << b << " col " << c;
      }
    }
  }
  // Greedy row, for good measure.
  EXPECT_EQ(tokens[0], std::max_element(rows[0].logits.begin(), rows[0].logits.end()) -
                           rows[0].logits.begin());
}

TEST_F(CpuSampleOpsTest, SampleDoesNotDependOnBatchComposition) {
  const std::vector<Row> rows = make_rows();
  const DeviceBatch in = upload(rows, 5);
  const std::vector<int32_t> want = fetch_i32(*be, be->sample(in.logits, in.params).tokens);

  // Same rows, reversed and rotated.
  std::vector<size_t> perm(rows.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::reverse(perm.begin(), perm.end());
  std::rotate(perm.begin(), perm.begin() + 2, perm.end());
  std::vector<Row> permuted;
  for (size_t i : perm) permuted.push_back(rows[i]);
  const DeviceBatch perm_in = upload(permuted, 5);
  const std::vector<int32_t> got =
      fetch_i32(*be, be->sample(perm_in.logits, perm_in.params).tokens);
  for (size_t i = 0; i < perm.size(); ++i) EXPECT_EQ(got[i], want[perm[i]]) << "row " << perm[i];

  // A subset of the rows batched with unrelated ones.
  std::vector<Row> mixed = {rows[3], make_rows()[0], rows[5], rows[1]};
  mixed[1].logits = rng.uniform(sz(kVocab));
  const DeviceBatch mixed_in = upload(mixed, 5);
  const std::vector<int32_t> mgot =
      fetch_i32(*be, be->sample(mixed_in.logits, mixed_in.params).tokens);
  EXPECT_EQ(mgot[0], want[3]);
  EXPECT_EQ(mgot[2], want[5]);
  EXPECT_EQ(mgot[3], want[1]);
}

TEST_F(CpuSampleOpsTest, SampleWithoutLogprobColumns) {
  std::vector<Row> rows = make_rows();
  for (Row& r : rows) r.params.num_logprobs = 0;
  const DeviceBatch in = upload(rows, 0);
  const SampleResult out = be->sample(in.logits, in.params);
  EXPECT_FALSE(out.top_ids.defined());
  EXPECT_FALSE(out.top_logprobs.defined());
  const std::vector<int32_t> tokens = fetch_i32(*be, out.tokens);
  for (size_t b = 0; b < rows.size(); ++b) {
    EXPECT_EQ(tokens[b], sample::sample_row(rows[b].logits, rows[b].params).token);
  }
}

TEST_F(CpuSampleOpsTest, SampleMetadataErrorsThrowOnTheCallingThread) {
  const std::vector<Row> rows = make_rows();
  const DeviceBatch in = upload(rows, 5);
  SamplingBatch bad = in.params;
  bad.num_rows = 6;
  expect_error([&] { be->sample(in.logits, bad); }, ErrorCode::kInvalidArgument, "num_rows");
  bad = in.params;
  bad.seed = up_i(std::vector<int32_t>(rows.size(), 0), {static_cast<int64_t>(rows.size())});
  expect_error([&] { be->sample(in.logits, bad); }, ErrorCode::kInvalidArgument, "batch.seed");
  bad = in.params;
  bad.position = be->upload(Tensor::from_vector<int64_t>(std::vector<int64_t>(rows.size(), 0),
                                                         {static_cast<int64_t>(rows.size())}),
                            DType::kI64);
  expect_error([&] { be->sample(in.logits, bad); }, ErrorCode::kInvalidArgument,
               "argument batch.position must be i32[7]");
  bad = in.params;
  bad.max_logprobs = -1;
  expect_error([&] { be->sample(in.logits, bad); }, ErrorCode::kInvalidArgument, "max_logprobs");
  bad = in.params;
  bad.top_p = Tensor();
  expect_error([&] { be->sample(in.logits, bad); }, ErrorCode::kInvalidArgument, "batch.top_p");
}

TEST_F(CpuSampleOpsTest, SampleContentErrorsSurfaceAtSynchronize) {
  std::vector<Row> rows = make_rows();
  {
    const DeviceBatch in = upload(rows, 4);  // row 2 asks for 5 log-probabilities
    be->sample(in.logits, in.params);
    expect_error([&] { be->synchronize(); }, ErrorCode::kInvalidArgument,
                 "batch.num_logprobs[2] = 5");
  }
  rows[4].params.temperature = -1.0f;
  {
    const DeviceBatch in = upload(rows, 5);
    be->sample(in.logits, in.params);
    expect_error([&] { be->synchronize(); }, ErrorCode::kInvalidArgument, "sample: row 4");
  }
  EXPECT_NO_THROW(be->synchronize());
}

// ---- select_tokens -----------------------------------------------------------------------------

TEST_F(CpuSampleOpsTest, SelectTokensPatchesRemappedRowsInPlace) {
  Tensor tokens = up_i({10, 11, 12, 13, 14}, {5});
  void* addr = tokens.raw_data();
  Tensor remap = up_i({-1, 1, -1, 0, 1}, {5});
  Tensor previous = up_i({100, 101}, {2});
  be->select_tokens(tokens, remap, previous);
  EXPECT_EQ(fetch_i32(*be, tokens), (std::vector<int32_t>{10, 101, 12, 100, 101}));
  EXPECT_EQ(tokens.raw_data(), addr);
  EXPECT_EQ(fetch_i32(*be, previous), (std::vector<int32_t>{100, 101}));
  // Stream order: a patch enqueued after an upload_into sees the new tokens, and the rows with
  // remap -1 keep them.
  be->upload_into(tokens, testing::host_i32({20, 21, 22, 23, 24}, {5}));
  be->select_tokens(tokens, up_i({0, -1, -1, -1, -1}, {5}), previous);
  EXPECT_EQ(fetch_i32(*be, tokens), (std::vector<int32_t>{100, 21, 22, 23, 24}));
  // No previous step: nothing changes.
  be->select_tokens(tokens, up_i({-1, -1, -1, -1, -1}, {5}), be->zeros({0}, DType::kI32));
  EXPECT_EQ(fetch_i32(*be, tokens), (std::vector<int32_t>{100, 21, 22, 23, 24}));
  // A view patches only its own rows.
  be->select_tokens(tokens.narrow(0, 3, 2), up_i({1, 0}, {2}), previous);
  EXPECT_EQ(fetch_i32(*be, tokens), (std::vector<int32_t>{100, 21, 22, 101, 100}));
  EXPECT_NO_THROW(
      be->select_tokens(be->zeros({0}, DType::kI32), be->zeros({0}, DType::kI32), previous));
  EXPECT_NO_THROW(be->synchronize());
}

TEST_F(CpuSampleOpsTest, SelectTokensErrors) {
  Tensor tokens = up_i({10, 11}, {2});
  Tensor previous = up_i({100, 101}, {2});
  expect_error([&] { be->select_tokens(tokens, up_i({0}, {1}), previous); },
               ErrorCode::kInvalidArgument, "argument remap must be i32[2]");
  expect_error(
      [&] {
        be->select_tokens(tokens, up({0, 0}, {2}), previous);
      },
      ErrorCode::kInvalidArgument, "remap");
  expect_error(
      [&] {
        be->select_tokens(up({10, 11}, {2}), up_i({0, 1}, {2}), previous);
      },
      ErrorCode::kInvalidArgument, "argument tokens must be i32[*]");
  // A remap past `previous` fails on the stream and leaves every token as it was.
  expect_error(
      [&] {
        be->select_tokens(tokens, up_i({0, 2}, {2}), previous);
      },
      ErrorCode::kInvalidArgument, "remap[1] = 2");
  EXPECT_EQ(fetch_i32(*be, tokens), (std::vector<int32_t>{10, 11}));
  EXPECT_NO_THROW(be->synchronize());
}

// ---- adjust_logits -----------------------------------------------------------------------------

TEST_F(CpuSampleOpsTest, AdjustLogitsAddsEntriesThenMasks) {
  // 2 rows of 40 tokens (2 mask words each).
  std::vector<float> host(80);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  Tensor logits = up(host, {2, 40});
  LogitAdjustments a;
  a.rows = up_i({0, 1, 1}, {3});
  a.tokens = up_i({3, 0, 39}, {3});
  a.values = up({10.0f, -2.0f, 1.5f}, {3});
  be->adjust_logits(logits, a);
  std::vector<float> expect = host;
  expect[3] += 10.0f;
  expect[40] -= 2.0f;
  expect[79] += 1.5f;
  EXPECT_EQ(fetch_f32(*be, logits), expect);
  // Row 0 allows tokens 0 and 35; row 1 allows everything.
  LogitAdjustments mask;
  mask.allowed = up_i({1, 1 << 3, -1, -1}, {2, 2});
  be->adjust_logits(logits, mask);
  const std::vector<float> got = fetch_f32(*be, logits);
  for (int t = 0; t < 40; ++t) {
    if (t == 0 || t == 35) {
      EXPECT_EQ(got[t], expect[t]) << t;
    } else {
      EXPECT_EQ(got[t], -std::numeric_limits<float>::infinity()) << t;
    }
    EXPECT_EQ(got[40 + t], expect[40 + t]) << t;
  }
  EXPECT_NO_THROW(be->synchronize());
}

TEST_F(CpuSampleOpsTest, AdjustLogitsErrors) {
  Tensor logits = up({1.0f, 2.0f, 3.0f}, {1, 3});
  LogitAdjustments a;
  a.rows = up_i({0}, {1});
  a.tokens = up_i({0, 1}, {2});
  a.values = up({1.0f}, {1});
  expect_error([&] { be->adjust_logits(logits, a); }, ErrorCode::kInvalidArgument,
               "adjust_logits: argument adjustments.tokens must be i32[1]");
  LogitAdjustments m;
  m.allowed = up_i({1, 1}, {1, 2});
  expect_error([&] { be->adjust_logits(logits, m); }, ErrorCode::kInvalidArgument,
               "argument adjustments.allowed must be i32[1, 1]");
  // An entry outside the logits fails on the stream and changes nothing.
  a.tokens = up_i({3}, {1});
  expect_error(
      [&] {
        be->adjust_logits(logits, a);
        be->synchronize();
      },
      ErrorCode::kInvalidArgument, "entry 0 (row 0, token 3) is outside logits [1, 3]");
  EXPECT_EQ(fetch_f32(*be, logits), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_NO_THROW(be->synchronize());
}

// ---- copy_rows ---------------------------------------------------------------------------------

TEST_F(CpuSampleOpsTest, CopyRowsCopiesWholeRows) {
  const std::vector<float> init = rng.uniform(5 * 2 * 3);
  Tensor t = up(init, {5, 2, 3});
  // Row 0 is copied twice (a snapshot restored into two slots); rows 1 -> 4 too.
  be->copy_rows(t, up_i({0, 1, 0}, {3}), up_i({2, 4, 3}, {3}));
  const std::vector<float> got = fetch_f32(*be, t);
  const int src_of[] = {0, 1, 0, 0, 1};
  for (size_t r = 0; r < 5; ++r) {
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(got[r * 6 + i], init[sz(src_of[r]) * 6 + i]) << "row " << r;
    }
  }
}

TEST_F(CpuSampleOpsTest, CopyRowsHandlesAnyDtype) {
  Tensor ids = be->upload(Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {3, 2}), DType::kI64);
  be->copy_rows(ids, up_i({2}, {1}), up_i({0}, {1}));
  const Tensor h = be->to_host(ids);
  const int64_t* p = h.data<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(p, p + 6), (std::vector<int64_t>{5, 6, 3, 4, 5, 6}));

  Tensor bf = be->upload(testing::host_f32({1.5f, 2.5f, -3.0f, 4.0f}, {4}), DType::kBF16);
  be->copy_rows(bf, up_i({3, 2}, {2}), up_i({0, 1}, {2}));
  EXPECT_EQ(fetch_f32(*be, be->upload(be->to_host(bf), DType::kF32)),
            (std::vector<float>{4.0f, -3.0f, -3.0f, 4.0f}));

  // Nothing to copy is fine.
  be->copy_rows(bf, be->zeros({0}, DType::kI32), be->zeros({0}, DType::kI32));
  EXPECT_NO_THROW(be->synchronize());
}

TEST_F(CpuSampleOpsTest, CopyRowsRejectsBadIndicesAtSynchronize) {
  Tensor t = up(rng.uniform(4 * 3), {4, 3});
  be->copy_rows(t, up_i({0, 1}, {2}), up_i({2, 7}, {2}));
  expect_error([&] { be->synchronize(); }, ErrorCode::kInvalidArgument, "dst[1] = 7");
  be->copy_rows(t, up_i({-1}, {1}), up_i({2}, {1}));
  expect_error([&] { be->synchronize(); }, ErrorCode::kInvalidArgument, "src[0] = -1");
  // A row that is read and written: the result would depend on the copy order.
  be->copy_rows(t, up_i({0, 2}, {2}), up_i({2, 3}, {2}));
  expect_error([&] { be->synchronize(); }, ErrorCode::kInvalidArgument,
               "row 2 is both a source (src[1]) and a destination (dst[0])");
  be->copy_rows(t, up_i({1}, {1}), up_i({1}, {1}));
  expect_error([&] { be->synchronize(); }, ErrorCode::kInvalidArgument, "row 1 is both");
  be->copy_rows(t, up_i({0, 1}, {2}), up_i({3, 3}, {2}));
  expect_error([&] { be->synchronize(); }, ErrorCode::kInvalidArgument,
               "row 3 is a destination twice (dst[0] and dst[1])");
  EXPECT_NO_THROW(be->synchronize());
}

TEST_F(CpuSampleOpsTest, CopyRowsMetadataErrorsThrowOnTheCallingThread) {
  Tensor t = up(rng.uniform(4 * 3), {4, 3});
  expect_error(
      [&] {
        be->copy_rows(t, up_i({0, 1}, {2}), up_i({2}, {1}));
      },
      ErrorCode::kInvalidArgument, "dst");
  expect_error([&] { be->copy_rows(t, up({0}, {1}), up_i({2}, {1})); }, ErrorCode::kInvalidArgument,
               "src");
  expect_error([&] { be->copy_rows(up({1.0f}, {}), up_i({0}, {1}), up_i({0}, {1})); },
               ErrorCode::kInvalidArgument, "at least one dimension");
  expect_error([&] { be->copy_rows(t.narrow(1, 0, 2), up_i({0}, {1}), up_i({1}, {1})); },
               ErrorCode::kInvalidArgument, "contiguous");
}

}  // namespace
}  // namespace deepinfer
