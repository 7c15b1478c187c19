// The paths of linear / grouped_linear on block-scaled FP8 weights (kFp8Block, e4m3 values with
// one f32 scale per block_rows x block_cols block) and the choice between them:
//
//   1. gemv_fp8.cu: the decode GEMV on FP8 tensor cores, for 1..kFp8GemvMaxTokens tokens with
//      dynamic activation quantization (act_group > 0) that the kernel does itself.
//   2. gemm_fp8.cu, cuBLASLt: W8A8 FP8 tensor-core GEMM with DeepSeek's scaling (1x128 on the
//      activations, 128x128 on the weights), for every other M when the weight has 128x128
//      blocks and act_group == 128.
//   3. The fallback (everything else: other blocks such as 32x32 at prefill, act_group == 0,
//      shapes cuBLASLt rejects): the weight dequantized into a bf16 scratch and the bf16 path.
#pragma once

#include <algorithm>
#include <cstdint>

namespace deepinfer::cuda {

// Up to this M the GEMV. Its tensor-core work grows with M at no extra weight traffic (an m16n8k32
// covers 8 tokens, two cover 16), so it streams the weights at bandwidth up to 16 tokens; the
// per-CTA activation quantization (M x K f32 read from L2 per split) is what grows. Above, the
// GEMM's tiles are full enough for cuBLASLt.
constexpr int kFp8GemvMaxTokens = 16;
constexpr int kFp8GemvMaxWarps = 8;    // 16 weight rows per warp
constexpr int kFp8GemvMaxSlab = 2048;  // K columns per CTA: bounds its shared memory (42 KiB)
constexpr int kFp8GemvMaxSplits = 8;   // K splits = CTAs of a cluster (portable cluster size)

struct Fp8Problem {
  int64_t m, n, k, groups;  // Y[M, G*N] = X[M, G*K] . W[G*N, K]^T per group
  int block_rows, block_cols, act_group;
};

struct Fp8GemvConfig {
  bool use = false;
  int kstep = 64;    // K per tensor-core step of a warp: 64 (16-byte loads) or 32 (8-byte loads)
  int warps = 8;     // per CTA; the CTA covers 16 * warps weight rows
  int splits = 1;    // CTAs over K of the same rows: one cluster, reduced in shared memory
  int64_t slab = 0;  // K columns per split, a multiple of act_group
  int64_t row_tiles = 0;
};

// The GEMV applies for act_group > 0 (the tensor cores take the e4m3 activations), act_group and
// block_cols multiples of 32 (a tensor-core step never straddles a scale), K % 16 == 0 (16-byte
// aligned weight rows), act_group <= kFp8GemvMaxSlab and K small enough for 8 splits. The tiling
// depends on N, K, G, the blocks and the SM count, never on M: a token's result does not depend
// on the other tokens of the batch.
inline Fp8GemvConfig choose_fp8_gemv(const Fp8Problem& p, int num_sms) {
  Fp8GemvConfig c;
  if (p.m < 1 || p.m > kFp8GemvMaxTokens || p.act_group <= 0 || p.act_group % 32 != 0 ||
      p.act_group > kFp8GemvMaxSlab || p.block_cols % 32 != 0 || p.k < 16 || p.k % 16 != 0 ||
      p.n < 1 || p.groups > 65535) {
    return c;
  }
  const int64_t act_groups = (p.k + p.act_group - 1) / p.act_group;  // along K
  const int64_t per_slab_max = kFp8GemvMaxSlab / p.act_group;
  const int64_t min_splits = (act_groups + per_slab_max - 1) / per_slab_max;
  if (min_splits > kFp8GemvMaxSplits) return c;
  // Two CTAs per SM keep enough weight bytes in flight; 8 warps (128 rows) per CTA unless even 8
  // splits leave fewer CTAs than SMs, then 4 (64 rows).
  const int64_t target = 2 * static_cast<int64_t>(num_sms);
  const int64_t max_splits = std::min<int64_t>(kFp8GemvMaxSplits, act_groups);
  int64_t splits = 1;
  int warps = kFp8GemvMaxWarps;
  for (const int w : {kFp8GemvMaxWarps, kFp8GemvMaxWarps / 2}) {
    warps = w;
    const int64_t tiles = (p.n + 16 * w - 1) / (16 * w) * p.groups;
    splits = min_splits;
    while (splits < max_splits && tiles * splits < target) ++splits;
    if (tiles * splits >= num_sms) break;
  }
  c.use = true;
  c.kstep = p.act_group % 64 == 0 && p.block_cols % 64 == 0 ? 64 : 32;
  c.warps = warps;
  c.slab = (act_groups + splits - 1) / splits * p.act_group;
  c.splits = static_cast<int>((p.k + c.slab - 1) / c.slab);
  c.row_tiles = (p.n + 16 * warps - 1) / (16 * warps);
  return c;
}

// cuBLASLt's block-scaled FP8 GEMM (Hopper: CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F on the
// activations, _BLK128x128_32F on the weights) applies to 128x128 blocks with act_group == 128,
// N and K multiples of 16 (FP8 operands need 16-byte aligned leading dimensions), a scale grid
// whose rows are a multiple of 4 floats (cuBLASLt reads the weight scales with a leading
// dimension of round_up(ceil(K / 128), 4)) and, for G > 1, groups that start on a scale block
// (N % 128 == 0). Whether cuBLASLt has an algorithm is known only when it is asked.
inline bool fp8_cublaslt_applies(const Fp8Problem& p) {
  const int64_t scale_cols = (p.k + 127) / 128;
  return p.block_rows == 128 && p.block_cols == 128 && p.act_group == 128 && p.k % 16 == 0 &&
         p.n % 16 == 0 && scale_cols % 4 == 0 && (p.groups == 1 || p.n % 128 == 0) && p.m >= 1;
}

}  // namespace deepinfer::cuda
