// What the Hopper attention kernel's GPU tests check of a traced launch
// (cuda/attention/sm90/attention_wgmma_trace.h): at least one block recorded, and each recorded
// block's stamps run in its roles' program order, tile by tile.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/attention/sm90/attention_wgmma_trace.h"

namespace deepinfer::backend_ops {

// `w`: the host copy of a traced launch's buffer for its first `ctas` blocks.
inline void expect_trace_in_program_order(const int64_t* w, int ctas) {
  const std::vector<int64_t> words(w, w + cuda::overlap_trace_words(ctas));
  EXPECT_GE(cuda::summarize_overlap_trace(words, ctas).ctas, 1);
  const std::vector<std::vector<int>> roles = {
      {cuda::kProducerTop, cuda::kProducerFree, cuda::kProducerLanded, cuda::kProducerPublished,
       cuda::kProducerIssued},
      {cuda::kScorerTop, cuda::kScorerFull, cuda::kScorerPrevValues, cuda::kScorerScores,
       cuda::kScorerProbsFree, cuda::kScorerPublished, cuda::kScorerIssued},
      {cuda::kValueTop, cuda::kValueReady, cuda::kValueDone}};
  for (int c = 0; c < ctas; ++c) {
    const int64_t* rec = w + c * cuda::kOverlapTraceWordsPerCta;
    if (rec[cuda::kTraceClockEnd] == 0) continue;  // a grid of fewer blocks
    const int tiles =
        static_cast<int>(std::min<int64_t>(rec[cuda::kTraceTiles], cuda::kOverlapTraceTiles));
    for (const std::vector<int>& events : roles) {
      int64_t last = rec[cuda::kTraceClockStart];
      for (int i = 0; i < tiles; ++i) {
        for (const int e : events) {
          const int64_t v = rec[cuda::kOverlapTraceHeaderWords + e * cuda::kOverlapTraceTiles + i];
          EXPECT_GE(v, last) << "block " << c << " tile " << i << " event " << e;
          last = v;
        }
      }
    }
  }
}

}  // namespace deepinfer::backend_ops
