// The sample op of the CUDA backend: the pipeline of cpp/src/sample/sampler.{h,cpp}, per row, on
// the device, with no host sync.
//
//  1. sample_prepare (one CTA per row): argmax (lowest id on ties), max logit, log of the
//     softmax normaliser sum exp(x - max) in double, the candidate mass sum w(x) in double when
//     top-k is off (w(x) = exp((x - max) / T), 0 for -inf), and, for rows that need the rank
//     order (sampled rows, or rows that report log-probabilities), 32-bit sort keys whose
//     ascending order is logit descending (-0 folded onto +0, as the CPU's rank_key does).
//  2. cub::DeviceSegmentedRadixSort of (key, id) pairs, one segment per row; a greedy row without
//     log-probabilities gets an empty segment. Radix sort is stable and the ids go in ascending,
//     so equal logits keep the lower id first: exactly the CPU's rank order.
//  3. sample_draw (one CTA per row): top-k cut, top-p cut on the cumulative weight in rank order,
//     inverse-CDF draw with u = sample::uniform(seed, position, 0) (sample/counter_rng.h, the
//     CPU sampler's own definition),
//     logprob of the token and the top-N (ids, logprobs), padded with -1 / -inf.
//
// Where a result can legitimately differ from the CPU: every weight and sum is double, as on the
// CPU, but summed in a different order (parallel reductions and a chunked block scan instead of
// one sequential loop; the CPU sums the candidate mass in id order when top-k is off, in rank
// order otherwise, and so does this op, just in a different association), and CUDA's exp may
// differ from the host's by an ulp. These differences are ~1e-16 relative, so a token can differ
// only when u * mass (or top_p * mass) lands within that distance of a cumulative-weight
// boundary. Within this op the top-p cut and the draw use bitwise the same prefix sums, so the
// draw always stays inside the kept prefix, as on the CPU.
//
// Invalid parameters cannot raise an error on the device (the CPU op throws); they are
// sanitised so every index stays in range: temperature < 0 or NaN samples greedily, top_p NaN or
// > 1 is "off" and top_p <= 0 keeps one token, num_logprobs is clamped to [0, max_logprobs].
// Rows with NaN or +inf logits, or no finite logit, give an unspecified (in-range) token.
#include <climits>
#include <cmath>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <string>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "sample/counter_rng.h"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 512;  // per row; also the chunk of the rank-order scans

// Per-row device pointers of a SamplingBatch.
struct RowParams {
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const int64_t* seed;
  const int32_t* position;
  const int32_t* num_logprobs;
};

struct RowStats {
  double max_logit;
  double log_norm;  // log(sum exp(x - max)) over the row
  double id_mass;   // candidate mass when top-k is off: sum of w(x) in id order
  int32_t argmax;
  int32_t pad;
};

// ---- the CPU sampler's exact definitions --------------------------------------------------------

// Ascending order of the key = logit descending (the high half of the CPU's rank_key).
__device__ __forceinline__ uint32_t rank_key(float x) {
  if (x == 0.0f) x = 0.0f;  // -0 and +0 tie and fall back to the id
  const uint32_t bits = __float_as_uint(x);
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return ~ascending;
}

// Weight of a logit: exp((x - max) / T) in double, exactly 0 for -inf (a masked token).
__device__ __forceinline__ double token_weight(float x, double max_logit, double temperature) {
  if (x == -INFINITY) return 0.0;
  return exp((static_cast<double>(x) - max_logit) / temperature);
}

// A row samples greedily at temperature 0 (and, sanitised, for < 0 or NaN).
__device__ __forceinline__ bool is_greedy(float temperature) {
  return !(temperature > 0.0f);
}

__device__ __forceinline__ int row_num_top(const RowParams& p, int64_t b, int cols, int vocab) {
  return min(max(p.num_logprobs[b], 0), min(cols, vocab));
}

// ---- 1. statistics and sort input ---------------------------------------------------------------

struct ArgMax {
  float value;
  int id;  // vocab = none
};

struct ArgMaxOp {
  __device__ __forceinline__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    return (a.value > b.value || (a.value == b.value && a.id < b.id)) ? a : b;
  }
};

__global__ void __launch_bounds__(kThreads)
    sample_prepare_kernel(const float* __restrict__ logits, int vocab, RowParams params, int cols,
                          RowStats* __restrict__ stats, uint32_t* __restrict__ keys,
                          int32_t* __restrict__ values, int* __restrict__ seg_begin,
                          int* __restrict__ seg_end) {
  enter_dependent_grid();
  using ArgMaxReduce = cub::BlockReduce<ArgMax, kThreads>;
  using SumReduce = cub::BlockReduce<double, kThreads>;
  __shared__ union {
    typename ArgMaxReduce::TempStorage argmax;
    typename SumReduce::TempStorage sum;
  } tmp;
  __shared__ ArgMax s_best;
  const int64_t b = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const float* row = logits + b * vocab;

  // Strictly greater keeps each thread's lowest id among equal maxima; the reduction breaks ties
  // by id, so the block's result is the lowest id of the maximum.
  ArgMax best{-INFINITY, vocab};
  for (int v = tid; v < vocab; v += kThreads) {
    const float x = row[v];
    if (x > best.value || (best.id == vocab && x == best.value)) best = ArgMax{x, v};
  }
  best = ArgMaxReduce(tmp.argmax).Reduce(best, ArgMaxOp{});
  if (tid == 0) s_best = best;
  __syncthreads();
  best = s_best;
  const int argmax = min(best.id, vocab - 1);  // a NaN row can leave "none"
  const double max_logit = row[argmax];

  const float temperature_f = params.temperature[b];
  const bool greedy = is_greedy(temperature_f);
  const double temperature = temperature_f;
  const bool top_k_on = params.top_k[b] > 0 && params.top_k[b] < vocab;
  const bool need_scaled = !greedy && !top_k_on && temperature != 1.0;
  double raw = 0.0, scaled = 0.0;
  for (int v = tid; v < vocab; v += kThreads) {
    const float x = row[v];
    raw += exp(static_cast<double>(x) - max_logit);
    if (need_scaled) scaled += token_weight(x, max_logit, temperature);
  }
  __syncthreads();  // tmp is reused
  raw = SumReduce(tmp.sum).Sum(raw);
  __syncthreads();
  scaled = SumReduce(tmp.sum).Sum(scaled);
  if (tid == 0) {
    RowStats st;
    st.max_logit = max_logit;
    st.log_norm = log(raw);
    st.id_mass = temperature == 1.0 ? raw : scaled;
    st.argmax = argmax;
    st.pad = 0;
    stats[b] = st;
  }

  const bool needs_order = !greedy || row_num_top(params, b, cols, vocab) > 0;
  const int first = static_cast<int>(b) * vocab;
  if (tid == 0) {
    seg_begin[b] = first;
    seg_end[b] = needs_order ? first + vocab : first;  // an empty segment is not sorted
  }
  if (needs_order) {
    for (int v = tid; v < vocab; v += kThreads) {
      keys[first + v] = rank_key(row[v]);
      values[first + v] = v;
    }
  }
}

// ---- 3. cut and draw ----------------------------------------------------------------------------

using BlockScanD = cub::BlockScan<double, kThreads>;

// One chunk of the rank-order prefix sum: returns carry + (weights of this chunk's ranks up to
// the thread's own, inclusive) and adds the chunk's total to carry. Every pass over the ranks calls
// this with the same inputs chunk by chunk, so equal ranks get bitwise equal cumulative sums.
__device__ __forceinline__ double chunk_cum(double w, double& carry,
                                            typename BlockScanD::TempStorage& tmp) {
  double incl = 0.0, total = 0.0;
  BlockScanD(tmp).InclusiveSum(w, incl, total);
  __syncthreads();  // tmp is reused by the next chunk
  const double cum = carry + incl;
  carry += total;
  return cum;
}

__global__ void __launch_bounds__(kThreads)
    sample_draw_kernel(const float* __restrict__ logits, int vocab, RowParams params, int cols,
                       const RowStats* __restrict__ stats, const int32_t* __restrict__ sorted_ids,
                       int32_t* __restrict__ tokens, float* __restrict__ logprobs,
                       int32_t* __restrict__ top_ids, float* __restrict__ top_logprobs) {
  enter_dependent_grid();
  __shared__ typename BlockScanD::TempStorage scan_tmp;
  __shared__ int s_first;
  __shared__ int s_last;
  __shared__ double s_cum;
  const int64_t b = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const float* row = logits + b * vocab;
  const int32_t* ranked = sorted_ids + b * vocab;  // ids in rank order (only if the row needs it)
  const RowStats st = stats[b];
  const float temperature_f = params.temperature[b];

  int token = st.argmax;
  if (!is_greedy(temperature_f)) {
    const double temperature = temperature_f;
    const int top_k = params.top_k[b];
    const bool top_k_on = top_k > 0 && top_k < vocab;
    const int num_candidates = top_k_on ? top_k : vocab;
    // Weight of this thread's rank in the chunk at `base` (0 past the candidates).
    auto rank_weight = [&](int base) {
      const int r = base + tid;
      return r < num_candidates ? token_weight(row[ranked[r]], st.max_logit, temperature) : 0.0;
    };

    // Candidates are ranks [0, num_candidates); their total weight is the top-p reference.
    double candidate_mass = st.id_mass;
    if (top_k_on) {
      double carry = 0.0;
      for (int base = 0; base < num_candidates; base += kThreads) {
        chunk_cum(rank_weight(base), carry, scan_tmp);
      }
      candidate_mass = carry;
    }

    int kept = num_candidates;
    double kept_mass = candidate_mass;
    const float top_p = params.top_p[b];
    if (top_p < 1.0f) {  // false for NaN: no filter
      // The smallest prefix whose cumulative weight reaches top_p * candidate_mass (all
      // candidates, with their full sum, if rounding keeps it just below).
      const double threshold = static_cast<double>(top_p) * candidate_mass;
      double carry = 0.0;
      kept_mass = 0.0;
      for (int base = 0; base < num_candidates; base += kThreads) {
        if (tid == 0) s_first = INT_MAX;
        const double w = rank_weight(base);
        const double cum = chunk_cum(w, carry, scan_tmp);  // also orders s_first's reset
        const int r = base + tid;
        if (r < num_candidates && cum >= threshold) atomicMin(&s_first, r);
        __syncthreads();
        const int first = s_first;
        if (first != INT_MAX) {
          if (r == first) s_cum = cum;
          __syncthreads();
          kept = first + 1;
          kept_mass = s_cum;
          break;
        }
        kept_mass = carry;
        __syncthreads();  // s_first is reset for the next chunk
      }
    }

    // Inverse CDF over the kept ranks: the first rank of positive weight whose cumulative weight
    // exceeds the target; rank 0 (weight 1) if rounding leaves none, as on the CPU, which falls
    // back to the last positive rank it visited.
    const double target =
        sample::uniform(static_cast<uint64_t>(params.seed[b]), params.position[b], 0) * kept_mass;
    double carry = 0.0;
    int pick = 0;
    for (int base = 0; base < kept; base += kThreads) {
      if (tid == 0) {
        s_first = INT_MAX;
        s_last = -1;
      }
      const double w = rank_weight(base);  // the same inputs as the top-p pass: equal sums
      const double cum = chunk_cum(w, carry, scan_tmp);
      const int r = base + tid;
      if (r < kept && w > 0.0) {
        atomicMax(&s_last, r);
        if (cum > target) atomicMin(&s_first, r);
      }
      __syncthreads();
      const int first = s_first;
      const int last = s_last;
      __syncthreads();  // before the next chunk resets them
      if (last >= 0) pick = last;
      if (first != INT_MAX) {
        pick = first;
        break;
      }
    }
    token = ranked[pick];
  }

  const double log_norm = st.log_norm;
  auto logprob = [&](int id) {
    return static_cast<float>(static_cast<double>(row[id]) - st.max_logit - log_norm);
  };
  if (tid == 0) {
    tokens[b] = token;
    logprobs[b] = logprob(token);
  }
  const int num_top = row_num_top(params, b, cols, vocab);
  for (int c = tid; c < cols; c += kThreads) {
    const bool has = c < num_top;
    const int id = has ? ranked[c] : -1;
    top_ids[b * cols + c] = id;
    top_logprobs[b * cols + c] = has ? logprob(id) : -INFINITY;
  }
}

}  // namespace

SampleResult CudaBackend::sample_impl(const Tensor& logits, const SamplingBatch& batch) {
  const char* op = "sample";
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  if (rows * vocab > INT_MAX) {  // the radix sort and the kernels index items with int
    fail(op, "logits " + logits.describe() + " has more than 2^31 - 1 elements");
  }

  const int cols = batch.max_logprobs;
  SampleResult out;
  out.tokens = empty({rows}, DType::kI32);
  out.logprobs = empty({rows}, DType::kF32);
  if (cols > 0) {
    out.top_ids = empty({rows, cols}, DType::kI32);
    out.top_logprobs = empty({rows, cols}, DType::kF32);
  }
  if (rows == 0) return out;

  const RowParams params{batch.temperature.data<float>(), batch.top_k.data<int32_t>(),
                         batch.top_p.data<float>(),       batch.seed.data<int64_t>(),
                         batch.position.data<int32_t>(),  batch.num_logprobs.data<int32_t>()};
  const int items = static_cast<int>(rows * vocab);
  const int v = static_cast<int>(vocab);
  cudaStream_t s = stream();

  Tensor stats = scratch(static_cast<size_t>(rows) * sizeof(RowStats));
  Tensor keys = empty({2, rows * vocab}, DType::kI32);  // u32 bits, two radix buffers
  Tensor ids = empty({2, rows * vocab}, DType::kI32);
  Tensor segments = empty({2, rows}, DType::kI32);  // begin, end
  auto* key_buf = static_cast<uint32_t*>(keys.raw_data());
  int32_t* id_buf = ids.data<int32_t>();
  int* seg_begin = segments.data<int32_t>();
  int* seg_end = seg_begin + rows;
  auto* row_stats = static_cast<RowStats*>(stats.raw_data());

  const dim3 grid(static_cast<unsigned>(rows));
  launch_programmatic(op, grid, dim3(kThreads), 0, s, pdl(), sample_prepare_kernel,
                      logits.data<float>(), v, params, cols, row_stats, key_buf, id_buf, seg_begin,
                      seg_end);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);

  // The temp-storage query is a host computation on the sizes (no launch, no sync).
  cub::DoubleBuffer<uint32_t> d_keys(key_buf, key_buf + items);
  cub::DoubleBuffer<int32_t> d_ids(id_buf, id_buf + items);
  size_t temp_bytes = 0;
  DEEPINFER_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(nullptr, temp_bytes, d_keys, d_ids,
                                                                items, static_cast<int>(rows),
                                                                seg_begin, seg_end, 0, 32, s));
  Tensor temp = scratch(std::max<size_t>(temp_bytes, 1));
  DEEPINFER_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(
      temp.raw_data(), temp_bytes, d_keys, d_ids, items, static_cast<int>(rows), seg_begin, seg_end,
      0, 32, s));

  launch_programmatic(op, grid, dim3(kThreads), 0, s, pdl(), sample_draw_kernel,
                      logits.data<float>(), v, params, cols, row_stats, d_ids.Current(),
                      out.tokens.data<int32_t>(), out.logprobs.data<float>(),
                      cols > 0 ? out.top_ids.data<int32_t>() : nullptr,
                      cols > 0 ? out.top_logprobs.data<float>() : nullptr);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

}  // namespace deepinfer::cuda
