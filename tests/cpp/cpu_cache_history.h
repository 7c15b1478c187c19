// The cache and attention ops' CPU tests' worlds (test_cpu_attention.cpp,
// test_cpu_attention_op.cpp): every sequence's full per-position history on the host, and the
// same rows as the ops see them (a ring holding the last R positions before the call, entries in
// shuffled physical blocks), so the tests check the addressing along with the math.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "cpu_test_util.h"

namespace deepinfer::testing {

// Random per-position rows of width `width` for every sequence (positions 0 .. ctx + q - 1),
// plus the same rows laid out as an op would see them.
struct History {
  int64_t width;
  std::vector<std::vector<float>> rows;  // rows[b][p * width + c]

  History(Rng& rng, const std::vector<SeqSpec>& seqs, int64_t w, float lo = -1, float hi = 1)
      : width(w) {
    for (const SeqSpec& s : seqs) rows.push_back(rng.uniform(sz((s.ctx + s.q) * w), lo, hi));
  }
  const float* at(size_t b, int64_t p) const { return rows[b].data() + p * width; }

  // This call's rows [T, width].
  std::vector<float> chunk(const std::vector<SeqSpec>& seqs) const {
    std::vector<float> out;
    for (size_t b = 0; b < seqs.size(); ++b) {
      out.insert(out.end(), rows[b].begin() + seqs[b].ctx * width, rows[b].end());
    }
    return out;
  }
  // A ring [slots, R, width] of garbage with each sequence's last R cached positions in place.
  std::vector<float> ring(Rng& rng, const std::vector<SeqSpec>& seqs, int64_t slots,
                          int64_t len) const {
    std::vector<float> r = rng.uniform(sz(slots * len * width), -9, 9);
    for (size_t b = 0; b < seqs.size(); ++b) {
      for (int64_t p = std::max<int64_t>(0, seqs[b].ctx - len); p < seqs[b].ctx; ++p) {
        std::copy(at(b, p), at(b, p) + width, r.begin() + (seqs[b].slot * len + p % len) * width);
      }
    }
    return r;
  }
};

// Paged entry cache: entry j of sequence b at row table[b][j / epb] * epb + j % epb, with the
// physical blocks handed out in shuffled order (block 0 never used).
struct PagedEntries {
  int epb;
  int max_blocks;
  int num_blocks;
  std::vector<int32_t> table;
  std::vector<std::vector<float>> entries;  // entries[b][j * width + c]
  std::vector<float> cache;

  PagedEntries(Rng& rng, const std::vector<int>& counts, int entries_per_block, int64_t width,
               int blocks_per_seq, bool integers = false)
      : epb(entries_per_block), max_blocks(blocks_per_seq) {
    num_blocks = 1 + static_cast<int>(counts.size()) * max_blocks;
    std::vector<int32_t> physical(sz(num_blocks - 1));
    std::iota(physical.begin(), physical.end(), 1);
    std::shuffle(physical.begin(), physical.end(), rng.engine());
    table = physical;
    cache = rng.uniform(sz(num_blocks * epb * width), -9, 9);
    for (size_t b = 0; b < counts.size(); ++b) {
      entries.push_back(integers ? rng.integers(sz(counts[b] * width), -2, 2)
                                 : rng.uniform(sz(counts[b] * width)));
      for (int j = 0; j < counts[b]; ++j) {
        const int64_t row = int64_t{table[b * sz(max_blocks) + sz(j / epb)]} * epb + j % epb;
        std::copy(entries[b].begin() + j * width, entries[b].begin() + (j + 1) * width,
                  cache.begin() + row * width);
      }
    }
  }
};

class CpuAttentionTest : public BackendTest {
 protected:
  CpuAttentionTest() { rng = Rng(99); }
};

}  // namespace deepinfer::testing
