// Rows of the cache ops (ring_write, compress_pool, scatter_rows), at tiny widths and at
// V4-Flash widths (D = 512, SWA ring of 134, CSA m = 4 with overlap, HCA m = 128). Rings and
// caches start as random garbage so a row read from or written to the wrong slot shows up.
// ring_write and scatter_rows copy or encode (bf16 and fp8 KV caches, kv_record.h, rows
// labelled kv_bf16_ / kv_fp8_): byte-exact; compress_pool's softmax differs by summation order
// and expf ulps.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "batch_layout.h"
#include "cases.h"
#include "inputs.h"
#include "kv_inputs.h"

namespace deepinfer::backend_ops {
namespace {

// ---- ring_write ---------------------------------------------------------------------------------

struct RingIn {
  HostBatch hb;
  Tensor ring, rows;
};

// Rows of `width` channels into a ring of `dtype` (rope_dim selecting the fp8 record); `encoded`:
// the rows come in the ring's format (rms_norm_rope_kv's), encoded by the host codec.
void add_ring_write(std::vector<OpCase>& t, const std::string& label,
                    const std::vector<SeqSpec>& seqs, int64_t slots, int64_t ring_len,
                    int64_t width, DType dtype = DType::kF32, int rope_dim = 0,
                    bool encoded = false) {
  add(t, Case<RingIn>{
             .op = "ring_write",
             .label = kv_label(dtype) + (encoded ? "encoded_rows_" : "") + label,
             .draw =
                 [=](Rng& rng) {
                   HostBatch hb(rng, seqs, 128);
                   if (dtype == DType::kF32) {
                     Tensor ring = random_f32(rng, {slots, ring_len, width});
                     return RingIn{hb, ring, random_f32(rng, {hb.num_tokens(), width})};
                   }
                   Tensor ring = random_kv_cache(rng, {slots, ring_len}, dtype, width, rope_dim);
                   Tensor rows = random_kv_rows(rng, hb.num_tokens(), width);
                   if (encoded) rows = encode_kv_rows(rows, dtype, rope_dim);
                   return RingIn{hb, ring, rows};
                 },
             .run =
                 [rope_dim](Backend& be, const RingIn& in) {
                   Tensor ring = up_same(be, in.ring);
                   be.ring_write(ring, up_same(be, in.rows), in.hb.upload(be), rope_dim);
                   return out(ring);
                 },
             .expect = bytes(),
         });
}

// ---- compress_pool ------------------------------------------------------------------------------

struct PoolIn {
  HostBatch hb;
  Tensor seq, window, rope_pos, dest;  // the EntryBatch
  Tensor proj, ring, ape;
};

// Pools every window that closes in this call (listed in shuffled order, as the planner may),
// plus `padding` padding entries (window -1, dest -1: a zero row, whatever their seq).
void add_compress(std::vector<OpCase>& t, const std::string& label,
                  const std::vector<SeqSpec>& seqs, int64_t m, int64_t dim, bool overlap,
                  int padding = 0) {
  const CompressSpec spec{int(m), overlap, int(dim)};
  add(t, Case<PoolIn>{
             .op = "compress_pool",
             .label = label,
             .draw =
                 [=](Rng& rng) {
                   HostBatch hb(rng, seqs, 128);
                   const int64_t c = overlap ? 2 * dim : dim;
                   // The ring holds the rows of positions ctx - R .. ctx - 1; R = m + 5 (2m + 5
                   // with overlap) covers the previous window of every window that closes in
                   // this call.
                   const int64_t ring_len = (overlap ? 2 * m : m) + 5;
                   int64_t slots = 0;
                   for (const SeqSpec& q : seqs) slots = std::max<int64_t>(slots, q.slot + 1);
                   std::vector<std::pair<int, int>> wins;  // (sequence, window)
                   for (size_t s = 0; s < seqs.size(); ++s) {
                     for (int w = seqs[s].ctx / int(m); w < (seqs[s].ctx + seqs[s].q) / int(m);
                          ++w) {
                       wins.emplace_back(int(s), w);
                     }
                   }
                   // Padding: seq 0 and one past the last sequence.
                   for (int i = 0; i < padding; ++i) {
                     wins.emplace_back(i % 2 == 0 ? 0 : int(seqs.size()), -1);
                   }
                   std::shuffle(wins.begin(), wins.end(), rng);
                   std::vector<int32_t> seq_ids, windows, rope_pos, dest;
                   for (const auto& [s, w] : wins) {
                     seq_ids.push_back(s);
                     windows.push_back(w);
                     rope_pos.push_back(w < 0 ? 0 : int32_t(w * m));
                     dest.push_back(w < 0 ? -1 : 0);
                   }
                   Tensor proj = random_f32(rng, {hb.num_tokens(), 2 * c}, 2.0f);
                   Tensor ring = random_f32(rng, {slots, ring_len, 2 * c}, 2.0f);
                   Tensor ape = random_f32(rng, {m, c});
                   return PoolIn{hb,        i32(seq_ids), i32(windows), i32(rope_pos),
                                 i32(dest), proj,         ring,         ape};
                 },
             .run =
                 [spec](Backend& be, const PoolIn& in) {
                   const EntryBatch entries{int(in.seq.numel()), up(be, in.seq), up(be, in.window),
                                            up(be, in.rope_pos), up(be, in.dest)};
                   return out(be.compress_pool(up(be, in.proj), up(be, in.ring), up(be, in.ape),
                                               in.hb.upload(be), entries, spec));
                 },
             .expect = close(1e-5, 1e-6),
         });
}

// ---- scatter_rows -------------------------------------------------------------------------------

// n rows of `width` channels to distinct random destinations of a cache of `dtype` (rope_dim
// selecting the fp8 record), `padding` of them -1 (padding entries: not stored).
void add_scatter(std::vector<OpCase>& t, int64_t cache_rows, int64_t n, int64_t width,
                 int padding = 0, DType dtype = DType::kF32, int rope_dim = 0) {
  add(t, Case<Tensors>{
             .op = "scatter_rows",
             .label = kv_label(dtype) + (padding ? "padding_" : "") + std::to_string(n) + "_into_" +
                      std::to_string(cache_rows) + "x" + std::to_string(width) +
                      (rope_dim ? "_rope" + std::to_string(rope_dim) : ""),
             .draw =
                 [=](Rng& rng) {
                   std::vector<int32_t> perm(static_cast<size_t>(cache_rows));
                   for (int64_t i = 0; i < cache_rows; ++i) perm[size_t(i)] = int32_t(i);
                   std::shuffle(perm.begin(), perm.end(), rng);
                   perm.resize(static_cast<size_t>(n));
                   for (int i = 0; i < padding; ++i) perm[size_t(i) * 3 % size_t(n)] = -1;
                   if (dtype == DType::kF32) {
                     return Tensors{random_f32(rng, {cache_rows, width}),
                                    random_f32(rng, {n, width}), i32(perm)};
                   }
                   return Tensors{random_kv_cache(rng, {cache_rows}, dtype, width, rope_dim),
                                  random_kv_rows(rng, n, width), i32(perm)};
                 },
             .run =
                 [rope_dim](Backend& be, const Tensors& in) {
                   Tensor cache = up_same(be, in[0]);
                   be.scatter_rows(cache, up(be, in[1]), up(be, in[2]), rope_dim);
                   return out(cache);
                 },
             .expect = bytes(),
         });
}

}  // namespace

std::vector<OpCase> cache_cases() {
  std::vector<OpCase> t;
  // Starting at 0, a decode row in a wrapped ring, a chunk longer than the ring (only its last
  // R rows land), a 3-token verification step and a 2-token step.
  const std::vector<SeqSpec> tiny = {{0, 5, 2}, {37, 1, 0}, {20, 30, 4}, {50, 3, 1}, {9, 2, 3}};
  add_ring_write(t, "swa_r14_d32", tiny, 5, 14, 32);
  add_ring_write(t, "csa_compressor_r13_w128", tiny, 5, 13, 4 * 32);  // 2m+5 rows of [kv|gate]
  add_ring_write(t, "odd_width_r7_w6", tiny, 6, 7, 6);                // the scalar path
  const std::vector<SeqSpec> flash = {{0, 300, 1}, {4000, 1, 0}, {1000, 4, 2}, {133, 6, 3}};
  add_ring_write(t, "v4_swa_r134_d512", flash, 4, 134, 512);
  add_ring_write(t, "v4_csa_compressor_r13_w2048", flash, 4, 13, 2 * 2 * 512);
  add_ring_write(t, "v4_hca_compressor_r133_w1024", flash, 4, 133, 2 * 512);
  // The SWA ring in the bf16 and fp8 KV formats (the compressor rings stay f32). fp8: the main
  // record with a partial scale group (nope 24) and with a width that is no multiple of 4 (nope
  // 4, rope 2; CUDA takes even nope only: kv_record.cuh), the index-key record (rope_dim 0),
  // V4's 584-byte record.
  for (const DType kv : {DType::kBF16, DType::kU8}) {
    add_ring_write(t, "swa_r14_d32", tiny, 5, 14, 32, kv, 8);
    add_ring_write(t, "odd_width_r7_w6", tiny, 6, 7, 6, kv, 2);
    add_ring_write(t, "v4_swa_r134_d512", flash, 4, 134, 512, kv, 64);
    // Rows already in the ring's format: records copied (words where the record allows; the odd
    // width's 7-byte fp8 record byte by byte).
    add_ring_write(t, "swa_r14_d32", tiny, 5, 14, 32, kv, 8, /*encoded=*/true);
    add_ring_write(t, "odd_width_r7_w6", tiny, 6, 7, 6, kv, 2, /*encoded=*/true);
    add_ring_write(t, "v4_swa_r134_d512", flash, 4, 134, 512, kv, 64, /*encoded=*/true);
  }
  add_ring_write(t, "index_r14_d32", tiny, 5, 14, 32, DType::kU8, 0);
  // V4.1's FP8 SWA record: 33-byte rows (D 32, no alignment), a partial scale group (D 6) and
  // V4.1's 528 bytes (D 512); the RoPE channels are e4m3 like the others.
  add_ring_write(t, "swa_r14_d32", tiny, 5, 14, 32, DType::kF8E4M3, 8);
  add_ring_write(t, "odd_width_r7_w6", tiny, 6, 7, 6, DType::kF8E4M3, 2);
  add_ring_write(t, "swa_r134_d512", flash, 4, 134, 512, DType::kF8E4M3, 64);
  add_ring_write(t, "swa_r134_d512", flash, 4, 134, 512, DType::kF8E4M3, 64, /*encoded=*/true);
  add_ring_write(t, "swa_r14_d32", tiny, 5, 14, 32, DType::kF8E4M3, 8, /*encoded=*/true);

  // Windows from this call's rows only, from the wrapped ring plus this call, window 0 (no
  // previous window with overlap), a decode token closing a window, a 6-token verification step.
  const std::vector<SeqSpec> pool = {{0, 9, 2}, {13, 3, 0}, {6, 2, 1}, {27, 1, 3}, {101, 6, 4}};
  for (const bool overlap : {false, true}) {
    const std::string tag = overlap ? "_overlap" : "";
    add_compress(t, "m4_d32" + tag, pool, 4, 32, overlap);
    add_compress(t, "m4_d8" + tag, pool, 4, 8, overlap);
    // Padding entries of a fixed-shape (graph) batch among the real ones.
    add_compress(t, "padding_m4_d32" + tag, pool, 4, 32, overlap, 3);
  }
  add_compress(t, "m8_d32", {{0, 17, 0}, {21, 5, 1}, {63, 1, 2}}, 8, 32, false);
  // The CUDA kernel splits a window's slots over up to 16 thread groups in batches of 8 and
  // merges their partial softmaxes: uneven shares (20 slots over 4 groups, 10 of window 0 with
  // overlap), a width that leaves part of a channel chunk idle, and shares of more than one
  // batch (200 slots over 16 groups).
  const std::vector<SeqSpec> small = {{0, 45, 0}, {39, 1, 1}, {15, 10, 2}};
  add_compress(t, "split_m20_d40", small, 20, 40, false);
  add_compress(t, "split_m10_d40_overlap", small, 10, 40, true);
  add_compress(t, "split_m40_d8", small, 40, 8, false);
  const std::vector<SeqSpec> large = {{0, 420, 0}, {399, 1, 1}, {150, 60, 2}};
  add_compress(t, "split_m200_d8", large, 200, 8, false);
  add_compress(t, "split_m100_d36_overlap", large, 100, 36, true);
  // CSA: m = 4 with overlap, D = 512 (main) and 128 (indexer).
  const std::vector<SeqSpec> csa = {{0, 200, 0}, {4095, 1, 1}, {1001, 4, 2}, {3000, 6, 3}};
  add_compress(t, "v4_csa_m4_d512_overlap", csa, 4, 512, true);
  add_compress(t, "v4_csa_indexer_m4_d128_overlap", csa, 4, 128, true);
  // HCA: m = 128, no overlap: a prefill chunk closing windows 0 and 1, a window completed by a
  // decode token (positions 896..1022 from the ring), a chunk crossing one boundary.
  const std::vector<SeqSpec> hca = {{0, 300, 0}, {1023, 1, 1}, {100, 200, 2}, {2000, 60, 3}};
  add_compress(t, "v4_hca_m128_d512", hca, 128, 512, false);
  // The usual decode step: a single entry (positions 1920..2046 from the ring).
  add_compress(t, "v4_hca_decode_one_entry", {{2047, 1, 0}}, 128, 512, false);

  add_scatter(t, 64, 10, 32);
  add_scatter(t, 64, 0, 32);
  add_scatter(t, 40, 7, 6);
  add_scatter(t, 4096, 300, 512);
  add_scatter(t, 4096, 50, 128);
  add_scatter(t, 64, 10, 32, 3);  // padding entries of a graph batch
  // Entry caches in the bf16 and fp8 KV formats: main entries (rope 64; fp8 with a partial scale
  // group and with a width that is no multiple of 4), index keys (rope 0), V4's D 512 and Di 128.
  for (const DType kv : {DType::kBF16, DType::kU8}) {
    add_scatter(t, 64, 10, 96, 3, kv, 16);
    add_scatter(t, 40, 7, 6, 0, kv, 2);
    add_scatter(t, 64, 10, 36, 0, kv, 0);
    add_scatter(t, 4096, 300, 512, 0, kv, 64);
    add_scatter(t, 4096, 50, 128, 0, kv, 0);
  }
  // V4.1's FP4 records: main entries (rope > 0; e4m3 scales per 16; an odd width leaves a high
  // nibble empty) and index keys (rope 0; UE8M0 per 32, partial groups), V4.1's 288 and 68 bytes;
  // the FP8 record as entries (V4.1's MXFP8 option).
  add_scatter(t, 64, 10, 96, 3, DType::kE2M1x2, 16);
  add_scatter(t, 40, 7, 7, 0, DType::kE2M1x2, 2);
  add_scatter(t, 64, 10, 36, 0, DType::kE2M1x2, 0);
  add_scatter(t, 64, 10, 16, 0, DType::kE2M1x2, 0);
  add_scatter(t, 4096, 300, 512, 0, DType::kE2M1x2, 64);
  add_scatter(t, 4096, 50, 128, 0, DType::kE2M1x2, 0);
  add_scatter(t, 4096, 300, 512, 0, DType::kF8E4M3, 64);
  return t;
}

}  // namespace deepinfer::backend_ops
