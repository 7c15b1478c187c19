#include "model/v41_caches.h"

#include <algorithm>
#include <string>

#include "deepinfer/error.h"
#include "kv/cache_geometry.h"

namespace deepinfer {

V41Caches::V41Caches(const V41TextConfig& config, const CacheShape& shape, Backend& backend)
    : config_(config), shape_(shape) {
  if (shape.num_blocks < 1 || shape.num_state_slots < 1 || shape.block_size < 1 ||
      shape.max_backtrack < 1) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "V4.1 cache shape needs num_blocks, num_state_slots, block_size and "
        "max_backtrack >= 1 (got " +
            std::to_string(shape.num_blocks) + ", " + std::to_string(shape.num_state_slots) + ", " +
            std::to_string(shape.block_size) + ", " + std::to_string(shape.max_backtrack) + ")");
  }
  if (shape.kv_dtype != KvCacheDType::kF32) {
    throw Error(ErrorCode::kUnsupported,
                std::string("kv_cache_dtype \"") + kv_cache_dtype_name(shape.kv_dtype) +
                    "\" is not available for DeepSeek-V4.1 yet: its caches are f32 (V4.1's FP8 "
                    "SWA and FP4 compressed/index formats are not implemented)");
  }
  const int64_t slots = shape.num_state_slots + std::max(0, shape.num_scratch_slots);
  const int64_t d = config.head_dim;
  const int64_t di = config.index_head_dim;
  const int64_t f32 = 4;
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    LayerCaches c;
    c.rope_dim = config.rope_head_dim;
    const int64_t swa_len = kv::swa_ring_len(config.sliding_window, shape.max_backtrack);
    c.swa_ring = backend.zeros({slots, swa_len, d}, DType::kF32);
    bytes_per_slot_ += swa_len * d * f32;
    const int ratio = config.ratio(layer);
    if (config.is_kv_source(layer)) {
      const int64_t epb = kv::entries_per_block(ratio, shape.block_size);
      c.comp_entries = backend.zeros({shape.num_blocks * epb, d}, DType::kF32);
      bytes_per_block_ += epb * d * f32;
      if (ratio > 1) {  // C1 needs no ring: an entry is one token
        const int64_t ring_len = kv::compressor_ring_len(ratio, false, shape.max_backtrack);
        c.comp_ring = backend.zeros({slots, ring_len, 2 * d}, DType::kF32);
        bytes_per_slot_ += ring_len * 2 * d * f32;
      }
      if (config.is_index_k_source(layer)) {
        c.index_entries = backend.zeros({shape.num_blocks * epb, di}, DType::kF32);
        bytes_per_block_ += epb * di * f32;
      }
    }
    layers_.push_back(std::move(c));
  }
}

const Tensor& V41Caches::entries_for(int layer) const {
  return layers_.at(static_cast<size_t>(config_.kv_source.at(static_cast<size_t>(layer))))
      .comp_entries;
}

const Tensor& V41Caches::index_keys_for(int layer) const {
  return layers_.at(static_cast<size_t>(config_.index_k_source.at(static_cast<size_t>(layer))))
      .index_entries;
}

}  // namespace deepinfer
