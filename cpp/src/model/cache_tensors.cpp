#include "model/cache_tensors.h"

#include <algorithm>

#include "deepinfer/error.h"
#include "deepinfer/v41_config.h"
#include "kv/cache_geometry.h"
#include "tensor/kv_record.h"

namespace deepinfer {

const char* kv_cache_dtype_name(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kF32:
      return "f32";
    case KvCacheDType::kBF16:
      return "bf16";
    case KvCacheDType::kFp8:
      return "fp8";
  }
  return "?";
}

bool auto_kv_is_fp8(const ModelConfig& model) {
  return model.quantization.fp8 || model.v41 != nullptr;
}

KvCacheDType resolve_kv_cache_dtype(const std::string& name, DeviceKind device, bool fp8_weights) {
  if (name == "auto") {
    // The CPU reference keeps f32 KV (the oracle); a device takes DeepSeek's fp8 records for an
    // FP8 checkpoint and bf16 otherwise.
    if (device == DeviceKind::kCpu) return KvCacheDType::kF32;
    return fp8_weights ? KvCacheDType::kFp8 : KvCacheDType::kBF16;
  }
  if (name == "f32") return KvCacheDType::kF32;
  if (name == "bf16") return KvCacheDType::kBF16;
  if (name == "fp8") return KvCacheDType::kFp8;
  throw Error(
      ErrorCode::kInvalidArgument,
      "kv_cache_dtype must be \"auto\", \"f32\", \"bf16\" or \"fp8\", got \"" + name + "\"");
}

V41KvDTypes v41_kv_dtypes(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kBF16:
      return {DType::kBF16, DType::kBF16, DType::kBF16};
    case KvCacheDType::kFp8:
      // V4.1's shipped formats (model.md C.1, D.3): FP8 SWA, FP4 compressed KV and index keys.
      return {DType::kF8E4M3, DType::kE2M1x2, DType::kE2M1x2};
    case KvCacheDType::kF32:
      break;
  }
  return {DType::kF32, DType::kF32, DType::kF32};
}

namespace {

// The tensor dtype of a KV cache of `dtype`.
DType storage_dtype(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kBF16:
      return DType::kBF16;
    case KvCacheDType::kFp8:
      return DType::kU8;
    case KvCacheDType::kF32:
      break;
  }
  return DType::kF32;
}

}  // namespace

ModelCaches::ModelCaches(const ModelConfig& config, const CacheShape& shape, Backend& backend,
                         int num_mtp_layers)
    : shape_(shape) {
  if (shape.num_blocks < 1 || shape.num_state_slots < 1 || shape.block_size < 1 ||
      shape.max_backtrack < 1) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "cache shape needs num_blocks, num_state_slots, block_size and max_backtrack >= 1 "
        "(got " +
            std::to_string(shape.num_blocks) + ", " + std::to_string(shape.num_state_slots) + ", " +
            std::to_string(shape.block_size) + ", " + std::to_string(shape.max_backtrack) + ")");
  }
  if (config.v41 != nullptr) {
    init_v41(*config.v41, backend, num_mtp_layers);
    return;
  }
  const int64_t slots = shape.num_state_slots + std::max(0, shape.num_scratch_slots);
  const int64_t d = config.head_dim;
  const int64_t di = config.index_head_dim;
  const int64_t f32 = 4;
  const DType kv = storage_dtype(shape.kv_dtype);
  if (!backend.supports_kv_cache_dtype(kv)) {
    throw Error(ErrorCode::kUnsupported,
                std::string("kv_cache_dtype \"") + kv_cache_dtype_name(shape.kv_dtype) +
                    "\" is not available on the " + backend.name() +
                    " backend yet: its KV kernels for bf16/fp8 caches are not built");
  }
  const int rope = config.rope_head_dim;
  // Bytes of one row of the main KV (swa ring, entries) and of one index key.
  const kv_record::RowCodec main{kv, d, rope};
  const kv_record::RowCodec index{kv, di, 0};
  main_layers_ = config.num_hidden_layers;
  for (int li = 0; li < config.num_hidden_layers + num_mtp_layers; ++li) {
    LayerCaches c;
    c.rope_dim = rope;
    const int64_t swa_len = kv::swa_ring_len(config.sliding_window, shape.max_backtrack);
    c.swa_ring = backend.zeros({slots, swa_len, main.row_width()}, kv);
    bytes_per_slot_ += swa_len * main.row_bytes();
    const AttentionKind kind = config.attention_kind(li);
    if (kind != AttentionKind::kSliding) {
      const int ratio = config.compress_rate(li);
      const bool csa = kind == AttentionKind::kCompressedSparse;
      const int64_t epb = kv::entries_per_block(ratio, shape.block_size);
      const int64_t ring_len = kv::compressor_ring_len(ratio, csa, shape.max_backtrack);
      const int64_t row = 2 * (csa ? 2 * d : d);
      c.comp_ring = backend.zeros({slots, ring_len, row}, DType::kF32);
      c.comp_entries = backend.zeros({shape.num_blocks * epb, main.row_width()}, kv);
      bytes_per_slot_ += ring_len * row * f32;
      bytes_per_block_ += epb * main.row_bytes();
      block_layer_bytes_.push_back(epb * main.row_bytes());
      if (csa) {
        c.index_ring = backend.zeros({slots, ring_len, 4 * di}, DType::kF32);
        c.index_entries = backend.zeros({shape.num_blocks * epb, index.row_width()}, kv);
        bytes_per_slot_ += ring_len * 4 * di * f32;
        bytes_per_block_ += epb * index.row_bytes();
        block_layer_bytes_.back() += epb * index.row_bytes();
      }
    } else {
      block_layer_bytes_.push_back(0);
    }
    if (li == config.num_hidden_layers) {
      const int64_t trunk = int64_t{config.hc_mult} * config.hidden_size;
      c.trunk_ring = backend.zeros({slots, shape.max_backtrack, trunk}, DType::kF32);
      bytes_per_slot_ += shape.max_backtrack * trunk * f32;
    }
    layers_.push_back(std::move(c));
  }
}

void ModelCaches::init_v41(const V41TextConfig& config, Backend& backend, int num_dspark) {
  const CacheShape& shape = shape_;
  const V41KvDTypes kv = v41_kv_dtypes(shape.kv_dtype);
  const char* name = kv_cache_dtype_name(shape.kv_dtype);
  for (const auto& [dtype, what] : {std::pair{kv.swa, "SWA keys"}, {kv.entries, "compressed KV"}}) {
    if (!backend.supports_kv_cache_dtype(dtype)) {
      throw Error(ErrorCode::kUnsupported, std::string("kv_cache_dtype \"") + name +
                                               "\" of DeepSeek-V4.1 stores its " + what + " as " +
                                               dtype_name(dtype) + " records, which the " +
                                               backend.name() + " backend cannot use yet");
    }
  }
  if (!backend.supports_index_cache_dtype(kv.index)) {
    throw Error(ErrorCode::kUnsupported,
                std::string("kv_cache_dtype \"") + name +
                    "\" of DeepSeek-V4.1 stores its index keys as " + dtype_name(kv.index) +
                    " records (FP4 e2m1 + UE8M0 per 32), which the " + backend.name() +
                    " backend's indexer cannot read yet; use kv_cache_dtype \"bf16\" or \"f32\"");
  }
  const int64_t slots = shape.num_state_slots + std::max(0, shape.num_scratch_slots);
  const int64_t d = config.head_dim;
  const int64_t di = config.index_head_dim;
  const int64_t f32 = 4;
  const int rope = config.rope_head_dim;
  // Bytes of one SWA key, one compressed entry and one index key (kv_record.h).
  const kv_record::RowCodec swa{kv.swa, d, rope};
  const kv_record::RowCodec entry{kv.entries, d, rope};
  const kv_record::RowCodec index{kv.index, di, 0};
  main_layers_ = config.num_hidden_layers;
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    LayerCaches c;
    c.rope_dim = rope;
    const int64_t swa_len = kv::swa_ring_len(config.sliding_window, shape.max_backtrack);
    c.swa_ring = backend.zeros({slots, swa_len, swa.row_width()}, kv.swa);
    bytes_per_slot_ += swa_len * swa.row_bytes();
    c.export_swa_ring =
        config.yoco_truncation == YocoTruncation::kOff || !config.is_yoco_consumer(layer);
    int64_t block_bytes = 0;
    // Only sources own compressed entries (and, for C2, the compressor ring) and index keys;
    // their readers read them (V4.1's share-KV and index-K sources, model.md C.3.7).
    if (config.is_kv_source(layer)) {
      const int ratio = config.ratio(layer);
      const int64_t epb = kv::entries_per_block(ratio, shape.block_size);
      c.comp_entries = backend.zeros({shape.num_blocks * epb, entry.row_width()}, kv.entries);
      block_bytes += epb * entry.row_bytes();
      if (ratio > 1) {  // C1 needs no ring: an entry is one token
        const int64_t ring_len = kv::compressor_ring_len(ratio, false, shape.max_backtrack);
        c.comp_ring = backend.zeros({slots, ring_len, 2 * d}, DType::kF32);
        bytes_per_slot_ += ring_len * 2 * d * f32;
      }
      if (config.is_index_k_source(layer)) {
        c.index_entries = backend.zeros({shape.num_blocks * epb, index.row_width()}, kv.index);
        block_bytes += epb * index.row_bytes();
      }
    }
    bytes_per_block_ += block_bytes;
    block_layer_bytes_.push_back(block_bytes);
    layers_.push_back(std::move(c));
  }
  // The DSpark blocks (layers num_hidden_layers + K): an SWA ring each, holding the main keys
  // and a draft block's keys (model.md D.3 "DSpark rings").
  for (int k = 0; k < num_dspark; ++k) {
    LayerCaches c;
    c.rope_dim = rope;
    const int64_t swa_len = kv::swa_ring_len(config.sliding_window, shape.max_backtrack);
    c.swa_ring = backend.zeros({slots, swa_len, swa.row_width()}, kv.swa);
    bytes_per_slot_ += swa_len * swa.row_bytes();
    block_layer_bytes_.push_back(0);
    layers_.push_back(std::move(c));
  }
}

void ModelCaches::copy_state_slots(Backend& backend,
                                   const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  if (pairs.empty()) return;
  // A slot the copy stream is still writing may be a source or a destination here.
  wait_all_imports(backend);
  std::vector<int32_t> src, dst;
  for (const auto& [s, d] : pairs) {
    if (s < 0 || s >= shape_.num_state_slots || d < 0 || d >= shape_.num_state_slots) {
      throw Error(ErrorCode::kInvalidArgument, "state slot copy " + std::to_string(s) + " -> " +
                                                   std::to_string(d) + " is outside [0, " +
                                                   std::to_string(shape_.num_state_slots) + ")");
    }
    src.push_back(s);
    dst.push_back(d);
  }
  const int64_t n = static_cast<int64_t>(src.size());
  Tensor src_t = backend.upload(Tensor::from_vector(src, {n}), DType::kI32);
  Tensor dst_t = backend.upload(Tensor::from_vector(dst, {n}), DType::kI32);
  for (LayerCaches& c : layers_) {
    for (const Tensor* t : {&c.swa_ring, &c.comp_ring, &c.index_ring, &c.trunk_ring}) {
      if (t->defined()) backend.copy_rows(*t, src_t, dst_t);
    }
  }
}

namespace {

// A host tensor of `like`'s dtype and shape over `bytes` (memory the caller owns; `keep_alive`
// holds it for as long as the tensor, and so an enqueued copy, lives).
Tensor host_view(const Tensor& like, void* bytes, const std::shared_ptr<const void>& keep_alive) {
  auto storage = Storage::borrow(bytes, like.nbytes(), Device{DeviceKind::kCpu, 0}, keep_alive);
  return Tensor(std::move(storage), like.dtype(), like.shape());
}

size_t payload_bytes(const std::vector<Tensor>& views) {
  size_t n = 0;
  for (const Tensor& t : views) n += t.nbytes();
  return n;
}

void check_payload_size(const char* what, size_t want, size_t got) {
  if (want != got) {
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": the payload has " +
                                                 std::to_string(got) + " bytes, the caches need " +
                                                 std::to_string(want));
  }
}

}  // namespace

std::vector<Tensor> ModelCaches::layer_block_views(int layer, int32_t block) const {
  if (block < 0 || block >= shape_.num_blocks) {
    throw Error(ErrorCode::kInvalidArgument, "KV block " + std::to_string(block) +
                                                 " is outside [0, " +
                                                 std::to_string(shape_.num_blocks) + ")");
  }
  const LayerCaches& c = layers_.at(static_cast<size_t>(layer));
  std::vector<Tensor> views;
  for (const Tensor* t : {&c.comp_entries, &c.index_entries}) {
    if (!t->defined()) continue;
    const int64_t epb = t->size(0) / shape_.num_blocks;
    views.push_back(t->narrow(0, block * epb, epb));
  }
  return views;
}

std::vector<Tensor> ModelCaches::layer_state_views(int layer, int32_t slot) const {
  if (slot < 0 || slot >= shape_.num_state_slots) {
    throw Error(ErrorCode::kInvalidArgument, "state slot " + std::to_string(slot) +
                                                 " is outside [0, " +
                                                 std::to_string(shape_.num_state_slots) + ")");
  }
  const LayerCaches& c = layers_.at(static_cast<size_t>(layer));
  std::vector<Tensor> views;
  for (const Tensor* t : {&c.swa_ring, &c.comp_ring, &c.index_ring, &c.trunk_ring}) {
    if (t == &c.swa_ring && !c.export_swa_ring) continue;
    if (t->defined()) views.push_back(t->narrow(0, slot, 1));
  }
  return views;
}

std::vector<Tensor> ModelCaches::block_views(int32_t block) const {
  std::vector<Tensor> views;
  for (int li = 0; li < num_layers(); ++li) {
    std::vector<Tensor> layer = layer_block_views(li, block);
    views.insert(views.end(), layer.begin(), layer.end());
  }
  return views;
}

std::vector<Tensor> ModelCaches::state_views(int32_t slot) const {
  std::vector<Tensor> views;
  for (int li = 0; li < num_layers(); ++li) {
    std::vector<Tensor> layer = layer_state_views(li, slot);
    views.insert(views.end(), layer.begin(), layer.end());
  }
  return views;
}

namespace {

void export_views(Backend& backend, const std::vector<Tensor>& views, std::span<uint8_t> dst,
                  const std::shared_ptr<const void>& keep_alive, const char* what) {
  check_payload_size(what, payload_bytes(views), dst.size());
  size_t offset = 0;
  for (const Tensor& v : views) {
    backend.copy_to_host(v, host_view(v, dst.data() + offset, keep_alive));
    offset += v.nbytes();
  }
}

void import_views(Backend& backend, const std::vector<Tensor>& views, std::span<const uint8_t> src,
                  const char* what) {
  check_payload_size(what, payload_bytes(views), src.size());
  size_t offset = 0;
  for (const Tensor& v : views) {
    // upload_into copies `src` before it returns, so borrowing it without an owner is safe.
    backend.upload_into(v, host_view(v, const_cast<uint8_t*>(src.data() + offset), nullptr));
    offset += v.nbytes();
  }
}

}  // namespace

void ModelCaches::export_block(Backend& backend, int32_t block, std::span<uint8_t> dst,
                               const std::shared_ptr<const void>& keep_alive) const {
  export_views(backend, block_views(block), dst, keep_alive, "export of a KV block");
}

int64_t ModelCaches::bytes_per_state_export() const {
  return static_cast<int64_t>(payload_bytes(state_views(0)));
}

void ModelCaches::export_state_slot(Backend& backend, int32_t slot, std::span<uint8_t> dst,
                                    const std::shared_ptr<const void>& keep_alive) const {
  export_views(backend, state_views(slot), dst, keep_alive, "export of a state slot");
}

void ModelCaches::import_block(Backend& backend, int32_t block, std::span<const uint8_t> src) {
  import_views(backend, block_views(block), src, "import of a KV block");
}

void ModelCaches::import_state_slot(Backend& backend, int32_t slot, std::span<const uint8_t> src) {
  import_views(backend, state_views(slot), src, "import of a state slot");
}

void ModelCaches::import_layered(Backend& backend, std::span<const int32_t> blocks,
                                 std::span<const std::span<const uint8_t>> payloads, int32_t slot,
                                 std::span<const uint8_t> state,
                                 const std::function<void(int layer)>& layer_done,
                                 const std::shared_ptr<const void>& keep_alive) {
  if (blocks.size() != payloads.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "layered import of " + std::to_string(payloads.size()) + " block payloads into " +
                    std::to_string(blocks.size()) + " blocks");
  }
  // Every index and size is checked before the first copy, so a bad argument enqueues nothing.
  for (size_t i = 0; i < blocks.size(); ++i) {
    check_payload_size("import of a KV block", payload_bytes(block_views(blocks[i])),
                       payloads[i].size());
  }
  check_payload_size("import of a state slot", payload_bytes(state_views(slot)), state.size());
  pending_imports_.resize(layers_.size());
  // Payloads are layer-major: layer L's bytes follow layers 0..L-1's in each payload.
  const int n = num_layers();
  std::vector<size_t> block_off(static_cast<size_t>(n) + 1, 0), state_off(block_off);
  for (int li = 0; li < n; ++li) {
    const auto i = static_cast<size_t>(li);
    block_off[i + 1] =
        block_off[i] + (blocks.empty() ? 0 : payload_bytes(layer_block_views(li, blocks[0])));
    state_off[i + 1] = state_off[i] + payload_bytes(layer_state_views(li, slot));
  }
  // A layer's views of every block and of the slot, with their host bytes, go up together.
  std::vector<Tensor> dsts, srcs;
  auto add_all = [&](const std::vector<Tensor>& views, const uint8_t* bytes) {
    for (const Tensor& v : views) {
      dsts.push_back(v);
      srcs.push_back(host_view(v, const_cast<uint8_t*>(bytes), keep_alive));
      bytes += v.nbytes();
    }
  };
  auto upload_layer = [&] {
    if (keep_alive) {
      // Read in place when pinned, in one batch; the backend holds `keep_alive` until the copies
      // ran.
      backend.upload_pinned_batch_on_copy_stream(dsts, srcs);
    } else {
      // upload_into_on_copy_stream copies the bytes before it returns: no owner needed.
      for (size_t k = 0; k < dsts.size(); ++k) backend.upload_into_on_copy_stream(dsts[k], srcs[k]);
    }
    dsts.clear();
    srcs.clear();
  };
  // The MTP blocks go first: forward_with_mtp reads their trunk ring before the main layers run,
  // so waiting for them must not mean waiting for every main layer's copies too.
  std::vector<int> order;
  for (int li = main_layers_; li < n; ++li) order.push_back(li);
  for (int li = 0; li < std::min(main_layers_, n); ++li) order.push_back(li);
  backend.begin_copies();
  for (int li : order) {
    const auto i = static_cast<size_t>(li);
    for (size_t k = 0; k < blocks.size(); ++k)
      add_all(layer_block_views(li, blocks[k]), payloads[k].data() + block_off[i]);
    add_all(layer_state_views(li, slot), state.data() + state_off[i]);
    upload_layer();
    pending_imports_[i].push_back(backend.record_copy_event());
    if (layer_done) layer_done(li);
  }
}

void ModelCaches::wait_layer(Backend& backend, int index) {
  if (static_cast<size_t>(index) >= pending_imports_.size()) return;
  std::vector<std::unique_ptr<Event>>& events = pending_imports_[static_cast<size_t>(index)];
  if (!events.empty() && wait_observer_) wait_observer_(index);
  for (const std::unique_ptr<Event>& e : events) backend.wait_event(*e);
  events.clear();
}

void ModelCaches::wait_all_imports(Backend& backend) {
  for (int li = 0; li < static_cast<int>(pending_imports_.size()); ++li) wait_layer(backend, li);
}

int ModelCaches::num_pending_imports() const {
  int n = 0;
  for (const auto& events : pending_imports_) n += static_cast<int>(events.size());
  return n;
}

}  // namespace deepinfer
