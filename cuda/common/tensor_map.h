// Tensor maps (CUtensorMap) for the tensor memory accelerator's 2-D copies (cp.async.bulk.tensor,
// sm_90+), encoded on the host by the driver's cuTensorMapEncodeTiled. The entry point is found
// through the runtime (cudaGetDriverEntryPointByVersion), so nothing links libcuda. Host code only.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::cuda {

// A row-major matrix of bytes in device memory: `rows` rows of `row_bytes` bytes (a multiple of
// 16), the base 16-byte aligned.
struct ByteMatrix {
  const void* base;
  uint64_t rows;
  uint64_t row_bytes;
};

// How a box lands in shared memory: row-major, or with the 128-byte swizzle of wgmma's K-major
// operands (16-byte chunk c of row r at c ^ (r % 8); boxes of 128-byte rows, 1 KB aligned).
enum class TensorMapSwizzle { kNone, k128B };

// One tensor map per matrix, read in boxes of `box_rows` rows x `box_bytes` bytes (by default
// row-major in shared memory), with L2 promotion to 128-byte lines: a box's 64-byte
// rows fetch their whole line, whose other half the next box along the row reads (on the H100 the
// routed experts' copies at B = 1 took 24.0 us with it, 27.9 without and 25.2 with 256-byte
// promotion; session 46, benchmarks/RESULTS.md). Rows and columns past a matrix read as zeros.
// Empty where the driver lacks the entry point or rejects a map (the callers then copy without
// maps).
std::vector<CUtensorMap> encode_byte_matrix_maps(
    std::span<const ByteMatrix> matrices, uint32_t box_bytes, uint32_t box_rows,
    TensorMapSwizzle swizzle = TensorMapSwizzle::kNone);

}  // namespace deepinfer::cuda
