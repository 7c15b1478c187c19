// Rows of the V4.1 mHC and Engram ops (docs/model.md#v41-ops): hc_pre_shifted and hc_collapse
// (summation order and expf ulps, as hc_pre's rows), engram_hash (integer math: exact),
// embedding_fp8 (the FP8 table's lookup: exact) and engram_gate (summation order and expf: ~1e-5 of
// the largest reference value). Shapes at tiny widths and at V4.1-Flash's (hc_mult 4, H 5120;
// Engram orders 2..4, 8 heads, its layer-14 multipliers and primes), with T = 0, 1 and several
// rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cases.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

constexpr int64_t kV41Hidden = 5120;

// [tokens, streams, hidden] of an op over X [T, N, H].
struct Dims3 {
  int64_t tokens;
  int64_t n;
  int64_t hidden;
};

// ---- shifted mHC --------------------------------------------------------------------------------

struct ShiftedDims {
  int64_t tokens;
  int n;
  int64_t hidden;
  int sinkhorn_iters;

  std::string label() const {
    return "t" + std::to_string(tokens) + "_n" + std::to_string(n) + "_h" + std::to_string(hidden) +
           "_iters" + std::to_string(sinkhorn_iters);
  }
};

// n = 5: the largest n for hc_pre's one-warp weights; n = 6 and 9 its block path (9: two batches
// of stream loads in the collapse); V4.1-Flash widths at decode and prefill sizes, and T = 0.
const std::vector<ShiftedDims> kShiftedDims = {
    {0, 4, 64, 20},         {1, 4, 64, 20},          {37, 4, 64, 20},
    {7, 2, 64, 1},          {3, 1, 64, 20},          {2, 5, 64, 20},
    {3, 6, 40, 5},          {2, 9, 40, 20},          {0, 4, kV41Hidden, 20},
    {1, 4, kV41Hidden, 20}, {64, 4, kV41Hidden, 20}, {203, 4, kV41Hidden, 20}};

void add_shifted(std::vector<OpCase>& t) {
  for (const ShiftedDims& c : kShiftedDims) {
    const int64_t width = c.n * c.hidden;
    const int64_t fn_rows = static_cast<int64_t>(2 + c.n) * c.n;
    // fn scaled so that the mix is O(1) and the sigmoids / softmax are not saturated.
    const float fn_scale = 1.0f / std::sqrt(static_cast<float>(width));
    for (const bool first : {false, true}) {
      add(t,
          Case<Tensors>{
              .op = "hc_pre_shifted",
              .label = c.label() + (first ? "_first" : "_prev"),
              .draw =
                  [=](Rng& rng) {
                    Tensors in{random_f32(rng, {c.tokens, c.n, c.hidden}),
                               random_f32(rng, {fn_rows, width}, fn_scale),
                               random_f32(rng, {fn_rows}, 0.5f),
                               Tensor::from_vector(std::vector<float>{0.8f, 1.3f, 2.0f}, {3})};
                    // The previous sub-layer's pre; undefined for the first sub-layer.
                    in.push_back(first ? Tensor() : random_f32(rng, {c.tokens, c.n}));
                    return in;
                  },
              .run =
                  [c](Backend& be, const Tensors& in) {
                    HcParams p;
                    p.hc_mult = c.n;
                    p.sinkhorn_iters = c.sinkhorn_iters;
                    p.norm_eps = 1e-20f;  // V4.1's rms_norm_eps
                    HcShiftedMix m = be.hc_pre_shifted(up(be, in[0]), up(be, in[1]), up(be, in[2]),
                                                       up(be, in[3]), up(be, in[4]), p);
                    return Outputs{{"pre", m.pre}, {"post", m.post}, {"comb", m.comb}, {"y", m.y}};
                  },
              .expect = close(kRtol, kAtol),
          });
    }
  }
  // hc_collapse takes any number of streams.
  for (const Dims3& d : std::vector<Dims3>{{0, 4, 64},
                                           {1, 4, 64},
                                           {5, 1, 100},
                                           {37, 9, 40},
                                           {3, 64, 32},
                                           {1, 4, kV41Hidden},
                                           {64, 4, kV41Hidden},
                                           {256, 4, kV41Hidden}}) {
    const int64_t tokens = d.tokens, n = d.n, hidden = d.hidden;
    add(t, Case<Tensors>{
               .op = "hc_collapse",
               .label = "t" + std::to_string(tokens) + "_n" + std::to_string(n) + "_h" +
                        std::to_string(hidden),
               .draw =
                   [=](Rng& rng) {
                     return Tensors{random_f32(rng, {tokens, n, hidden}),
                                    random_f32(rng, {tokens, n})};
                   },
               .run =
                   [](Backend& be, const Tensors& in) {
                     return out(be.hc_collapse(up(be, in[0]), up(be, in[1])));
                   },
               .expect = close(kRtol, kAtol),
           });
  }
}

// ---- Engram -------------------------------------------------------------------------------------

// V4.1-Flash's layer-14 hash constants (tests/python/v41_op_fixtures.py: NumPy default_rng(10007 *
// 14) multipliers, the nextprime chain above engram_vocab_size - 1).
const std::vector<int64_t> kFlashMult14 = {67716810739261, 51510806800915, 30921347202721,
                                           82619226485591};
const std::vector<int64_t> kFlashPrimes14 = {
    16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627,
    16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769,
    16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889};
constexpr int32_t kV41Vocab = 129280;
constexpr int32_t kV41CompressedVocab = 99092;

struct EngramHashIn {
  Tensor ngram;      // [T, n] i32
  Tensor token_map;  // [V] i32
  EngramHashParams params;
};

// A batch's n-gram windows: sequences that start at `starts` (their first row's position) with
// `rows` rows each, over random token histories; column r is the token at position p - r, -1
// before the sequence start. Tokens include 0 and vocab - 1.
Tensor ngram_windows(Rng& rng, const std::vector<std::pair<int, int>>& seqs, int n, int vocab) {
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<int32_t> out;
  int64_t rows = 0;
  for (const auto& [start, count] : seqs) {
    // history[i] is the token at position start - (n - 1) + i.
    std::vector<int32_t> history(static_cast<size_t>(n - 1 + count));
    for (int32_t& id : history) {
      const uint32_t pick = rng() % 16;
      id = pick == 0 ? 0 : pick == 1 ? vocab - 1 : token(rng);
    }
    for (int i = 0; i < count; ++i) {
      for (int r = 0; r < n; ++r) {
        const int pos = start + i - r;
        out.push_back(pos < 0 ? -1 : history[static_cast<size_t>(n - 1 + i - r)]);
      }
      ++rows;
    }
  }
  return Tensor::from_vector(out, {rows, n});
}

// token_map [vocab] into [0, compressed), with 0 and compressed - 1 among the values.
Tensor random_token_map(Rng& rng, int vocab, int compressed) {
  std::vector<int32_t> map(static_cast<size_t>(vocab));
  std::uniform_int_distribution<int32_t> id(0, compressed - 1);
  for (int32_t& m : map) m = id(rng);
  map.front() = compressed - 1;
  map.back() = 0;
  return i32(map);
}

struct EngramHashRow {
  std::string label;
  std::vector<std::pair<int, int>> seqs;  // (first position, rows)
  int vocab;
  int compressed;
  // Fixed constants (V4.1-Flash's), or random ones of this order and head count.
  std::vector<int64_t> multipliers;
  std::vector<int64_t> primes;
  int n;
  int heads;
};

// Random constants: odd multipliers anywhere in [1, 2^63) (the products wrap modulo 2^64, as the
// CPU's unsigned arithmetic does) and table sizes up to the i32 row range.
EngramHashParams random_hash_params(Rng& rng, int n, int heads, int32_t pad) {
  EngramHashParams p;
  std::uniform_int_distribution<int64_t> mult(0, std::numeric_limits<int64_t>::max() / 2 - 1);
  for (int r = 0; r < n; ++r) p.multipliers.push_back(2 * mult(rng) + 1);
  const int64_t tables = static_cast<int64_t>(n - 1) * heads;
  std::uniform_int_distribution<int64_t> prime(2, std::numeric_limits<int32_t>::max() / tables);
  for (int64_t i = 0; i < tables; ++i) p.primes.push_back(prime(rng));
  p.heads = heads;
  p.pad_id = pad;
  return p;
}

void add_engram(std::vector<OpCase>& t) {
  const std::vector<std::pair<int, int>> ragged = {{0, 5}, {1, 1}, {2, 3}, {700, 1}, {40, 9}};
  const std::vector<EngramHashRow> rows = {
      {"flash_t0", {{10, 0}}, kV41Vocab, kV41CompressedVocab, kFlashMult14, kFlashPrimes14, 4, 8},
      {"flash_t1", {{1000, 1}}, kV41Vocab, kV41CompressedVocab, kFlashMult14, kFlashPrimes14, 4, 8},
      {"flash_start", {{0, 4}}, kV41Vocab, kV41CompressedVocab, kFlashMult14, kFlashPrimes14, 4, 8},
      {"flash_ragged", ragged, kV41Vocab, kV41CompressedVocab, kFlashMult14, kFlashPrimes14, 4, 8},
      {"flash_prefill4096",
       {{0, 4096}},
       kV41Vocab,
       kV41CompressedVocab,
       kFlashMult14,
       kFlashPrimes14,
       4,
       8},
      {"random_n4_h8_ragged", ragged, kV41Vocab, kV41CompressedVocab, {}, {}, 4, 8},
      {"random_n2_h1", ragged, 50, 7, {}, {}, 2, 1},
      {"random_n3_h5", ragged, 1000, 300, {}, {}, 3, 5},
      {"random_n6_h3_t1", {{3, 1}}, 1000, 300, {}, {}, 6, 3},
  };
  for (const EngramHashRow& row : rows) {
    add(t, Case<EngramHashIn>{
               .op = "engram_hash",
               .label = row.label,
               .draw =
                   [row](Rng& rng) {
                     EngramHashIn in;
                     in.ngram = ngram_windows(rng, row.seqs, row.n, row.vocab);
                     in.token_map = random_token_map(rng, row.vocab, row.compressed);
                     // cpad: the pad token's compressed id (the pad token is id 2).
                     const int32_t pad = in.token_map.data<int32_t>()[2];
                     if (row.multipliers.empty()) {
                       in.params = random_hash_params(rng, row.n, row.heads, pad);
                     } else {
                       in.params = {row.multipliers, row.primes, row.heads, pad};
                     }
                     return in;
                   },
               .run =
                   [](Backend& be, const EngramHashIn& in) {
                     return out(be.engram_hash(up(be, in.ngram), up(be, in.token_map), in.params));
                   },
               .expect = exact(),
           });
  }

  // embedding_fp8: the FP8 table's lookup (exact: e4m3 times a power of two). Flash's row width
  // 256 (8 scales per row) at decode and prefill sizes, partial scale groups (40, 8 columns) and
  // T = 0; every draw looks up the table's first and last rows. `mapped`: the table in host
  // memory the kernel reads in place (upload_weight_mapped; engram_table_memory "host").
  struct LookupDims {
    int64_t vocab, cols, tokens;
    bool mapped;
  };
  for (const LookupDims d :
       {LookupDims{1000, 256, 24, false}, LookupDims{5003, 256, 24 * 64, false},
        LookupDims{97, 40, 33, false}, LookupDims{50, 8, 7, false}, LookupDims{10, 256, 0, false},
        LookupDims{1, 32, 3, false}, LookupDims{5003, 256, 24 * 64, true},
        LookupDims{97, 40, 33, true}}) {
    add(t, Case<Tensors>{
               .op = "embedding_fp8",
               .label = "v" + std::to_string(d.vocab) + "_c" + std::to_string(d.cols) + "_t" +
                        std::to_string(d.tokens) + (d.mapped ? "_mapped" : ""),
               .draw =
                   [d](Rng& rng) {
                     Tensor values = random_bytes(rng, {d.vocab, d.cols}, DType::kF8E4M3);
                     // 0x7f and 0xff are e4m3 NaN: no table holds them.
                     for (int64_t i = 0; i < values.numel(); ++i) {
                       uint8_t& b = values.data<uint8_t>()[i];
                       if ((b & 0x7f) == 0x7f) b = static_cast<uint8_t>(b - 1);
                     }
                     // Scales 2^-27 .. 2^12 (e8m0 0xff is NaN, rejected at load).
                     Tensor scales = random_bytes(rng, {d.vocab, (d.cols + 31) / 32}, DType::kE8M0);
                     for (int64_t i = 0; i < scales.numel(); ++i) {
                       uint8_t& b = scales.data<uint8_t>()[i];
                       b = static_cast<uint8_t>(100 + b % 40);
                     }
                     Tensor ids = random_ids(rng, d.tokens, 0, static_cast<int32_t>(d.vocab - 1));
                     if (d.tokens >= 2) {
                       ids.data<int32_t>()[0] = static_cast<int32_t>(d.vocab - 1);
                       ids.data<int32_t>()[d.tokens - 1] = 0;
                     }
                     return Tensors{values, scales, ids};
                   },
               .run =
                   [d](Backend& be, const Tensors& in) {
                     const auto place = [&](const Tensor& host) {
                       return d.mapped ? be.upload_weight_mapped(host)
                                       : be.upload_weight(host, host.dtype());
                     };
                     return out(be.embedding_fp8(place(in[0]), place(in[1]), up(be, in[2])));
                   },
               .expect = exact(),
           });
  }

  // engram_gate: X [T, N, H], kv [T, (N + 1) * H], q_weight and k_weight [N, H].
  for (const Dims3& d : std::vector<Dims3>{{0, 4, kV41Hidden},
                                           {1, 4, kV41Hidden},
                                           {5, 4, kV41Hidden},
                                           {64, 4, kV41Hidden},
                                           {1, 2, 4},
                                           {7, 3, 40},
                                           {3, 1, 100},
                                           {300, 4, 64}}) {
    const int64_t tokens = d.tokens, n = d.n, hidden = d.hidden;
    add(t, Case<Tensors>{
               .op = "engram_gate",
               .label = "t" + std::to_string(tokens) + "_n" + std::to_string(n) + "_h" +
                        std::to_string(hidden),
               .draw =
                   [=](Rng& rng) {
                     return Tensors{random_f32(rng, {tokens, n, hidden}),
                                    random_f32(rng, {tokens, (n + 1) * hidden}),
                                    random_f32(rng, {n, hidden}), random_f32(rng, {n, hidden})};
                   },
               .run =
                   [](Backend& be, const Tensors& in) {
                     return out(be.engram_gate(up(be, in[0]), up(be, in[1]), up(be, in[2]),
                                               up(be, in[3]), 1e-20f));
                   },
               .expect = close(kRtol, kAtol),
           });
  }
}

}  // namespace

std::vector<OpCase> v41_cases() {
  std::vector<OpCase> t;
  add_shifted(t);
  add_engram(t);
  return t;
}

}  // namespace deepinfer::backend_ops
