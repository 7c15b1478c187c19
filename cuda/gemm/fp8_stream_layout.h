// The order in which the streaming FP8 linear (fp8_stream.cu) stages the quantized activations:
// the mma order of the routed experts' FP8 weight decode (moe/sm80/experts_quant_tile.cuh,
// slice_input), so that each lane's 16-byte activation piece holds the inputs its decoded weight
// chunk meets in the mma. Host-includable: tests/cpp checks that it is a permutation of every
// 128-input slice, fp8_stream.cu that it inverts slice_input.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// Position of input k in its staged row. A 128-input slice is 16 pieces of 8 bf16 (piece
// 4 q + t: lane q's piece of mma steps 2 t, 2 t + 1), element 2 i + h of a piece being input
// slice_input(q, 2 t + i / 2, i % 2, h) = 64 (s / 4) + 16 q + 4 (s % 4) + w + 2 h for step s and
// k slot pair w; this inverts it.
constexpr int64_t fp8_stream_staged_index(int64_t k) {
  const int64_t slice = k / 128;
  const int r = static_cast<int>(k % 128);
  const int q = (r >> 4) & 3;
  const int r16 = r & 15;
  const int s = 4 * (r >> 6) + (r16 >> 2);  // the mma step within the slice
  const int w = r16 & 1;
  const int h = (r16 >> 1) & 1;
  const int t = s >> 1;
  const int i = 2 * (s & 1) + w;
  return slice * 128 + 8 * (4 * q + t) + 2 * i + h;
}

}  // namespace deepinfer::cuda
