// Rows of linear and grouped_linear, f32 and bf16 weights, at tiny widths and at the
// DeepSeek-V4-Flash decode shapes.
//
// f32 GEMMs differ from the reference by summation order only. bf16 weights are drawn
// bf16-rounded (the device keeps them in bf16, widened exactly). The CUDA backend runs bf16
// linears of 1..kGemvMaxTokens tokens with K % 8 == 0 and 16-byte aligned x and w on its GEMV,
// on the f32 activations: held to the f32 tolerance. The others run cuBLAS on bf16-rounded
// activations, so those rows draw x bf16-rounded too (the device's cast then changes nothing) and
// the products agree exactly: only the f32 summation order differs, at bf16-GEMM tolerance. The
// bf16 rows model that kernel choice, so they apply to the CUDA backend only.
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
  return t;
}

}  // namespace deepinfer::backend_ops
