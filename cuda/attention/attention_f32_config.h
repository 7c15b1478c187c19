// Tile constants of the f32 attention kernel (attention_f32.cu), shared with its heuristics.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deepinfer::cuda {

constexpr int kAttnThreads = 256;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kAttnKeys = 32;           // keys per tile: one per lane in the score phase
constexpr int kAttnHeadsPerThread = 8;  // heads of one thread in the P.V phase
constexpr int kAttnQFloats = 8192;      // q floats per block: heads per block = 8192 / D
constexpr int kAttnMaxDim = 1024;       // D/4 column groups must fit the block's threads

// Shared memory of a block: q [HB][D], the key tile [32][D+4], the tile's probabilities
// [32][hb_stride], per head the running max, denominator and rescale factor, key pointers [32].
inline size_t attn_smem_bytes(int64_t dim, int64_t hb, int64_t hb_stride) {
  const int64_t floats = hb * dim + kAttnKeys * (dim + 4) + kAttnKeys * hb_stride + 3 * hb_stride;
  return static_cast<size_t>(floats) * sizeof(float) + kAttnKeys * sizeof(const float*);
}

}  // namespace deepinfer::cuda
