// Helpers shared by the CPU backend tests: random inputs, host tensors, batch layouts and
// tolerance checks against double-precision references.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "deepinfer/tensor.h"

namespace deepinfer::testing {

// Index conversion for test loops that count in int64_t.
inline size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

// Bit-for-bit equality of two float vectors (-0 differs from +0; NaNs compare by payload). An
// empty vector's data() may be null, which memcmp must not be given even for zero bytes.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

class Rng {
 public:
  explicit Rng(uint32_t seed) : gen_(seed) {}
  std::vector<float> uniform(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen_);
    return v;
  }
  // Small integers: products and sums stay exact in fp32, so ties are exact too.
  std::vector<float> integers(size_t n, int lo, int hi) {
    std::uniform_int_distribution<int> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(dist(gen_));
    return v;
  }
  int range(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen_); }
  std::mt19937& engine() { return gen_; }

 private:
  std::mt19937 gen_;
};

inline Tensor host_f32(const std::vector<float>& v, Shape shape) {
  return Tensor::from_vector<float>(v, std::move(shape));
}
inline Tensor host_i32(const std::vector<int32_t>& v, Shape shape) {
  return Tensor::from_vector<int32_t>(v, std::move(shape));
}

inline std::vector<float> fetch_f32(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  EXPECT_EQ(h.dtype(), DType::kF32);
  const float* p = h.data<float>();
  return std::vector<float>(p, p + h.numel());
}
inline std::vector<int32_t> fetch_i32(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  EXPECT_EQ(h.dtype(), DType::kI32);
  const int32_t* p = h.data<int32_t>();
  return std::vector<int32_t>(p, p + h.numel());
}

// |got - want| <= atol + rtol * |want| elementwise; reports the first few mismatches.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                         double rtol = 1e-5, double atol = 1e-6, const std::string& what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      ADD_FAILURE() << what << " index " << i << ": got " << got[i] << ", want " << want[i]
                    << " (error " << err << ")";
      if (++reported == 5) return;
    }
  }
}

// One sequence of a test batch: `ctx` tokens already cached, `q` new rows, state `slot`.
struct SeqSpec {
  int ctx = 0;
  int q = 1;
  int slot = 0;
};

// Host-side description of a batch; `upload` turns it into a BatchLayout of device tensors.
struct HostLayout {
  std::vector<SeqSpec> seqs;
  int block_size = 8;
  int max_blocks = 0;
  std::vector<int32_t> block_table;  // [B, max_blocks]
  std::vector<int32_t> positions;
  std::vector<int32_t> token_seq;
  std::vector<int32_t> q_start;

  HostLayout(std::vector<SeqSpec> s, int block, int max_blocks_per_seq,
             std::vector<int32_t> table = {})
      : seqs(std::move(s)),
        block_size(block),
        max_blocks(max_blocks_per_seq),
        block_table(std::move(table)) {
    q_start.push_back(0);
    for (size_t b = 0; b < seqs.size(); ++b) {
      for (int i = 0; i < seqs[b].q; ++i) {
        positions.push_back(seqs[b].ctx + i);
        token_seq.push_back(static_cast<int32_t>(b));
      }
      q_start.push_back(static_cast<int32_t>(positions.size()));
    }
    if (block_table.empty()) block_table.assign(seqs.size() * static_cast<size_t>(max_blocks), 0);
  }

  int num_tokens() const { return static_cast<int>(positions.size()); }

  BatchLayout upload(Backend& be) const {
    BatchLayout l;
    const auto t = static_cast<int64_t>(positions.size());
    const auto b = static_cast<int64_t>(seqs.size());
    l.num_tokens = static_cast<int>(t);
    l.num_seqs = static_cast<int>(b);
    l.block_size = block_size;
    l.max_blocks_per_seq = max_blocks;
    std::vector<int32_t> ctx, slot, ids(static_cast<size_t>(t), 0);
    for (const SeqSpec& s : seqs) {
      ctx.push_back(s.ctx);
      slot.push_back(s.slot);
    }
    l.token_ids = be.upload(host_i32(ids, {t}), DType::kI32);
    l.positions = be.upload(host_i32(positions, {t}), DType::kI32);
    l.token_seq = be.upload(host_i32(token_seq, {t}), DType::kI32);
    l.seq_q_start = be.upload(host_i32(q_start, {b + 1}), DType::kI32);
    l.seq_ctx_len = be.upload(host_i32(ctx, {b}), DType::kI32);
    l.seq_slot = be.upload(host_i32(slot, {b}), DType::kI32);
    l.block_table = be.upload(host_i32(block_table, {b, max_blocks}), DType::kI32);
    return l;
  }
};

// Fixture base: a 3-thread CPU backend (more threads than this machine's cores, so splits and
// nesting are exercised), a seeded generator and upload shortcuts.
class BackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(3);
  Rng rng{1234};

  Tensor up(const std::vector<float>& v, Shape shape) {
    return be->upload(host_f32(v, std::move(shape)), DType::kF32);
  }
  Tensor up_i(const std::vector<int32_t>& v, Shape shape) {
    return be->upload(host_i32(v, std::move(shape)), DType::kI32);
  }
  // Runs `f` and synchronizes; expects an Error of `code` whose message contains `needle`.
  template <typename F>
  void expect_error(F&& f, ErrorCode code, const std::string& needle) {
    try {
      f();
      be->synchronize();
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
};

}  // namespace deepinfer::testing
