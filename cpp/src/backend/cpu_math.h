// Scalar and vector helpers of the CPU backend's kernels. All fp32, no fast-math: vector loops
// keep a fixed number of independent lane accumulators so the compiler can vectorise them
// without reassociating, and every result is independent of thread count.
#pragma once

#include <cmath>
#include <cstdint>

namespace deepinfer::cpu {

inline constexpr int kLanes = 8;

// Sum of lane accumulators in a fixed pairwise order.
inline float reduce_lanes(const float (&acc)[kLanes]) {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return reduce_lanes(acc) + tail;
}

// Mean of squares, accumulated in double: the statistic of RMS norms over up to N*H channels.
inline double mean_square(const float* x, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * x[i];
  return n > 0 ? acc / static_cast<double>(n) : 0.0;
}

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// silu(x) = x * sigmoid(x), as torch computes it.
inline float silu(float x) {
  return x * sigmoid(x);
}

// torch.nn.functional.softplus with beta 1, threshold 20: linear above the threshold.
inline float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

// silu(min(gate, limit)) * clamp(up, -limit, limit).
inline float swiglu(float gate, float up, float limit) {
  // Comparisons rather than fmin/fmax so a NaN propagates, as torch.clamp does.
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  return silu(g) * u;
}

}  // namespace deepinfer::cpu

namespace deepinfer::cpu {

// parallel_for grain for loops whose iterations cost about `per_item` elementary operations:
// chunks of at least ~16K operations amortise the pool's hand-off.
inline int64_t grain_for(int64_t per_item) {
  constexpr int64_t kMinChunkWork = 1 << 14;
  return per_item >= kMinChunkWork ? 1 : kMinChunkWork / (per_item > 0 ? per_item : 1);
}

}  // namespace deepinfer::cpu
