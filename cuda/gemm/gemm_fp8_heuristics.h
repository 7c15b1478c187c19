// The paths of linear / grouped_linear on block-scaled FP8 weights (kFp8Block, e4m3 values with
// one f32 scale per block_rows x block_cols block) and the choice between them:
//
//   1. fp8_stream.cu (DEEPINFER_FP8_LINEAR=stream or stream_pdl; by default only for grouped
//      linears above the GEMV's tokens: fp8_grouped_takes_stream): the streaming kernel
//      for 1..kFp8StreamMaxTokens tokens with dynamic activation quantization (act_group > 0). It
//      streams the weight bytes through a cp.async ring in shared memory and decodes them to bf16
//      in registers (the routed experts' streaming kernel, applied to a dense weight). It
//      assumes power-of-two block scales (DeepSeek's ue8m0), which bf16 holds exactly.
//   2. gemv_fp8.cu (the default): the decode GEMV on FP8 tensor cores, which quantizes x itself,
//      for 1..kFp8GemvMaxTokens tokens with act_group > 0.
//   3. gemm_fp8.cu, cuBLASLt: W8A8 FP8 tensor-core GEMM with DeepSeek's scaling (1x128 on the
//      activations, 128x128 on the weights), for every other M when the weight has 128x128
//      blocks and act_group == 128.
//   4. The fallback (everything else: other blocks such as 32x32 at prefill, act_group == 0,
//      shapes cuBLASLt rejects): the weight dequantized into a bf16 scratch and the bf16 path.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/gemm/fp8_linear_choice.h"

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
// block_cols multiples of 32 (a tensor-core step never straddles a scale), act_group, block_cols
// and block_rows powers of two (the kernel finds a column's scales by shifts: DeepSeek's blocks
// are 128 or 32, its activation groups 128), K % 16 == 0 (16-byte aligned weight rows),
// act_group <= kFp8GemvMaxSlab and K small enough for 8 splits. The tiling depends on N, K, G,
// the blocks and the SM count, never on M: a token's result does not depend on the other tokens
// of the batch.
inline Fp8GemvConfig choose_fp8_gemv(const Fp8Problem& p, int num_sms) {
  Fp8GemvConfig c;
  const auto power_of_two = [](int v) { return v > 0 && (v & (v - 1)) == 0; };
  if (p.m < 1 || p.m > kFp8GemvMaxTokens || p.act_group <= 0 || p.act_group % 32 != 0 ||
      p.act_group > kFp8GemvMaxSlab || p.block_cols % 32 != 0 || !power_of_two(p.act_group) ||
      !power_of_two(p.block_cols) || !power_of_two(p.block_rows) || p.k < 16 || p.k % 16 != 0 ||
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
    // Equal slabs: down to a count that divides K's activation groups while the CTAs still cover
    // the SMs. wo_a (8 groups of 1024 x 4096, 8 row tiles each) took 5 splits of 7, 7, 7, 7 and 4
    // groups (320 CTAs); 4 splits of 8 (256 CTAs) made the H100 decode step 2-5% faster at B = 1
    // and moved B = 8 within its noise; 8 splits were slower than 4 (session 44).
    for (int64_t even = splits; even >= min_splits; --even) {
      if (act_groups % even == 0) {
        if (tiles * even >= num_sms) splits = even;
        break;
      }
    }
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

// ---- the streaming kernel (fp8_stream.cu) -------------------------------------------------------

// Up to this M the streaming kernel (cuBLASLt's tiles are full enough above).
constexpr int kFp8StreamMaxTokens = 64;
// K per slice of the ring: one step of the weight copies and of the activation staging.
constexpr int kFp8StreamSliceK = 128;
// A warp owns two m16 tiles: 32 weight rows; a CTA 2, 4 or 8 warps.
constexpr int kFp8StreamRowsPerWarp = 32;
constexpr int kFp8StreamMaxWarps = 8;
constexpr int kFp8StreamMinWarps = 2;
// K splits = CTAs of one cluster (the portable cluster size), reduced through distributed shared
// memory in split order.
constexpr int kFp8StreamMaxSplits = 8;
// 32-bit words of one staged activation row of a slice (bf16 pairs, padded by 8 words so that the
// rows of 8 tokens start 8 banks apart: experts_quant_config.h's kQuantRowWords).
constexpr int kFp8StreamRowWords = kFp8StreamSliceK / 2 + 8;

// The token tile of a call: 16 up to 16 tokens (16 accumulators per thread), else 64 (64). It
// changes no sum: each output's reduction over K is fixed by the K split.
constexpr int fp8_stream_tokens(int64_t m) {
  return m <= 16 ? 16 : 64;
}
// Ring depth (slices) of a CTA, for two CTAs per SM except 8 warps x 64 tokens (one): 8 warps
// hold 3 slices at 16 tokens (3 x 36.5 KiB, 128 KiB of weights in flight per SM) and 4 at 64 (4 x
// 50 KiB, 96 KiB in flight); 4 warps 5 at 16 tokens (5 x 20.5 KiB) and 3 at 64 (3 x 34 KiB);
// 2 warps 5 at 16 tokens and 4 at 64 (4 x 26 KiB). Small CTAs carry small weights: a deeper ring
// keeps all of a split's few slices in flight at once.
constexpr int fp8_stream_stages(int tokens, int warps) {
  if (tokens <= 16) return warps == kFp8StreamMaxWarps ? 3 : 5;
  return warps == kFp8StreamMinWarps || warps == kFp8StreamMaxWarps ? 4 : 3;
}
// Dynamic shared memory of a CTA: the ring of weight slices (rows x 128 bytes) and activation
// slices (tokens x kFp8StreamRowWords words). The split partials reuse it after the last slice.
constexpr size_t fp8_stream_smem(int warps, int tokens) {
  const size_t weights = static_cast<size_t>(warps) * kFp8StreamRowsPerWarp * kFp8StreamSliceK;
  const size_t acts = static_cast<size_t>(tokens) * kFp8StreamRowWords * 4;
  return static_cast<size_t>(fp8_stream_stages(tokens, warps)) * (weights + acts);
}
static_assert(fp8_stream_smem(kFp8StreamMaxWarps, 64) <= 227 * 1024, "fits sm_90's opt-in");
static_assert(2 * (fp8_stream_smem(8, 16) + 1024) <= 228 * 1024 &&
                  2 * (fp8_stream_smem(4, 16) + 1024) <= 228 * 1024 &&
                  2 * (fp8_stream_smem(2, 16) + 1024) <= 228 * 1024 &&
                  2 * (fp8_stream_smem(4, 64) + 1024) <= 228 * 1024 &&
                  2 * (fp8_stream_smem(2, 64) + 1024) <= 228 * 1024,
              "two CTAs per SM but at 8 warps x 64 tokens");

struct Fp8StreamConfig {
  bool use = false;
  int warps = kFp8StreamMaxWarps;  // per CTA; the CTA covers 32 * warps weight rows
  int splits = 1;                  // CTAs over K of the same rows: one cluster
  int slab = 0;                    // slices of K per split (the last split may have fewer)
  int64_t row_tiles = 0;           // CTAs over N per group
  int tokens = 16;                 // token tile (fp8_stream_tokens)
};

// The streaming kernel applies for 1 <= M <= kFp8StreamMaxTokens, act_group > 0 (the quantized
// activations are exact in bf16), block_cols a power of two >= 16 (a 16-byte weight chunk never
// straddles a scale) and K % 16 == 0 (16-byte aligned weight rows). The tiling depends on N, K, G
// and the SM count only, never on M: a token's result does not depend on the other tokens. It
// takes the widest CTA (8, 4, then 2 warps) that gives at least one CTA per SM with up to 8 K
// splits, and the splits that fill the slots of two CTAs per SM best (CTAs / (waves x slots);
// the fewest splits among equals): small weights get many CTAs, so enough bytes in flight, and
// no wave is left a quarter full.
inline Fp8StreamConfig choose_fp8_stream(const Fp8Problem& p, int num_sms) {
  Fp8StreamConfig c;
  const bool pow2_cols = p.block_cols >= 16 && (p.block_cols & (p.block_cols - 1)) == 0;
  if (p.m < 1 || p.m > kFp8StreamMaxTokens || p.act_group <= 0 || !pow2_cols || p.block_rows < 1 ||
      p.k < 16 || p.k % 16 != 0 || p.n < 1 || p.groups < 1 || p.groups > 65535 || num_sms < 1) {
    return c;
  }
  const int64_t slices = (p.k + kFp8StreamSliceK - 1) / kFp8StreamSliceK;
  const int64_t max_splits = std::min<int64_t>(kFp8StreamMaxSplits, slices);
  const int64_t slots = 2 * static_cast<int64_t>(num_sms);
  int64_t splits = 1;
  int warps = kFp8StreamMaxWarps;
  for (;; warps /= 2) {
    const int64_t rows = static_cast<int64_t>(kFp8StreamRowsPerWarp) * warps;
    const int64_t tiles = (p.n + rows - 1) / rows * p.groups;
    // Fill of s splits: ctas / waves (over slots); s beats the best when strictly fuller.
    int64_t best_ctas = tiles, best_waves = (tiles + slots - 1) / slots;
    splits = 1;
    for (int64_t s = 2; s <= max_splits; ++s) {
      const int64_t ctas = tiles * s;
      const int64_t waves = (ctas + slots - 1) / slots;
      if (ctas * best_waves > best_ctas * waves) {
        best_ctas = ctas;
        best_waves = waves;
        splits = s;
      }
    }
    if (tiles * splits >= num_sms || warps == kFp8StreamMinWarps) break;
  }
  const int64_t rows = static_cast<int64_t>(kFp8StreamRowsPerWarp) * warps;
  const int64_t row_tiles = (p.n + rows - 1) / rows;
  if (row_tiles > 0x7fffffff) return c;
  c.use = true;
  c.warps = warps;
  c.slab = static_cast<int>((slices + splits - 1) / splits);
  c.splits = static_cast<int>((slices + c.slab - 1) / c.slab);
  c.row_tiles = row_tiles;
  c.tokens = fp8_stream_tokens(p.m);
  return c;
}

// The default (legacy) choice's one use of the streaming kernel: a grouped linear (V4's wo_a,
// 8 groups) with more tokens than the GEMV takes. cuBLASLt runs it as one GEMM per group, each
// latency bound at these sizes (H200, wo_a 8 x 1024 x 4096, session 19: 117 us at 32 tokens and
// 121 at 64, against the streaming kernel's 52 and 75).
inline bool fp8_grouped_takes_stream(const Fp8Problem& p) {
  return p.groups > 1 && p.m > kFp8GemvMaxTokens && p.m <= kFp8StreamMaxTokens;
}

// ---- the Hopper weight stream (sm90/fp8_wgmma.cu; DEEPINFER_FP8_LINEAR=wgmma) -------------------

// Weight rows per CTA (one m64 wgmma tile), columns per ring stage (one activation group and one
// weight scale column), ring depth, and K splits (CTAs of one cluster).
constexpr int kFp8WgmmaRows = 64;
constexpr int kFp8WgmmaSliceK = 128;
constexpr int kFp8WgmmaStages = 4;
constexpr int kFp8WgmmaMaxSplits = 8;
// Up to these M: linear and linear_pair as the GEMV did, grouped linears as the streaming kernel
// did (wo_a past 16 tokens, where cuBLASLt runs a latency-bound GEMM per group).
constexpr int kFp8WgmmaMaxTokens = 16;
constexpr int kFp8WgmmaGroupedMaxTokens = 64;
// The f16 math's bound for linear and linear_pair too: its activations stream through the ring
// with the weights, so no CTA holds a K range of them.
constexpr int kFp8WgmmaF16MaxTokens = 64;
// Fp8WgmmaMath::kAuto takes the f16 math past kFp8WgmmaMaxTokens tokens for grouped linears and
// for linears of at most this many rows (a linear_pair: both weights'), where it beat the paths
// there on an H100 (session 55, us at 32 / 64 tokens): wq_a 10.1 / 11.0 against cuBLASLt's 16.7 /
// 16.9, wkv 8.5 / 10.4 against 16.3 / 16.6, grouped wo_a 28.1 / 42.1 against the mma.sync
// stream's 31.1 / 51.5. Wider weights stay on cuBLASLt (wq_b, wo_b, the shared expert's and the
// indexer's: 1.1-2.3x faster there at 64 tokens).
constexpr int64_t kFp8WgmmaF16AutoMaxRows = 1536;
// The activations of a CTA's K range stay in shared memory: at most this many bytes at the
// largest token tile of its kind of call.
constexpr int64_t kFp8WgmmaMaxActBytes = 64 * 1024;
// Where a CTA's (token, 128 columns) items number at most this many (M x blocks per split), it
// quantizes its own tile of x (fused_quant): one batch of loads per warp, no quantization launch
// ahead of the kernel. More items cost each CTA more serial L2 round trips than the launch they
// save: on the H100 (session 48) fused took 0.7-1.9 us off every V4-Flash linear at M = 1 (8
// items or fewer), and added 0.9-1.0 us to wq_b, wo_a and wo_b at M = 4 (32-64 items).
constexpr int64_t kFp8WgmmaFusedQuantMaxItems = 16;

// The token tile of a call (the wgmma's N): 8, 16, 32 or 64.
constexpr int fp8_wgmma_tokens(int64_t m) {
  return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64;
}

struct Fp8WgmmaConfig {
  bool use = false;
  int tokens = 8;            // token tile (fp8_wgmma_tokens)
  int splits = 1;            // CTAs over K of the same rows: one cluster
  int kb_per_split = 0;      // 128-column blocks per split (the last split may have fewer)
  bool fused_quant = false;  // each CTA quantizes its tile of x (else quantize_rows_e4m3 first)
  Fp8WgmmaMath math = Fp8WgmmaMath::kMmaSync;  // kMmaSync or kF16 (never kAuto)
};

// The weight stream applies on wgmma devices for 1 <= M <= kFp8WgmmaMaxTokens (grouped:
// kFp8WgmmaGroupedMaxTokens; on the f16 math: kFp8WgmmaF16MaxTokens; `choice` kAuto takes the f16
// math as kFp8WgmmaF16AutoMaxRows says) to DeepSeek's scaling: act_group 128 and 128-column weight
// blocks (one promotion per stage), block_rows a power of two >= 64 (a tile's rows share one
// scale row), K % 16 == 0 (16-byte rows for the tensor copies) and, when grouped, N % 64 == 0 (no
// tile straddles two groups). `rows` is the launch's row count per group (both weights of a
// pair). The K split depends on N, K, G, the math and the SM count only, never on M: each row
// tile's CTAs double their splits while they stay under two CTAs per SM and every split keeps at
// least two blocks, then (mma.sync math, which keeps a CTA's activations) more splits while a
// split's activations at the largest tile would not fit. Where a CTA has few activation items
// (kFp8WgmmaFusedQuantMaxItems) it quantizes x itself, with the activation quantization's math:
// the same codes either way.
inline Fp8WgmmaConfig choose_fp8_wgmma(const Fp8Problem& p, int num_sms, bool wgmma_device,
                                       Fp8WgmmaMath choice = Fp8WgmmaMath::kMmaSync) {
  Fp8WgmmaConfig c;
  const bool auto_f16 =
      p.m > kFp8WgmmaMaxTokens && (p.groups > 1 || p.n <= kFp8WgmmaF16AutoMaxRows);
  const Fp8WgmmaMath math = choice != Fp8WgmmaMath::kAuto ? choice
                            : auto_f16                    ? Fp8WgmmaMath::kF16
                                                          : Fp8WgmmaMath::kMmaSync;
  const bool f16 = math == Fp8WgmmaMath::kF16;
  const int64_t max_tokens = f16            ? kFp8WgmmaF16MaxTokens
                             : p.groups > 1 ? kFp8WgmmaGroupedMaxTokens
                                            : kFp8WgmmaMaxTokens;
  const bool pow2_rows = p.block_rows >= kFp8WgmmaRows && (p.block_rows & (p.block_rows - 1)) == 0;
  if (!wgmma_device || p.m < 1 || p.m > max_tokens || p.act_group != kFp8WgmmaSliceK ||
      p.block_cols != kFp8WgmmaSliceK || !pow2_rows || p.k < 16 || p.k % 16 != 0 || p.n < 1 ||
      p.groups < 1 || (p.groups > 1 && p.n % kFp8WgmmaRows != 0) || num_sms < 1) {
    return c;
  }
  const int64_t blocks = (p.k + kFp8WgmmaSliceK - 1) / kFp8WgmmaSliceK;
  const int64_t tiles = (p.n + kFp8WgmmaRows - 1) / kFp8WgmmaRows * p.groups;
  if (tiles > 0x7fffffff) return c;
  int64_t splits = 1;
  while (splits < kFp8WgmmaMaxSplits && tiles * splits < 2 * static_cast<int64_t>(num_sms) &&
         blocks / (2 * splits) >= 2) {
    splits *= 2;
  }
  const auto act_bytes = [&](int64_t s) {
    return (blocks + s - 1) / s * kFp8WgmmaSliceK * fp8_wgmma_tokens(max_tokens);
  };
  while (!f16 && act_bytes(splits) > kFp8WgmmaMaxActBytes && splits < kFp8WgmmaMaxSplits) {
    ++splits;
  }
  if (!f16 && act_bytes(splits) > kFp8WgmmaMaxActBytes) return c;
  c.use = true;
  c.math = math;
  c.tokens = fp8_wgmma_tokens(p.m);
  c.kb_per_split = static_cast<int>((blocks + splits - 1) / splits);
  c.splits = static_cast<int>((blocks + c.kb_per_split - 1) / c.kb_per_split);
  c.fused_quant = p.m * c.kb_per_split <= kFp8WgmmaFusedQuantMaxItems;
  return c;
}

}  // namespace deepinfer::cuda
