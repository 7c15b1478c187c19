#include "backend/cpu_gemm.h"

#include <algorithm>
#include <array>
#include <utility>

#include "backend/cpu_math.h"

namespace deepinfer::cpu {

namespace {

// Register tile: kMr rows of x times kNr rows of w, each pair with kLanes accumulators along K.
constexpr int kMr = 2;
constexpr int kNr = 4;
// Cache blocks: a K slice of kKc floats keeps a tile's rows in L1, and kMc rows of x in L2
// while the w tiles stream past them.
constexpr int64_t kKc = 512;
constexpr int64_t kMc = 64;

// y[i][j] (+)= sum over kc of x[i][.] * w[j][.] for an MR x NR tile. The per-element summation
// order depends only on kc, never on the tile's place, which is what makes results independent of
// how the matrix is split.
template <int MR, int NR>
void micro_kernel(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t kc, float* y,
                  int64_t ldy, bool accumulate) {
  float acc[MR][NR][kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= kc; k += kLanes) {
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; ++j) {
        for (int l = 0; l < kLanes; ++l) acc[i][j][l] += x[i * ldx + k + l] * w[j * ldw + k + l];
      }
    }
  }
  float tail[MR][NR] = {};
  for (; k < kc; ++k) {
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; ++j) tail[i][j] += x[i * ldx + k] * w[j * ldw + k];
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      const float s = reduce_lanes(acc[i][j]) + tail[i][j];
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + s : s;
    }
  }
}

using MicroKernel = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t,
                             bool);

template <int MR, int... NR>
constexpr auto kernel_row(std::integer_sequence<int, NR...>) {
  return std::array<MicroKernel, sizeof...(NR)>{&micro_kernel<MR, NR + 1>...};
}

template <int... MR>
constexpr auto kernel_table(std::integer_sequence<int, MR...>) {
  return std::array<std::array<MicroKernel, kNr>, sizeof...(MR)>{
      kernel_row<MR + 1>(std::make_integer_sequence<int, kNr>())...};
}

// kTable[mr - 1][nr - 1] handles a tile of mr <= kMr rows by nr <= kNr columns.
constexpr auto kTable = kernel_table(std::make_integer_sequence<int, kMr>());

// Rows [m0, m1) by columns [n0, n1) of y.
void gemm_block(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
                int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t k) {
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kc = std::min(kKc, k - k0);
    const bool accumulate = k0 > 0;
    for (int64_t mb = m0; mb < m1; mb += kMc) {
      const int64_t mb_end = std::min(m1, mb + kMc);
      for (int64_t j = n0; j < n1; j += kNr) {
        const int64_t nr = std::min<int64_t>(kNr, n1 - j);
        for (int64_t i = mb; i < mb_end; i += kMr) {
          const int64_t mr = std::min<int64_t>(kMr, mb_end - i);
          kTable[static_cast<size_t>(mr - 1)][static_cast<size_t>(nr - 1)](
              x + i * ldx + k0, ldx, w + j * ldw + k0, ldw, kc, y + i * ldy + j, ldy, accumulate);
        }
      }
    }
  }
}

}  // namespace

void gemm_nt(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
             int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + n, 0.0f);
    return;
  }
  // Chunks of at least ~64K multiply-adds keep the pool's overhead small.
  constexpr int64_t kMinWork = 1 << 16;
  if (n >= m) {
    const int64_t tiles = (n + kNr - 1) / kNr;
    const int64_t grain = std::max<int64_t>(1, kMinWork / (m * k * kNr));
    pool.parallel_for(
        tiles,
        [&](int64_t begin, int64_t end) {
          gemm_block(x, ldx, w, ldw, y, ldy, 0, m, begin * kNr, std::min(n, end * kNr), k);
        },
        grain);
  } else {
    const int64_t tiles = (m + kMr - 1) / kMr;
    const int64_t grain = std::max<int64_t>(1, kMinWork / (n * k * kMr));
    pool.parallel_for(
        tiles,
        [&](int64_t begin, int64_t end) {
          gemm_block(x, ldx, w, ldw, y, ldy, begin * kMr, std::min(m, end * kMr), 0, n, k);
        },
        grain);
  }
}

}  // namespace deepinfer::cpu
