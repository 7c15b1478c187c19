// Rows of sample: greedy rows, temperature / top-k / top-p rows over many (seed, position) pairs,
// masked (-inf) and tied logits, and the top-N log-probabilities, at V = 1000 and V = 129280.
// Apart from the other ops because SamplingBatch is changing (position [B] i32): sampling_rows.h
// is the one place that uploads it.
//
// Tokens must be equal. The backends compute the same double-precision weights but sum them in
// different orders (and exp may differ by an ulp), so a token could legitimately differ only when
// u * mass lands within ~1e-16 relative of a cumulative-weight boundary; no random row here comes
// anywhere near that, so any mismatch is a bug.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cases.h"
#include "sampling_rows.h"

namespace deepinfer::backend_ops {
namespace {

struct SampleIn {
  Tensor logits;  // [rows, V]
  SamplingRows rows;
};

Outputs run_sample(Backend& be, const SampleIn& in) {
  const SampleResult r = be.sample(be.upload(in.logits, DType::kF32), in.rows.upload(be));
  Outputs outs = {{"tokens", r.tokens}, {"logprobs", r.logprobs}};
  if (in.rows.max_logprobs > 0) {
    outs.push_back({"top_ids", r.top_ids});
    outs.push_back({"top_logprobs", r.top_logprobs});
  }
  return outs;
}

void check_sample(const SampleIn& in, const Outputs& ref, const Outputs& dev) {
  const SamplingRows& h = in.rows;
  const int64_t rows = in.logits.size(0);
  const Tensor &tok_c = ref[0].value, &tok_g = dev[0].value;
  const Tensor &lp_c = ref[1].value, &lp_g = dev[1].value;
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t c = tok_c.data<int32_t>()[r], g = tok_g.data<int32_t>()[r];
    if (c != g) {
      ++mismatches;
      ADD_FAILURE() << "token differs at " << h.describe(r) << ": reference " << c << ", device "
                    << g;
      continue;
    }
    EXPECT_NEAR(lp_g.data<float>()[r], lp_c.data<float>()[r], 1e-5) << h.describe(r);
  }
  EXPECT_EQ(mismatches, 0) << "of " << rows << " rows";
  const int64_t cols = h.max_logprobs;
  if (cols == 0) return;
  const Tensor &id_c = ref[2].value, &id_g = dev[2].value;
  const Tensor &tl_c = ref[3].value, &tl_g = dev[3].value;
  ASSERT_EQ(id_g.shape(), (Shape{rows, cols}));
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(id_g.data<int32_t>()[i], id_c.data<int32_t>()[i])
        << "top id, " << h.describe(i / cols) << " column " << i % cols;
    const float c = tl_c.data<float>()[i], g = tl_g.data<float>()[i];
    if (std::isinf(c)) {
      EXPECT_EQ(c, g) << "top logprob padding, " << h.describe(i / cols);
    } else {
      EXPECT_NEAR(g, c, 1e-5) << "top logprob, " << h.describe(i / cols) << " column " << i % cols;
    }
  }
}

void add_sample(std::vector<OpCase>& t, const std::string& label,
                std::function<SampleIn(Rng&)> draw) {
  add(t, Case<SampleIn>{
             .op = "sample",
             .label = label,
             .draw = std::move(draw),
             .run = run_sample,
             .expect = check_sample,
         });
}

// One batch of random rows: parameters drawn from lists that cover greedy, plain, top-k (off,
// negative, larger than V), top-p, and extreme temperatures; max_logprobs 0 or 6.
SampleIn random_rows(Rng& rng, int64_t vocab, int rows, int max_logprobs) {
  std::mt19937_64 rng64(rng());
  const float temps[] = {0.0f, 0.6f, 1.0f, 1.0f, 1.7f, 25.0f};
  const int32_t top_ks[] = {0, 0, 1, 7, 50, 300, -3, static_cast<int32_t>(vocab + 5)};
  const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.8f, 0.5f, 0.05f};
  const RowKind kinds[] = {RowKind::kNormal, RowKind::kNormal, RowKind::kTied, RowKind::kMasked,
                           RowKind::kFlat};
  SampleIn in{Tensor::zeros({rows, vocab}, DType::kF32), {}};
  in.rows.max_logprobs = max_logprobs;
  for (int r = 0; r < rows; ++r) {
    fill_logits_row(in.logits.data<float>() + int64_t{r} * vocab, vocab, kinds[rng() % 5], rng);
    const int32_t n = max_logprobs == 0 ? 0 : static_cast<int32_t>(rng() % 7);
    const float temp = temps[rng() % 6];
    const int32_t k = top_ks[rng() % 8];
    const float p = top_ps[rng() % 6];
    const auto seed = static_cast<int64_t>(rng64());
    in.rows.add(temp, k, p, seed, static_cast<int64_t>(rng64() % 1000000), n);
  }
  return in;
}

// Greedy: argmax with the lowest id on ties, exactly as the reference, with and without
// log-probs.
SampleIn greedy_rows(Rng& rng, int64_t vocab) {
  const int rows = 9;
  SampleIn in{Tensor::zeros({rows, vocab}, DType::kF32), {}};
  in.rows.max_logprobs = 4;
  for (int r = 0; r < rows; ++r) {
    float* row = in.logits.data<float>() + r * vocab;
    fill_logits_row(row, vocab, r % 3 == 0 ? RowKind::kTied : RowKind::kNormal, rng);
    if (r % 3 == 1 && vocab > 10) {
      // A tie at the maximum, the lower id placed later in memory order of the threads.
      row[vocab - 1] = 100.0f;
      row[vocab / 2 + 1] = 100.0f;
      row[3] = -0.0f;
      row[4] = 0.0f;
    }
    in.rows.add(0.0f, r % 2 == 0 ? 5 : 0, 0.5f, static_cast<int64_t>(rng()), r, r % 5);
  }
  return in;
}

// Rows whose candidates are all tied or mostly masked: the rank order's tie rule decides.
SampleIn tied_and_masked_rows(Rng& rng) {
  const int64_t vocab = 3000;
  const int rows = 64;
  SampleIn in{Tensor::zeros({rows, vocab}, DType::kF32), {}};
  in.rows.max_logprobs = 5;
  for (int r = 0; r < rows; ++r) {
    float* row = in.logits.data<float>() + r * vocab;
    for (int64_t v = 0; v < vocab; ++v) row[v] = static_cast<float>(rng() % 4);  // 4 levels
    if (r % 4 == 3) {
      for (int64_t v = 0; v < vocab; ++v) {
        if (v % 7 != 0) row[v] = -std::numeric_limits<float>::infinity();
      }
    }
    in.rows.add(r % 2 == 0 ? 1.0f : 3.0f, (r / 2) % 3 == 0 ? 0 : 100 + r, r % 3 == 0 ? 1.0f : 0.3f,
                static_cast<int64_t>(rng()), r * 11, 5);
  }
  return in;
}

}  // namespace

std::vector<OpCase> sample_cases() {
  std::vector<OpCase> t;
  // Batches of random rows: 12 of 64 rows at V = 1000, 3 of 48 rows at the V4 vocabulary.
  for (int call = 0; call < 12; ++call) {
    const int n = call % 3 == 0 ? 0 : 6;
    add_sample(t, "random_v1000_b64_n" + std::to_string(n) + "_" + std::to_string(call),
               [n](Rng& rng) { return random_rows(rng, 1000, 64, n); });
  }
  for (int call = 0; call < 3; ++call) {
    const int n = call % 3 == 0 ? 0 : 6;
    add_sample(t, "random_v129280_b48_n" + std::to_string(n) + "_" + std::to_string(call),
               [n](Rng& rng) { return random_rows(rng, kVocab, 48, n); });
  }
  for (const int64_t vocab : {1, 7, 1000, 129280}) {
    add_sample(t, "greedy_v" + std::to_string(vocab),
               [vocab](Rng& rng) { return greedy_rows(rng, vocab); });
  }
  add_sample(t, "ties_and_masks_v3000", tied_and_masked_rows);
  return t;
}

}  // namespace deepinfer::backend_ops
