// rms_norm's kernel choice (rms_norm.cu): a warp, a block or a cluster of blocks per row, or
// the scalar fallback, from the row width, the alignment, the row count and the SM count.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

constexpr int kNormWarpThreads = 256;       // 8 rows per block
constexpr int64_t kNormWarpUnits = 32 * 8;  // 1024 floats
constexpr int kNormBlockVec = 8;            // float4s per thread in the block kernel
constexpr int kNormBlockMaxThreads = 512;   // so rows up to kNormBlockUnits
constexpr int64_t kNormBlockUnits = kNormBlockMaxThreads * kNormBlockVec;  // 16384 floats
constexpr int64_t kNormClusterUnits = 512;  // float4s per block of a cluster (target)
constexpr int kNormMaxCluster = 8;          // the portable cluster size limit

enum class RmsNormKernel {
  kWarp,     // rms_norm_warp_kernel<warp_vec>: rows of at most kNormWarpUnits float4s
  kCluster,  // rms_norm_block_kernel<true, true>: few long rows, a cluster of blocks per row
  kBlock,    // rms_norm_block_kernel<false, preload_weight>: one block per row
  kScalar,   // rms_norm_kernel: any row
};

struct RmsNormConfig {
  RmsNormKernel kernel;
  int warp_vec;         // kWarp: float4s per lane (1, 2, 4 or 8)
  int64_t cluster;      // kCluster: blocks per row
  int64_t per_block;    // kCluster: float4s per block
  unsigned threads;     // kCluster, kBlock: threads per block
  bool preload_weight;  // kBlock: load w with x (few rows)
};

// `vec`: the width is a multiple of 4 and x, y (and w) are 16-byte aligned.
inline RmsNormConfig choose_rms_norm(int64_t rows, int64_t dim, bool vec, int num_sms) {
  RmsNormConfig c{};
  const int64_t units = dim / 4;
  if (vec && units <= kNormWarpUnits) {
    c.kernel = RmsNormKernel::kWarp;
    c.warp_vec = units <= 32 ? 1 : units <= 64 ? 2 : units <= 128 ? 4 : 8;
  } else if (vec && units <= kNormBlockUnits) {
    // Few long rows would leave all but a few SMs idle and each row latency-bound on one SM:
    // split each over a cluster of 4 or 8 blocks of about kNormClusterUnits float4s.
    int64_t cluster = 1;
    while (cluster < kNormMaxCluster && cluster * kNormClusterUnits < units) cluster *= 2;
    if (units > 2 * kNormClusterUnits && rows * cluster <= num_sms) {
      c.kernel = RmsNormKernel::kCluster;
      c.cluster = cluster;
      c.per_block = (units + cluster - 1) / cluster;
      c.threads = static_cast<unsigned>(
          32 * ((c.per_block + 32 * kNormBlockVec - 1) / (32 * kNormBlockVec)));
    } else {
      c.kernel = RmsNormKernel::kBlock;
      c.threads =
          static_cast<unsigned>(32 * ((units + 32 * kNormBlockVec - 1) / (32 * kNormBlockVec)));
      c.preload_weight = rows <= num_sms;
    }
  } else {
    c.kernel = RmsNormKernel::kScalar;
  }
  return c;
}

}  // namespace deepinfer::cuda
