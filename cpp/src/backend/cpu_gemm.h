// The CPU backend's matrix multiply: y = x w^T with both operands row-major along K (the layout of
// nn.Linear weights), fp32 with fp32 accumulation.
#pragma once

#include <cstdint>

#include "common/thread_pool.h"

namespace deepinfer::cpu {

// y[M, N] = x[M, K] * w[N, K]^T. ldx, ldw, ldy are row strides in elements. Work is split over M
// or N on `pool`; each output element is summed in the same order whatever the split, so results
// do not depend on the thread count.
void gemm_nt(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
             int64_t m, int64_t n, int64_t k, ThreadPool& pool);

}  // namespace deepinfer::cpu
