// The bf16 GEMV of linear / grouped_linear for the smallest batches (gemv_bf16.cu): its tile
// constants and arguments, the choice between it and cuBLAS, and its tiling.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace deepinfer::cuda {

// Up to this M bf16 linears take the GEMV (cuBLAS above). On the H200 the GEMV made a B = 1 decode
// step 7% faster but a B = 8 step 25% slower than cuBLAS (its FMA work grows with M), so it is
// kept for the smallest batches.
constexpr int kGemvMaxTokens = 2;
constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * 32;
constexpr int kGemvBlockK = 64;  // k per warp and step: 8 lanes x 8 bf16
constexpr int kGemvUnroll = 4;   // blocks whose loads are issued together (M <= 4)
// Weights above this size (the 1 GB lm_head) stay on cuBLAS, which streams them at roofline.
constexpr int64_t kGemvMaxWeightBytes = int64_t{256} << 20;

struct GemvArgs {
  const float* x;          // [M, ldx]; group g reads columns [g K, (g + 1) K)
  const __nv_bfloat16* w;  // [G N, K]
  float* y;                // [M, ldy]; group g writes columns [g N, (g + 1) N)
  int64_t ldx, ldy;
  int64_t n, k;  // per group
  int m;         // tokens, 1..MT
  int splits;    // S: warps sharing the rows of a CTA, each over a contiguous range of K blocks
};

// CTAs of the GEMV for R rows per lane and S splits.
inline int64_t gemv_ctas(int64_t n, int64_t groups, int r, int s) {
  const int64_t rows_cta = (kGemvWarps / s) * 4 * r;
  return groups * ((n + rows_cta - 1) / rows_cta);
}

struct GemvProblem {
  int64_t m, n, k, groups;  // Y[M, G*N] = X[M, G*K] . W[G*N, K]^T per group
  bool bf16_weights;
  bool aligned;  // x and w 16-byte aligned
  int64_t weight_bytes;
};

struct GemvConfig {
  bool use;           // false: cuBLAS
  int rows_per_lane;  // R
  int splits;         // S
  int64_t row_tiles;  // grid x
};

// The GEMV applies for bf16 w, 1 <= M <= kGemvMaxTokens, K % 8 == 0, 16-byte aligned x and w and
// weights up to kGemvMaxWeightBytes. The tiling (R, S) depends on N, K, G and the SM count only,
// never on M, so a token's result does not depend on the other tokens.
inline GemvConfig choose_gemv(const GemvProblem& p, int num_sms) {
  GemvConfig c{};
  if (!p.bf16_weights || p.m < 1 || p.m > kGemvMaxTokens || p.k < 8 || p.k % 8 != 0 || !p.aligned ||
      p.weight_bytes > kGemvMaxWeightBytes || p.groups > 65535) {
    return c;
  }
  // Enough CTAs for two per SM: the fewest K splits (each warp keeping at least kGemvUnroll
  // blocks), 2 rows per lane unless even 8 splits leave too few CTAs.
  const int64_t target = 2 * static_cast<int64_t>(num_sms);
  const int64_t nblk = (p.k + kGemvBlockK - 1) / kGemvBlockK;
  const int max_s = static_cast<int>(std::clamp<int64_t>(nblk / kGemvUnroll, 1, kGemvWarps));
  const auto pick_s = [&](int r) {
    int s = 1;
    while (2 * s <= max_s && gemv_ctas(p.n, p.groups, r, s) < target) s *= 2;
    return s;
  };
  int r = 2;
  int s = pick_s(r);
  if (gemv_ctas(p.n, p.groups, r, s) < target) {
    r = 1;
    s = pick_s(r);
  }
  c.use = true;
  c.rows_per_lane = r;
  c.splits = s;
  const int64_t rows_cta = (kGemvWarps / s) * 4 * r;
  c.row_tiles = (p.n + rows_cta - 1) / rows_cta;
  return c;
}

}  // namespace deepinfer::cuda
