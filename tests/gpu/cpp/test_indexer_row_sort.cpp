// The binned selection's whole-row sort (cuda/indexer/indexer_select_binned.cu,
// IndexerSelectKernel::kRowSort, the default where the binned kernel runs) against the host's
// ranking and against the binned kernel's histogram passes (kBinned) and the one-block kernel
// (kOneBlock), on scores written by the test (the op's select stage alone): descending score,
// the lower slot first at equal scores, -1 past the token's visible entries. Rows of 1 to 2,000
// visible entries at ratio 4 (networks of 32, 64, 128, 512 and 1,024; 33, 512, 513 and 1,024 at
// their edges; 1,025, the first row past kRowSortMaxSlots, which takes the histogram passes), top
// 512 and 64, batches whose longest row fits the sort (the scores read before the slot count) and
// batches where it does not (each token's own choice). Scores are small integers (hundreds of
// ties), a few -inf (unmapped entries rank last, by slot), or random floats. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/indexer/indexer_options.h"
#include "cuda_test.h"
#include "deepinfer/backend.h"
#include "indexer_rows.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

constexpr int kRatio = 4;
constexpr int kBlock = 128;

struct RowSortCase {
  std::string name;
  std::vector<SeqSpec> seqs;  // decode rows: entries visible = (ctx + 1) / 4
  int top_k;
  bool integers;
};

// The host's top-k of one token: its visible slots by score descending, the lower slot first at
// equal scores, then -1.
std::vector<int32_t> host_top_k(const float* row, int64_t visible, int top_k) {
  std::vector<int32_t> slots(static_cast<size_t>(visible));
  std::iota(slots.begin(), slots.end(), 0);
  std::stable_sort(slots.begin(), slots.end(), [&](int32_t a, int32_t b) {
    return row[a] > row[b];  // stable: equal scores keep the lower slot first
  });
  slots.resize(static_cast<size_t>(std::min<int64_t>(visible, top_k)));
  slots.resize(static_cast<size_t>(top_k), -1);
  return slots;
}

// The shared CUDA backend (CudaTest: skipped without a GPU, failed where the device is required).
using IndexerRowSort = CudaTest;

TEST_F(IndexerRowSort, SameSlotsAsTheHostAndTheOtherSelections) {
  Backend* be = &gpu();
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(*be);
  // ctx for a row of `entries` visible entries.
  const auto row_of = [](int entries, int slot) { return SeqSpec{entries * kRatio - 1, 1, slot}; };
  std::vector<SeqSpec> widths, past;
  int slot = 0;
  for (const int e : {1, 31, 32, 33, 100, 511, 512, 513, 700, 1023, 1024}) {
    widths.push_back(row_of(e, slot++));
  }
  past = widths;
  for (const int e : {1025, 2000}) past.push_back(row_of(e, slot++));
  const std::vector<RowSortCase> cases = {
      {"fit_top512_integers", widths, 512, true},
      {"fit_top512_floats", widths, 512, false},
      {"fit_top64_integers", widths, 64, true},
      {"past_top512_integers", past, 512, true},
      {"past_top64_floats", past, 64, false},
      {"b1_1024_integers", {row_of(1024, 0)}, 512, true},
  };
  std::mt19937 rng(20261207);
  for (const RowSortCase& rc : cases) {
    SCOPED_TRACE(rc.name);
    Indexer c;
    c.block = kBlock;
    c.ratio = kRatio;
    c.seqs = rc.seqs;
    const IndexerIn in = draw_indexer(c, rng);
    const Tensor q = up(*be, in.q), w = up(*be, in.w), cache = up_same(*be, in.cache);
    const BatchLayout layout = in.hb.upload(*be);
    const int64_t tokens = in.hb.num_tokens();
    const int64_t bound = int64_t{in.hb.max_blocks} * (kBlock / kRatio);
    // Scores [tokens, bound]: integers in [-6, 6] (many ties) or floats, about 1 in 16 -inf; the
    // slots past a row's visible entries hold NaN, which no selection may read.
    std::vector<float> scores(static_cast<size_t>(tokens * bound),
                              std::numeric_limits<float>::quiet_NaN());
    std::uniform_int_distribution<int> small(-6, 6);
    std::uniform_real_distribution<float> real(-3.0f, 3.0f);
    std::uniform_int_distribution<int> one_in(0, 15);
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t visible =
          std::min<int64_t>((in.hb.positions[static_cast<size_t>(t)] + 1) / kRatio, bound);
      for (int64_t j = 0; j < visible; ++j) {
        float v = rc.integers ? static_cast<float>(small(rng)) : real(rng);
        if (one_in(rng) == 0) v = -std::numeric_limits<float>::infinity();
        scores[static_cast<size_t>(t * bound + j)] = v;
      }
    }
    const Tensor device_scores =
        be->upload(Tensor::from_vector(scores, {tokens, bound}), DType::kF32);
    using S = cuda::IndexerSelectKernel;
    const auto top_k_of = [&](S kernel) {
      cuda::IndexerRunOptions opt;
      opt.select_kernel = kernel;
      opt.run_scores = false;
      opt.scores = device_scores.data<float>();
      return be->to_host(cuda::indexer_topk_run(cuda_be, q, w, cache, layout, kRatio, rc.top_k,
                                                0.0625f, 0.125f, opt));
    };
    for (const S kernel : {S::kRowSort, S::kAuto, S::kBinned, S::kOneBlock}) {
      SCOPED_TRACE(kernel == S::kRowSort  ? "row sort"
                   : kernel == S::kAuto   ? "auto"
                   : kernel == S::kBinned ? "binned"
                                          : "one block");
      const Tensor got = top_k_of(kernel);
      ASSERT_EQ(got.numel(), tokens * rc.top_k);
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t visible =
            std::min<int64_t>((in.hb.positions[static_cast<size_t>(t)] + 1) / kRatio, bound);
        const std::vector<int32_t> want = host_top_k(scores.data() + t * bound, visible, rc.top_k);
        const int32_t* g = got.data<int32_t>() + t * rc.top_k;
        for (int i = 0; i < rc.top_k; ++i) {
          ASSERT_EQ(g[i], want[static_cast<size_t>(i)])
              << "token " << t << " (" << visible << " visible entries), column " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
