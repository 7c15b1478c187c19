// The device tensors behind the KV and state caches of every layer
// (docs/model.md#kv-and-state-layout):
//  - per state slot: the sliding-window ring of post-RoPE K=V vectors, and for compressed layers
//    the ring of per-token [kv | gate] projections the compressor pools from;
//  - per paged block: the compressed entries (and CSA index keys) of every compressed layer.
// Which slot and which blocks a sequence uses is decided by the caller (engine or test).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "kv/cache_geometry.h"

namespace deepinfer {

struct CacheShape {
  int num_blocks = 0;
  int num_state_slots = 0;
  // Extra slots after the callers' ones, never named by a ForwardRow: the padding rows of a
  // fixed-shape graph batch write their (discarded) state there.
  int num_scratch_slots = 0;
  int block_size = kv::kBlockSize;
  int max_backtrack = 6;
};

struct LayerCaches {
  Tensor swa_ring;       // [slots, W + backtrack, D]
  Tensor comp_ring;      // [slots, Rc, 2C]   (compressed layers)
  Tensor comp_entries;   // [blocks * 128/m, D]
  Tensor index_ring;     // [slots, Rc, 4 Di] (CSA layers)
  Tensor index_entries;  // [blocks * 128/m, Di]
};

class ModelCaches {
 public:
  ModelCaches(const ModelConfig& config, const CacheShape& shape, Backend& backend);

  const CacheShape& shape() const { return shape_; }
  LayerCaches& layer(int index) { return layers_.at(static_cast<size_t>(index)); }
  // Copies whole state slots (every layer's rings), src -> dst, in stream order.
  void copy_state_slots(Backend& backend, const std::vector<std::pair<int32_t, int32_t>>& pairs);
  // Bytes one paged block and one state slot take across all layers (for capacity planning).
  int64_t bytes_per_block() const { return bytes_per_block_; }
  int64_t bytes_per_state_slot() const { return bytes_per_slot_; }

 private:
  CacheShape shape_;
  std::vector<LayerCaches> layers_;
  int64_t bytes_per_block_ = 0;
  int64_t bytes_per_slot_ = 0;
};

}  // namespace deepinfer
