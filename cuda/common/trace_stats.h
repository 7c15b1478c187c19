// A phase's statistics over the blocks of a kernel's timing trace, for the host summaries of the
// trace instrumentation (hc/hc_fused_trace.h, attention/sm80/attention_mma_trace.h). Plain C++.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

struct TracePhaseStats {
  int blocks = 0;      // blocks that have the phase
  double mean = 0;     // cycles (their sum until finish)
  int64_t max = 0;     // cycles
  int max_block = -1;  // the block of the max

  void add(int block, int64_t cycles) {
    ++blocks;
    mean += static_cast<double>(cycles);
    if (max_block < 0 || cycles > max) {
      max = cycles;
      max_block = block;
    }
  }
  // After the last add: the sum becomes the mean.
  void finish() {
    if (blocks > 0) mean /= blocks;
  }
};

}  // namespace deepinfer::cuda
