// ModelCaches in the DeepSeek-V4.1 layout (docs/model.md#deepseek-v41-text-model): every layer has
// its SWA ring, only kv sources own compressed entries (and C2 sources the compressor ring), only
// index-K sources own index keys; readers own nothing, so a block's payload counts each source
// once.
#include <gtest/gtest.h>

#include <string>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "deepinfer/error.h"
#include "deepinfer/v41_config.h"
#include "model/cache_tensors.h"
#include "v41_config_fixtures.h"

namespace deepinfer {
namespace {

CacheShape small_shape() {
  CacheShape shape;
  shape.num_blocks = 3;
  shape.num_state_slots = 2;
  shape.max_backtrack = 6;
  return shape;
}

TEST(V41Caches, OnlySourcesOwnCompressedCaches) {
  // TINY_A: ratios 0 0 2 2 2 2 1 1 1 1, kv (and index-K) sources 2, 4, 6.
  const ModelConfig config = ModelConfig::from_json_text(v41_fixtures::kTinyA, "a.json");
  const V41TextConfig& v = *config.v41;
  auto backend = make_cpu_backend(1);
  ModelCaches caches(config, small_shape(), *backend);
  ASSERT_EQ(caches.num_layers(), v.num_hidden_layers);
  const int64_t d = v.head_dim;
  const int64_t di = v.index_head_dim;
  int64_t block_bytes = 0;
  for (int layer = 0; layer < v.num_hidden_layers; ++layer) {
    const LayerCaches& c = caches.layer(layer);
    SCOPED_TRACE("layer " + std::to_string(layer));
    EXPECT_EQ(c.swa_ring.shape(), (Shape{2, v.sliding_window + 6, d}));
    const bool source = v.is_kv_source(layer);
    EXPECT_EQ(c.comp_entries.defined(), source);
    EXPECT_EQ(c.index_entries.defined(), source);  // index-K sources are the kv sources
    EXPECT_EQ(c.comp_ring.defined(), source && v.ratio(layer) == 2);
    EXPECT_FALSE(c.index_ring.defined());
    if (!source) continue;
    const int64_t epb = 128 / v.ratio(layer);
    EXPECT_EQ(c.comp_entries.shape(), (Shape{3 * epb, d}));
    EXPECT_EQ(c.index_entries.shape(), (Shape{3 * epb, di}));
    block_bytes += epb * (d + di) * 4;
  }
  EXPECT_EQ(caches.bytes_per_block(), block_bytes);
  EXPECT_EQ(static_cast<int64_t>(caches.block_bytes_per_layer().size()), v.num_hidden_layers);
}

// kv_cache_dtype "fp8" on V4.1 means its shipped formats: FP8 SWA records (D + D/32 bytes), FP4
// main records (D/2 + D/16) and FP4 index records (Di/2 + ceil(Di/32)); the byte counts of a
// block and a slot follow (TINY_A: D 32, Di 16).
TEST(V41Caches, Fp8MeansTheShippedFormatsAndTheirSizes) {
  const ModelConfig config = ModelConfig::from_json_text(v41_fixtures::kTinyA, "a.json");
  const V41TextConfig& v = *config.v41;
  auto backend = make_cpu_backend(1);
  CacheShape shape = small_shape();
  shape.kv_dtype = KvCacheDType::kFp8;
  ModelCaches caches(config, shape, *backend);
  const int64_t d = v.head_dim;
  const int64_t di = v.index_head_dim;
  ASSERT_EQ(d, 32);
  ASSERT_EQ(di, 16);
  const int64_t swa_bytes = 32 + 1, entry_bytes = 16 + 2, index_bytes = 8 + 1;
  const int64_t ring = v.sliding_window + 6;
  int64_t block_bytes = 0, slot_bytes = 0;
  for (int layer = 0; layer < v.num_hidden_layers; ++layer) {
    const LayerCaches& c = caches.layer(layer);
    SCOPED_TRACE("layer " + std::to_string(layer));
    EXPECT_EQ(c.swa_ring.dtype(), DType::kF8E4M3);
    EXPECT_EQ(c.swa_ring.shape(), (Shape{2, ring, swa_bytes}));
    slot_bytes += ring * swa_bytes;
    if (!v.is_kv_source(layer)) continue;
    const int64_t epb = 128 / v.ratio(layer);
    EXPECT_EQ(c.comp_entries.dtype(), DType::kE2M1x2);
    EXPECT_EQ(c.comp_entries.shape(), (Shape{3 * epb, entry_bytes}));
    EXPECT_EQ(c.index_entries.dtype(), DType::kE2M1x2);
    EXPECT_EQ(c.index_entries.shape(), (Shape{3 * epb, index_bytes}));
    block_bytes += epb * (entry_bytes + index_bytes);
    if (v.ratio(layer) == 2) slot_bytes += c.comp_ring.nbytes() / 2;  // f32 compressor ring
  }
  EXPECT_EQ(caches.bytes_per_block(), block_bytes);
  EXPECT_EQ(caches.bytes_per_state_slot(), slot_bytes);
}

// bf16 stores every V4.1 cache as bf16 rows of D / Di.
TEST(V41Caches, Bf16StoresEveryCacheAsBf16) {
  const ModelConfig config = ModelConfig::from_json_text(v41_fixtures::kTinyB, "b.json");
  auto backend = make_cpu_backend(1);
  CacheShape shape = small_shape();
  shape.kv_dtype = KvCacheDType::kBF16;
  ModelCaches caches(config, shape, *backend);
  for (int layer = 0; layer < caches.num_layers(); ++layer) {
    const LayerCaches& c = caches.layer(layer);
    EXPECT_EQ(c.swa_ring.dtype(), DType::kBF16);
    if (c.comp_entries.defined()) {
      EXPECT_EQ(c.comp_entries.dtype(), DType::kBF16);
    }
    if (c.index_entries.defined()) {
      EXPECT_EQ(c.index_entries.dtype(), DType::kBF16);
    }
  }
}

}  // namespace
}  // namespace deepinfer
