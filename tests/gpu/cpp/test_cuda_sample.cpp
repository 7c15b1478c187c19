// CUDA sample against the CPU reference op (sample::sample_row): greedy rows, temperature /
// top-k / top-p rows over many (seed, position) pairs, masked (-inf) and tied logits, and the
// top-N log-probabilities, at V = 1000 and V = 129280.
//
// Tokens must be equal. The two backends compute the same double-precision weights but sum them
// in different orders (and exp may differ by an ulp), so a token could legitimately differ only
// when u * mass lands within ~1e-16 relative of a cumulative-weight boundary; no random case
// here comes anywhere near that, so any mismatch is a bug.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace deepinfer::gpu_test {
namespace {

size_t sz(int64_t i) {
  return static_cast<size_t>(i);
}

struct HostBatch {
  std::vector<float> temperature;
  std::vector<int32_t> top_k;
  std::vector<float> top_p;
  std::vector<int64_t> seed;
  std::vector<int64_t> position;
  std::vector<int32_t> num_logprobs;
  int max_logprobs = 0;

  int64_t rows() const { return static_cast<int64_t>(temperature.size()); }
  void add(float t, int32_t k, float p, int64_t s, int64_t pos, int32_t n) {
    temperature.push_back(t);
    top_k.push_back(k);
    top_p.push_back(p);
    seed.push_back(s);
    position.push_back(pos);
    num_logprobs.push_back(n);
  }
};

SamplingBatch upload_batch(Backend& be, const HostBatch& h) {
  const int64_t n = h.rows();
  SamplingBatch s;
  s.num_rows = static_cast<int>(n);
  s.max_logprobs = h.max_logprobs;
  s.temperature = be.upload(Tensor::from_vector(h.temperature, {n}), DType::kF32);
  s.top_k = be.upload(Tensor::from_vector(h.top_k, {n}), DType::kI32);
  s.top_p = be.upload(Tensor::from_vector(h.top_p, {n}), DType::kF32);
  s.seed = be.upload(Tensor::from_vector(h.seed, {n}), DType::kI64);
  s.position = be.upload(Tensor::from_vector(h.position, {n}), DType::kI32);  // [B] i32
  s.num_logprobs = be.upload(Tensor::from_vector(h.num_logprobs, {n}), DType::kI32);
  return s;
}

std::string row_params(const HostBatch& h, int64_t r) {
  const size_t i = sz(r);
  return "row " + std::to_string(r) + " (T " + std::to_string(h.temperature[i]) + ", top_k " +
         std::to_string(h.top_k[i]) + ", top_p " + std::to_string(h.top_p[i]) + ", seed " +
         std::to_string(h.seed[i]) + ", position " + std::to_string(h.position[i]) + ", N " +
         std::to_string(h.num_logprobs[i]) + ")";
}

// Runs both backends on the same logits [rows, V] and compares every output.
void compare_sample(Backends& b, const Tensor& logits, const HostBatch& h) {
  const int64_t rows = logits.size(0);
  Tensor lc = b.cpu->upload(logits, DType::kF32);
  Tensor lg = b.cuda->upload(logits, DType::kF32);
  SampleResult rc = b.cpu->sample(lc, upload_batch(*b.cpu, h));
  SampleResult rg;
  {
    HostSyncForbidden guard(*b.cuda);
    rg = b.cuda->sample(lg, upload_batch(*b.cuda, h));
  }
  Tensor tok_c = b.cpu->to_host(rc.tokens), tok_g = b.cuda->to_host(rg.tokens);
  Tensor lp_c = b.cpu->to_host(rc.logprobs), lp_g = b.cuda->to_host(rg.logprobs);
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t c = tok_c.data<int32_t>()[r], g = tok_g.data<int32_t>()[r];
    if (c != g) {
      ++mismatches;
      ADD_FAILURE() << "token differs at " << row_params(h, r) << ": cpu " << c << ", cuda " << g;
      continue;
    }
    EXPECT_NEAR(lp_g.data<float>()[r], lp_c.data<float>()[r], 1e-5) << row_params(h, r);
  }
  EXPECT_EQ(mismatches, 0) << "of " << rows << " rows";
  const int64_t cols = h.max_logprobs;
  if (cols == 0) return;
  Tensor id_c = b.cpu->to_host(rc.top_ids), id_g = b.cuda->to_host(rg.top_ids);
  Tensor tl_c = b.cpu->to_host(rc.top_logprobs), tl_g = b.cuda->to_host(rg.top_logprobs);
  ASSERT_EQ(id_g.shape(), (Shape{rows, cols}));
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(id_g.data<int32_t>()[i], id_c.data<int32_t>()[i])
        << "top id, " << row_params(h, i / cols) << " column " << i % cols;
    const float c = tl_c.data<float>()[i], g = tl_g.data<float>()[i];
    if (std::isinf(c)) {
      EXPECT_EQ(c, g) << "top logprob padding, " << row_params(h, i / cols);
    } else {
      EXPECT_NEAR(g, c, 1e-5) << "top logprob, " << row_params(h, i / cols) << " column "
                              << i % cols;
    }
  }
}

enum class RowKind { kNormal, kTied, kMasked, kFlat };

// Random logits of one row: N(0, sigma) with variations that exercise ties (values on a coarse
// grid), masked tokens (-inf) and nearly flat rows (draws deep in the rank order).
void fill_row(float* row, int64_t vocab, RowKind kind, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, kind == RowKind::kFlat ? 0.05f : 3.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int64_t v = 0; v < vocab; ++v) {
    float x = normal(rng);
    if (kind == RowKind::kTied) x = std::round(x * 2.0f) / 2.0f;
    if (kind == RowKind::kMasked && unit(rng) < 0.7f) x = -std::numeric_limits<float>::infinity();
    row[v] = x;
  }
  if (kind == RowKind::kMasked) row[rng() % sz(vocab)] = 1.0f;  // at least one finite logit
}

void run_random_rows(int64_t vocab, int calls, int rows_per_call, uint32_t seed) {
  SCOPED_TRACE("V " + std::to_string(vocab));
  Backends b;
  std::mt19937 rng(seed);
  std::mt19937_64 rng64(seed);
  const float temps[] = {0.0f, 0.6f, 1.0f, 1.0f, 1.7f, 25.0f};
  const int32_t top_ks[] = {0, 0, 1, 7, 50, 300, -3, static_cast<int32_t>(vocab + 5)};
  const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.8f, 0.5f, 0.05f};
  const RowKind kinds[] = {RowKind::kNormal, RowKind::kNormal, RowKind::kTied, RowKind::kMasked,
                           RowKind::kFlat};
  for (int call = 0; call < calls; ++call) {
    HostBatch h;
    h.max_logprobs = call % 3 == 0 ? 0 : 6;
    Tensor logits = Tensor::zeros({rows_per_call, vocab}, DType::kF32);
    for (int r = 0; r < rows_per_call; ++r) {
      fill_row(logits.data<float>() + int64_t{r} * vocab, vocab, kinds[rng() % 5], rng);
      const int32_t n = h.max_logprobs == 0 ? 0 : static_cast<int32_t>(rng() % 7);
      h.add(temps[rng() % 6], top_ks[rng() % 8], top_ps[rng() % 6], static_cast<int64_t>(rng64()),
            static_cast<int64_t>(rng64() % 1000000), n);
    }
    compare_sample(b, logits, h);
  }
}

TEST(CudaSample, RandomRowsMatchCpuSmallVocab) {
  DEEPINFER_REQUIRE_GPU();
  run_random_rows(1000, 12, 64, 31);
}

TEST(CudaSample, RandomRowsMatchCpuV4Vocab) {
  DEEPINFER_REQUIRE_GPU();
  run_random_rows(129280, 3, 48, 32);
}

// One request's token must not depend on its batch: the same row alone and inside a batch.
TEST(CudaSample, RowIndependentOfBatch) {
  DEEPINFER_REQUIRE_GPU();
  Backends b;
  std::mt19937 rng(33);
  const int64_t vocab = 5000;
  Tensor logits = Tensor::zeros({16, vocab}, DType::kF32);
  for (int r = 0; r < 16; ++r)
    fill_row(logits.data<float>() + r * vocab, vocab, RowKind::kNormal, rng);
  HostBatch all;
  for (int r = 0; r < 16; ++r) all.add(0.9f, 0, 0.9f, 1234, 77, 0);
  Tensor batched = b.cuda->to_host(
      b.cuda->sample(b.cuda->upload(logits, DType::kF32), upload_batch(*b.cuda, all)).tokens);
  for (int r = 0; r < 16; r += 5) {
    HostBatch one;
    one.add(0.9f, 0, 0.9f, 1234, 77, 0);
    Tensor row = logits.narrow(0, r, 1).contiguous();
    Tensor alone = b.cuda->to_host(
        b.cuda->sample(b.cuda->upload(row, DType::kF32), upload_batch(*b.cuda, one)).tokens);
    EXPECT_EQ(alone.data<int32_t>()[0], batched.data<int32_t>()[r]) << "row " << r;
  }
}

// Greedy: argmax with the lowest id on ties, exactly as the CPU, with and without log-probs.
TEST(CudaSample, GreedyMatchesCpuExactly) {
  DEEPINFER_REQUIRE_GPU();
  Backends b;
  std::mt19937 rng(34);
  for (int64_t vocab : {1, 7, 1000, 129280}) {
    SCOPED_TRACE("V " + std::to_string(vocab));
    const int rows = 9;
    Tensor logits = Tensor::zeros({rows, vocab}, DType::kF32);
    HostBatch h;
    h.max_logprobs = 4;
    for (int r = 0; r < rows; ++r) {
      float* row = logits.data<float>() + r * vocab;
      fill_row(row, vocab, r % 3 == 0 ? RowKind::kTied : RowKind::kNormal, rng);
      if (r % 3 == 1 && vocab > 10) {
        // A tie at the maximum, the lower id placed later in memory order of the threads.
        row[vocab - 1] = 100.0f;
        row[vocab / 2 + 1] = 100.0f;
        row[3] = -0.0f;
        row[4] = 0.0f;
      }
      h.add(0.0f, r % 2 == 0 ? 5 : 0, 0.5f, static_cast<int64_t>(rng()), r, r % 5);
    }
    compare_sample(b, logits, h);
  }
}

// Rows whose candidates are all tied or mostly masked: the rank order's tie rule decides.
TEST(CudaSample, TiesAndMasksMatchCpu) {
  DEEPINFER_REQUIRE_GPU();
  Backends b;
  std::mt19937 rng(35);
  const int64_t vocab = 3000;
  const int rows = 64;
  Tensor logits = Tensor::zeros({rows, vocab}, DType::kF32);
  HostBatch h;
  h.max_logprobs = 5;
  for (int r = 0; r < rows; ++r) {
    float* row = logits.data<float>() + r * vocab;
    for (int64_t v = 0; v < vocab; ++v) row[v] = static_cast<float>(rng() % 4);  // 4 levels
    if (r % 4 == 3) {
      for (int64_t v = 0; v < vocab; ++v) {
        if (v % 7 != 0) row[v] = -std::numeric_limits<float>::infinity();
      }
    }
    h.add(r % 2 == 0 ? 1.0f : 3.0f, (r / 2) % 3 == 0 ? 0 : 100 + r, r % 3 == 0 ? 1.0f : 0.3f,
          static_cast<int64_t>(rng()), r * 11, 5);
  }
  compare_sample(b, logits, h);
}

}  // namespace
}  // namespace deepinfer::gpu_test
