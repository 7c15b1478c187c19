// Rows of indexer_topk at tiny widths (4 heads of 32, ratios 4 and 8) and at V4-Flash widths
// (64 heads of 128, ratio 4, top-k 512..4096) over contexts up to 256K, ragged batches and
// prefill rows, over shuffled block tables.
//
// indexer_topk must return exactly the reference's indices. Summation order differs between
// backends, so near-tied scores could legitimately swap; the exact rows therefore use small
// integer q, weights and keys with power-of-two scales: every score is then exact in f32 in any
// order, so equal scores are true ties (many of them, which exercises the tie rule: lower index
// first) and different scores are at least 2^-7 apart. One row with random floats compares the
// chosen entries by score instead.
#include <vector>

#include "cases.h"
#include "indexer_rows.h"

namespace deepinfer::backend_ops {
namespace {

void add_indexer(std::vector<OpCase>& t) {
  Indexer c;
  // Visible entries: 0..1 (fewer than top_k), 12 (decode), 7..8 (5 rows), 50..50 (3 rows), 250.
  c.seqs = {{0, 7, 0}, {48, 1, 1}, {29, 5, 2}, {200, 3, 3}, {999, 2, 4}};
  const std::vector<int> tiny_ks = {1, 5, 16, 64, 300};
  add_indexer_exact(t, "tiny_h4_d32_m4", c, tiny_ks);
  c.ratio = 8;
  add_indexer_exact(t, "tiny_h4_d32_m8", c, tiny_ks);
  c.ratio = 4;
  c.heads = 3;  // heads not a multiple of the warps or register groups
  c.dim = 20;
  add_indexer_exact(t, "tiny_h3_d20_m4", c, tiny_ks);
  c.heads = 13;
  c.dim = 32;
  add_indexer_exact(t, "tiny_h13_d32_m4", c, tiny_ks);

  Indexer v4;
  v4.block = 128;
  v4.heads = 64;
  v4.dim = 128;
  v4.ratio = 4;
  // Visible: 1024 (decode), 250..250 (fewer than top_k), 0..50 (prefill from 0), 750..751.
  v4.seqs = {{4095, 1, 0}, {1000, 4, 1}, {0, 200, 2}, {3000, 6, 3}};
  add_indexer_exact(t, "v4_h64_d128_m4", v4, {512});
  v4.seqs = {{4096, 1, 0}};
  add_indexer_exact(t, "v4_b1_decode", v4, {512});
  // Long rows at few tokens, which the split selection takes (indexer_select_split.cu): one
  // decode row of 32,768 visible entries (cuda_op_bench's B = 1 at 128K); its integer scores tie
  // often, so that many keys share the threshold's bin. Then a ragged batch: 32,768, 10,000,
  // 2,250..2,250 and 375 visible entries (fewer than top_k: every one is taken).
  v4.seqs = {{131071, 1, 0}};
  add_indexer_exact(t, "v4_b1_ctx131072", v4, {512, 2048});
  v4.seqs = {{131071, 1, 0}, {39999, 1, 1}, {8999, 2, 2}, {1499, 1, 3}};
  add_indexer_exact(t, "v4_ragged_ctx131072", v4, {512});

  // The binned selection (indexer_select_binned.cu) takes the rows whose keys and pairs fit one
  // block's shared memory (at top 512 up to 18,333 slots on the H200). B = 1 at 32K context
  // (8,192 visible entries, cuda_op_bench's latency case) at top 512 and 2048; then a small
  // batch of such rows, one of them shorter than top_k (375 entries: every one is taken).
  v4.seqs = {{32767, 1, 0}};
  add_indexer_exact(t, "v4_b1_ctx32768", v4, {512, 2048});
  v4.seqs = {{32767, 1, 0}, {20000, 1, 1}, {1499, 1, 2}, {32000, 2, 3}};
  add_indexer_exact(t, "v4_b4_ctx32768", v4, {512});
  // Both sides of its limit at top 512: a block table of 572 blocks (18,304 slots) fits, one of
  // 573 blocks (18,336 slots) does not and goes to the split selection.
  v4.seqs = {{73215, 1, 0}};
  add_indexer_exact(t, "v4_b1_bound18304", v4, {512});
  v4.seqs = {{73343, 1, 0}};
  add_indexer_exact(t, "v4_b1_bound18336", v4, {512});
  // Many ties: 3 distinct keys (then a single one) repeated over the cache, so that the k-th
  // score is shared by thousands of entries and the binned selection's refine passes reach the
  // slot bits (the lowest entries win).
  Indexer ties = v4;
  ties.key_patterns = 3;
  ties.seqs = {{32767, 1, 0}, {4095, 1, 1}};
  add_indexer_exact(t, "v4_ties3_ctx32768", ties, {512, 2048});
  ties.key_patterns = 1;
  add_indexer_exact(t, "v4_ties1_ctx32768", ties, {512});

  Indexer longc;
  longc.block = 128;  // 32 entries per block
  // 50,000 visible entries: the block table reaches 50,016 entries, whose scores fit in shared
  // memory (about 200 KB of the H200's 227 KB) next to 512 or 2048 chosen pairs; with 4096 pairs
  // (32 KB) they do not, and the selection reads them from global memory.
  longc.seqs = {{200000, 1, 0}, {100, 2, 1}, {70000, 3, 2}};
  add_indexer_exact(t, "bound50016", longc, {512, 2048, 4096});
  // 62,500 visible entries and a block table of 2048 columns (65,536 entries, 256 KB of
  // scores): the selection reads the scores from global memory.
  longc.seqs = {{250000, 1, 0}, {100, 2, 1}, {70000, 3, 2}};
  longc.max_blocks = 2048;
  add_indexer_exact(t, "bound65536", longc, {512, 2048, 4096});
  // 1500 prefill rows at that bound need 384 MB of scores: the op runs them in token groups.
  longc.seqs = {{0, 1500, 0}, {3000, 2, 1}};
  add_indexer_exact(t, "bound65536_1500_rows", longc, {512});

  Indexer floats = v4;
  floats.integers = false;
  floats.seqs = {{4095, 1, 0}, {1000, 4, 1}, {37, 5, 2}};
  add_indexer_floats(t, "v4_random_floats", floats, 512);
  // Random floats in long rows: few keys share the threshold's bin.
  floats.seqs = {{131071, 1, 0}, {39999, 1, 1}};
  add_indexer_floats(t, "v4_random_floats_ctx131072", floats, 512);
}

}  // namespace

std::vector<OpCase> indexer_cases() {
  std::vector<OpCase> t;
  add_indexer(t);
  return t;
}

}  // namespace deepinfer::backend_ops
