// Dense ops of the CUDA backend: embedding, RMSNorm, elementwise ops, row gathers and copies,
// RoPE, argmax, token selection. Each matches the CPU reference op (cpp/src/backend/
// cpu_ops_dense.cpp, cpu_ops_sample.cpp) on the same inputs.
//
// Matching the CPU bit for bit where it is cheap: the CPU build has no FMA contraction, so a
// product that feeds a sum is written with __fmul_rn / __fadd_rn here (nvcc would otherwise fuse
// it into one fma with a different rounding). RMS statistics accumulate in double like the CPU's.
// Remaining differences: summation order of the double sums, and expf / cosf / sinf, which are
// within 2 ulp of glibc's.
//
// Content errors (an id or a row index out of range) cannot be seen on the host without a sync.
// The CPU ops throw for them; these kernels write a defined value instead (see each op).
#include <cstdint>

#include "cuda_backend.h"
#include "cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

// ---- host-side checks ---------------------------------------------------------------------------

void check_rank_range(const char* op, const char* arg, const Tensor& t, DType dtype,
                      int64_t min_rank, int64_t max_rank) {
  check_device(op, arg, t);
  check_dtype(op, arg, t, dtype);
  if (t.dim() < min_rank || t.dim() > max_rank) {
    fail(op, std::string("argument ") + arg + " must have rank " + std::to_string(min_rank) + "-" +
                 std::to_string(max_rank) + ", got " + t.describe());
  }
}

// ---- launch geometry ----------------------------------------------------------------------------

constexpr int kElementwiseThreads = 256;

// Grid of a grid-stride elementwise kernel over n elements: enough blocks to fill the device,
// never more than the elements need.
unsigned elementwise_blocks(const CudaBackend& be, int64_t n) {
  const int64_t fill = static_cast<int64_t>(be.num_sms()) * 16;
  const int64_t need = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(need < fill ? need : fill);
}

// Threads of a one-block-per-row kernel over rows of `width` elements (a multiple of 32).
int row_threads(int64_t width) {
  if (width >= 4096) return 512;
  if (width >= 1024) return 256;
  return 128;
}

// ---- block reductions ---------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32; call at most
// once per kernel (it reuses one shared buffer without a trailing barrier). The order is fixed by
// the launch geometry, so the result is deterministic.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const unsigned lane = threadIdx.x % 32;
  const unsigned warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const unsigned warps = blockDim.x / 32;
  return warp_sum(lane < warps ? partial[lane] : T(0));
}

// ---- kernels
// --------------------------------------------------------------------------------------

// One block per token. An id outside [0, vocab) gives a zero row (the CPU op throws).
template <typename T>
__global__ void embedding_kernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                                 float* __restrict__ out, int64_t vocab, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  const T* src = table + (valid ? static_cast<int64_t>(id) : 0) * hidden;
  float* dst = out + t * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    dst[h] = valid ? load_as_float(src, h) : 0.0f;
  }
}

// One block per row: y = x * (1 / sqrt(float(mean(x^2)) + eps)) [* w], mean in double as on the
// CPU. `w` may be null (unweighted).
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                float* __restrict__ y, int64_t dim, float eps) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const double v = xr[i];
    acc += v * v;  // exact in double, so a fused multiply-add rounds the same
  }
  acc = block_sum(acc);
  const float inv = 1.0f / sqrtf(static_cast<float>(acc / static_cast<double>(dim)) + eps);
  if (w != nullptr) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] * inv) * w[i];
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv;
  }
}

__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float factor,
                             int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = x[i] * factor;
  }
}

__global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                           float* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = a[i] + b[i];
  }
}

// silu(min(gate, L)) * clamp(up, -L, L) as cpu::swiglu: comparisons (not fminf/fmaxf) so a NaN
// propagates; silu(g) = g * (1 / (1 + exp(-g))).
__device__ __forceinline__ float swiglu_value(float gate, float up, float limit) {
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  const float sigmoid = 1.0f / (1.0f + expf(-g));
  return (g * sigmoid) * u;
}

__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                              float* __restrict__ y, float limit, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = swiglu_value(gate[i], up[i], limit);
  }
}

// Row copies in units of U (16, 8, 4, 2 or 1 bytes, whatever divides the row and both bases).
// Grid: x = output row, y = chunks of a long row.
template <typename U>
__global__ void gather_rows_kernel(const U* __restrict__ src, const int32_t* __restrict__ rows,
                                   U* __restrict__ dst, int64_t src_rows, int64_t row_units) {
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

// One thread per output element of x viewed as [rows = T * heads, dim]. Channels before `first`
// are copied; channel first + 2i (+1) is the first (second) element of rotated pair i. Both
// threads of a pair compute the same angle, cos and sin as the CPU: float(pos) * inv_freq[i],
// cosf, sinf (not the __cosf intrinsics), products rounded separately.
__global__ void rope_kernel(const float* __restrict__ x, const int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, float* __restrict__ y,
                            int64_t heads, int64_t dim, int64_t first, bool inverse, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    const int64_t c = e % dim;
    if (c < first) {
      y[e] = x[e];
      continue;
    }
    const int64_t row = e / dim;
    const int64_t k = c - first;
    const int64_t i = k / 2;
    const int64_t pair = e - (k % 2);  // flat index of the pair's first element
    const float a = x[pair];
    const float b = x[pair + 1];
    const float angle = static_cast<float>(positions[row / heads]) * inv_freq[i];
    const float co = cosf(angle);
    const float si = inverse ? -sinf(angle) : sinf(angle);
    y[e] = (k % 2 == 0) ? __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si))
                        : __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
  }
}

// Argmax candidate: (value, index); index == `none` marks "no candidate yet".
struct ArgBest {
  float value;
  int64_t index;
};

// True when b beats a: larger value, or equal value and lower index. NaNs never become
// candidates. This is a maximum under a total order, so any reduction tree gives one answer.
__device__ __forceinline__ bool beats(const ArgBest& b, const ArgBest& a, int64_t none) {
  if (b.index == none) return false;
  if (a.index == none) return true;
  return b.value > a.value || (b.value == a.value && b.index < a.index);
}

// One block per row. Matches the CPU's sequential scan "best = 0; if row[c] > row[best]": when
// row[0] is NaN nothing ever beats it (result 0); otherwise NaNs are skipped and the result is the
// lowest index of the largest non-NaN value.
__global__ void argmax_kernel(const float* __restrict__ x, int32_t* __restrict__ out,
                              int64_t cols) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  const int64_t none = cols;
  ArgBest best{0.0f, none};
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = row[c];
    // Within a thread c increases, so strict > keeps the lowest index among equal values.
    if (!isnan(v) && (best.index == none || v > best.value)) best = ArgBest{v, c};
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    ArgBest other;
    other.value = __shfl_xor_sync(0xffffffffu, best.value, offset);
    other.index = __shfl_xor_sync(0xffffffffu, best.index, offset);
    if (beats(other, best, none)) best = other;
  }
  __shared__ ArgBest partial[32];
  const unsigned lane = threadIdx.x % 32;
  const unsigned warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) {
      if (beats(partial[w], best, none)) best = partial[w];
    }
    const bool first_nan = isnan(row[0]);
    out[blockIdx.x] = first_nan || best.index == none ? 0 : static_cast<int32_t>(best.index);
  }
}

// out[i] = previous[remap[i]] when remap[i] >= 0, else host[i]. A remap past `previous` (the CPU
// op throws) falls back to host[i].
__global__ void select_tokens_kernel(const int32_t* __restrict__ host,
                                     const int32_t* __restrict__ remap,
                                     const int32_t* __restrict__ previous,
                                     int32_t* __restrict__ out, int64_t num_previous, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int32_t r = remap[i];
    out[i] = r >= 0 && r < num_previous ? previous[r] : host[i];
  }
}

// ---- row-copy dispatch
// ----------------------------------------------------------------------------

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

template <typename U>
void launch_gather(cudaStream_t stream, const void* src, const int32_t* rows, void* dst,
                   int64_t out_rows, int64_t src_rows, size_t row_bytes) {
  const int64_t units = static_cast<int64_t>(row_bytes / sizeof(U));
  gather_rows_kernel<U><<<copy_grid(out_rows, units), kCopyThreads, 0, stream>>>(
      static_cast<const U*>(src), rows, static_cast<U*>(dst), src_rows, units);
}

template <typename U>
void launch_copy(cudaStream_t stream, void* base, const int32_t* src, const int32_t* dst,
                 int64_t pairs, int64_t num_rows, size_t row_bytes) {
  const int64_t units = static_cast<int64_t>(row_bytes / sizeof(U));
  copy_rows_kernel<U><<<copy_grid(pairs, units), kCopyThreads, 0, stream>>>(
      static_cast<U*>(base), src, dst, num_rows, units);
}

size_t row_bytes_of(const Tensor& t) {
  size_t bytes = dtype_size(t.dtype());
  for (int64_t d = 1; d < t.dim(); ++d) bytes *= static_cast<size_t>(t.size(d));
  return bytes;
}

}  // namespace

// ---- ops
// ------------------------------------------------------------------------------------------

Tensor CudaBackend::embedding(const Tensor& table, const Tensor& ids) {
  const char* op = "embedding";
  check_device(op, "table", table);
  check_rank(op, "table", table, 2);
  if (table.dtype() != DType::kF32 && table.dtype() != DType::kBF16) {
    fail(op, "argument table must be f32 or bf16, got " + table.describe());
  }
  check_tensor(op, "ids", ids, DType::kI32, {-1});
  const int64_t vocab = table.size(0);
  const int64_t hidden = table.size(1);
  const int64_t tokens = ids.size(0);
  Tensor out = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0 || hidden == 0) return out;
  const int threads = row_threads(hidden);
  if (table.dtype() == DType::kF32) {
    embedding_kernel<float><<<static_cast<unsigned>(tokens), threads, 0, stream()>>>(
        table.data<float>(), ids.data<int32_t>(), out.data<float>(), vocab, hidden);
  } else {
    embedding_kernel<__nv_bfloat16><<<static_cast<unsigned>(tokens), threads, 0, stream()>>>(
        table.data<__nv_bfloat16>(), ids.data<int32_t>(), out.data<float>(), vocab, hidden);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps) {
  const char* op = "rms_norm";
  check_rank_range(op, "x", x, DType::kF32, 1, 8);
  const int64_t dim = x.size(-1);
  if (weight.defined()) check_tensor(op, "weight", weight, DType::kF32, {dim});
  const int64_t rows = dim > 0 ? x.numel() / dim : 0;
  Tensor out = empty(x.shape(), DType::kF32);
  if (rows == 0) return out;
  rms_norm_kernel<<<static_cast<unsigned>(rows), row_threads(dim), 0, stream()>>>(
      x.data<float>(), weight.defined() ? weight.data<float>() : nullptr, out.data<float>(), dim,
      eps);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::scale(const Tensor& x, float factor) {
  const char* op = "scale";
  check_rank_range(op, "x", x, DType::kF32, 0, 8);
  Tensor out = empty(x.shape(), DType::kF32);
  const int64_t n = x.numel();
  if (n == 0) return out;
  scale_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      x.data<float>(), out.data<float>(), factor, n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::add(const Tensor& a, const Tensor& b) {
  const char* op = "add";
  check_rank_range(op, "a", a, DType::kF32, 0, 8);
  check_tensor(op, "b", b, DType::kF32, a.shape());
  Tensor out = empty(a.shape(), DType::kF32);
  const int64_t n = a.numel();
  if (n == 0) return out;
  add_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      a.data<float>(), b.data<float>(), out.data<float>(), n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::swiglu(const Tensor& gate, const Tensor& up, float swiglu_limit) {
  const char* op = "swiglu";
  check_rank_range(op, "gate", gate, DType::kF32, 0, 8);
  check_tensor(op, "up", up, DType::kF32, gate.shape());
  Tensor out = empty(gate.shape(), DType::kF32);
  const int64_t n = gate.numel();
  if (n == 0) return out;
  swiglu_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      gate.data<float>(), up.data<float>(), out.data<float>(), swiglu_limit, n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::gather_rows(const Tensor& x, const Tensor& rows) {
  const char* op = "gather_rows";
  check_device(op, "x", x);
  if (x.dim() < 1) fail(op, "argument x must have at least one dimension, got " + x.describe());
  check_tensor(op, "rows", rows, DType::kI32, {-1});
  Shape shape = x.shape();
  const int64_t src_rows = shape[0];
  shape[0] = rows.size(0);
  Tensor out = empty(shape, x.dtype());
  const size_t row_bytes = row_bytes_of(x);
  if (shape[0] == 0 || row_bytes == 0) return out;
  const void* src = x.raw_data();
  void* dst = out.raw_data();
  const int32_t* r = rows.data<int32_t>();
  switch (copy_unit(row_bytes, src, dst)) {
    case 16:
      launch_gather<uint4>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
    case 8:
      launch_gather<uint2>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
    case 4:
      launch_gather<uint32_t>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
    case 2:
      launch_gather<uint16_t>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
    default:
      launch_gather<uint8_t>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

void CudaBackend::copy_rows(const Tensor& t, const Tensor& src, const Tensor& dst) {
  // The copies run concurrently, so, as on the CPU, the result is defined only when no row is a
  // destination twice and no destination is also a source. The CPU op checks that (it needs the
  // indices' contents); here it is the caller's contract and a violation races.
  const char* op = "copy_rows";
  check_device(op, "t", t);
  if (t.dim() < 1) fail(op, "argument t must have at least one dimension, got " + t.describe());
  check_tensor(op, "src", src, DType::kI32, {-1});
  const int64_t n = src.size(0);
  check_tensor(op, "dst", dst, DType::kI32, {n});
  const int64_t num_rows = t.size(0);
  const size_t row_bytes = row_bytes_of(t);
  if (n == 0 || row_bytes == 0) return;
  void* base = t.raw_data();
  const int32_t* s = src.data<int32_t>();
  const int32_t* d = dst.data<int32_t>();
  switch (copy_unit(row_bytes, base, base)) {
    case 16:
      launch_copy<uint4>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
    case 8:
      launch_copy<uint2>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
    case 4:
      launch_copy<uint32_t>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
    case 2:
      launch_copy<uint16_t>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
    default:
      launch_copy<uint8_t>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

Tensor CudaBackend::rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                         bool inverse) {
  const char* op = "rope";
  check_rank_range(op, "x", x, DType::kF32, 2, 3);
  const int64_t tokens = x.size(0);
  const int64_t heads = x.dim() == 3 ? x.size(1) : 1;
  const int64_t dim = x.size(-1);
  check_tensor(op, "positions", positions, DType::kI32, {tokens});
  check_tensor(op, "inv_freq", inv_freq, DType::kF32, {-1});
  const int64_t half = inv_freq.size(0);
  if (2 * half > dim) {
    fail(op, "inv_freq " + inv_freq.describe() + " rotates " + std::to_string(2 * half) +
                 " channels, more than x's last dimension " + std::to_string(dim));
  }
  Tensor out = empty(x.shape(), DType::kF32);
  const int64_t n = x.numel();
  if (n == 0) return out;
  rope_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      x.data<float>(), positions.data<int32_t>(), inv_freq.data<float>(), out.data<float>(), heads,
      dim, dim - 2 * half, inverse, n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::argmax(const Tensor& x) {
  const char* op = "argmax";
  check_tensor(op, "x", x, DType::kF32, {-1, -1});
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  if (cols == 0) fail(op, "argument x has no columns: " + x.describe());
  Tensor out = empty({rows}, DType::kI32);
  if (rows == 0) return out;
  const int threads = cols >= 16384 ? 1024 : row_threads(cols);
  argmax_kernel<<<static_cast<unsigned>(rows), threads, 0, stream()>>>(x.data<float>(),
                                                                       out.data<int32_t>(), cols);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::select_tokens(const Tensor& host, const Tensor& remap, const Tensor& previous) {
  const char* op = "select_tokens";
  check_tensor(op, "host", host, DType::kI32, {-1});
  const int64_t n = host.size(0);
  check_tensor(op, "remap", remap, DType::kI32, {n});
  check_tensor(op, "previous", previous, DType::kI32, {-1});
  Tensor out = empty({n}, DType::kI32);
  if (n == 0) return out;
  select_tokens_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      host.data<int32_t>(), remap.data<int32_t>(), previous.data<int32_t>(), out.data<int32_t>(),
      previous.size(0), n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

}  // namespace deepinfer::cuda
