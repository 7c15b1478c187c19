// Tile constants of the MoE kernels (docs/model.md#mixture-of-experts), shared by the kernels
// and their heuristics, and the device-built work list of the expert GEMMs.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// Largest expert count: group_pairs keeps two ints per expert in shared memory.
constexpr int kMaxExperts = 4096;
// Token rows per moe_experts pass: bounds the [pairs, I] and [pairs, H] intermediates (y is
// 400 MB at 4096 tokens, top-6, H = 4096). Every pass streams all the used experts' weights, so
// fewer, larger passes read them fewer times (a 4096-token prefill chunk is one pass).
constexpr int64_t kMaxPassTokens = 4096;

// Router logits: from kRouteGemmTokens tokens on, cuBLAS SGEMM; below, router_gemv_kernel with
// CTAs of kRouteThreads threads over (kE experts, kR tokens) tiles, the small tile while
// T <= kRouteSmallTokens (T = 1: one CTA per expert, every SM busy), the wider one above (each x
// row read from L2 by fewer CTAs).
constexpr int64_t kRouteGemmTokens = 64;
constexpr int64_t kRouteSmallTokens = 4;
constexpr int kRouteThreads = 256;
constexpr int kRouteSmallE = 1, kRouteSmallR = 4;
constexpr int kRouteWideE = 8, kRouteWideR = 4;
// Tokens per CTA of the top-k selection (one warp each).
constexpr int kSelectWarps = 4;
// Experts per lane held in registers by route_select_warp_kernel: E <= 32 * kSelectSlots.
constexpr int kSelectSlots = 8;
// Picks one lane of route_select_warp_kernel holds: top_k <= 32.
constexpr int kSelectMaxK = 32;

// Decode expert GEMMs (experts_gemv.cu).
constexpr int kExpertGemvRows = 4;        // pairs per tile
constexpr int kExpertGemvWarps = 4;       // warps per CTA
constexpr int kExpertGemvWeightRows = 4;  // weight rows one warp streams together

// Prefill expert GEMMs on CUDA cores (experts_tiled.cu).
constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileK = 32;
constexpr int kTileThreads = 256;

constexpr int kGroupThreads = 256;

// combine: hidden elements per thread (one float4), threads per CTA, slots loaded together.
constexpr int kCombineVec = 4;
constexpr int kCombineThreads = 128;
constexpr int kCombineSlots = 8;

// The device-built work list of the expert GEMMs (experts_group.cu writes it).
struct TileList {
  const int32_t* expert;  // [max_tiles] expert of the tile
  const int32_t* start;   // [max_tiles] first row of the tile in the expert-sorted pair order
  const int32_t* rows;    // [max_tiles] rows of the tile (1..tile_rows)
  const int32_t* count;   // [1] tiles written
};

}  // namespace deepinfer::cuda
