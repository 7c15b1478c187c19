// Engram ops of the CUDA backend (V4.1's n-gram memory, docs/model.md#v41-ops): the n-gram hash
// rows and the per-stream gate, as the CPU reference computes them
// (cpp/src/backend/cpu_ops_engram.cpp), and the lookup of a table kept as shipped
// (embedding_fp8: e4m3 rows with a UE8M0 scale per 32 columns, decoded per looked-up row). A
// dense table's lookup is `embedding`, the projection `linear`.
//
// embedding_fp8 is exact (e4m3 times a power of two is an f32), so it matches the CPU bit for
// bit. Where the CPU op throws on an id outside the table, the kernel writes a zero row.
//
// engram_hash is integer math in unsigned 64-bit arithmetic, bit for bit the CPU's. Its constants
// (multipliers, primes and the table offsets) travel as a kernel argument by value, so the op
// uploads nothing and can be captured in a graph. Where the CPU op throws on contents (a token id
// outside [-1, vocab), a negative compressed id), the kernel cannot without a host sync; it
// hashes the pad id there instead.
//
// engram_gate sums in double, as the CPU does (its mean squares and the gate's dot product);
// the products that feed the sums, the gate and the update are rounded as the CPU rounds them
// (no FMA contraction). Differences come from the summation order and expf.
#include <cstdint>
#include <string>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/activation.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/engram/engram_heuristics.h"

namespace deepinfer::cuda {

namespace {

struct EngramHashArgs {
  uint64_t multipliers[kEngramMaxOrder];  // [n]
  uint64_t primes[kEngramMaxTables];      // [(n - 1) * heads], (order, head) order
  uint64_t offsets[kEngramMaxTables];     // exclusive prefix sums of the primes
  const int32_t* ngram;                   // [T, n]
  const int32_t* token_map;               // [vocab]
  int32_t* rows;                          // [T, (n - 1) * heads]
  int64_t tokens;
  int64_t vocab;
  uint64_t pad;
  int n;
  int heads;
};

// One thread per (token, head): the hash chain h of the token's window, and after each order
// r = 1..n-1 the row h mod P[r-1][head] + offset[r-1][head].
__global__ void __launch_bounds__(kEngramHashThreads) engram_hash_kernel(EngramHashArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t total = a.tokens * a.heads;
  const int64_t cols = static_cast<int64_t>(a.n - 1) * a.heads;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t t = e / a.heads;
    const int head = static_cast<int>(e % a.heads);
    const int32_t* window = a.ngram + t * a.n;
    int32_t* dst = a.rows + t * cols;
    uint64_t h = 0;
    for (int r = 0; r < a.n; ++r) {
      const int32_t token = window[r];
      uint64_t id = a.pad;
      if (token >= 0 && token < a.vocab) {
        const int32_t mapped = a.token_map[token];
        if (mapped >= 0) id = static_cast<uint64_t>(mapped);
      }
      const uint64_t term = id * a.multipliers[r];
      h = r == 0 ? term : (h ^ term);
      if (r == 0) continue;  // orders start at bigrams
      const int i = (r - 1) * a.heads + head;
      // Fits i32: the front checked that the primes sum below 2^31.
      dst[i] = static_cast<int32_t>(h % a.primes[i] + a.offsets[i]);
    }
  }
}

// The three sums of one gate row, reduced over the block in a fixed order.
struct GateSums {
  double xx;   // sum x^2
  double kk;   // sum k^2
  double dot;  // sum ((x * wq) * wk) * k
};

__device__ GateSums block_gate_sums(GateSums v) {
  __shared__ double partial[3][32];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  v.xx = warp_sum(v.xx);
  v.kk = warp_sum(v.kk);
  v.dot = warp_sum(v.dot);
  if (lane == 0) {
    partial[0][warp] = v.xx;
    partial[1][warp] = v.kk;
    partial[2][warp] = v.dot;
  }
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x / 32);
  GateSums total;
  total.xx = warp_sum(lane < warps ? partial[0][lane] : 0.0);
  total.kk = warp_sum(lane < warps ? partial[1][lane] : 0.0);
  total.dot = warp_sum(lane < warps ? partial[2][lane] : 0.0);
  return total;
}

// One block per (token t, stream s) row:
//   d = dot * rsqrt(mean(x^2) + eps) * rsqrt(mean(k^2) + eps) / sqrt(H),
//   g = sigmoid(sign(d) * sqrt(max(|d|, 1e-6))),  out = x + g * v.
__global__ void engram_gate_kernel(const float* __restrict__ X, const float* __restrict__ kv,
                                   const float* __restrict__ q_weight,
                                   const float* __restrict__ k_weight, float* __restrict__ out,
                                   int n, int64_t hidden, float eps) {
  const int64_t row = blockIdx.x;  // t * n + s
  const int64_t t = row / n;
  const int64_t s = row % n;
  const float* x = X + row * hidden;
  const float* kvt = kv + t * (n + 1) * hidden;
  const float* k = kvt + s * hidden;
  const float* v = kvt + static_cast<int64_t>(n) * hidden;  // the value follows the N keys
  const float* wq = q_weight + s * hidden;
  const float* wk = k_weight + s * hidden;
  GateSums part{0.0, 0.0, 0.0};
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    const float xc = x[c];
    const float kc = k[c];
    part.xx += static_cast<double>(xc) * xc;
    part.kk += static_cast<double>(kc) * kc;
    part.dot += static_cast<double>(__fmul_rn(__fmul_rn(__fmul_rn(xc, wq[c]), wk[c]), kc));
  }
  const GateSums sum = block_gate_sums(part);
  const double count = static_cast<double>(hidden);
  const float rx = 1.0f / sqrtf(__fadd_rn(static_cast<float>(sum.xx / count), eps));
  const float rk = 1.0f / sqrtf(__fadd_rn(static_cast<float>(sum.kk / count), eps));
  const float inv_sqrt_h = 1.0f / sqrtf(static_cast<float>(hidden));
  const float d = __fmul_rn(__fmul_rn(__fmul_rn(static_cast<float>(sum.dot), rx), rk), inv_sqrt_h);
  // sign(0) = 0 gives g = 1/2, as the reference does.
  const float sign = d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f);
  const float g = sigmoid(__fmul_rn(sign, sqrtf(fmaxf(fabsf(d), 1e-6f))));
  float* dst = out + row * hidden;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    dst[c] = __fadd_rn(x[c], __fmul_rn(g, v[c]));
  }
}

// One thread per (looked-up row, column) over a grid-stride loop: with rows of a multiple of 32
// codes (Flash's 256) a warp reads one 32-byte sector of one row and one scale byte, so only the
// looked-up rows' bytes cross the bus, wherever the table lives.
__global__ void __launch_bounds__(kEngramLookupThreads)
    embedding_fp8_kernel(const uint8_t* __restrict__ values, const uint8_t* __restrict__ scales,
                         const int32_t* __restrict__ ids, float* __restrict__ out, int64_t vocab,
                         int64_t cols, int64_t groups, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t t = e / cols;
    const int64_t c = e % cols;
    const int32_t id = ids[t];
    float v = 0.0f;
    if (id >= 0 && id < vocab) {
      const int64_t row = id;
      const __nv_fp8_storage_t code = values[row * cols + c];
      const float decoded = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
      v = __fmul_rn(decoded, e8m0_to_float(scales[row * groups + c / 32]));
    }
    out[e] = v;
  }
}

}  // namespace

Tensor CudaBackend::embedding_fp8_impl(const Tensor& values, const Tensor& scales,
                                       const Tensor& ids) {
  const char* op = "embedding_fp8";
  const int64_t vocab = values.size(0);
  const int64_t cols = values.size(1);
  const int64_t tokens = ids.size(0);
  Tensor out = empty({tokens, cols}, DType::kF32);
  const int64_t total = tokens * cols;
  if (total == 0) return out;
  embedding_fp8_kernel<<<engram_lookup_blocks(total, num_sms()), kEngramLookupThreads, 0,
                         stream()>>>(static_cast<const uint8_t*>(values.raw_data()),
                                     static_cast<const uint8_t*>(scales.raw_data()),
                                     ids.data<int32_t>(), out.data<float>(), vocab, cols,
                                     scales.size(1), total);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::engram_hash_impl(const Tensor& ngram, const Tensor& token_map,
                                     const EngramHashParams& params) {
  const char* op = "engram_hash";
  const int64_t tokens = ngram.size(0);
  const auto n = static_cast<int>(ngram.size(1));
  const int heads = params.heads;
  const auto tables = static_cast<int64_t>(params.primes.size());
  if (n > kEngramMaxOrder || tables > kEngramMaxTables) {
    throw Error(ErrorCode::kUnsupported,
                std::string(op) + ": the CUDA backend hashes n-grams up to order " +
                    std::to_string(kEngramMaxOrder) + " into at most " +
                    std::to_string(kEngramMaxTables) + " tables, got n = " + std::to_string(n) +
                    " and " + std::to_string(tables) + " tables");
  }
  Tensor rows = empty({tokens, tables}, DType::kI32);
  if (tokens == 0) return rows;
  EngramHashArgs a{};
  uint64_t offset = 0;
  for (int64_t i = 0; i < tables; ++i) {
    a.primes[i] = static_cast<uint64_t>(params.primes[static_cast<size_t>(i)]);
    a.offsets[i] = offset;
    offset += a.primes[i];
  }
  for (int r = 0; r < n; ++r) {
    a.multipliers[r] = static_cast<uint64_t>(params.multipliers[static_cast<size_t>(r)]);
  }
  a.ngram = ngram.data<int32_t>();
  a.token_map = token_map.data<int32_t>();
  a.rows = rows.data<int32_t>();
  a.tokens = tokens;
  a.vocab = token_map.size(0);
  a.pad = static_cast<uint64_t>(params.pad_id);
  a.n = n;
  a.heads = heads;
  engram_hash_kernel<<<engram_hash_blocks(tokens * heads, num_sms()), kEngramHashThreads, 0,
                       stream()>>>(a);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return rows;
}

Tensor CudaBackend::engram_gate_impl(const Tensor& X, const Tensor& kv, const Tensor& q_weight,
                                     const Tensor& k_weight, float eps) {
  const char* op = "engram_gate";
  const int64_t tokens = X.size(0);
  const int64_t n = X.size(1);
  const int64_t hidden = X.size(2);
  Tensor out = empty(X.shape(), DType::kF32);
  const int64_t rows = tokens * n;
  if (rows == 0 || hidden == 0) return out;
  if (rows > 0x7fffffff) fail(op, "X " + X.describe() + " has more than 2^31 - 1 stream rows");
  const int threads = engram_gate_threads(rows, hidden, num_sms());
  engram_gate_kernel<<<static_cast<unsigned>(rows), threads, 0, stream()>>>(
      X.data<float>(), kv.data<float>(), q_weight.data<float>(), k_weight.data<float>(),
      out.data<float>(), static_cast<int>(n), hidden, eps);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

}  // namespace deepinfer::cuda
