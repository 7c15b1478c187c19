// The key-split Hopper attention kernel's block (sm90/attention_wgmma_keysplit.cu, whose head
// comment describes the roles and their synchronisation): its warpgroups and their register
// shares, the named barriers between the consumers, the shared-memory layout and its accessors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"

namespace deepinfer::cuda::attention_wgmma {

using KeySplitTiles = Tiles<true>;  // 128-byte swizzled tiles only

constexpr int kSplitThreads = 384;
constexpr int kSplitConsumers = 256;
constexpr int kSplitProducerThreads = 128;
constexpr int kSplitConsumerRegs = 208;
constexpr int kSplitProducerRegs = 88;
static_assert(2 * kSplitConsumerRegs + kSplitProducerRegs == 3 * 168,
              "setmaxnreg moves registers between the warpgroups, the total stays the block's");
constexpr int kStepKeys = 2 * kKeys;  // a step: a 64-key tile per consumer warpgroup

enum KeySplitBarrier : int {
  kQueryBarrier = 1,  // both consumers: q's tile stored
  kMax0 = 2,
  kMax1 = 3,
  kProbs0 = 4,
  kProbs1 = 5,
  kDoneBarrier = 6,  // both consumers past their last products, denominators exchanged
  kStageFirst = 7,   // + warpgroup: its rows staged (store_output_staged)
};

// Shared memory: q, the two key tiles, P0' and P1, the flags, the maxima and denominators
// exchanged, the block's rows' sinks, the mbarriers.
struct KeySplitLayout {
  static constexpr size_t kQBytes = size_t{kRows} * kDim * 2;
  static constexpr size_t kKbBytes = size_t{kKeys} * kDim * 2;
  static constexpr size_t kPBytes = size_t{kRows} * kKeys * 2;
  static constexpr size_t kQOff = 0;
  static constexpr size_t kKbOff = kQOff + kQBytes;  // tile b at kKbOff + b * kKbBytes
  static constexpr size_t kPOff = kKbOff + 2 * kKbBytes;
  static constexpr size_t kFlagsOff = kPOff + 2 * kPBytes;                 // int [2][kKeys]
  static constexpr size_t kMaxOff = kFlagsOff + 2 * kKeys * sizeof(int);   // float [2][kRows]
  static constexpr size_t kDenOff = kMaxOff + 2 * kRows * sizeof(float);   // float [2][kRows]
  static constexpr size_t kSinkOff = kDenOff + 2 * kRows * sizeof(float);  // float [kRows]
  static constexpr size_t kBarOff = kSinkOff + kRows * sizeof(float);
  // ready[2][2], free[2][2], flags[2]
  static constexpr int kBars = 10;
  static constexpr size_t kBytes = kBarOff + kBars * sizeof(uint64_t);
  static_assert(kKbOff % 1024 == 0 && kPOff % 1024 == 0 && kPBytes % 1024 == 0,
                "1 KB aligned tiles");
  static_assert(kFlagsOff % 8 == 0 && kBarOff % 8 == 0, "aligned flags and mbarriers");
  static_assert(kBytes <= 227 * 1024, "fits Hopper's opt-in shared memory per block");
};

// The layout's regions and mbarriers at a block's shared memory `base`.
struct KeySplitSmem {
  uint8_t* base;
  using L = KeySplitLayout;
  __device__ uint8_t* q() const { return base + L::kQOff; }
  __device__ uint8_t* kb(int b) const { return base + L::kKbOff + b * L::kKbBytes; }
  __device__ uint8_t* ps(int b) const { return base + L::kPOff + b * L::kPBytes; }
  __device__ int* flags() const { return reinterpret_cast<int*>(base + L::kFlagsOff); }
  __device__ float* maxes() const { return reinterpret_cast<float*>(base + L::kMaxOff); }
  __device__ float* dens() const { return reinterpret_cast<float*>(base + L::kDenOff); }
  __device__ float* sinks() const { return reinterpret_cast<float*>(base + L::kSinkOff); }
  __device__ uint64_t* bar(int i) const {
    return reinterpret_cast<uint64_t*>(base + L::kBarOff) + i;
  }
  // ready[b][h], free[b][h], flags[b]: L::kBars in all.
  __device__ uint64_t* ready_bar(int b, int h) const { return bar(2 * b + h); }
  __device__ uint64_t* free_bar(int b, int h) const { return bar(4 + 2 * b + h); }
  __device__ uint64_t* flags_bar(int b) const { return bar(8 + b); }
};

// The producer's share of a step: keys kr + 16 i (i < 4) of both tiles, channel chunks sub + 8 k
// of a half.
constexpr int kProducerKeys = 4;

}  // namespace deepinfer::cuda::attention_wgmma
