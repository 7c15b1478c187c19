// The lightning indexer's fp8 q, as DeepSeek's engine feeds its indexer (kernels.md #17-19:
// "Indexer Q: RoPE + quant -> FP8"; DeepGEMM's fp8_paged_mqa_logits takes q as e4m3 without a
// scale): each (token, head) row of Di channels becomes e4m3 codes of q / s, rounded to nearest
// even, with s = fp8_scale(amax of the row) = 2^ceil(log2(max(amax, 1e-4) / 448)) (act_quant with
// a UE8M0 scale: |q / s| <= 448, nothing saturates), and s moves into the head's weight, since
// ReLU(s x) = s ReLU(x) for s > 0. Being a power of two, s changes no rounding: the scores over
// the codes and the scaled weights are those over the dequantized q (q rounded to e4m3 relative
// to its row's scale) and the weights, bit for bit (barring f32 overflow or underflow).
#pragma once

#include <cstdint>

namespace deepinfer::indexer_q {

// codes[0, dim) = the e4m3 codes of q[0, dim) / s; returns s (a power of two).
float quantize_row(const float* q, int64_t dim, uint8_t* codes);

}  // namespace deepinfer::indexer_q
