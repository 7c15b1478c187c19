// Rows of indexer_topk over bf16, fp8 and V4.1 FP4 index caches (kv_record.h: bf16 keys, e4m3
// keys with one f32 scale, or e2m1 keys with a UE8M0 scale per 32 channels), labelled kv_bf16_ /
// kv_fp8_ / kv_v41fp4_: the rows of cases_attention.cpp (indexer_rows.h) with the cache drawn as
// f32 keys stored through the host codec, so that both backends decode the same records. The
// exact rows' keys (exact_kv_keys) survive bf16 and fp8 unchanged and keep every score exact in
// f32; FP4 rounds them to e2m1 times a power of two per group (2 significant bits, so the scores
// stay exact, and many keys tie), the ties decided by the tie rule. The random-float row's e4m3
// and e2m1 keys use every code. (ring_write and scatter_rows, which write these formats, have
// their rows in cases_cache.cpp.)
#include <vector>

#include "cases.h"
#include "indexer_rows.h"

namespace deepinfer::backend_ops {

std::vector<OpCase> kv_dtype_cases() {
  std::vector<OpCase> t;
  for (const DType dtype : {DType::kBF16, DType::kU8, DType::kE2M1x2}) {
    Indexer c;
    c.cache = dtype;
    // Visible entries: 0..1 (fewer than top_k), 12 (decode), 7..8, 50..50, 250.
    c.seqs = {{0, 7, 0}, {48, 1, 1}, {29, 5, 2}, {200, 3, 3}, {999, 2, 4}};
    add_indexer_exact(t, "tiny_h4_d32_m4", c, {5, 64});
    c.heads = 3;  // heads not a multiple of the warps; rows of 40 (bf16), 24 (fp8), 11 (FP4) bytes
    c.dim = 20;
    add_indexer_exact(t, "tiny_h3_d20_m4", c, {16});

    // V4-Flash: Di 128, 64 heads, CSA ratio 4, top-k 512.
    Indexer v4;
    v4.cache = dtype;
    v4.block = 128;
    v4.heads = 64;
    v4.dim = 128;
    // Visible: 1024 (decode), 250..250 (fewer than top_k), 0..50 (prefill from 0), 750..751.
    v4.seqs = {{4095, 1, 0}, {1000, 4, 1}, {0, 200, 2}, {3000, 6, 3}};
    add_indexer_exact(t, "v4_h64_d128_m4", v4, {512});
    // cuda_op_bench's latency case: one decode row at 32K context (8,192 visible entries), the
    // tensor-core scores then the binned selection.
    v4.seqs = {{32767, 1, 0}};
    add_indexer_exact(t, "v4_b1_ctx32768", v4, {512});
    // Long context at V4 width: 16,384 and 5,000 visible entries (the binned selection).
    v4.seqs = {{65535, 1, 0}, {19999, 2, 1}};
    add_indexer_exact(t, "v4_long_h64_d128_m4", v4, {512});
    // One decode row of 32,768 visible entries (the split selection).
    v4.seqs = {{131071, 1, 0}};
    add_indexer_exact(t, "v4_b1_ctx131072", v4, {512});

    // 50,000 visible entries (the selection's scores in shared memory) at the small width.
    Indexer longc;
    longc.cache = dtype;
    longc.block = 128;
    longc.seqs = {{200000, 1, 0}, {100, 2, 1}, {70000, 3, 2}};
    add_indexer_exact(t, "bound50016", longc, {2048});

    Indexer floats = v4;
    floats.integers = false;
    floats.seqs = {{4095, 1, 0}, {1000, 4, 1}, {37, 5, 2}};
    add_indexer_floats(t, "v4_random_floats", floats, 512);
  }
  // V4's width over fp8 keys, the shapes of the wgmma kernel (indexer_score_wgmma.cu, 64 heads on
  // sm_90): B = 1, 3 and 64 decode rows whose contexts end mid-block and mid-tile (records
  // copied in runs of a 32-entry block at ratio 4), a prefill chunk, and ratio 128 (one entry per
  // block: records copied key by key), exact and in random floats.
  Indexer fp8;
  fp8.cache = DType::kU8;
  fp8.block = 128;
  fp8.heads = 64;
  fp8.dim = 128;
  fp8.seqs = {{9999, 1, 0}};  // 2,500 visible: 39 tiles and 4 keys
  add_indexer_exact(t, "wgmma_b1_mid_block", fp8, {512});
  fp8.seqs = {{5000, 1, 0}, {777, 1, 1}, {12345, 1, 2}};
  add_indexer_exact(t, "wgmma_b3_mid_block", fp8, {512});
  fp8.seqs.clear();
  for (int b = 0; b < 64; ++b) fp8.seqs.push_back({300 + 61 * b, 1, b});
  add_indexer_exact(t, "wgmma_b64_mid_block", fp8, {512});
  fp8.seqs = {{2000, 37, 0}, {130, 3, 1}};
  add_indexer_exact(t, "wgmma_prefill", fp8, {512});
  Indexer fp8_hca = fp8;
  fp8_hca.ratio = 128;
  fp8_hca.seqs = {{20000, 1, 0}, {9000, 3, 1}, {100, 1, 2}};  // 156, 70..71 and 0 visible
  add_indexer_exact(t, "wgmma_ratio128", fp8_hca, {64, 512});
  Indexer fp8_floats = fp8;
  fp8_floats.integers = false;
  fp8_floats.seqs.clear();
  for (int b = 0; b < 64; ++b) fp8_floats.seqs.push_back({500 + 97 * b, 1, b});
  add_indexer_floats(t, "wgmma_b64_random_floats", fp8_floats, 512);
  fp8_hca.integers = false;
  add_indexer_floats(t, "wgmma_ratio128_random_floats", fp8_hca, 64);
  // The same shapes with q in fp8 (quantize_indexer_q, then the op over the codes and scaled
  // weights: the engine's path over fp8 index keys; the pipelined wgmma kernel's one-MMA tiles at
  // ratio 4 on sm_90), labelled kv_fp8_q8_: exact (integer q is exact in e4m3 after its scale),
  // in random floats, and the small shapes of the other kernels (mma.sync, CUDA cores).
  Indexer q8 = fp8;
  q8.fp8_q = true;
  q8.seqs = {{9999, 1, 0}};
  add_indexer_exact(t, "wgmma_b1_mid_block", q8, {512});
  q8.seqs.clear();
  for (int b = 0; b < 64; ++b) q8.seqs.push_back({300 + 61 * b, 1, b});
  add_indexer_exact(t, "wgmma_b64_mid_block", q8, {512});
  q8.seqs = {{2000, 37, 0}, {130, 3, 1}};
  add_indexer_exact(t, "wgmma_prefill", q8, {512});
  q8.seqs = {{32767, 1, 0}};
  add_indexer_exact(t, "v4_b1_ctx32768", q8, {512});
  Indexer q8_floats = fp8_floats;
  q8_floats.fp8_q = true;
  add_indexer_floats(t, "wgmma_b64_random_floats", q8_floats, 512);
  Indexer q8_hca = fp8_hca;
  q8_hca.fp8_q = true;
  add_indexer_floats(t, "wgmma_ratio128_random_floats", q8_hca, 64);
  Indexer q8_small;
  q8_small.cache = DType::kU8;
  q8_small.fp8_q = true;
  q8_small.seqs = {{0, 7, 0}, {48, 1, 1}, {29, 5, 2}, {200, 3, 3}, {999, 2, 4}};
  add_indexer_exact(t, "tiny_h4_d32_m4", q8_small, {5, 64});
  q8_small.heads = 16;
  q8_small.dim = 128;
  q8_small.integers = false;
  add_indexer_floats(t, "h16_d128_random_floats", q8_small, 64);
  // The quantization alone: codes and scaled weights, bytes for bytes (rows of zeros, of tiny
  // values near the 1e-4 floor, of large ones, and random ones).
  add(t, Case<Tensors>{
             .op = "quantize_indexer_q",
             .label = "t37_h64_d128",
             .draw =
                 [](std::mt19937& rng) {
                   Tensor q = random_f32(rng, {37, 64, 128});
                   float* p = q.data<float>();
                   for (int64_t i = 0; i < 128; ++i) {
                     p[i] = 0.0f;                 // row 0: zeros
                     p[128 + i] *= 1e-6f;         // row 1: below the floor
                     p[256 + i] *= 1e5f;          // row 2: large
                     p[384 + i] = float(i) - 64;  // row 3: integers
                   }
                   return Tensors{q, random_f32(rng, {37, 64})};
                 },
             .run =
                 [](Backend& be, const Tensors& in) {
                   const IndexerQFp8 r = be.quantize_indexer_q(up(be, in[0]), up(be, in[1]));
                   return Outputs{{"q", r.q}, {"weights", r.weights}};
                 },
             .expect = {bytes(), bytes()},
         });

  // V4.1-Flash's width over its FP4 index keys: 32 heads of 128 (the tensor-core scores with two
  // head groups), ratio 4: a ragged batch, then one decode row of 32,768 visible entries.
  Indexer v41;
  v41.cache = DType::kE2M1x2;
  v41.block = 128;
  v41.heads = 32;
  v41.dim = 128;
  v41.seqs = {{4095, 1, 0}, {1000, 4, 1}, {0, 200, 2}, {3000, 6, 3}};
  add_indexer_exact(t, "v41_h32_d128_m4", v41, {512});
  v41.seqs = {{131071, 1, 0}};
  add_indexer_exact(t, "v41_b1_ctx131072", v41, {512, 2048});
  return t;
}

}  // namespace deepinfer::backend_ops
