// Rows of adjust_logits (in place: sparse additive entries, then the allowed-token bitmask) at
// V = 1000 and V = 129280, with and without each part.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cases.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

// in: logits [B, V], rows [N], tokens [N], values [N], allowed [B, ceil(V/32)] (an empty tensor:
// no mask); out: the adjusted logits.
Outputs run_adjust_logits(Backend& be, const Tensors& in) {
  Tensor logits = up(be, in[0]);
  LogitAdjustments a;
  if (in[1].numel() > 0) {
    a.rows = up(be, in[1]);
    a.tokens = up(be, in[2]);
    a.values = up(be, in[3]);
  }
  if (in[4].numel() > 0) a.allowed = be.upload(in[4], DType::kI32);
  be.adjust_logits(logits, a);
  return out(logits);
}

Tensors draw_adjustments(std::mt19937& rng, int64_t batch, int64_t vocab, int64_t entries,
                         bool masked) {
  Tensor logits = random_f32(rng, {batch, vocab}, 3.0f);
  std::set<std::pair<int32_t, int32_t>> pairs;  // each (row, token) at most once
  std::uniform_int_distribution<int32_t> row(0, static_cast<int32_t>(batch - 1));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  while (static_cast<int64_t>(pairs.size()) < entries) pairs.emplace(row(rng), token(rng));
  std::vector<int32_t> rows, tokens;
  for (const auto& [r, t] : pairs) {
    rows.push_back(r);
    tokens.push_back(t);
  }
  const int64_t words = (vocab + 31) / 32;
  std::vector<int32_t> mask;
  if (masked) {
    std::uniform_int_distribution<uint32_t> bits;
    for (int64_t i = 0; i < batch * words; ++i) mask.push_back(static_cast<int32_t>(bits(rng)));
    std::fill(mask.begin(), mask.begin() + words, -1);  // row 0: everything allowed
  }
  return Tensors{
      logits, i32(rows), i32(tokens), random_f32(rng, {entries}, 2.0f),
      masked ? Tensor::from_vector(mask, {batch, words}) : Tensor::zeros({0}, DType::kI32)};
}

}  // namespace

std::vector<OpCase> adjust_logits_cases() {
  std::vector<OpCase> t;
  struct Shape {
    int64_t batch, vocab, entries;
    bool masked;
  };
  for (const Shape s : {Shape{1, 1000, 7, false}, Shape{3, 1000, 0, true}, Shape{5, 1000, 40, true},
                        Shape{64, 129280, 600, true}, Shape{8, 129280, 3000, false}}) {
    add(t, Case<Tensors>{
               .op = "adjust_logits",
               .label = "B" + std::to_string(s.batch) + "_V" + std::to_string(s.vocab) + "_n" +
                        std::to_string(s.entries) + (s.masked ? "_mask" : ""),
               .draw =
                   [s](Rng& rng) {
                     return draw_adjustments(rng, s.batch, s.vocab, s.entries, s.masked);
                   },
               .run = run_adjust_logits,
               .expect = exact(),
           });
  }
  return t;
}

}  // namespace deepinfer::backend_ops
