// The counter-based random numbers of sampling and of random weights, one definition for the
// host (the CPU sampler, the CPU backend) and the device (the CUDA sample and
// fill_random_normal kernels), so every backend draws bit-identical values.
//
// A value is a pure function of its key (seed, position, stream) or (seed, index): it does not
// depend on batch size, row order or thread count, so a request's tokens do not depend on what
// else is batched with it.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"

namespace deepinfer::sample {

// One step of SplitMix64 with state x: add the golden-ratio increment, then the finaliser (a
// bijective 64-bit mixer). Adding the increment first keeps 0 from mapping to 0.
DEEPINFER_HOST_DEVICE constexpr uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A double in [0, 1) from the top 53 bits of a hash of (seed, position, stream).
DEEPINFER_HOST_DEVICE constexpr double uniform(uint64_t seed, int64_t position,
                                               uint32_t stream = 0) {
  // Chained rather than summed: every round is a bijection of the previous hash, so no linear
  // relation between (position, stream) pairs survives to the output.
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<uint64_t>(position));
  h = splitmix64(h ^ static_cast<uint64_t>(stream));
  // Top 53 bits: every value is an exact double, and the result is < 1.
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// A standard normal value keyed by (seed, index) (Box-Muller on two counter-based uniforms); used
// to make random weights, not for sampling. The host's and the device's log / cos may differ in
// the last ulp of the double, which the rounding to float all but always absorbs.
DEEPINFER_HOST_DEVICE inline float normal(uint64_t seed, uint64_t index) {
  const uint64_t h = splitmix64(splitmix64(seed) ^ index);
  const uint64_t g = splitmix64(h);
  // u1 in (0, 1] so the log is finite; u2 in [0, 1).
  const double u1 = (static_cast<double>(h >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(g >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace deepinfer::sample
