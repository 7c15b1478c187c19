// moe_experts on quantized weights (MXFP4, block-scaled FP8) against the CPU reference, which
// dequantizes them exactly: the rows of cuda/moe/sm80/experts_quant.cu.
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cases.h"
#include "deepinfer/weight.h"
#include "inputs.h"
#include "moe_inputs.h"

namespace deepinfer::backend_ops {
namespace {

// ---- moe_experts on quantized weights ----------------------------------------------------------

struct QuantExperts {
  WeightFormat format;
  int block;      // kFp8Block: square scale blocks
  int act_group;  // of w1, w3 and w2
  int experts, top_k, hidden, inter, tokens;
  // Every token names its first expert in all of its slots (a hash routing may name an expert
  // more than once): an expert then gets more pairs than the pass has tokens.
  bool repeated = false;

  std::string label() const {
    const std::string f =
        format == WeightFormat::kMxfp4 ? std::string("mxfp4") : "fp8b" + std::to_string(block);
    return f + "_act" + std::to_string(act_group) + "_e" + std::to_string(experts) + "_k" +
           std::to_string(top_k) + "_h" + std::to_string(hidden) + "_i" + std::to_string(inter) +
           "_t" + std::to_string(tokens) + (repeated ? "_repeated" : "");
  }
};

// A random [n, k] weight in `format` as a checkpoint ships it, whose values have a standard
// deviation near `std`: random e2m1 bytes (every code, +-0 included) with e8m0 scales, or e4m3
// bytes with exponent fields 0..10 (subnormals and zeros included, no NaN) with power-of-two f32
// block scales; each scale a random power of two within 2x of the one giving `std`.
MatrixWeight random_quantized(Rng& rng, WeightFormat format, int64_t n, int64_t k, int block,
                              int act_group, float std) {
  MatrixWeight w;
  w.format = format;
  w.act_group = act_group;
  std::uniform_int_distribution<int> byte(0, 255), jitter(-1, 1);
  if (format == WeightFormat::kMxfp4) {
    w.block_rows = 1;
    w.block_cols = 32;
    w.values = random_bytes(rng, {n, k / 2}, DType::kE2M1x2);
    w.scales = Tensor::zeros({n, k / 32}, DType::kE8M0);
    // e2m1 codes drawn uniformly have an rms of about 2.9.
    const int e = static_cast<int>(std::lround(std::log2(std / 2.9f))) + 127;
    auto* p = static_cast<uint8_t*>(w.scales.raw_data());
    for (int64_t i = 0; i < w.scales.numel(); ++i) p[i] = static_cast<uint8_t>(e + jitter(rng));
    return w;
  }
  w.block_rows = block;
  w.block_cols = block;
  w.values = Tensor::zeros({n, k}, DType::kF8E4M3);
  auto* v = static_cast<uint8_t*>(w.values.raw_data());
  std::uniform_int_distribution<int> exponent(0, 10);
  for (int64_t i = 0; i < w.values.numel(); ++i) {
    const int b = byte(rng);
    v[i] = static_cast<uint8_t>((b & 0x87) | (exponent(rng) << 3));
  }
  // Exponent fields 0..10 give an rms of about 2.5.
  const float base = std::exp2(std::round(std::log2(std / 2.5f)));
  w.scales = Tensor::zeros(weight_scale_shape(n, k, block, block), DType::kF32);
  float* sp = w.scales.data<float>();
  for (int64_t i = 0; i < w.scales.numel(); ++i) sp[i] = std::ldexp(base, jitter(rng));
  return w;
}

struct QuantExpertsIn {
  std::vector<MatrixWeight> w1, w3, w2;
  Tensor x;
  HostRouting routing;
};

void add_quant_experts(std::vector<OpCase>& t, const QuantExperts& c) {
  // Tolerance. The device multiplies the same values (exact products) and differs from the
  // reference by f32 summation order only, which is ~1e-6 of the output. Activation quantization
  // rounds the SwiGLU output to e4m3 (3 mantissa bits): an element whose gate/up sums land within
  // an f32 rounding of an e4m3 midpoint may round the other way on the device, moving one term of
  // a down-GEMM sum by 2^-4 of itself, ~1e-3 of the output at the sizes here (and rarely). A wrong
  // fragment, nibble order or scale is off by O(1).
  const double rtol = c.act_group > 0 ? 5e-3 : 1e-4;
  add(t, Case<QuantExpertsIn>{
             .op = "moe_experts",
             .label = c.label(),
             .draw =
                 [c](Rng& rng) {
                   QuantExpertsIn in;
                   const float s13 = 1.0f / std::sqrt(static_cast<float>(c.hidden));
                   const float s2 = 1.0f / std::sqrt(static_cast<float>(c.inter));
                   for (int e = 0; e < c.experts; ++e) {
                     in.w1.push_back(random_quantized(rng, c.format, c.inter, c.hidden, c.block,
                                                      c.act_group, s13));
                     in.w3.push_back(random_quantized(rng, c.format, c.inter, c.hidden, c.block,
                                                      c.act_group, s13));
                     in.w2.push_back(random_quantized(rng, c.format, c.hidden, c.inter, c.block,
                                                      c.act_group, s2));
                   }
                   in.x = random_f32(rng, {c.tokens, c.hidden});
                   in.routing = random_routing(c.tokens, c.experts, c.top_k, rng);
                   if (c.repeated) {
                     auto* ids = static_cast<int32_t*>(in.routing.ids.raw_data());
                     for (int64_t i = 0; i < int64_t{c.tokens} * c.top_k; ++i) {
                       ids[i] = ids[i - i % c.top_k];
                     }
                   }
                   return in;
                 },
             .run =
                 [](Backend& be, const QuantExpertsIn& in) {
                   ExpertWeights w;
                   for (size_t e = 0; e < in.w1.size(); ++e) {
                     w.w1.push_back(be.upload_matrix_weight(in.w1[e]));
                     w.w3.push_back(be.upload_matrix_weight(in.w3[e]));
                     w.w2.push_back(be.upload_matrix_weight(in.w2[e]));
                   }
                   const Routing routing{up(be, in.routing.ids), up(be, in.routing.weights)};
                   return out(be.moe_experts(up(be, in.x), routing, w, 10.0f));
                 },
             .expect = close(rtol, 1e-6),
             .deterministic = true,
         });
}

void add_all_quant_experts(std::vector<OpCase>& t) {
  constexpr WeightFormat kMx = WeightFormat::kMxfp4, kFp8 = WeightFormat::kFp8Block;
  // CUDA (cuda/moe/sm80/experts_quant.cu): up to 16 pairs per expert on average the decode shape
  // (16-row tiles), above the prefill shape (64-row tiles, several per expert from 65 pairs);
  // act_group 0: three bf16 activation planes. H and I are multiples of 32 but not all of the
  // 128-input slices or of the 128 / 256 output columns of a CTA. On
  // sm_90 (unless DEEPINFER_MOE_QUANT_PREFILL=mma_sync) the prefill shape is
  // sm90/experts_quant_wgmma.cu (128-row tiles, wgmma n 32 / 64 / 96 / 128 by a tile's rows: 360
  // tokens give about 90 pairs per expert, 600 about 150, i.e. a full tile and a short one).
  for (const auto& [format, block, act] : {std::array<int, 3>{static_cast<int>(kMx), 32, 32},
                                           {static_cast<int>(kMx), 32, 0},
                                           {static_cast<int>(kFp8), 128, 128},
                                           {static_cast<int>(kFp8), 128, 0},
                                           {static_cast<int>(kFp8), 32, 128},
                                           {static_cast<int>(kFp8), 32, 0}}) {
    const auto f = static_cast<WeightFormat>(format);
    for (const int tokens : {1, 5, 64, 360, 600}) {
      add_quant_experts(t, {f, block, act, 16, 4, 256, 160, tokens});
    }
    add_quant_experts(t, {f, block, act, 64, 6, 96, 352, 40});  // tails: 96 < 128, 352 = 2.75 x 128
    add_quant_experts(t, {f, block, act, 4, 2, 160, 96, 300});  // 150 pairs per expert: 3 tiles
  }
  // V4-Flash sizes (H 4096, I 2048), few experts (the CPU reference holds them in f32): 2 tokens
  // (one pair per expert and n8 group), 20 tokens (15 pairs per expert: both n8 groups of a
  // decode tile), 200 tokens (prefill tiles).
  for (const int tokens : {2, 20, 200}) {
    add_quant_experts(t, {kMx, 32, 32, 8, 6, 4096, 2048, tokens});
  }
  add_quant_experts(t, {kFp8, 128, 128, 8, 6, 4096, 2048, 20});
  // One token: too few CTAs for the SMs, so the streaming kernels split K over a cluster
  // (expert_stream_splits on 132 SMs: top-6 two splits, top-2 four), MXFP4 (the lean kernel on
  // 8-row tiles and the narrow shape, expert_stream_narrow_tiles, where the activations are
  // quantized, as at 2 tokens above) and FP8; three activation planes at K 1024 (8 slices, two
  // splits); a K tail (H 1056: 9 slices in splits of 5 and 4, the default kernel's bounds checks).
  add_quant_experts(t, {kMx, 32, 32, 8, 6, 4096, 2048, 1});
  // 8 tokens that each name one of 7 experts 6 times: the narrow shape's 8-row tiles (at most 8
  // tokens), where an expert gets at least 12 pairs, so two or more tiles of its weights.
  add_quant_experts(t, {kMx, 32, 32, 7, 6, 4096, 2048, 8, true});
  add_quant_experts(t, {kMx, 32, 32, 8, 2, 4096, 2048, 1});
  add_quant_experts(t, {kFp8, 128, 128, 8, 6, 4096, 2048, 1});
  add_quant_experts(t, {kFp8, 128, 128, 8, 2, 4096, 2048, 1});
  add_quant_experts(t, {kMx, 32, 0, 8, 2, 1024, 1024, 1});
  add_quant_experts(t, {kMx, 32, 32, 8, 2, 1056, 1024, 1});
  // The tiny real-format checkpoints of tests/python/test_quantized_parity.py (H 64, I 32 and
  // H 96, I 48, 8 experts, top-2).
  for (const int tokens : {1, 5, 72}) add_quant_experts(t, {kMx, 32, 32, 8, 2, 64, 32, tokens});
  for (const int tokens : {1, 72}) add_quant_experts(t, {kFp8, 16, 16, 8, 2, 64, 32, tokens});
  for (const int tokens : {1, 80}) add_quant_experts(t, {kFp8, 32, 32, 8, 2, 96, 48, tokens});
}

}  // namespace

std::vector<OpCase> moe_quant_cases() {
  std::vector<OpCase> t;
  add_all_quant_experts(t);
  return t;
}

}  // namespace deepinfer::backend_ops
