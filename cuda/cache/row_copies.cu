// gather_rows and copy_rows of the CUDA backend: whole rows of any dtype copied in the widest
// unit (16, 8, 4, 2 or 1 bytes) that divides the row and both bases, as the CPU reference ops
// (cpp/src/backend/cpu_ops_dense.cpp). An index out of range cannot be raised without a host
// sync (the CPU ops throw): gather_rows writes a zero row, copy_rows skips the pair.
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"

namespace deepinfer::cuda {

namespace {

// Row copies in units of U (16, 8, 4, 2 or 1 bytes, whatever divides the row and both bases).
// Grid: x = output row, y = chunks of a long row.
template <typename U>
__global__ void gather_rows_kernel(const U* __restrict__ src, const int32_t* __restrict__ rows,
                                   U* __restrict__ dst, int64_t src_rows, int64_t row_units) {
  enter_dependent_grid();
  const int64_t i = blockIdx.x;
  const int32_t r = rows[i];
  U* d = dst + i * row_units;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (r < 0 || r >= src_rows) {
    // Out of range (the CPU op throws): a zero row.
    for (int64_t k = first; k < row_units; k += stride) d[k] = U{};
    return;
  }
  const U* s = src + static_cast<int64_t>(r) * row_units;
  for (int64_t k = first; k < row_units; k += stride) d[k] = s[k];
}

// In place: rows[dst[i]] = rows[src[i]]. A pair with an index outside [0, num_rows) is skipped
// (the CPU op throws and copies nothing). No __restrict__: source and destination share `base`.
template <typename U>
__global__ void copy_rows_kernel(U* base, const int32_t* __restrict__ src,
                                 const int32_t* __restrict__ dst, int64_t num_rows,
                                 int64_t row_units) {
  enter_dependent_grid();
  const int64_t i = blockIdx.x;
  const int32_t s = src[i];
  const int32_t d = dst[i];
  if (s < 0 || s >= num_rows || d < 0 || d >= num_rows) return;
  const U* from = base + static_cast<int64_t>(s) * row_units;
  U* to = base + static_cast<int64_t>(d) * row_units;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; k < row_units;
       k += stride) {
    to[k] = from[k];
  }
}

// The widest unit (16, 8, 4, 2, 1 bytes) that divides the row and both base addresses.
int copy_unit(size_t row_bytes, const void* a, const void* b) {
  const uintptr_t bits = static_cast<uintptr_t>(row_bytes) | reinterpret_cast<uintptr_t>(a) |
                         reinterpret_cast<uintptr_t>(b);
  for (int unit : {16, 8, 4, 2}) {
    if (bits % static_cast<uintptr_t>(unit) == 0) return unit;
  }
  return 1;
}

constexpr int kCopyThreads = 256;

// Chunks of a row (grid y) so that a few long rows still spread over the device.
dim3 copy_grid(int64_t rows, int64_t row_units) {
  int64_t chunks = (row_units + kCopyThreads * 4 - 1) / (kCopyThreads * 4);
  if (chunks < 1) chunks = 1;
  if (chunks > 65535) chunks = 65535;
  return dim3(static_cast<unsigned>(rows), static_cast<unsigned>(chunks), 1);
}

// Calls f.template operator()<U>() with U the unsigned type of `unit` bytes (copy_unit's).
template <typename F>
void with_copy_unit(int unit, F&& f) {
  switch (unit) {
    case 16:
      f.template operator()<uint4>();
      break;
    case 8:
      f.template operator()<uint2>();
      break;
    case 4:
      f.template operator()<uint32_t>();
      break;
    case 2:
      f.template operator()<uint16_t>();
      break;
    default:
      f.template operator()<uint8_t>();
      break;
  }
}

size_t row_bytes_of(const Tensor& t) {
  size_t bytes = dtype_size(t.dtype());
  for (int64_t d = 1; d < t.dim(); ++d) bytes *= static_cast<size_t>(t.size(d));
  return bytes;
}

}  // namespace

Tensor CudaBackend::gather_rows_impl(const Tensor& x, const Tensor& rows) {
  const char* op = "gather_rows";
  Shape shape = x.shape();
  const int64_t src_rows = shape[0];
  shape[0] = rows.size(0);
  Tensor out = empty(shape, x.dtype());
  const size_t row_bytes = row_bytes_of(x);
  if (shape[0] == 0 || row_bytes == 0) return out;
  const void* src = x.raw_data();
  void* dst = out.raw_data();
  const int32_t* r = rows.data<int32_t>();
  with_copy_unit(copy_unit(row_bytes, src, dst), [&]<typename U>() {
    const int64_t units = static_cast<int64_t>(row_bytes / sizeof(U));
    launch_programmatic(op, copy_grid(shape[0], units), dim3(kCopyThreads), 0, stream(), pdl(),
                        gather_rows_kernel<U>, static_cast<const U*>(src), r, static_cast<U*>(dst),
                        src_rows, units);
  });
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

void CudaBackend::copy_rows_impl(const Tensor& t, const Tensor& src, const Tensor& dst) {
  // The copies run concurrently, so, as on the CPU, the result is defined only when no row is a
  // destination twice and no destination is also a source. The CPU op checks that (it needs the
  // indices' contents); here it is the caller's contract and a violation races.
  const char* op = "copy_rows";
  const int64_t n = src.size(0);
  const int64_t num_rows = t.size(0);
  const size_t row_bytes = row_bytes_of(t);
  if (n == 0 || row_bytes == 0) return;
  void* base = t.raw_data();
  const int32_t* s = src.data<int32_t>();
  const int32_t* d = dst.data<int32_t>();
  with_copy_unit(copy_unit(row_bytes, base, base), [&]<typename U>() {
    const int64_t units = static_cast<int64_t>(row_bytes / sizeof(U));
    launch_programmatic(op, copy_grid(n, units), dim3(kCopyThreads), 0, stream(), pdl(),
                        copy_rows_kernel<U>, static_cast<U*>(base), s, d, num_rows, units);
  });
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace deepinfer::cuda
