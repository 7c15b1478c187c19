// Rows of linear, grouped_linear and linear_pair, f32 and bf16 weights, at tiny widths and at the
// DeepSeek-V4-Flash decode shapes.
//
// f32 GEMMs differ from the reference by summation order only. bf16 weights are drawn
// bf16-rounded (the device keeps them in bf16, widened exactly). The CUDA backend runs bf16
// linears of 1..kGemvMaxTokens tokens with K % 8 == 0 and 16-byte aligned x and w on its GEMV,
// on the f32 activations: held to the f32 tolerance. The others run cuBLAS on bf16-rounded
// activations, so those rows draw x bf16-rounded too (the device's cast then changes nothing) and
// the products agree exactly: only the f32 summation order differs, at bf16-GEMM tolerance. The
// bf16 rows model that kernel choice, so they apply to the CUDA backend only.
//
// Block-scaled FP8 weights (kFp8Block) are drawn as N(0, 1) values quantized per block to e4m3
// with a power-of-two scale, as DeepSeek ships them; the CPU reference dequantizes them exactly
// and quantize-dequantizes x when act_group > 0. The rows cover each CUDA path
// (cuda/gemm/gemm_fp8_heuristics.h): the FP8 tensor-core GEMV (act_group > 0, M <= 16; with
// DEEPINFER_FP8_LINEAR=stream the streaming kernel up to M = 64 instead), cuBLASLt's
// block-scaled GEMM (128x128 blocks, act_group 128, larger M) and the bf16 fallback (other blocks,
// act_group 0, ragged K), at ragged N and K. Every product of an e4m3 weight and an e4m3
// activation is exact and every scale a power of two, so the device differs from the reference
// by the summation only: f32 in the fallback, and on the FP8 tensor cores partial sums of 32-128
// products whose accumulation is not IEEE f32 on Hopper (a few bits shorter), folded in f32.
// Relative to max |y| that stays far below 1e-3 at these K (y ~ sqrt(K)). act_group 0 draws x
// bf16-rounded: the fallback's cuBLAS path casts x to bf16.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cases.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

constexpr int64_t kGemvMaxTokens = 2;
bool gemv_path(int64_t m, int64_t k) {
  return m >= 1 && m <= kGemvMaxTokens && k % 8 == 0;
}

struct Gemm {
  int64_t m, k, n;
  int groups;  // 0: linear; else grouped_linear with x [m, groups*k], w [groups*n, k]

  const char* op() const { return groups ? "grouped_linear" : "linear"; }
  std::string label(const char* variant) const {
    return std::string(variant) + (groups ? "_g" + std::to_string(groups) : "") + "_m" +
           std::to_string(m) + "_k" + std::to_string(k) + "_n" + std::to_string(n);
  }
  int g() const { return groups ? groups : 1; }
  Tensor run(Backend& be, const Tensor& x, const Tensor& w) const {
    return groups ? be.grouped_linear(x, w, groups) : be.linear(x, w);
  }
};

const std::vector<Gemm> kGemms = {{1, 64, 96, 0},        {37, 64, 96, 0},       {5, 7, 3, 0},
                                  {3, kHidden, 1024, 0}, {37, kHidden, 512, 0}, {4, 64, 16, 2},
                                  {37, 32, 24, 4},       {3, kHidden, 1024, 8}};

const std::vector<std::string> kCudaOnly = {"cuda"};
const char* const kCudaOnlyWhy =
    "the reference models the CUDA kernel choice (GEMV on f32 activations for 1-2 tokens, "
    "cuBLAS on bf16-rounded activations otherwise)";

void add_f32(std::vector<OpCase>& t, const Gemm& c) {
  add(t, Case<Tensors>{
             .op = c.op(),
             .label = c.label("f32"),
             .draw =
                 [c](Rng& rng) {
                   return Tensors{random_f32(rng, {c.m, c.g() * c.k}),
                                  random_f32(rng, {c.g() * c.n, c.k})};
                 },
             .run =
                 [c](Backend& be, const Tensors& in) {
                   return out(c.run(be, up(be, in[0]), up_weight(be, in[1], DType::kF32)));
                 },
             .expect = close(kRtol, kAtol),
         });
}

// bf16 weights; `gemv` says which path the CUDA backend takes (see the top of the file).
void add_bf16(std::vector<OpCase>& t, const Gemm& c, const char* variant = "bf16") {
  const bool gemv = gemv_path(c.m, c.k);
  add(t, Case<Tensors>{
             .op = c.op(),
             .label = c.label(variant),
             .draw =
                 [c, gemv](Rng& rng) {
                   Tensor x = random_f32(rng, {c.m, c.g() * c.k});
                   Tensor w = random_f32(rng, {c.g() * c.n, c.k});
                   return Tensors{gemv ? x : round_bf16(x), round_bf16(w)};
                 },
             .run =
                 [c](Backend& be, const Tensors& in) {
                   return out(c.run(be, up(be, in[0]), up_weight(be, in[1], DType::kBF16)));
                 },
             .expect = gemv ? close(kRtol, kAtol) : close(1e-3, 1e-5),
             .only_backends = kCudaOnly,
             .only_why = kCudaOnlyWhy,
             .bf16_weights = true,
         });
}

// A bf16 linear on views of x or w one element past a 16-byte boundary (4 and 2 bytes off): the
// cuBLAS path, still correct.
void add_bf16_unaligned(std::vector<OpCase>& t, bool shift_x) {
  const int64_t m = 3, k = kHidden, n = 512;
  const int64_t ox = shift_x ? 1 : 0, ow = shift_x ? 0 : 1;
  add(t, Case<Tensors>{
             .op = "linear",
             .label = std::string("bf16_unaligned_") + (shift_x ? "x" : "w") + "_m3_k4096_n512",
             .draw =
                 [](Rng& rng) {
                   return Tensors{round_bf16(random_f32(rng, {m * k + 1})),
                                  round_bf16(random_f32(rng, {n * k + 1}))};
                 },
             .run =
                 [ox, ow](Backend& be, const Tensors& in) {
                   const Tensor x = up(be, in[0]).narrow(0, ox, m * k).reshape({m, k});
                   const Tensor w =
                       up_weight(be, in[1], DType::kBF16).narrow(0, ow, n * k).reshape({n, k});
                   return out(be.linear(x, w));
                 },
             .expect = close(1e-3, 1e-5),
             .only_backends = kCudaOnly,
             .only_why = kCudaOnlyWhy,
             .bf16_weights = true,
         });
}

// A kFp8Block weight [rows, cols] of N(0, 1) values: e4m3 values and one power-of-two scale per
// block, 2^ceil(log2(amax / 448)) so nothing saturates.
Tensors random_fp8_weight(Rng& rng, int64_t rows, int64_t cols, int br, int bc) {
  const Tensor w = random_f32(rng, {rows, cols});
  const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  Tensor scales = Tensor::zeros({sr, sc}, DType::kF32);
  Tensor scaled = Tensor::zeros({rows, cols}, DType::kF32);
  const float* wp = w.data<float>();
  float* sp = scales.data<float>();
  float* q = scaled.data<float>();
  for (int64_t bi = 0; bi < sr; ++bi) {
    for (int64_t bj = 0; bj < sc; ++bj) {
      float amax = 1e-4f;
      for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
        for (int64_t c = bj * bc; c < std::min(cols, (bj + 1) * bc); ++c) {
          amax = std::max(amax, std::fabs(wp[r * cols + c]));
        }
      }
      const float scale = std::exp2(std::ceil(std::log2(amax / 448.0f)));
      sp[bi * sc + bj] = scale;
      for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
        for (int64_t c = bj * bc; c < std::min(cols, (bj + 1) * bc); ++c) {
          q[r * cols + c] = wp[r * cols + c] / scale;  // exact: a power of two
        }
      }
    }
  }
  return Tensors{scaled.to(DType::kF8E4M3), scales};
}

// x_norm (linear only): a RowNorm of x (the q-LoRA norm before wq_b).
struct Fp8Gemm {
  Gemm shape;
  int br, bc, act_group;
  bool x_norm = false;
  std::string label() const {
    return shape.label(("fp8_b" + std::to_string(br) + "x" + std::to_string(bc) + "_a" +
                        std::to_string(act_group) + (x_norm ? "_xnorm" : ""))
                           .c_str());
  }
};

// A RowNorm's weight [k]: values around 1, as trained norms have.
Tensor random_norm_weight(Rng& rng, int64_t k) {
  const Tensor u = random_f32(rng, {k});
  Tensor w = Tensor::zeros({k}, DType::kF32);
  for (int64_t i = 0; i < k; ++i) w.data<float>()[i] = 1.0f + 0.25f * u.data<float>()[i];
  return w;
}

void add_fp8(std::vector<OpCase>& t, const Fp8Gemm& f) {
  const Gemm c = f.shape;
  add(t, Case<Tensors>{
             .op = c.op(),
             .label = f.label(),
             .draw =
                 [c, f](Rng& rng) {
                   Tensor x = random_f32(rng, {c.m, c.g() * c.k});
                   Tensors w = random_fp8_weight(rng, c.g() * c.n, c.k, f.br, f.bc);
                   Tensors in{f.act_group == 0 ? round_bf16(x) : x, w[0], w[1]};
                   if (f.x_norm) in.push_back(random_norm_weight(rng, c.k));
                   return in;
                 },
             .run =
                 [c, f](Backend& be, const Tensors& in) {
                   MatrixWeight host;
                   host.values = in[1];
                   host.scales = in[2];
                   host.format = WeightFormat::kFp8Block;
                   host.block_rows = f.br;
                   host.block_cols = f.bc;
                   host.act_group = f.act_group;
                   const MatrixWeight w = be.upload_matrix_weight(host);
                   const Tensor x = up(be, in[0]);
                   if (f.x_norm) return out(be.linear(x, w, RowNorm{up(be, in[3]), 1e-6f}));
                   return out(c.groups ? be.grouped_linear(x, w, c.groups) : be.linear(x, w));
                 },
             .expect = close(1e-3, 1e-5),
             .only_backends = kCudaOnly,
             .only_why = "the tolerance models the CUDA FP8 paths (tensor-core accumulation; "
                         "act_group 0 casts x to bf16 above the GEMV)",
         });
}

// linear_pair of two weights of one x: FP8 pairs (the CUDA backend runs them as one GEMV launch
// where linear_fp8_pair applies, else as two linears) and f32 pairs (two linears everywhere),
// both outputs held to linear's tolerance. x_norm: with a RowNorm of x.
struct PairGemm {
  int64_t m, k, na, nb;
  int br, bc, act_group;  // br 0: f32 weights
  bool x_norm = false;
  std::string label() const {
    return (br ? "fp8_b" + std::to_string(br) + "x" + std::to_string(bc) + "_a" +
                     std::to_string(act_group)
               : std::string("f32")) +
           "_m" + std::to_string(m) + "_k" + std::to_string(k) + "_na" + std::to_string(na) +
           "_nb" + std::to_string(nb) + (x_norm ? "_xnorm" : "");
  }
};

void add_pair(std::vector<OpCase>& t, const PairGemm& c) {
  add(t, Case<Tensors>{
             .op = "linear_pair",
             .label = c.label(),
             .draw =
                 [c](Rng& rng) {
                   Tensor x = random_f32(rng, {c.m, c.k});
                   Tensors in;
                   if (c.br == 0) {
                     in = {x, random_f32(rng, {c.na, c.k}), random_f32(rng, {c.nb, c.k})};
                   } else {
                     Tensors a = random_fp8_weight(rng, c.na, c.k, c.br, c.bc);
                     Tensors b = random_fp8_weight(rng, c.nb, c.k, c.br, c.bc);
                     in = {c.act_group == 0 ? round_bf16(x) : x, a[0], a[1], b[0], b[1]};
                   }
                   if (c.x_norm) in.push_back(random_norm_weight(rng, c.k));
                   return in;
                 },
             .run =
                 [c](Backend& be, const Tensors& in) {
                   const auto weight = [&](int i) {
                     MatrixWeight host;
                     host.values = in[static_cast<size_t>(i)];
                     if (c.br != 0) {
                       host.scales = in[static_cast<size_t>(i + 1)];
                       host.format = WeightFormat::kFp8Block;
                       host.block_rows = c.br;
                       host.block_cols = c.bc;
                       host.act_group = c.act_group;
                     }
                     return be.upload_matrix_weight(host);
                   };
                   const MatrixWeight a = weight(1);
                   const MatrixWeight b = weight(c.br != 0 ? 3 : 2);
                   const RowNorm norm = c.x_norm ? RowNorm{up(be, in.back()), 1e-6f} : RowNorm{};
                   auto [ya, yb] = be.linear_pair(up(be, in[0]), a, b, norm);
                   return Outputs{{"a", std::move(ya)}, {"b", std::move(yb)}};
                 },
             .expect = close(1e-3, 1e-5),
             .only_backends = kCudaOnly,
             .only_why = "the tolerance models the CUDA FP8 paths (tensor-core accumulation; "
                         "act_group 0 casts x to bf16 above the GEMV)",
         });
}

}  // namespace

std::vector<OpCase> gemm_cases() {
  std::vector<OpCase> t;
  for (const Gemm& c : kGemms) add_f32(t, c);
  for (const Gemm& c : kGemms) add_bf16(t, c);
  // The bf16 linears of a V4-Flash decode step (N x K of w; groups: wo_a's grouped projection),
  // one token each; M = 3..17 (cuBLAS) once for linear and once for grouped_linear.
  struct DecodeShape {
    int64_t n, k;
    int groups;
  };
  for (const DecodeShape& s : std::vector<DecodeShape>{{1024, kHidden, 0},
                                                       {32768, 1024, 0},
                                                       {512, kHidden, 0},
                                                       {kHidden, 8192, 0},
                                                       {1024, kHidden, 8},
                                                       {2048, kHidden, 0},
                                                       {kHidden, 2048, 0},
                                                       {8192, 1024, 0},
                                                       {64, kHidden, 0},
                                                       {256, kHidden, 0}}) {
    const bool above = s.n == 1024 && s.k == kHidden;
    for (const int64_t m : {1, 3, 8, 16, 17}) {
      if (m > kGemvMaxTokens && !above) continue;
      add_bf16(t, Gemm{m, s.k, s.n, s.groups}, "bf16_decode");
    }
  }
  // K % 8 != 0: the cuBLAS path (bf16-rounded x).
  add_bf16(t, Gemm{3, 4100, 256, 0}, "bf16_fallback");
  add_bf16(t, Gemm{2, 36, 40, 3}, "bf16_fallback");
  add_bf16_unaligned(t, true);
  add_bf16_unaligned(t, false);

  // FP8 block-scaled weights, M <= 16 with act_group > 0: the GEMV, whose 16-byte (128x128) and
  // 8-byte (32x32 blocks or act_group 32) steps these rows cover (with DEEPINFER_FP8_LINEAR=stream
  // the streaming kernel): ragged N and K (K % 16 == 0), grouped, V4-Flash shapes.
  for (const int64_t m : {1, 3, 16}) {
    add_fp8(t, {{m, 1040, 300, 0}, 128, 128, 128});
    add_fp8(t, {{m, 1040, 300, 0}, 32, 32, 128});
    add_fp8(t, {{m, 1024, 72, 3}, 128, 128, 128});
  }
  add_fp8(t, {{5, 544, 200, 0}, 32, 32, 32});
  add_fp8(t, {{9, 8192, 100, 0}, 128, 128, 128});  // GEMV: 8 splits of one slab each
  // The GEMV's activation groups: 64 columns (two values per lane in its batched quantization)
  // and 256 (its per-group loop), each with a partial last group (K 1040).
  for (const int64_t m : {3, 16}) {
    add_fp8(t, {{m, 1040, 300, 0}, 128, 128, 64});
    add_fp8(t, {{m, 1040, 300, 0}, 128, 128, 256});
  }
  for (const int64_t m : {1, 16}) {
    add_fp8(t, {{m, kHidden, 1024, 0}, 128, 128, 128});  // wq_a
    add_fp8(t, {{m, 1024, 32768, 0}, 128, 128, 128});    // wq_b
    add_fp8(t, {{m, kHidden, 1024, 8}, 128, 128, 128});  // wo_a
    add_fp8(t, {{m, 8192, kHidden, 0}, 128, 128, 128});  // wo_b
  }
  // Grouped shapes the Hopper weight stream takes (sm90/fp8_wgmma.cu, opt-in: run the table with
  // DEEPINFER_FP8_LINEAR=wgmma; 128x128 blocks, act_group 128, M <= 16, grouped M <= 64 with
  // N % 64 == 0): each token tile (8, 16, 32, 64) and the grouped bound (64 | 65 on cuBLASLt),
  // K 1040 (9 blocks, the last partial: zero-filled activations and weights), ragged N within one
  // group's tiles. By default the GEMV, the streaming kernel and cuBLASLt run them.
  for (const int64_t m : {1, 9, 17, 33, 64, 65}) add_fp8(t, {{m, 1040, 128, 3}, 128, 128, 128});
  add_fp8(t, {{7, 1040, 300, 0}, 128, 128, 128});
  // Weights of one partial 128x128 block, as the tiny real-format checkpoints have (K < 128, N <
  // 64: the weight stream's box is wider and taller than the matrix; one or two stages, so its
  // last wgmma reads the ring stage its partial tile then takes), and a pair of them.
  for (const int64_t m : {1, 5, 16}) {
    add_fp8(t, {{m, 64, 48, 0}, 128, 128, 128});
    add_fp8(t, {{m, 96, 32, 0}, 128, 128, 128});
    add_fp8(t, {{m, 256, 40, 0}, 128, 128, 128});
    add_pair(t, {m, 64, 32, 48, 128, 128, 128});
  }
  // linear_pair at the V4-Flash pairs (wq_a with wkv, wq_b with the indexer's wq_b, the shared
  // expert's w1 with w3): one GEMV launch up to 16 tokens, two linears above (M 17: cuBLASLt);
  // a first weight whose rows are not whole GEMV tiles (300), blocks that differ from the GEMV's
  // steps (32x32), act_group 0 (the fallback) and f32 weights: two linears.
  for (const int64_t m : {1, 5, 16, 17}) {
    add_pair(t, {m, kHidden, 1024, 512, 128, 128, 128});
    add_pair(t, {m, 1024, 32768, 8192, 128, 128, 128});
    add_pair(t, {m, kHidden, 2048, 2048, 128, 128, 128});
  }
  // With the q-LoRA norm (RowNorm) of x: wq_b alone and with the indexer's wq_b, where the GEMV
  // (or under wgmma the weight stream, its fused quantization at M 1, quantize_rows_e4m3 at 5
  // and 16) norms x as it quantizes it, and at 17 (rms_norm, then cuBLASLt); a partial block.
  for (const int64_t m : {1, 5, 16, 17}) {
    add_pair(t, {m, 1024, 32768, 8192, 128, 128, 128, true});
    add_fp8(t, {{m, 1024, 32768, 0}, 128, 128, 128, true});
  }
  add_pair(t, {3, 64, 32, 48, 128, 128, 128, true});
  add_fp8(t, {{3, 96, 32, 0}, 128, 128, 128, true});
  // V4.1's 32x32 blocks (the GEMV's 8-byte steps), act_group 32 and 128.
  add_fp8(t, {{5, 544, 200, 0}, 32, 32, 32, true});
  add_pair(t, {3, 1040, 256, 200, 32, 32, 128, true});
  add_pair(t, {3, 64, 96, 40, 0, 0, 0, true});
  add_pair(t, {3, 1040, 300, 200, 128, 128, 128});
  add_pair(t, {3, 1040, 256, 200, 32, 32, 128});
  add_pair(t, {3, 1024, 256, 128, 128, 128, 0});
  add_pair(t, {3, 64, 96, 40, 0, 0, 0});
  // The streaming kernel (fp8_stream.cu; M <= 64, act_group > 0, K % 16 == 0): both token tiles
  // (16 and 64) and the boundaries (16 | 17, 64 | 65 on cuBLASLt or the fallback), CTAs of 2
  // warps with 8 K splits (wq_a; grouped with ragged N), 4 warps (wo_b), 8 warps (wo_a, wq_b),
  // K whose last split has fewer slices (K 1040: 9 slices in 5 splits of 2), a partial single
  // slice (K 48, 16x16 blocks).
  // (The rows above cover M = 1, 3, 16 of the first shapes.)
  for (const int64_t m : {17, 33, 64, 65}) {
    add_fp8(t, {{m, 1040, 300, 0}, 32, 32, 128});
    add_fp8(t, {{m, 1024, 72, 3}, 128, 128, 128});
  }
  for (const int64_t m : {3, 17, 33, 64, 65}) {
    add_fp8(t, {{m, kHidden, 1024, 0}, 128, 128, 128});  // wq_a
  }
  for (const int64_t m : {1, 3, 16, 17, 33, 64, 65}) {
    add_fp8(t, {{m, 48, 200, 2}, 16, 16, 16});
  }
  add_fp8(t, {{33, 8192, kHidden, 0}, 128, 128, 128});  // wo_b: 4 warps, 8 slices per split
  add_fp8(t, {{64, kHidden, 1024, 8}, 128, 128, 128});  // wo_a: grouped, 8 warps
  add_fp8(t, {{40, 1024, 32768, 0}, 128, 128, 128});    // wq_b: 8 warps, 2 splits
  // cuBLASLt (128x128, act_group 128, M > 64; legacy: M > 16): ragged M and N (N % 16 == 0),
  // grouped.
  for (const int64_t m : {17, 300, 1024}) {
    add_fp8(t, {{m, 1024, 512, 0}, 128, 128, 128});
    add_fp8(t, {{m, 1536, 400, 0}, 128, 128, 128});
  }
  add_fp8(t, {{300, 512, 256, 2}, 128, 128, 128});
  add_fp8(t, {{300, kHidden, 1024, 8}, 128, 128, 128});  // wo_a at prefill
  // Fallback (weights dequantized to bf16): 32x32 blocks above the GEMV, act_group 0 (the bf16
  // GEMV at 1 token, cuBLAS above), K not for cuBLASLt (ceil(K / 128) % 4 != 0) or for any FP8
  // kernel (K % 16 != 0), ragged N not a multiple of 16.
  add_fp8(t, {{300, 1040, 300, 0}, 32, 32, 128});
  add_fp8(t, {{1, 1024, 300, 0}, 128, 128, 0});
  add_fp8(t, {{17, 1040, 300, 0}, 128, 128, 0});
  add_fp8(t, {{300, 1040, 512, 0}, 128, 128, 128});
  add_fp8(t, {{3, 1000, 300, 0}, 128, 128, 128});
  add_fp8(t, {{300, 1024, 300, 0}, 128, 128, 128});
  add_fp8(t, {{300, 1000, 96, 2}, 128, 128, 0});
  // The tiny real-format checkpoints of tests/python/test_quantized_parity.py: F2_CONFIG with
  // 16x16 blocks (act_group 16: the fallback) and the wide config's non-square 64x32 blocks, whose
  // grouped wo_a has groups of 16 / 24 rows, less than a scale block.
  for (const int64_t m : {1, 3, 72}) {
    add_fp8(t, {{m, 64, 32, 0}, 16, 16, 16});   // wq_a, wkv, shared w1/w3
    add_fp8(t, {{m, 32, 128, 0}, 16, 16, 16});  // wq_b
    add_fp8(t, {{m, 64, 16, 2}, 16, 16, 16});   // wo_a
    add_fp8(t, {{m, 32, 64, 0}, 16, 16, 16});   // wo_b, shared w2
    add_fp8(t, {{m, 32, 512, 0}, 16, 16, 16});  // indexer wq_b
  }
  for (const int64_t m : {1, 80}) {
    add_fp8(t, {{m, 96, 48, 0}, 64, 32, 32});  // wq_a
    add_fp8(t, {{m, 64, 24, 2}, 64, 32, 32});  // wo_a
    add_fp8(t, {{m, 48, 96, 0}, 64, 32, 32});  // wo_b
  }
  return t;
}

}  // namespace deepinfer::backend_ops
