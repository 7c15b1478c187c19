// The KV and state caches of the DeepSeek-V4.1 text model (f32; V4.1's own FP8/FP4 KV formats are
// a later step). Every layer has its sliding-window ring in the sequence's state slot. Only kv
// sources own compressed entries (paged, 128/m per block) and, for C2, the compressor ring of
// per-token [kv | gate] rows; only index-K sources own index keys. Share-KV readers and
// share-index layers hold none: they read their source's (V41Caches::entries_for / index_keys_for),
// so a reader aliases its source's cache and nothing is stored twice.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/v41_config.h"
#include "model/cache_tensors.h"

namespace deepinfer {

class V41Caches {
 public:
  V41Caches(const V41TextConfig& config, const CacheShape& shape, Backend& backend);

  const CacheShape& shape() const { return shape_; }
  // Layer `layer`'s own caches: swa_ring always; comp_ring (C2 kv sources), comp_entries (kv
  // sources), index_entries (index-K sources); the others undefined.
  LayerCaches& layer(int layer) { return layers_.at(static_cast<size_t>(layer)); }
  // The compressed entries a compressed layer attends to: its kv source's.
  const Tensor& entries_for(int layer) const;
  // The index keys an index source scores: its index-K source's.
  const Tensor& index_keys_for(int layer) const;

  int64_t bytes_per_block() const { return bytes_per_block_; }
  int64_t bytes_per_state_slot() const { return bytes_per_slot_; }

 private:
  const V41TextConfig& config_;
  CacheShape shape_;
  std::vector<LayerCaches> layers_;
  int64_t bytes_per_block_ = 0;
  int64_t bytes_per_slot_ = 0;
};

}  // namespace deepinfer
