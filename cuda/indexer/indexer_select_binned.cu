// The indexer's binned selection, one wide block per token, for the latency case (a decode step of
// a few tokens): the same set and order as indexer_select.cu, in fewer passes over the row.
//  1. Load: the token's scores are read from global memory once, as order keys (a float's bits
//     mapped so that unsigned order is float order) into shared memory, and counted by their top
//     kBinnedBits bits into a histogram (one shared atomic per distinct bin of a warp).
//  2. Threshold bin: a block scan from the top bin finds the bin b holding the k-th largest key.
//  3. Collect: every key above bin b is a winner; the keys in bin b are candidates, kept as
//     (key, slot) pairs (the slot inverted below the key, so that the larger pair has the larger
//     score or, at equal scores, the lower slot: the tie rule). When bin b's keys are all taken
//     they are winners too.
//  4. Refine (only over the candidates): a radix select over the pairs' remaining 53 bits, 10 or
//     11 per pass, most significant first, until the bin reached is taken whole. Pairs are
//     distinct, so it ends by the last pass; ties on the score are resolved by the slot bits.
//  5. Sort of the k winners (32-pair chunks sorted in registers, then a winner's column counted
//     by binary searches over the chunks), and the outputs (the slots' entries).
// indexer_heuristics.h picks it where a row's keys and pairs fit the block's shared memory
// (binned_select_smem_bytes).
//
// A token of at most kRowSortMaxSlots slots (a decode step up to 4K tokens of context at ratio 4)
// sorts its whole row instead (IndexerSelectKernel::kRowSort, the default): one pair per thread,
// a bitonic network, descending. Its first k pairs are the k largest in descending order, the
// same slots in the same order as steps 1-5, in 15 block barriers (strides of 32 and more; the
// shorter ones are warp shuffles) whatever the scores, where steps 1-5 take more refinement
// passes the more scores share the threshold bin. In the model benchmark's B = 1 decode step
// (H100, 1,024 slots) the selection ended 9.5 us after the scores instead of 14.0 (12.5 against
// 17.0 us per call over three steps); on the op benchmark's random scores both take 9.7 us.
#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/indexer/indexer_launch.h"

namespace deepinfer::cuda {

namespace {

constexpr int kBins = 1 << kBinnedBits;
constexpr int kKeyShift = 32 - kBinnedBits;
// Bins a thread sums in a scan: the widest pass's bins over the block's threads.
constexpr int kBinsPerThread = kBins / kBinnedThreads;
static_assert(kBins % kBinnedThreads == 0);
constexpr int kLoads = 4;  // score loads per thread in flight

// misc[] words after the scan's 32 warp sums.
constexpr int kMiscBin = 32;        // the bin a scan found
constexpr int kMiscRemaining = 33;  // how many of that bin's keys are still to be taken
constexpr int kMiscWhole = 34;      // 1: that bin is taken whole
constexpr int kMiscWinners = 35;    // winners appended to buf
constexpr int kMiscCandidates = 36;
static_assert(kMiscCandidates < kBinnedMiscWords);

// The refine passes over the pairs' bits below the key's top kBinnedBits: 53 bits, widest first.
constexpr int kRefinePasses = 5;
__constant__ int kRefineShift[kRefinePasses] = {42, 32, 21, 10, 0};
__constant__ int kRefineWidth[kRefinePasses] = {11, 10, 11, 11, 10};
static_assert(64 - kBinnedBits == 53, "the refine passes cover the bits below the first pass");

__device__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ uint64_t pack_pair(uint32_t key, int64_t j) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(j));
}

// Adds one to hist[bin] for every lane whose bin is below `bins` (all lanes must call it): one
// atomic per distinct bin of the warp, since neighbouring scores often share their top bits.
__device__ __forceinline__ void warp_count(uint32_t* hist, int bin, int bins, int lane) {
  const unsigned peers = __match_any_sync(kFullMask, bin);
  if (bin < bins && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

// Appends v to list[] for every lane with `take` (all lanes must call it): one atomic on *count
// per warp.
__device__ __forceinline__ void warp_append(uint64_t* list, int* count, bool take, uint64_t v,
                                            int lane) {
  const unsigned taken = __ballot_sync(kFullMask, take);
  if (taken == 0) return;
  int first = 0;
  if (lane == 0) first = atomicAdd(count, __popc(taken));
  first = __shfl_sync(kFullMask, first, 0);
  if (take) list[first + __popc(taken & ((1u << lane) - 1u))] = v;
}

// Over hist[0, bins) with `remaining` (>= 1, at most the histogram's total) keys to take from the
// top bin down: writes the bin holding the last of them to misc[kMiscBin], how many of that bin's
// keys are taken to misc[kMiscRemaining], and whether that is all of them to misc[kMiscWhole].
// Every thread must call it; misc[] is valid after it returns.
__device__ void find_bin(const uint32_t* hist, int bins, int remaining, int* misc) {
  const int top = bins - 1 - kBinsPerThread * static_cast<int>(threadIdx.x);
  int local = 0;
#pragma unroll
  for (int q = 0; q < kBinsPerThread; ++q) {
    if (top - q >= 0) local += static_cast<int>(hist[top - q]);
  }
  const int before = block_exclusive_scan(local, misc);
  // Exactly one thread's bins reach `remaining`.
  if (before < remaining && before + local >= remaining) {
    int cum = before;
    for (int q = 0; q < kBinsPerThread; ++q) {
      const int c = static_cast<int>(hist[top - q]);
      if (cum + c >= remaining) {
        misc[kMiscBin] = top - q;
        misc[kMiscRemaining] = remaining - cum;
        misc[kMiscWhole] = c == remaining - cum;
        break;
      }
      cum += c;
    }
  }
  __syncthreads();
}

// The whole-row sort of one token of n <= sort_slots slots: out[0, k) the slots' entries of the
// k largest pairs, descending; out[k, top_k) -1. `exchange` holds 2 * sort_slots pairs: the
// network's strides of 32 and more go through it, alternating halves, so one barrier a stage
// suffices (a half is rewritten two such stages later, after every thread passed the barrier
// between). Every thread of the block must call it.
// `score`: this thread's slot's score (read where tid < n).
__device__ void select_by_row_sort(const SelectArgs& a, int g, int n, int k, float score,
                                   int32_t* out, uint64_t* exchange) {
  const int tid = static_cast<int>(threadIdx.x);
  int width = 32;  // the network's width: a power of two >= n, whole warps
  while (width < n) width <<= 1;
  const bool mine = tid < width;  // warp-uniform: width is a multiple of 32
  uint64_t v = tid < n ? pack_pair(order_key(score), tid) : 0;  // 0: below every pair
  int half = 0;
  for (int size = 2; size <= width; size <<= 1) {
    const bool descending = (tid & size) == 0;  // every thread at size == width
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      uint64_t other = 0;
      if (stride >= 32) {
        uint64_t* x = exchange + half * width;
        if (mine) x[tid] = v;
        __syncthreads();
        if (mine) other = x[tid ^ stride];
        half ^= 1;
      } else if (mine) {
        other = __shfl_xor_sync(kFullMask, v, stride);
      }
      const bool lower = (tid & stride) == 0;
      if (mine) v = (lower == descending) == (other > v) ? other : v;
    }
  }
  if (tid < k) {
    const auto slot = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(v));
    out[tid] = static_cast<int32_t>(slot_entry(a.list, g, slot));
  }
  for (int i = k + tid; i < a.top_k; i += kBinnedThreads) out[i] = -1;
}

// sort_slots: rows of at most this many slots take select_by_row_sort (0: none).
__global__ void __launch_bounds__(kBinnedThreads)
    indexer_select_binned_kernel(SelectArgs a, DeviceLayout l, int sort_slots) {
  enter_dependent_grid();
  extern __shared__ float4 smem4[];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int g = static_cast<int>(blockIdx.x);
  const int t = a.token0 + g;
  const int64_t cap32 = (a.cap + 31) / 32 * 32;
  uint64_t* buf = reinterpret_cast<uint64_t*>(smem4);          // [cap32]: the winners, then zeros
  uint64_t* cand = buf + cap32;                                // [row]: the threshold bin's pairs
  uint32_t* keys = reinterpret_cast<uint32_t*>(cand + a.row);  // [row]
  uint32_t* hist = keys + a.row;                               // [kBins]
  int* misc = reinterpret_cast<int*>(hist + kBins);            // [kBinnedMiscWords]

  // Where every token's row fits the whole-row sort, this thread's score is read before the
  // token's slot count is known: the two global round trips overlap (the scratch row is a.row
  // floats, so the read stays inside it).
  const float* sc = a.scores + static_cast<int64_t>(g) * a.row;
  const bool all_sorted = a.row <= sort_slots;
  const float early_score = all_sorted && tid < a.row ? sc[tid] : 0.0f;
  const int64_t n64 = select_slots(a, l, g);
  const int k = static_cast<int>(n64 < a.top_k ? n64 : a.top_k);
  const int n = static_cast<int>(n64);  // n <= row < 2^31 (binned_select_smem_bytes)
  int32_t* out = a.out + static_cast<int64_t>(t) * a.top_k;
  if (k == 0) {
    for (int i = tid; i < a.top_k; i += kBinnedThreads) out[i] = -1;
    return;
  }
  if (n <= sort_slots) {  // uniform over the block
    const float score = all_sorted ? early_score : tid < n ? sc[tid] : 0.0f;
    select_by_row_sort(a, g, n, k, score, out, buf);
    return;
  }
  const int k32 = (k + 31) / 32 * 32;
  for (int i = k + tid; i < k32; i += kBinnedThreads) buf[i] = 0;  // below every pair
  for (int b = tid; b < kBins; b += kBinnedThreads) hist[b] = 0;
  if (tid == 0) {
    misc[kMiscWinners] = 0;
    misc[kMiscCandidates] = 0;
  }
  __syncthreads();

  // 1. Load and count. The trip count is the block's, so that every lane takes part in
  //    __match_any_sync; kLoads loads per thread are in flight per step.
  const bool count = k < n;  // with k == n every key is taken
  for (int base = 0; base < n; base += kLoads * kBinnedThreads) {
    float v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = base + u * kBinnedThreads + tid;
      v[u] = i < n ? sc[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = base + u * kBinnedThreads + tid;
      int bin = kBins;  // none
      if (i < n) {
        const uint32_t key = order_key(v[u]);
        keys[i] = key;
        bin = static_cast<int>(key >> kKeyShift);
      }
      if (count) warp_count(hist, bin, kBins, lane);
    }
  }
  __syncthreads();

  // 2. The threshold bin: keys above it are winners; `remaining` of its own are still to take.
  int threshold_bin = -1;  // k == n: every key is a winner
  int remaining = 0;
  bool whole = true;
  if (count) {
    find_bin(hist, kBins, k, misc);
    threshold_bin = misc[kMiscBin];
    remaining = misc[kMiscRemaining];
    whole = misc[kMiscWhole] != 0;
  }

  // 3. Collect, in slot order over shared memory (no bank conflicts).
  const int lowest_winner_bin = whole ? threshold_bin : threshold_bin + 1;
  for (int base = 0; base < n; base += kBinnedThreads) {
    const int i = base + tid;
    uint64_t pair = 0;
    int bin = -2;  // none
    if (i < n) {
      const uint32_t key = keys[i];
      pair = pack_pair(key, i);
      bin = static_cast<int>(key >> kKeyShift);
    }
    warp_append(buf, &misc[kMiscWinners], bin >= lowest_winner_bin, pair, lane);
    if (!whole) warp_append(cand, &misc[kMiscCandidates], bin == threshold_bin, pair, lane);
  }
  __syncthreads();

  // 4. Refine over the c candidates: the `remaining` largest pairs are those >= `prefix` once
  //    the bin a pass reaches is taken whole.
  if (!whole) {
    const int c = misc[kMiscCandidates];
    uint64_t prefix = static_cast<uint64_t>(threshold_bin) << (64 - kBinnedBits);
    uint64_t mask = ~uint64_t{0} << (64 - kBinnedBits);
    for (int pass = 0; pass < kRefinePasses; ++pass) {
      const int shift = kRefineShift[pass];
      const int bins = 1 << kRefineWidth[pass];
      for (int b = tid; b < bins; b += kBinnedThreads) hist[b] = 0;
      __syncthreads();
      for (int base = 0; base < c; base += kBinnedThreads) {
        const int i = base + tid;
        int bin = bins;  // none
        if (i < c) {
          const uint64_t v = cand[i];
          if ((v & mask) == prefix) bin = static_cast<int>((v >> shift) & (bins - 1));
        }
        warp_count(hist, bin, bins, lane);
      }
      __syncthreads();
      find_bin(hist, bins, remaining, misc);
      prefix |= static_cast<uint64_t>(misc[kMiscBin]) << shift;
      mask |= static_cast<uint64_t>(bins - 1) << shift;
      remaining = misc[kMiscRemaining];
      // The next pass's barriers come before misc[] is rewritten; the last pass is always
      // whole (one distinct pair is left), so every thread leaves the loop at the same pass.
      if (misc[kMiscWhole] != 0) break;
    }
    for (int base = 0; base < c; base += kBinnedThreads) {
      const int i = base + tid;
      const uint64_t v = i < c ? cand[i] : 0;
      warp_append(buf, &misc[kMiscWinners], i < c && v >= prefix, v, lane);
    }
    __syncthreads();
  }

  // 5. Sort. buf holds the k distinct winners, then zeros (below every pair) up to k32.
  //  a. Every warp sorts 32-pair chunks of buf descending in registers (a bitonic network over
  //     the lanes).
  //  b. A winner's output column is the number of winners above it: the sum over the chunks of
  //     a branchless binary search (six probes) for how many of the chunk's pairs are above it.
  //     `per` threads (a power of two, up to 32, as many as the block has for every winner at
  //     once) share a winner, each over every per-th chunk, and add their counts by shuffles.
  const int chunks = k32 / 32;
  for (int chunk = tid >> 5; chunk < chunks; chunk += kBinnedThreads / 32) {
    uint64_t v = buf[chunk * 32 + lane];
    for (int size = 2; size <= 32; size <<= 1) {
      const bool descending = (lane & size) == 0;  // every lane at size 32
      for (int stride = size / 2; stride > 0; stride >>= 1) {
        const uint64_t other = __shfl_xor_sync(kFullMask, v, stride);
        const bool lower = (lane & stride) == 0;
        v = (lower == descending) == (other > v) ? other : v;
      }
    }
    buf[chunk * 32 + lane] = v;
  }
  __syncthreads();
  int per = 1;
  while (per < 32 && 2 * per * k32 <= kBinnedThreads) per *= 2;  // top 512: per = 2
  const int part = tid & (per - 1);
  for (int i0 = 0; i0 < k; i0 += kBinnedThreads / per) {
    const int i = i0 + tid / per;
    int rank = 0;
    uint64_t mine = 0;
    if (i < k) {
      mine = buf[i];
      for (int chunk = part; chunk < chunks; chunk += per) {
        const uint64_t* sorted = buf + chunk * 32;
        int above = 0;  // pairs of the chunk above mine: a prefix of it
#pragma unroll
        for (int step = 16; step > 0; step >>= 1) {
          if (sorted[above + step - 1] > mine) above += step;
        }
        if (sorted[above] > mine) ++above;  // above was 31: the whole chunk is above
        rank += above;
      }
    }
    for (int o = 1; o < per; o <<= 1) rank += __shfl_xor_sync(kFullMask, rank, o);
    if (i < k && part == 0) {
      const auto slot = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(mine));
      out[rank] = static_cast<int32_t>(slot_entry(a.list, g, slot));
    }
  }
  for (int i = k + tid; i < a.top_k; i += kBinnedThreads) out[i] = -1;
}

}  // namespace

void launch_indexer_select_binned(const SelectArgs& a, const DeviceLayout& l, int64_t n,
                                  size_t smem, bool row_sort, KernelSmemLimits& smem_limits,
                                  bool pdl, cudaStream_t stream) {
  // The widest sort whose exchange (two halves of 8-byte pairs) fits the block's shared memory
  // (kRowSortMaxSlots at V4's top 512 wherever a row can hold more than 512 slots:
  // binned_select_smem_bytes is then over 18 KB).
  int sort_slots = 0;
  for (int s = kRowSortMaxSlots; row_sort && s >= 32; s /= 2) {
    if (2 * sizeof(uint64_t) * static_cast<size_t>(s) <= smem) {
      sort_slots = s;
      break;
    }
  }
  smem_limits.allow(indexer_select_binned_kernel, smem);
  launch_programmatic("indexer select binned", dim3(static_cast<unsigned>(n)), dim3(kBinnedThreads),
                      smem, stream, pdl, indexer_select_binned_kernel, a, l, sort_slots);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer select binned");
}

}  // namespace deepinfer::cuda
