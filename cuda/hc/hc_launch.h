// The fused decode path of the mHC ops (hc_fused.cu) as the unfused ops (hc_pre.cu) call it: at
// decode sizes (hc_fused_grid: T <= 256, n <= 4) hc_pre, hc_head and hc_post_pre are one kernel
// each, hc_fused_kernel, a thread-block cluster per token group. DEEPINFER_HC_PRE chooses where
// (CudaBackend::hc_pre_choice; by default up to kHcFusedAutoMaxTokens tokens). Above, the
// unfused path's mix may be split over K (hc_mix.cu).
#pragma once

#include "cuda/common/smem_limits.h"
#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

class CudaBackend;

// The trunk update of hc_post_pre: trunk = hc_post(X, out, post, comb), which the fused kernel
// computes as it reads the trunk for the mix.
struct HcTrunkUpdate {
  const float* out;   // [T, hidden]
  const float* post;  // [T, n]
  const float* comb;  // [T, n, n]
  float* trunk;       // [T, n, hidden]
};

// The largest cluster of hc_fused_kernel the current device schedules: kHcFusedWideCluster (16,
// a non-portable size, allowed on the kernels here) where at least one such cluster fits
// (`limits`' max_active_clusters), kHcFusedPortableCluster otherwise; and for the wide size how
// many clusters are active at once (the fewest over the kernel's instantiations; 0 with the
// portable size, which hc_fused_cluster_for then keeps whatever the count). The device must have
// clusters (sm_90+).
HcFusedClusters hc_fused_max_cluster(KernelSmemLimits& limits);

// Whether the fused kernel takes a call on X [T, n, H] with weights fn: the backend's choice
// (hc_fused_chosen) at a decode size (hc_fused_grid) and 16-byte aligned rows (float4 loads).
bool hc_fused_applies(const CudaBackend& be, const Tensor& X, const Tensor& fn,
                      const HcParams& params);

// Launches hc_fused_kernel when hc_fused_applies (and y_norm's weight, where defined, is 16-byte
// aligned); false leaves the call to the unfused path. post / comb null: hc_head. update set
// (hc_post_pre): X is the trunk before hc_post. y_norm: y is written normed (RowNorm).
bool launch_hc_fused(CudaBackend& be, const Tensor& X, const Tensor& fn, const Tensor& base,
                     const Tensor& scale, const HcParams& params, float* post, float* comb,
                     float* y, const RowNorm& y_norm, const char* op,
                     const HcTrunkUpdate* update = nullptr);

// The unfused mix's K-split partial sums (hc_mix.cu): `partial` [splits, T, rows + 1] holds each
// token's dot products with fn's `rows` rows over a split's columns, then its sum of squares.
struct HcMixPartials {
  Tensor partial;
  int64_t splits = 0;  // 0: not launched
};

// Launches hc_mix_split_kernel for X [T, n, H] and fn [rows, n * H] where the backend's choice
// takes it (hc_mix_split_chosen) and X and fn are 16-byte aligned; else launches nothing and
// returns splits 0 (the mix is then rms_norm and cuBLAS's GEMM). update set (hc_post_pre; H a
// multiple of 4, out and trunk 16-byte aligned): X is the trunk before hc_post, and the kernel
// writes the updated trunk and mixes it.
HcMixPartials launch_hc_mix_split(CudaBackend& be, const Tensor& X, const Tensor& fn, int rows,
                                  const char* op, const HcTrunkUpdate* update = nullptr);

// hc_post_pre by the split mix (hc_mix.cu computing the trunk, update.trunk = trunk's memory,
// and mixing it) and hc_pre's finish kernel into mix's post, comb and y (y not normed), where
// launch_hc_mix_split takes it; false (nothing launched) leaves the call to hc_post then hc_pre.
bool hc_post_pre_split(CudaBackend& be, const Tensor& X, const Tensor& fn, const Tensor& base,
                       const Tensor& scale, const HcParams& params, const HcTrunkUpdate& update,
                       const Tensor& trunk, HcMix& mix);

}  // namespace deepinfer::cuda
