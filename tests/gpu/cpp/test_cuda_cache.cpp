// CUDA cache ops (ring_write, compress_pool, scatter_rows) against the CPU reference on the same
// inputs, at tiny widths and at V4-Flash widths (D = 512, SWA ring of 134, CSA m = 4 with
// overlap, HCA m = 128). Rings start as random garbage so a row read from or written to the
// wrong slot shows up.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "layout_test_util.h"

namespace deepinfer::gpu_test {
namespace {

// ---- ring_write ---------------------------------------------------------------------------------

void check_ring_write(const std::vector<SeqSpec>& seqs, int64_t slots, int64_t ring_len,
                      int64_t width, uint32_t seed, const std::string& what) {
  Backends b;
  std::mt19937 rng(seed);
  HostBatch hb(rng, seqs, 128);
  const int64_t t = hb.num_tokens();
  Pair ring = both(b, random_f32(rng, {slots, ring_len, width}));
  Pair rows = both(b, random_f32(rng, {t, width}));
  b.cpu->ring_write(ring.cpu, rows.cpu, hb.upload(*b.cpu));
  b.cuda->ring_write(ring.cuda, rows.cuda, hb.upload(*b.cuda));
  expect_close(b, ring.cpu, ring.cuda, 0, 0, what);
}

TEST(CudaCacheOps, RingWriteTiny) {
  DEEPINFER_REQUIRE_GPU();
  // Starting at 0, a decode row in a wrapped ring, a chunk longer than the ring (only its last
  // R rows land), a 3-token verification step and a 2-token step.
  const std::vector<SeqSpec> seqs = {{0, 5, 2}, {37, 1, 0}, {20, 30, 4}, {50, 3, 1}, {9, 2, 3}};
  check_ring_write(seqs, 5, 14, 32, 1, "SWA ring D=32");
  check_ring_write(seqs, 5, 13, 4 * 32, 2, "CSA compressor ring 2m+5 of [kv|gate]");
  check_ring_write(seqs, 6, 7, 6, 3, "odd width (scalar path)");
}

TEST(CudaCacheOps, RingWriteFlashWidths) {
  DEEPINFER_REQUIRE_GPU();
  const std::vector<SeqSpec> seqs = {{0, 300, 1}, {4000, 1, 0}, {1000, 4, 2}, {133, 6, 3}};
  check_ring_write(seqs, 4, 134, 512, 4, "SWA ring 134 x 512");
  check_ring_write(seqs, 4, 13, 2 * 2 * 512, 5, "CSA compressor ring 13 x 2048");
  check_ring_write(seqs, 4, 133, 2 * 512, 6, "HCA compressor ring 133 x 1024");
}

// ---- compress_pool ------------------------------------------------------------------------------

// Pools every window that closes in this call (listed in shuffled order, as the planner may).
void check_compress(const std::vector<SeqSpec>& seqs, int64_t m, int64_t dim, bool overlap,
                    uint32_t seed, const std::string& what) {
  Backends b;
  std::mt19937 rng(seed);
  HostBatch hb(rng, seqs, 128);
  const int64_t t = hb.num_tokens();
  const int64_t c = overlap ? 2 * dim : dim;
  // The ring holds the rows of positions ctx - R .. ctx - 1; R = m + 5 (2m + 5 with overlap)
  // covers the previous window of every window that closes in this call.
  const int64_t ring_len = (overlap ? 2 * m : m) + 5;
  int64_t slots = 0;
  for (const SeqSpec& q : seqs) slots = std::max<int64_t>(slots, q.slot + 1);
  std::vector<std::pair<int, int>> wins;  // (sequence, window)
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int w = seqs[s].ctx / int(m); w < (seqs[s].ctx + seqs[s].q) / int(m); ++w) {
      wins.emplace_back(int(s), w);
    }
  }
  std::shuffle(wins.begin(), wins.end(), rng);
  ASSERT_FALSE(wins.empty()) << what;
  std::vector<int32_t> seq_ids, windows, rope_pos, dest;
  for (auto [s, w] : wins) {
    seq_ids.push_back(s);
    windows.push_back(w);
    rope_pos.push_back(int32_t(w * m));
    dest.push_back(0);
  }
  const int64_t e = int64_t(wins.size());
  Pair seq_p = both(b, i32(seq_ids), DType::kI32);
  Pair win_p = both(b, i32(windows), DType::kI32);
  Pair rope_p = both(b, i32(rope_pos), DType::kI32);
  Pair dest_p = both(b, i32(dest), DType::kI32);
  EntryBatch eb_cpu{int(e), seq_p.cpu, win_p.cpu, rope_p.cpu, dest_p.cpu};
  EntryBatch eb_cuda{int(e), seq_p.cuda, win_p.cuda, rope_p.cuda, dest_p.cuda};
  Pair proj = both(b, random_f32(rng, {t, 2 * c}, 2.0f));
  Pair ring = both(b, random_f32(rng, {slots, ring_len, 2 * c}, 2.0f));
  Pair ape = both(b, random_f32(rng, {m, c}));
  const CompressSpec spec{int(m), overlap, int(dim)};
  Tensor got_cpu =
      b.cpu->compress_pool(proj.cpu, ring.cpu, ape.cpu, hb.upload(*b.cpu), eb_cpu, spec);
  Tensor got_cuda =
      b.cuda->compress_pool(proj.cuda, ring.cuda, ape.cuda, hb.upload(*b.cuda), eb_cuda, spec);
  ASSERT_EQ(got_cuda.shape(), (Shape{e, dim})) << what;
  expect_close(b, got_cpu, got_cuda, 1e-5, 1e-6, what);
}

TEST(CudaCacheOps, CompressPoolTiny) {
  DEEPINFER_REQUIRE_GPU();
  // Windows from this call's rows only, from the wrapped ring plus this call, window 0 (no
  // previous window with overlap), a decode token closing a window, a 6-token verification step.
  const std::vector<SeqSpec> seqs = {{0, 9, 2}, {13, 3, 0}, {6, 2, 1}, {27, 1, 3}, {101, 6, 4}};
  for (bool overlap : {false, true}) {
    const std::string tag = overlap ? " overlap" : " no overlap";
    check_compress(seqs, 4, 32, overlap, 10, "m=4 D=32" + tag);
    check_compress(seqs, 4, 8, overlap, 11, "m=4 D=8" + tag);
  }
  check_compress({{0, 17, 0}, {21, 5, 1}, {63, 1, 2}}, 8, 32, false, 12, "m=8 D=32");
}

TEST(CudaCacheOps, CompressPoolSlotSplits) {
  DEEPINFER_REQUIRE_GPU();
  // The CUDA kernel splits a window's slots over up to 16 thread groups in batches of 8 and
  // merges their partial softmaxes: uneven shares (20 slots over 4 groups, 10 of window 0 with
  // overlap), a width that leaves part of a channel chunk idle, and shares of more than one
  // batch (200 slots over 16 groups).
  const std::vector<SeqSpec> small = {{0, 45, 0}, {39, 1, 1}, {15, 10, 2}};
  check_compress(small, 20, 40, false, 40, "m=20 D=40");
  check_compress(small, 10, 40, true, 41, "m=10 D=40 overlap");
  check_compress(small, 40, 8, false, 42, "m=40 D=8");
  const std::vector<SeqSpec> large = {{0, 420, 0}, {399, 1, 1}, {150, 60, 2}};
  check_compress(large, 200, 8, false, 43, "m=200 D=8");
  check_compress(large, 100, 36, true, 44, "m=100 D=36 overlap");
}

TEST(CudaCacheOps, CompressPoolFlashWidths) {
  DEEPINFER_REQUIRE_GPU();
  // CSA: m = 4 with overlap, D = 512 (main) and 128 (indexer).
  const std::vector<SeqSpec> csa = {{0, 200, 0}, {4095, 1, 1}, {1001, 4, 2}, {3000, 6, 3}};
  check_compress(csa, 4, 512, true, 20, "CSA m=4 D=512");
  check_compress(csa, 4, 128, true, 21, "CSA indexer m=4 D=128");
  // HCA: m = 128, no overlap: a prefill chunk closing windows 0 and 1, a window completed by
  // a decode token (positions 896..1022 from the ring), a chunk crossing one boundary.
  const std::vector<SeqSpec> hca = {{0, 300, 0}, {1023, 1, 1}, {100, 200, 2}, {2000, 60, 3}};
  check_compress(hca, 128, 512, false, 22, "HCA m=128 D=512");
  // The usual decode step: a single entry (positions 1920..2046 from the ring).
  check_compress({{2047, 1, 0}}, 128, 512, false, 23, "HCA decode, one entry");
}

// ---- scatter_rows -------------------------------------------------------------------------------

void check_scatter(int64_t cache_rows, int64_t n, int64_t width, uint32_t seed) {
  Backends b;
  std::mt19937 rng(seed);
  std::vector<int32_t> perm(static_cast<size_t>(cache_rows));
  for (int64_t i = 0; i < cache_rows; ++i) perm[size_t(i)] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  perm.resize(static_cast<size_t>(n));
  Pair cache = both(b, random_f32(rng, {cache_rows, width}));
  Pair rows = both(b, random_f32(rng, {n, width}));
  Pair dest = both(b, i32(perm), DType::kI32);
  b.cpu->scatter_rows(cache.cpu, rows.cpu, dest.cpu);
  b.cuda->scatter_rows(cache.cuda, rows.cuda, dest.cuda);
  expect_close(b, cache.cpu, cache.cuda, 0, 0, "scatter_rows width " + std::to_string(width));
}

TEST(CudaCacheOps, ScatterRows) {
  DEEPINFER_REQUIRE_GPU();
  check_scatter(64, 10, 32, 30);
  check_scatter(64, 0, 32, 31);
  check_scatter(40, 7, 6, 32);
  check_scatter(4096, 300, 512, 33);
  check_scatter(4096, 50, 128, 34);
}

}  // namespace
}  // namespace deepinfer::gpu_test
