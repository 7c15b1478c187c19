// Rows of the dense ops: embedding, rms_norm, scale, add, swiglu, gather_rows, copy_rows, rope,
// argmax, at tiny widths and at DeepSeek-V4-Flash widths.
//
// Tolerances: copies, gathers, argmax, scale, add and the embedding must be exact; ops whose only
// differences are summation order (rms) or expf/cosf/sinf ulps are held to ~1e-5 of the largest
// reference value. A bf16 embedding table is drawn bf16-rounded, so the reference's f32 table and
// the device's bf16 one hold the same values: exact.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cases.h"
#include "compare.h"
#include "inputs.h"
#include "kv_inputs.h"

namespace deepinfer::backend_ops {
namespace {

// inv_freq[i] = theta^(-2i / rope_dim), as the model computes it.
Tensor rope_inv_freq(int64_t rope_dim, double theta) {
  std::vector<float> v(static_cast<size_t>(rope_dim / 2));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(
        1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / static_cast<double>(rope_dim)));
  }
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

void add_embedding(std::vector<OpCase>& t) {
  struct Dims {
    int64_t vocab, hidden, tokens;
  };
  for (const Dims d : {Dims{100, 64, 1}, Dims{100, 64, 37}, Dims{1000, kHidden, 3}}) {
    const std::string shape = "v" + std::to_string(d.vocab) + "_h" + std::to_string(d.hidden) +
                              "_t" + std::to_string(d.tokens);
    for (const DType stored : {DType::kF32, DType::kBF16}) {
      const bool bf16 = stored == DType::kBF16;
      add(t, Case<Tensors>{
                 .op = "embedding",
                 .label = std::string(dtype_name(stored)) + "_" + shape,
                 .draw =
                     [d, bf16](Rng& rng) {
                       Tensor table = random_f32(rng, {d.vocab, d.hidden});
                       return Tensors{
                           bf16 ? round_bf16(table) : table,
                           random_ids(rng, d.tokens, 0, static_cast<int32_t>(d.vocab - 1))};
                     },
                 .run =
                     [stored](Backend& be, const Tensors& in) {
                       return out(be.embedding(up_weight(be, in[0], stored), up(be, in[1])));
                     },
                 .expect = exact(),
                 .bf16_weights = bf16,
             });
    }
  }
}

// The shapes reach every kernel of the CUDA op: a warp per row (widths up to 1024 floats, with
// partly filled lanes), a block per row with and without the weight loaded early (few / many
// rows), a cluster of blocks per row (few rows wider than 4096 floats, the last block shorter),
// and the scalar fallback (a width not a multiple of 4, wider than 16384). "Few" is relative to
// the SM count; these shapes split as described on an H200 (132 SMs).
void add_rms_norm(std::vector<OpCase>& t) {
  const std::vector<Shape> shapes = {{1, 64},
                                     {37, 64},
                                     {5, 7},
                                     {3, kHidden},
                                     {3, kHcMult * kHidden},
                                     {2, kHeads, kHeadDim},
                                     {64},
                                     {1, 4},
                                     {9, 36},
                                     {1, 512},
                                     {1, kHeads, kHeadDim},
                                     {300, 1024},
                                     {1, 1024},
                                     {2, 1028},
                                     {1, kHidden},
                                     {200, kHidden},
                                     {1, 8192},
                                     {64, 8192},
                                     {1, kHcMult * kHidden},
                                     {1, kHcMult, kHidden},
                                     {3, 5000},
                                     {140, kHcMult * kHidden},
                                     {2, 4098},
                                     {1, 20000}};
  for (const Shape& s : shapes) {
    for (const bool weighted : {true, false}) {
      add(t, Case<Tensors>{
                 .op = "rms_norm",
                 .label = (weighted ? "weighted_" : "unweighted_") + dims(s),
                 .draw =
                     [s](Rng& rng) {
                       return Tensors{random_f32(rng, s, 3.0f), random_f32(rng, {s.back()})};
                     },
                 .run =
                     [weighted](Backend& be, const Tensors& in) {
                       return out(
                           be.rms_norm(up(be, in[0]), weighted ? up(be, in[1]) : Tensor(), 1e-6f));
                     },
                 .expect = close(kRtol, kAtol),
             });
    }
  }
  // A base that is not 16-byte aligned (a view one float into its storage) takes the scalar
  // kernel.
  for (const int64_t dim : {int64_t{512}, kHidden, kHcMult * kHidden}) {
    for (const bool weighted : {true, false}) {
      add(t, Case<Tensors>{
                 .op = "rms_norm",
                 .label = (weighted ? "unaligned_weighted_" : "unaligned_unweighted_") +
                          std::to_string(dim),
                 .draw =
                     [dim](Rng& rng) {
                       return Tensors{random_f32(rng, {dim + 1}, 3.0f), random_f32(rng, {dim})};
                     },
                 .run =
                     [dim, weighted](Backend& be, const Tensors& in) {
                       return out(be.rms_norm(up(be, in[0]).narrow(0, 1, dim),
                                              weighted ? up(be, in[1]) : Tensor(), 1e-6f));
                     },
                 .expect = close(kRtol, kAtol),
             });
    }
  }
}

void add_elementwise(std::vector<OpCase>& t) {
  const std::vector<Shape> shapes = {{1, 64}, {37, 64}, {3, kHidden}, {3, 2048}, {5, 3, 7}};
  for (const Shape& s : shapes) {
    const auto draw = [s](Rng& rng) {
      return Tensors{random_f32(rng, s, 6.0f), random_f32(rng, s, 6.0f)};
    };
    add(t, Case<Tensors>{
               .op = "scale",
               .label = dims(s),
               .draw = draw,
               .run = [](Backend& be,
                         const Tensors& in) { return out(be.scale(up(be, in[0]), 0.37f)); },
               .expect = exact(),
           });
    add(t, Case<Tensors>{
               .op = "add",
               .label = dims(s),
               .draw = draw,
               .run = [](Backend& be,
                         const Tensors& in) { return out(be.add(up(be, in[0]), up(be, in[1]))); },
               .expect = exact(),
           });
    // i32: index arithmetic (a row's first logits row plus the drafts it accepted).
    add(t, Case<Tensors>{
               .op = "add",
               .label = "i32_" + dims(s),
               .draw =
                   [s](Rng& rng) {
                     int64_t n = 1;
                     for (const int64_t e : s) n *= e;
                     return Tensors{random_ids(rng, n, -100000, 100000).reshape(s),
                                    random_ids(rng, n, -7, 7).reshape(s)};
                   },
               .run = [](Backend& be,
                         const Tensors& in) { return out(be.add(up(be, in[0]), up(be, in[1]))); },
               .expect = exact(),
           });
    for (const float limit : {10.0f, 3.0f, 1e30f}) {
      add(t, Case<Tensors>{
                 .op = "swiglu",
                 .label = "limit" + num(limit) + "_" + dims(s),
                 .draw = draw,
                 .run =
                     [limit](Backend& be, const Tensors& in) {
                       return out(be.swiglu(up(be, in[0]), up(be, in[1]), limit));
                     },
                 .expect = close(kRtol, kAtol),
             });
    }
  }
}

void add_rows(std::vector<OpCase>& t) {
  struct Rows {
    Shape shape;
    DType dtype;
  };
  // Row sizes that pick each copy width: 16 B, 8 B (bf16 x4), 4 B, 2 B (bf16 x3), 1 B (fp8 x5).
  for (const Rows& c : std::vector<Rows>{{{37, 64}, DType::kF32},
                                         {{5, kHeads, kHeadDim}, DType::kF32},
                                         {{9, 4}, DType::kBF16},
                                         {{9, 3}, DType::kI32},
                                         {{9, 3}, DType::kBF16},
                                         {{9, 5}, DType::kF8E4M3},
                                         {{9}, DType::kI64}}) {
    const std::string tag = std::string(dtype_name(c.dtype)) + "_" + dims(c.shape);
    const auto rows = static_cast<int32_t>(c.shape[0]);
    for (const bool none : {false, true}) {
      add(t,
          Case<Tensors>{
              .op = "gather_rows",
              .label = (none ? "no_rows_" : "") + tag,
              .draw =
                  [c, rows, none](Rng& rng) {
                    Tensor x = random_bytes(rng, c.shape, c.dtype);
                    // Repeats included.
                    return Tensors{x, none ? i32({}) : random_ids(rng, 2 * rows + 1, 0, rows - 1)};
                  },
              .run =
                  [](Backend& be, const Tensors& in) {
                    return out(be.gather_rows(up_same(be, in[0]), up(be, in[1])));
                  },
              .expect = bytes(),
          });
    }
  }
  for (const Rows& c : std::vector<Rows>{{{16, 64}, DType::kF32},
                                         {{8, 134, kHeadDim}, DType::kF32},  // an SWA ring per slot
                                         {{16, 3}, DType::kBF16},
                                         {{16, 5}, DType::kF8E4M3},
                                         {{16}, DType::kI32}}) {
    // Sources among the first half (one read twice), distinct destinations in the second half.
    const auto half = static_cast<int32_t>(c.shape[0] / 2);
    add(t, Case<Tensors>{
               .op = "copy_rows",
               .label = std::string(dtype_name(c.dtype)) + "_" + dims(c.shape),
               .draw = [c](Rng& rng) { return Tensors{random_bytes(rng, c.shape, c.dtype)}; },
               .run =
                   [half](Backend& be, const Tensors& in) {
                     Tensor x = up_same(be, in[0]);
                     be.copy_rows(x, up(be, i32({0, 1, 1, half - 1})),
                                  up(be, i32({half + 2, half, 2 * half - 1, half + 1})));
                     return out(x);
                   },
               .expect = bytes(),
           });
  }
}

void add_rope(std::vector<OpCase>& t) {
  struct Rope {
    Shape shape;
    int64_t rope_dim;
    int32_t max_pos;
  };
  for (const Rope& c : std::vector<Rope>{{{1, 4, 64}, 16, 10},
                                         {{37, 4, 64}, 64, 5000},
                                         {{5, 7}, 6, 100},
                                         {{37, 64}, 64, 200000},
                                         {{3, kHeads, kHeadDim}, kRopeDim, 1 << 20},
                                         {{3, kHeadDim}, kRopeDim, 100000},
                                         {{4, 2, 8}, 0, 10},
                                         // Rotated channels from 58 and 10: a quad of channels
                                         // would straddle the copied and the rotated ones.
                                         {{3, 4, 64}, 6, 100},
                                         {{2, 20}, 10, 50}}) {
    for (const bool inverse : {false, true}) {
      add(t, Case<Tensors>{
                 .op = "rope",
                 .label = (inverse ? "inverse_" : "") + dims(c.shape) + "_rope" +
                          std::to_string(c.rope_dim),
                 .draw =
                     [c](Rng& rng) {
                       return Tensors{random_f32(rng, c.shape),
                                      random_ids(rng, c.shape[0], 0, c.max_pos),
                                      rope_inv_freq(c.rope_dim, 10000.0)};
                     },
                 .run =
                     [inverse](Backend& be, const Tensors& in) {
                       return out(be.rope(up(be, in[0]), up(be, in[1]), up(be, in[2]), inverse));
                     },
                 .expect = close(kRtol, kAtol),
             });
    }
  }
  // bf16 x (the attention output under AttentionSpec::bf16_output), widened exactly: the quads
  // kernel at V4's shape and the element kernel at an odd width; the result is f32.
  for (const Rope& c : std::vector<Rope>{
           {{3, kHeads, kHeadDim}, kRopeDim, 1 << 20}, {{37, 4, 64}, 64, 5000}, {{5, 7}, 6, 100}}) {
    add(t, Case<Tensors>{
               .op = "rope",
               .label = "inverse_bf16_" + dims(c.shape) + "_rope" + std::to_string(c.rope_dim),
               .draw =
                   [c](Rng& rng) {
                     return Tensors{random_f32(rng, c.shape).to(DType::kBF16),
                                    random_ids(rng, c.shape[0], 0, c.max_pos),
                                    rope_inv_freq(c.rope_dim, 10000.0)};
                   },
               .run =
                   [](Backend& be, const Tensors& in) {
                     return out(be.rope(up_same(be, in[0]), up(be, in[1]), up(be, in[2]), true));
                   },
               .expect = close(kRtol, kAtol),
           });
  }
}

// rms_norm_rope: the fused warp kernel (rows up to 1024 floats whose rotated channels start on a
// float4: the q heads, kv and compressed entries at V4-Flash widths, tiny ones) and the two-op
// fallback (a rotation starting mid-float4, a row too wide for a warp, an unaligned base).
void add_rms_norm_rope(std::vector<OpCase>& t) {
  struct NormRope {
    Shape shape;
    int64_t rope_dim;
    int32_t max_pos;
    bool unaligned;
  };
  for (const NormRope& c : std::vector<NormRope>{{{1, kHeads, kHeadDim}, kRopeDim, 1 << 20, false},
                                                 {{3, kHeads, kHeadDim}, kRopeDim, 100000, false},
                                                 {{1, kHeadDim}, kRopeDim, 4096, false},
                                                 {{37, kHeadDim}, kRopeDim, 200000, false},
                                                 {{5, 4, 64}, 16, 10, false},
                                                 {{9, 128}, 64, 5000, false},
                                                 {{2, 16}, 16, 50, false},
                                                 {{4, 2, 8}, 0, 10, false},
                                                 {{5, 10}, 6, 100, false},
                                                 // Rotation from channel 58 of 64: the fallback's
                                                 // rope over a quad-aligned row.
                                                 {{3, 4, 64}, 6, 100, false},
                                                 {{3, 2048}, 64, 1000, false},
                                                 {{2, kHeadDim}, kRopeDim, 1000, true}}) {
    for (const bool weighted : {true, false}) {
      add(t, Case<Tensors>{
                 .op = "rms_norm_rope",
                 .label = std::string(weighted ? "weighted_" : "unweighted_") +
                          (c.unaligned ? "unaligned_" : "") + dims(c.shape) + "_rope" +
                          std::to_string(c.rope_dim),
                 .draw =
                     [c](Rng& rng) {
                       Shape drawn = c.shape;
                       if (c.unaligned) drawn.back() += 1;  // viewed one float in below
                       return Tensors{random_f32(rng, drawn, 3.0f),
                                      random_f32(rng, {c.shape.back()}),
                                      random_ids(rng, c.shape[0], 0, c.max_pos),
                                      rope_inv_freq(c.rope_dim, 10000.0)};
                     },
                 .run =
                     [c, weighted](Backend& be, const Tensors& in) {
                       Tensor x = up(be, in[0]);
                       if (c.unaligned) {
                         const int64_t dim = c.shape.back();
                         x = x.reshape({x.numel()}).narrow(0, 1, dim * (x.numel() / (dim + 1)));
                         x = x.reshape({x.numel() / dim, dim});
                       }
                       return out(be.rms_norm_rope(x, weighted ? up(be, in[1]) : Tensor(), 1e-6f,
                                                   up(be, in[2]), up(be, in[3])));
                     },
                 .expect = close(kRtol, kAtol),
             });
    }
  }
}

// rms_norm_rope under bf16_output (the engine's q under bf16_math): a device may return bf16 (the
// warp kernel: its f32 result rounded to nearest even) or f32 (the two-op path: a rotation from
// mid-float4, an unaligned base); either way within bf16's rounding of the CPU's f32.
void add_rms_norm_rope_bf16_output(std::vector<OpCase>& t) {
  struct NormRope {
    Shape shape;
    int64_t rope_dim;
  };
  for (const NormRope& c : std::vector<NormRope>{{{1, kHeads, kHeadDim}, kRopeDim},
                                                 {{3, kHeads, kHeadDim}, kRopeDim},
                                                 {{5, 4, 64}, 16},
                                                 {{5, 10}, 6}}) {
    add(t,
        Case<Tensors>{
            .op = "rms_norm_rope",
            .label = "bf16_output_" + dims(c.shape) + "_rope" + std::to_string(c.rope_dim),
            .draw =
                [c](Rng& rng) {
                  return Tensors{random_f32(rng, c.shape, 3.0f),
                                 random_ids(rng, c.shape[0], 0, 100000),
                                 rope_inv_freq(c.rope_dim, 10000.0)};
                },
            .run =
                [](Backend& be, const Tensors& in) {
                  return out(be.rms_norm_rope(up(be, in[0]), Tensor(), 1e-6f, up(be, in[1]),
                                              up(be, in[2]), /*bf16_output=*/true));
                },
            .expect = Expect<Tensors>([](const Tensors&, const Outputs& ref, const Outputs& dev) {
              const Tensor& got = dev[0].value;
              EXPECT_TRUE(got.dtype() == DType::kF32 || got.dtype() == DType::kBF16)
                  << got.describe();
              // A bf16 value is within 2^-9 of its own size of the f32 it rounds.
              EXPECT_TRUE(max_abs_close(ref[0].value, got.to(DType::kF32), 0x1p-8, kAtol));
            }),
        });
  }
}

// rms_norm_rope_kv: the model's kv rows in a KV cache format. On the device each row must be
// the bytes of its own rms_norm_rope result encoded by the host codec (the fused kernel: bf16 rows,
// V4's fp8 main record and V4.1's FP8 record at the warp kernel's widths; the two-step path
// elsewhere: records with a partial scale group, the index-key record, a row too wide for a
// warp); against
// the CPU the decoded values differ by at most one step of the format where the f32 results
// differ in their last bits (and a scale where a group's amax sits at a power of two).
void add_rms_norm_rope_kv(std::vector<OpCase>& t) {
  struct NormRopeKv {
    int64_t tokens, dim, rope_dim;
    DType kv;
  };
  for (const NormRopeKv& c : std::vector<NormRopeKv>{{1, kHeadDim, kRopeDim, DType::kU8},
                                                     {37, kHeadDim, kRopeDim, DType::kU8},
                                                     {37, kHeadDim, kRopeDim, DType::kBF16},
                                                     {5, kHeadDim, kRopeDim, DType::kF32},
                                                     {9, 128, 64, DType::kU8},
                                                     {6, 96, 32, DType::kU8},
                                                     {6, 100, 20, DType::kU8},
                                                     {4, 64, 0, DType::kU8},
                                                     {3, 2048, 64, DType::kU8},
                                                     {3, 2048, 64, DType::kBF16},
                                                     {37, kHeadDim, kRopeDim, DType::kF8E4M3},
                                                     {6, 96, 32, DType::kF8E4M3},
                                                     {6, 100, 20, DType::kF8E4M3}}) {
    add(t,
        Case<Tensors>{
            .op = "rms_norm_rope_kv",
            .label = kv_label(c.kv) + "t" + std::to_string(c.tokens) + "_d" +
                     std::to_string(c.dim) + "_rope" + std::to_string(c.rope_dim),
            .draw =
                [c](Rng& rng) {
                  // The rotated channels are the record's RoPE channels (all of x's where the
                  // record has none: the index-key record).
                  const int64_t rotated = c.rope_dim > 0 ? c.rope_dim : c.dim;
                  return Tensors{random_f32(rng, {c.tokens, c.dim}, 3.0f), random_f32(rng, {c.dim}),
                                 random_ids(rng, c.tokens, 0, 100000),
                                 rope_inv_freq(rotated, 10000.0)};
                },
            .run =
                [c](Backend& be, const Tensors& in) {
                  const Tensor x = up(be, in[0]), w = up(be, in[1]), pos = up(be, in[2]),
                               freq = up(be, in[3]);
                  return Outputs{{"rows", be.rms_norm_rope_kv(x, w, 1e-6f, pos, freq, c.kv,
                                                              static_cast<int>(c.rope_dim))},
                                 {"f32", be.rms_norm_rope(x, w, 1e-6f, pos, freq)}};
                },
            .expect = Expect<Tensors>([c](const Tensors&, const Outputs& ref, const Outputs& dev) {
              const Tensor& got = dev[0].value;
              ASSERT_EQ(got.dtype(), ref[0].value.dtype()) << got.describe();
              ASSERT_EQ(got.shape(), ref[0].value.shape()) << got.describe();
              const Tensor two_step = c.kv == DType::kF32
                                          ? dev[1].value
                                          : encode_kv_rows(dev[1].value, c.kv, c.rope_dim);
              EXPECT_EQ(0, std::memcmp(got.raw_data(), two_step.raw_data(), got.nbytes()))
                  << "the device's rows are not its rms_norm_rope result encoded";
              if (c.kv == DType::kF32) {
                EXPECT_TRUE(max_abs_close(ref[0].value, got, kRtol, kAtol));
                return;
              }
              const Tensor want = decode_kv_rows(ref[0].value, c.dim, c.rope_dim);
              const Tensor have = decode_kv_rows(got, c.dim, c.rope_dim);
              const float* a = want.data<float>();
              const float* b = have.data<float>();
              for (int64_t r = 0; r < c.tokens; ++r) {
                float amax = 0.0f;
                for (int64_t i = 0; i < c.dim; ++i)
                  amax = std::max(amax, std::fabs(a[r * c.dim + i]));
                for (int64_t i = 0; i < c.dim; ++i) {
                  const float x = a[r * c.dim + i], y = b[r * c.dim + i];
                  ASSERT_LE(std::fabs(x - y), 0.125f * std::fabs(x) + 1e-3f * amax)
                      << "row " << r << " channel " << i;
                }
              }
            }),
        });
  }
}

// Rows [8, cols] of ties and special values, one pattern per row.
Tensor argmax_special_values(Rng& rng, int64_t cols) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t rows = 8;
  Tensor x = Tensor::zeros({rows, cols}, DType::kF32);
  auto at = [&](int64_t r, int64_t c) -> float& { return x.data<float>()[r * cols + c]; };
  std::uniform_int_distribution<int64_t> col(0, cols - 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) at(r, c) = static_cast<float>(c % 17) * 0.25f - 2.0f;
  }
  // Row 0: the maximum (2.0 at c % 17 == 16) repeats: lowest index wins.
  // Row 1: a larger value at three random places.
  for (int k = 0; k < 3; ++k) at(1, col(rng)) = 100.0f;
  // Row 2: all equal -> 0.
  for (int64_t c = 0; c < cols; ++c) at(2, c) = 1.5f;
  // Row 3: NaN first -> 0 (the CPU's scan never replaces it).
  at(3, 0) = nan;
  // Row 4: NaNs elsewhere, including after the max, are skipped.
  for (int64_t c = 1; c < cols; c += 3) at(4, c) = nan;
  // Row 5: all -inf except NaNs -> lowest -inf index.
  for (int64_t c = 0; c < cols; ++c) at(5, c) = c % 2 == 0 ? nan : -inf;
  at(5, 0) = -inf;
  // Row 6: -0 and +0 are equal: the first zero wins.
  for (int64_t c = 0; c < cols; ++c) at(6, c) = -1.0f;
  at(6, cols - 1) = 0.0f;
  at(6, cols / 2) = -0.0f;
  // Row 7: +inf at the end.
  at(7, cols - 1) = inf;
  return x;
}

void add_argmax(std::vector<OpCase>& t) {
  const auto run = [](Backend& be, const Tensors& in) { return out(be.argmax(up(be, in[0]))); };
  // One block per row (up to 4096 floats), a row split over blocks and a final reduction (the
  // vocabulary, one row and a decode batch), the scalar path (widths not a multiple of 4, one and
  // several blocks), and a row longer than the most blocks a row gets (blocks loop).
  for (const Shape& s : std::vector<Shape>{{1, 64},
                                           {37, 64},
                                           {3, 1000},
                                           {4, kVocab},
                                           {2, 1},
                                           {1, 4},
                                           {5, 3},
                                           {3, 4096},
                                           {2, 4100},
                                           {1, kVocab},
                                           {64, kVocab},
                                           {3, 1027},
                                           {2, kVocab + 1},
                                           {1, 4 * 1024 * 1024 + 36}}) {
    add(t, Case<Tensors>{
               .op = "argmax",
               .label = dims(s),
               .draw = [s](Rng& rng) { return Tensors{random_f32(rng, s)}; },
               .run = run,
               .expect = exact(),
           });
  }
  // A base that is not 16-byte aligned (a view one float into its storage) takes the scalar path.
  for (const int64_t cols : {int64_t{1000}, kVocab}) {
    add(t, Case<Tensors>{
               .op = "argmax",
               .label = "unaligned_2x" + std::to_string(cols),
               .draw = [cols](Rng& rng) { return Tensors{random_f32(rng, {2 * cols + 1})}; },
               .run =
                   [cols](Backend& be, const Tensors& in) {
                     return out(be.argmax(up(be, in[0]).narrow(0, 1, 2 * cols).reshape({2, cols})));
                   },
               .expect = exact(),
           });
  }
  for (const int64_t cols : {int64_t{64}, int64_t{1000}, int64_t{4097}, kVocab}) {
    add(t, Case<Tensors>{
               .op = "argmax",
               .label = "ties_and_specials_8x" + std::to_string(cols),
               .draw = [cols](Rng& rng) { return Tensors{argmax_special_values(rng, cols)}; },
               .run = run,
               .expect = exact(),
           });
  }
}

}  // namespace

std::vector<OpCase> dense_cases() {
  std::vector<OpCase> t;
  add_embedding(t);
  add_rms_norm(t);
  add_elementwise(t);
  add_rows(t);
  add_rope(t);
  add_rms_norm_rope(t);
  add_rms_norm_rope_bf16_output(t);
  add_rms_norm_rope_kv(t);
  add_argmax(t);
  return t;
}

}  // namespace deepinfer::backend_ops
