// The device tensors behind the KV and state caches of every layer
// (docs/model.md#kv-and-state-layout):
//  - per state slot: the sliding-window ring of post-RoPE K=V vectors, and for compressed layers
//    the ring of per-token [kv | gate] projections the compressor pools from;
//  - per paged block: the compressed entries (and CSA index keys) of every compressed layer.
// Which slot and which blocks a sequence uses is decided by the caller (engine or test).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "kv/cache_geometry.h"

namespace deepinfer {

// How the KV caches store their rows (docs/model.md#kv-cache-dtypes): the SWA rings, the
// compressed entries and the CSA index keys. The compressor rings stay f32.
enum class KvCacheDType { kF32, kBF16, kFp8 };

const char* kv_cache_dtype_name(KvCacheDType dtype);  // "f32", "bf16", "fp8"
// The option kv_cache_dtype ("auto", "f32", "bf16", "fp8") on a backend of `device`: "auto" is
// f32 on the CPU reference, and on a device fp8 for a checkpoint with FP8 weights
// (`fp8_weights`), bf16 otherwise. An unknown name is Error(kInvalidArgument).
KvCacheDType resolve_kv_cache_dtype(const std::string& name, DeviceKind device,
                                    bool fp8_weights = false);
// Whether kv_cache_dtype "auto" takes fp8 on a device for `model` (resolve_kv_cache_dtype's
// fp8_weights; the engine and ModelInstance both ask here): for an FP8 V4 checkpoint (DeepSeek's
// records, as DeepSeek serves them) and for every V4.1 one (V4.1's shipped FP8 / FP4 formats, as
// DeepInfer stores them).
bool auto_kv_is_fp8(const ModelConfig& model);

// The tensor dtypes of DeepSeek-V4.1's caches for a kv_cache_dtype: "f32" and "bf16" store
// every cache so; "fp8" means V4.1's shipped formats (docs/model.md#kv-cache-dtypes): FP8 SWA
// keys (kF8E4M3 records, 528 B for D 512), FP4 compressed entries and FP4 index keys
// (kE2M1x2 records, 288 B and 68 B).
struct V41KvDTypes {
  DType swa;
  DType entries;
  DType index;
};
V41KvDTypes v41_kv_dtypes(KvCacheDType dtype);

struct CacheShape {
  int num_blocks = 0;
  int num_state_slots = 0;
  // Extra slots after the callers' ones, never named by a ForwardRow: the padding rows of a
  // fixed-shape graph batch write their (discarded) state there.
  int num_scratch_slots = 0;
  int block_size = kv::kBlockSize;
  int max_backtrack = 6;
  KvCacheDType kv_dtype = KvCacheDType::kF32;
};

struct LayerCaches {
  // Shapes for f32 caches; a bf16 cache has the same shape, a record cache (kU8, and V4.1's
  // kF8E4M3 / kE2M1x2) the record width (kv_record.h) in place of D / Di. The compressor rings
  // are always f32.
  Tensor swa_ring;       // [slots, W + backtrack, D]
  Tensor comp_ring;      // [slots, Rc, 2C]   (compressed layers)
  Tensor comp_entries;   // [blocks * 128/m, D]
  Tensor index_ring;     // [slots, Rc, 4 Di] (CSA layers)
  Tensor index_entries;  // [blocks * 128/m, Di]
  // The first MTP block only: the main model's HC trunk at the last `backtrack` positions
  // [slots, backtrack, hc_mult * H] f32. The engine runs the block one position behind the main
  // layers (position p reads the token at p + 1), so it reads the trunk of a chunk's first
  // position - 1 from here (ModelInstance::forward_with_mtp).
  Tensor trunk_ring;
  int rope_dim = 0;  // RoPE channels of swa_ring / comp_entries rows (selects their record)
  // False for DeepSeek-V4.1's YOCO consumer layers under prefill truncation: their SWA ring is
  // left out of state exports (KV tiers). A hit never reads it: it ends at least the keep count
  // before the prompt's end, and the prefill of that tail rewrites it (bounded replay).
  bool export_swa_ring = true;
};

class ModelCaches {
 public:
  // The caches of the main layers and of `num_mtp_layers` MTP blocks. For a DeepSeek-V4.1 config
  // (config.v41) the V4.1 layout instead (in v41_kv_dtypes(shape.kv_dtype)): an SWA ring per layer,
  // compressed entries (and the C2 compressor ring) only at kv sources, index keys only at index-K
  // sources; share-KV and share-index readers hold none and read their source's. There
  // `num_mtp_layers` DSpark blocks follow, with an SWA ring each.
  //
  // V4: the caches of the main layers and of `num_mtp_layers` MTP blocks (their own rings and
  // entries, in the same slots and blocks as the main layers': a sequence's drafter state lives
  // and is copied with its main state).
  ModelCaches(const ModelConfig& config, const CacheShape& shape, Backend& backend,
              int num_mtp_layers = 0);

  const CacheShape& shape() const { return shape_; }
  // Layer `index`: a main layer, or MTP block index - num_hidden_layers.
  LayerCaches& layer(int index) { return layers_.at(static_cast<size_t>(index)); }
  // Copies whole state slots (every layer's rings), src -> dst, in stream order.
  void copy_state_slots(Backend& backend, const std::vector<std::pair<int32_t, int32_t>>& pairs);
  // Bytes one paged block and one state slot take across all layers, in the caches' dtype (for
  // capacity planning).
  int64_t bytes_per_block() const { return bytes_per_block_; }
  int64_t bytes_per_state_slot() const { return bytes_per_slot_; }
  // Bytes of a state payload (export_state_slot): the slot without the rings not exported.
  int64_t bytes_per_state_export() const;
  // Bytes of one paged block per layer (0 for sliding-window layers), in payload order.
  const std::vector<int64_t>& block_bytes_per_layer() const { return block_layer_bytes_; }

  // Host copies of one paged block and of one state slot, for the host and store tiers
  // (docs/kv_store.md). Block payload: for each layer in order, the block's compressed entries
  // then its index keys (bytes_per_block() in all). State payload: for each layer, the slot's SWA
  // ring (unless !export_swa_ring), compressor ring, indexer ring and trunk ring
  // (bytes_per_state_export() in all). Raw cache
  // bytes in the caches' dtype, so an import restores exactly what was exported. export_*: enqueues
  // the copies into `dst` (exactly the payload's size) behind all work enqueued so far; `dst` holds
  // them once an event recorded afterwards completes, and `keep_alive` owns dst's memory until
  // then. No host sync.
  void export_block(Backend& backend, int32_t block, std::span<uint8_t> dst,
                    const std::shared_ptr<const void>& keep_alive) const;
  void export_state_slot(Backend& backend, int32_t slot, std::span<uint8_t> dst,
                         const std::shared_ptr<const void>& keep_alive) const;
  // import_*: enqueues writes of `src` (exactly the payload's size) into the block or slot; `src`
  // may be reused as soon as the call returns.
  void import_block(Backend& backend, int32_t block, std::span<const uint8_t> src);
  void import_state_slot(Backend& backend, int32_t slot, std::span<const uint8_t> src);

  // A KV tier hit, imported layer by layer on the backend's copy stream (Backend::begin_copies):
  // `payloads[i]` into `blocks[i]` and `state` into `slot` (payloads as above), the MTP blocks
  // first (their ring is read before the main layers run), then layer 0, 1, ...;
  // after each layer's copies of every block and of the slot an event is recorded on the copy
  // stream and kept as that layer's pending import. The forward waits for them layer by layer
  // (wait_layer); every other use of the caches on the compute stream waits for all of them
  // first (wait_all_imports). `layer_done`, when set, is called after each layer's event (tests).
  // Sizes are checked before anything is enqueued. With `keep_alive` (the owner of the payload
  // bytes, which must not be written while it lives) the copies read pinned bytes directly
  // (Backend::upload_pinned_into_on_copy_stream, which holds it until they ran); without it they
  // are staged, and the bytes may be reused as soon as this returns.
  void import_layered(Backend& backend, std::span<const int32_t> blocks,
                      std::span<const std::span<const uint8_t>> payloads, int32_t slot,
                      std::span<const uint8_t> state,
                      const std::function<void(int layer)>& layer_done = nullptr,
                      const std::shared_ptr<const void>& keep_alive = nullptr);
  // The compute stream waits (on the device) for layer `index`'s pending imports, which are
  // dropped: the forward calls it right before the layer reads its caches.
  void wait_layer(Backend& backend, int index);
  // The same for every layer (before a graph replay, a state copy or an export).
  void wait_all_imports(Backend& backend);
  int num_pending_imports() const;
  // Test hook: called by wait_layer for a layer with pending imports, before its waits.
  void set_import_wait_observer(std::function<void(int layer)> observer) {
    wait_observer_ = std::move(observer);
  }
  int num_layers() const { return static_cast<int>(layers_.size()); }

 private:
  CacheShape shape_;
  std::vector<LayerCaches> layers_;
  int64_t bytes_per_block_ = 0;
  int64_t bytes_per_slot_ = 0;
  std::vector<int64_t> block_layer_bytes_;
  int main_layers_ = 0;  // layers [main_layers_, num_layers()) are MTP blocks
  std::function<void(int layer)> wait_observer_;
  // Per layer, the copy-stream events of imports not yet waited for (import_layered).
  std::vector<std::vector<std::unique_ptr<Event>>> pending_imports_;

  void init_v41(const V41TextConfig& config, Backend& backend, int num_dspark);

  // The device views making up one block's / one slot's payload, in payload order.
  std::vector<Tensor> block_views(int32_t block) const;
  std::vector<Tensor> state_views(int32_t slot) const;
  // The same views of one layer (payload order within the layer).
  std::vector<Tensor> layer_block_views(int layer, int32_t block) const;
  std::vector<Tensor> layer_state_views(int layer, int32_t slot) const;
};

}  // namespace deepinfer
