// Tile shapes of the tensor-core expert GEMMs (sm80/experts_mma.cu), shared with the MoE
// heuristics, which choose between them.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

namespace deepinfer::cuda {

constexpr int kExpertMmaK = 32;                    // K per stage
constexpr int kExpertMmaThreads = 256;             // 8 warps
constexpr int kExpertMmaStride = kExpertMmaK + 8;  // bf16 row stride in shared memory (80 bytes)
// The 128-row shape from this many pairs per expert on average (exclusive).
constexpr int64_t kExpertMmaWideMinPairs = 64;

template <int kRows>
struct ExpertMmaTile {
  static constexpr int kM = kRows;                     // pair rows per CTA (the tile list's)
  static constexpr int kN = kRows == 64 ? 256 : 128;   // weight rows per CTA
  static constexpr int kStages = kRows == 64 ? 3 : 4;  // cp.async pipeline depth
  static constexpr int kWarpsM = kM / 32;              // warps over pair rows
  static constexpr int kStageElems = (kM + kN) * kExpertMmaStride;
  static constexpr size_t kSmemBytes = size_t{kStages} * kStageElems * sizeof(__nv_bfloat16);
  static_assert(kRows == 64 || kRows == 128, "two shapes");
  static_assert((kExpertMmaThreads / 32 / kWarpsM) * 64 == kN, "8 warps of 32 x 64 cover the tile");
  static_assert(kExpertMmaK == 32 && kExpertMmaThreads == 256 && kM % 64 == 0 && kN % 64 == 0,
                "the copy role: 4 threads per 64-byte row slice, 64 rows per pass");
  static_assert((kExpertMmaStride * sizeof(__nv_bfloat16)) % 16 == 0 && (kStageElems * 2) % 16 == 0,
                "16-byte aligned rows and stages (cp.async, ldmatrix)");
};

}  // namespace deepinfer::cuda
