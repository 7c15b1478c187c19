// Rows of attention, at tiny widths (D = 32, 4 heads, W = 8, ratios 4 and 8) and at V4-Flash
// widths (D = 512, 64 heads, W = 128, ring 134, CSA ratio 4 with top-k 512, HCA ratio 128 with
// dense entries, contexts up to 4096). Batches mix decode rows, 2..6-token verification steps and
// prefill chunks longer than the ring, over shuffled block tables. indexer_topk's rows are in
// cases_indexer.cpp.
//
// attention differs by summation order and expf ulps; with AttentionSpec::bf16_math (the CUDA
// tensor-core kernel) it is held to the bf16 tolerance. The V4-width bf16_ rows over bf16 and fp8
// caches (64 and 128 heads of 512) are the shapes of the Hopper wgmma kernels too, which take them
// by default on an sm_90 device: run the table with DEEPINFER_ATTENTION_KERNEL=mma_sync (or another
// value) to check the other kernels there against the CPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "batch_layout.h"
#include "cases.h"
#include "compare.h"
#include "inputs.h"
#include "kv_inputs.h"

namespace deepinfer::backend_ops {
namespace {

// ---- attention ----------------------------------------------------------------------------------

struct Attn {
  std::vector<SeqSpec> seqs;
  int block = 16;
  int heads = 4;
  int dim = 32;
  int window = 8;
  int ring_len = 14;  // W + 6
  int ratio = 0;      // 0: sliding only
  bool sparse = false;
  int topk_cols = 0;
  bool bf16 = false;       // AttentionSpec::bf16_math: the tensor-core path, bf16 tolerance
  DType kv = DType::kF32;  // the caches' dtype: kF32, kBF16, kU8 (fp8 records), kF8E4M3
  // The entries' dtype where it differs from kv (V4.1: kE2M1x2 entries under kF8E4M3 keys).
  DType entry_kv = DType::kF32;
  int rope = 0;  // rope_dim: the fp8 record's bf16 channels
  // AttentionSpec::swa_start per sequence (YOCO truncation's narrowed windows); empty: none.
  std::vector<int32_t> swa_start;
  // q in bf16 (rms_norm_rope's under bf16_output), drawn as f32 and rounded: the CPU widens it.
  bool q_bf16 = false;
  // AttentionSpec::bf16_output (the engine's call with bf16_math): a device may return bf16,
  // held widened against the CPU's f32 at the bf16 tolerance.
  bool out_bf16 = false;
  // This call's keys passed in the ring's format (rms_norm_rope_kv's rows, the engine's call):
  // drawn in f32 and encoded by the host codec; the op reads them as they are.
  bool kv_encoded = false;
  // AttentionSpec::output_rope_inv_freq with this many pairs (the last 2 * n channels rotated
  // back; the engine's call passes its layer's 32): 0 none.
  int rope_back = 0;
};

// Random f32 key rows of `dim` channels as a cache of `dtype` holds them ([.., row width]).
Tensor random_cache(Rng& rng, const Shape& rows_shape, int64_t dim, int64_t rope, DType dtype) {
  Shape shape = rows_shape;
  shape.push_back(dim);
  Tensor rows = random_f32(rng, shape);
  return dtype == DType::kF32 ? rows : encode_kv_rows(rows, dtype, rope);
}

struct AttnIn {
  HostBatch hb;
  Tensor q, kv, ring, sinks, entries, topk;
};

void add_attention(std::vector<OpCase>& t, const std::string& label, const Attn& c) {
  AttentionSpec spec{c.window, 1.0f / std::sqrt(float(c.dim)), c.ratio, c.sparse};
  spec.bf16_math = c.bf16;
  spec.bf16_output = c.out_bf16;
  spec.rope_dim = c.rope;
  // V4.1's records go through the f32 kernel even under bf16_math (attention.cu).
  Expect<AttnIn> expect = c.bf16 && c.kv != DType::kF8E4M3 ? bf16_math() : close(1e-5, 1e-6);
  if (c.out_bf16) {
    expect = Expect<AttnIn>([](const AttnIn&, const Outputs& ref, const Outputs& dev) {
      EXPECT_TRUE(bf16_close(ref[0].value, dev[0].value.to(DType::kF32)))
          << "device output " << dev[0].value.describe();
    });
  }
  add(t, Case<AttnIn>{
             .op = "attention",
             .label = kv_label(c.kv) + (c.kv_encoded ? "kvenc_" : "") + (c.bf16 ? "bf16_" : "") +
                      (c.q_bf16 ? "qbf16_" : "") + (c.out_bf16 ? "outbf16_" : "") +
                      (c.rope_back > 0 ? "ropeback_" : "") + label,
             .draw =
                 [c](Rng& rng) {
                   HostBatch hb(rng, c.seqs, c.block);
                   const int64_t tokens = hb.num_tokens();
                   int slots = 0;
                   for (const SeqSpec& s : c.seqs) slots = std::max(slots, s.slot + 1);
                   AttnIn in{hb,
                             random_f32(rng, {tokens, c.heads, c.dim}),
                             random_f32(rng, {tokens, c.dim}),
                             random_cache(rng, {slots, c.ring_len}, c.dim, c.rope, c.kv),
                             random_f32(rng, {c.heads}),
                             Tensor(),
                             Tensor()};
                   if (c.q_bf16) in.q = in.q.to(DType::kBF16);
                   if (c.kv_encoded) in.kv = encode_kv_rows(in.kv, c.kv, c.rope);
                   if (c.ratio > 0) {
                     const DType entry_kv = c.entry_kv == DType::kF32 ? c.kv : c.entry_kv;
                     in.entries = random_cache(rng, {int64_t{hb.num_blocks} * (c.block / c.ratio)},
                                               c.dim, c.rope, entry_kv);
                     if (c.sparse) in.topk = random_topk(rng, hb, c.ratio, c.topk_cols);
                   }
                   return in;
                 },
             .run =
                 [spec, c](Backend& be, const AttnIn& in) {
                   AttentionSpec s = spec;
                   if (c.rope_back > 0) {
                     // V4's frequencies: 10000^(-2i / (2n)).
                     std::vector<float> inv_freq(static_cast<size_t>(c.rope_back));
                     for (int i = 0; i < c.rope_back; ++i) {
                       inv_freq[static_cast<size_t>(i)] =
                           std::pow(10000.0f, -float(i) / c.rope_back);
                     }
                     s.output_rope_inv_freq =
                         up(be, Tensor::from_vector(inv_freq, {int64_t{c.rope_back}}));
                   }
                   if (!c.swa_start.empty()) {
                     s.swa_start =
                         up(be, Tensor::from_vector(c.swa_start,
                                                    {static_cast<int64_t>(c.swa_start.size())}));
                   }
                   return out(be.attention(up_same(be, in.q), up_same(be, in.kv),
                                           up_same(be, in.ring), up_same(be, in.entries),
                                           up(be, in.topk), up(be, in.sinks), in.hb.upload(be), s));
                 },
             .expect = std::move(expect),
         });
}

// Starting at 0; a decode row reading a wrapped ring; a chunk longer than the ring; 3- and
// 2-token verification steps.
const std::vector<SeqSpec> kTinySeqs = {{0, 5, 2}, {37, 1, 0}, {20, 30, 4}, {50, 3, 1}, {9, 2, 3}};

// A decode row at 4095, a 4-token step at 1000, a 200-token prefill chunk from 0 (longer than
// the ring), a 6-token verification step at 3000.
const std::vector<SeqSpec> kFlashSeqs = {{4095, 1, 0}, {1000, 4, 1}, {0, 200, 2}, {3000, 6, 3}};

// Decode rows of `batch` sequences at spread-out contexts.
std::vector<SeqSpec> decode_seqs(int batch, int s_q) {
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < batch; ++i) seqs.push_back({200 + (i * 997) % 3900, s_q, i});
  return seqs;
}

// Dense and sparse entries over kTinySeqs (positions below 32: fewer visible entries than
// top_k); `last_heads` for the last row.
void add_tiny_entries(std::vector<OpCase>& t, Attn c, int last_heads) {
  c.seqs = kTinySeqs;
  c.ratio = 4;
  add_attention(t, "tiny_dense_m4", c);
  c.ratio = 8;
  add_attention(t, "tiny_dense_m8", c);
  c.ratio = 4;
  c.sparse = true;
  c.topk_cols = 8;
  add_attention(t, "tiny_sparse_m4_k8", c);
  c.topk_cols = 3;
  c.ratio = 8;
  const std::string heads = c.heads == last_heads ? "" : "_h" + std::to_string(last_heads);
  c.heads = last_heads;
  add_attention(t, "tiny_sparse_m8_k3" + heads, c);
}

// YOCO truncation's per-sequence bound on the sliding keys (kTinySeqs): none, inside a decode
// row's window, in the middle of a 30-token chunk (its first rows see no sliding key), past a
// 3-token step's rows, 0.
void add_swa_start(std::vector<OpCase>& t, Attn c) {
  c.seqs = kTinySeqs;
  c.swa_start = {0, 33, 35, 60, 0};
  add_attention(t, "tiny_sliding_swa_start", c);
  c.ratio = 4;
  c.sparse = true;
  c.topk_cols = 8;
  add_attention(t, "tiny_sparse_m4_k8_swa_start", c);
}

// Few tokens over long key lists: the keys are split across blocks and combined.
void add_split_keys(std::vector<OpCase>& t, Attn c) {
  c.seqs = {{1000, 1, 0}, {777, 2, 1}};
  c.ratio = 4;
  add_attention(t, "tiny_dense_split", c);
  c.sparse = true;
  c.topk_cols = 100;
  add_attention(t, "tiny_sparse_split", c);
  c.ratio = 0;
  c.sparse = false;
  c.topk_cols = 0;
  c.window = 200;
  c.ring_len = 206;
  add_attention(t, "tiny_sliding_w200_split", c);
}

// The output's inverse RoPE in the call (AttentionSpec::output_rope_inv_freq) where the keys are
// split (the combine rotates as it stores) and where they are not (a rope after), with RoPE
// channels in whole quads and with an odd pair count (a rope after the combine).
void add_rope_back(std::vector<OpCase>& t, Attn c) {
  c.seqs = {{1000, 1, 0}, {777, 2, 1}};
  c.ratio = 4;
  c.rope_back = 4;
  add_attention(t, "tiny_dense_split", c);
  c.rope_back = 3;
  add_attention(t, "tiny_dense_split_odd_pairs", c);
  c.seqs = kTinySeqs;
  c.rope_back = 4;
  add_attention(t, "tiny_dense_m4", c);
}

// V4-Flash widths: sliding, CSA (sparse, m = 4, top-512) and HCA (dense, m = 128) layers over
// kFlashSeqs (with a 200-token prefill chunk from 0), a B = 1 decode, and for the tensor-core
// kernel also decode batches and a prefill chunk after cached tokens.
// A V4-Flash-width layer's Attn (64 heads of 512, W = 128, ring 134, blocks of 128) over caches of
// kv (its entries of entry_kv where that differs), sliding only.
Attn flash_widths(bool bf16, DType kv, DType entry_kv = DType::kF32) {
  Attn c;
  c.entry_kv = entry_kv;
  c.block = 128;
  c.heads = 64;
  c.dim = 512;
  c.window = 128;
  c.ring_len = 134;
  c.bf16 = bf16;
  c.kv = kv;
  c.rope = kv == DType::kF32 ? 0 : 64;
  return c;
}

// A V4-Flash CSA layer's Attn (flash_widths, ratio 4, sparse top-512) over kFlashSeqs.
Attn flash_csa(bool bf16, DType kv, DType entry_kv = DType::kF32) {
  Attn c = flash_widths(bf16, kv, entry_kv);
  c.ratio = 4;
  c.sparse = true;
  c.topk_cols = 512;
  c.seqs = kFlashSeqs;
  return c;
}

void add_flash(std::vector<OpCase>& t, bool bf16, DType kv = DType::kF32,
               DType entry_kv = DType::kF32) {
  Attn c = flash_widths(bf16, kv, entry_kv);
  c.seqs = kFlashSeqs;
  add_attention(t, "v4_sliding", c);
  c.seqs = {{4000, 1, 0}};
  add_attention(t, "v4_sliding_b1_decode", c);

  Attn csa = flash_csa(bf16, kv, entry_kv);
  add_attention(t, "v4_csa_top512", csa);
  csa.seqs = {{4096, 1, 0}};
  add_attention(t, "v4_csa_b1_decode", csa);
  csa.seqs = {{2047, 2, 0}, {1500, 2, 1}};
  add_attention(t, "v4_csa_two_2token_steps", csa);
  // The tensor-core kernel's plans (cuda/attention/attention_plan.h) over small batches: the
  // 16-head layout with the fused combine (B = 1, 2, 5; s_q 1..4), the 64-head one with the fused
  // combine (B = 37, 64) or without splits; top-k 1024; 128 heads; a sliding-only layer. V4.1's
  // records go through the f32 kernel (attention.cu): none of these rows for them.
  if (bf16 && kv != DType::kF8E4M3) {
    csa.seqs = decode_seqs(2, 1);
    add_attention(t, "v4_csa_b2_decode", csa);
    csa.seqs = decode_seqs(5, 1);
    add_attention(t, "v4_csa_b5_decode", csa);
    csa.seqs = decode_seqs(64, 1);
    add_attention(t, "v4_csa_b64_decode", csa);
    csa.seqs = {{4093, 3, 0}};
    add_attention(t, "v4_csa_b1_sq3", csa);
    csa.seqs = {{4092, 4, 0}, {3001, 4, 1}};
    add_attention(t, "v4_csa_b2_sq4", csa);
    csa.seqs = {{4094, 2, 0}, {3900, 2, 1}, {2222, 2, 2}, {4000, 2, 3}, {3500, 2, 4}};
    add_attention(t, "v4_csa_b5_sq2", csa);
    Attn k1024 = csa;
    k1024.topk_cols = 1024;
    k1024.seqs = {{4096, 1, 0}};
    add_attention(t, "v4_csa_top1024_b1_decode", k1024);
    k1024.seqs = {{4095, 1, 0}, {4000, 1, 1}, {3333, 2, 2}, {4096, 1, 3}, {2000, 1, 4}};
    add_attention(t, "v4_csa_top1024_b5", k1024);
    Attn h128 = csa;
    h128.heads = 128;
    h128.seqs = {{4096, 1, 0}};
    add_attention(t, "v4_csa_h128_b1_decode", h128);
    h128.seqs = {{4000, 2, 0}, {2500, 1, 1}};
    add_attention(t, "v4_csa_h128_b2", h128);
    Attn swa = c;
    swa.seqs = {{4000, 2, 0}, {100, 1, 1}};
    add_attention(t, "v4_sliding_b2", swa);
    swa.seqs = decode_seqs(5, 1);
    add_attention(t, "v4_sliding_b5_decode", swa);
  }
  if (bf16) {
    csa.seqs = decode_seqs(8, 1);
    add_attention(t, "v4_csa_b8_decode", csa);
    csa.seqs = decode_seqs(37, 1);
    add_attention(t, "v4_csa_b37_decode", csa);
    csa.seqs = decode_seqs(16, 2);
    add_attention(t, "v4_csa_b16_sq2", csa);
    csa.seqs = {{600, 150, 0}, {3000, 1, 1}};  // a prefill chunk after 600 cached tokens
    add_attention(t, "v4_csa_prefill_chunk_with_context", csa);
  }

  Attn hca = c;
  hca.ratio = 128;
  hca.seqs = kFlashSeqs;
  add_attention(t, "v4_hca_dense", hca);
  hca.seqs = {{4095, 1, 0}};
  add_attention(t, "v4_hca_b1_decode", hca);
  if (bf16) {
    hca.seqs = decode_seqs(8, 2);
    add_attention(t, "v4_hca_b8_sq2", hca);
  }
}

void add_f32_attention(std::vector<OpCase>& t) {
  Attn c;
  c.seqs = kTinySeqs;
  add_attention(t, "tiny_sliding", c);
  c.heads = 5;  // a head count that is not a multiple of 8
  c.dim = 64;
  add_attention(t, "tiny_sliding_h5_d64", c);
  c.heads = 12;
  c.dim = 96;
  add_attention(t, "tiny_sliding_h12_d96", c);
  add_tiny_entries(t, Attn{}, 4);
  add_split_keys(t, Attn{});
  add_swa_start(t, Attn{});
  add_flash(t, false);
  add_rope_back(t, Attn{});
}

// AttentionSpec::bf16_math: the CUDA tensor-core kernel (cuda/attention/sm80/attention_mma.cu).
void add_bf16_attention(std::vector<OpCase>& t) {
  Attn c;
  c.seqs = kTinySeqs;
  c.bf16 = true;
  c.dim = 64;
  add_attention(t, "tiny_sliding_h4_d64", c);
  c.heads = 5;  // one partial row group of 16
  c.dim = 128;
  add_attention(t, "tiny_sliding_h5_d128", c);
  c.heads = 72;  // two head groups of 64, the second with 8 heads
  c.dim = 64;
  add_attention(t, "tiny_sliding_h72_d64", c);
  c.heads = 12;  // D = 96 has no tensor-core kernel: the f32 kernel runs
  c.dim = 96;
  add_attention(t, "tiny_sliding_h12_d96_f32_fallback", c);
  c.heads = 3;
  c.dim = 256;
  add_attention(t, "tiny_sliding_h3_d256", c);
  Attn tiny;
  tiny.bf16 = true;
  tiny.dim = 64;
  add_tiny_entries(t, tiny, 20);
  add_split_keys(t, tiny);
  add_swa_start(t, tiny);
  add_flash(t, true);
  add_rope_back(t, tiny);
}

// bf16 and fp8 caches (kv_record.h), through both kernels: the keys are decoded exactly, so the
// tolerances are those of f32 caches. The fp8 record needs channel counts that are multiples of
// 8 in both parts (rope 8 of 32, 16 of 64, 64 of 512).
void add_kv_dtype_attention(std::vector<OpCase>& t) {
  for (const DType kv : {DType::kBF16, DType::kU8}) {
    Attn c;
    c.kv = kv;
    c.rope = 8;
    c.seqs = kTinySeqs;
    add_attention(t, "tiny_sliding", c);
    add_tiny_entries(t, c, 4);
    c.bf16 = true;
    c.dim = 64;
    c.rope = 16;
    add_attention(t, "tiny_sliding_h4_d64", c);
    c.heads = 72;  // two head groups of 64
    add_attention(t, "tiny_sliding_h72_d64", c);
    c.heads = 4;
    add_tiny_entries(t, c, 20);
    add_split_keys(t, c);
    add_flash(t, false, kv);
    add_flash(t, true, kv);
    // This call's keys in the ring's format (rms_norm_rope_kv's rows), through both kernels.
    Attn enc;
    enc.kv = kv;
    enc.rope = 8;
    enc.kv_encoded = true;
    add_tiny_entries(t, enc, 4);
    enc.bf16 = true;
    enc.dim = 64;
    enc.rope = 16;
    add_tiny_entries(t, enc, 20);
    add_split_keys(t, enc);
  }
}

// DeepSeek-V4.1's pair (kv_record.h): FP8 SWA keys (kF8E4M3 records) with FP4 compressed entries
// (kE2M1x2 main records), rows labelled kv_v41_. The keys are decoded exactly (the f32 kernel
// reads these records, also under bf16_math), so the tolerances are those of f32 caches. D 32
// gives 33- and 18-byte rows (no alignment), D 512 V4.1's 528 and 288 bytes.
void add_v41_kv_attention(std::vector<OpCase>& t) {
  Attn c;
  c.kv = DType::kF8E4M3;
  c.entry_kv = DType::kE2M1x2;
  c.rope = 8;
  c.seqs = kTinySeqs;
  add_attention(t, "tiny_sliding", c);
  add_tiny_entries(t, c, 4);
  c.bf16 = true;
  c.dim = 64;
  c.rope = 16;
  add_attention(t, "tiny_sliding_h4_d64", c);
  add_tiny_entries(t, c, 20);
  add_split_keys(t, c);
  add_flash(t, false, DType::kF8E4M3, DType::kE2M1x2);
  add_flash(t, true, DType::kF8E4M3, DType::kE2M1x2);
  // This call's keys as V4.1's FP8 records (rms_norm_rope_kv's rows, V4.1's engine call).
  c.kv_encoded = true;
  add_tiny_entries(t, c, 20);
  Attn csa = flash_csa(/*bf16=*/true, DType::kF8E4M3, DType::kE2M1x2);
  csa.kv_encoded = true;
  add_attention(t, "v4_csa_top512", csa);
}

// q in bf16 (the engine's under bf16_math: rms_norm_rope's bf16 output): the Hopper overlap
// kernels copy it into their q tile (V4 widths over bf16 and fp8 caches, 64 and 128 heads, decode
// batches and a prefill chunk, and with bf16 output, the engine's call); the other CUDA kernels
// read it widened (f32 caches, tiny widths, with and without bf16_math).
void add_bf16_query_attention(std::vector<OpCase>& t) {
  Attn tiny;
  tiny.q_bf16 = true;
  tiny.seqs = kTinySeqs;
  add_attention(t, "tiny_sliding", tiny);
  tiny.bf16 = true;
  tiny.dim = 64;
  add_tiny_entries(t, tiny, 20);
  for (const DType kv : {DType::kBF16, DType::kU8}) {
    Attn csa = flash_csa(/*bf16=*/true, kv);
    csa.q_bf16 = true;
    add_attention(t, "v4_csa_top512", csa);
    csa.seqs = decode_seqs(64, 1);
    add_attention(t, "v4_csa_b64_decode", csa);
    csa.heads = 128;
    csa.seqs = {{4000, 2, 0}, {2500, 1, 1}};
    add_attention(t, "v4_csa_h128_b2", csa);
    // The engine's call: bf16 output too; with more units than clusters fit, the persistent
    // pairs walk (fp8).
    csa.out_bf16 = true;
    csa.seqs = decode_seqs(150, 1);
    add_attention(t, "v4_csa_h128_b150_decode", csa);
    csa.heads = 64;
    csa.seqs = decode_seqs(64, 1);
    add_attention(t, "v4_csa_b64_decode", csa);
    // And this call's keys encoded already (rms_norm_rope_kv's rows): no encoding launch.
    csa.kv_encoded = true;
    add_attention(t, "v4_csa_b64_decode", csa);
    // The engine's call at small batches, where auto runs mma.sync's 16-head blocks with one key
    // tile per split (attention_plan.h, small_batch_mma_choice): q read in bf16, the output
    // written in bf16 by the separate combine.
    csa.seqs = {{4096, 1, 0}};
    add_attention(t, "v4_csa_b1_decode", csa);
    csa.seqs = {{2047, 2, 0}};
    add_attention(t, "v4_csa_b1_sq2", csa);
    csa.seqs = decode_seqs(8, 1);
    add_attention(t, "v4_csa_b8_decode", csa);
    // And the output's inverse RoPE in the call (the engine's since it fuses into the combine),
    // at the small batches' mma.sync route and the wgmma route's B = 64 (two splits, separate
    // combine) and B = 150 (one split: the rope after).
    csa.rope_back = 32;
    for (const int batch : {1, 2, 64, 150}) {
      csa.seqs = decode_seqs(batch, 1);
      add_attention(t, "v4_csa_b" + std::to_string(batch) + "_decode", csa);
    }
    csa.seqs = {{2047, 2, 0}};
    add_attention(t, "v4_csa_b1_sq2", csa);
    csa.rope_back = 0;
    csa.seqs = decode_seqs(64, 1);
    csa.heads = 128;
    csa.seqs = decode_seqs(150, 1);
    add_attention(t, "v4_csa_h128_b150_decode", csa);
    csa.heads = 64;
    csa.kv_encoded = false;
    csa.out_bf16 = false;
    Attn hca = csa;
    hca.heads = 64;
    hca.ratio = 128;
    hca.sparse = false;
    hca.topk_cols = 0;
    hca.seqs = kFlashSeqs;
    add_attention(t, "v4_hca_dense", hca);
  }
}

}  // namespace

std::vector<OpCase> attention_cases() {
  std::vector<OpCase> t;
  add_f32_attention(t);
  add_bf16_attention(t);
  add_kv_dtype_attention(t);
  add_v41_kv_attention(t);
  add_bf16_query_attention(t);
  return t;
}

}  // namespace deepinfer::backend_ops
