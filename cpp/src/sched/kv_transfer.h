// KvTransfer: copies of paged KV blocks and state slots between the device caches and host bytes,
// the device side of the host and store tiers (sched/kv_tiers.h). The engine implements it over
// its executor's caches; the tiers only see bytes.
//
// Payload of one block: its KV for all layers (block_bytes()), optionally followed by a state
// snapshot (state_bytes()): the rings of a state slot right after the block.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "deepinfer/backend.h"
#include "kv/block_pool.h"

namespace deepinfer::sched {

class KvTransfer {
 public:
  virtual ~KvTransfer() = default;
  virtual int64_t block_bytes() const = 0;
  virtual int64_t state_bytes() const = 0;
  // KV bytes of one block per layer, in payload order (part of the store's fingerprint).
  virtual std::vector<uint64_t> block_bytes_per_layer() const = 0;

  // Enqueues copies of `block`'s KV into dst[0, block_bytes()) and, when `slot` >= 0, of that
  // state slot into the state_bytes() after it, behind every step launched so far (stream order;
  // no host sync). `keep_alive` owns dst's memory until the copies ran.
  virtual void export_block(kv::BlockId block, int32_t slot, std::span<uint8_t> dst,
                            const std::shared_ptr<const void>& keep_alive) = 0;
  // The host tier's arena of `bytes`, allocated once: memory the device copies from and to
  // directly (Backend::allocate_pinned_host). The default is ordinary memory.
  virtual HostBuffer allocate_host_arena(size_t bytes) { return HostBuffer::ordinary(bytes); }
  // Completes once everything enqueued so far (exports included) has run.
  virtual std::unique_ptr<Event> record_event() = 0;
  // Enqueue writes of host bytes into a block (block_bytes()) or a state slot (state_bytes());
  // the bytes may be reused as soon as the call returns. Steps launched later see them.
  virtual void import_block(kv::BlockId block, std::span<const uint8_t> src) = 0;
  virtual void import_state(int32_t slot, std::span<const uint8_t> src) = 0;
  // A finished fetch: payloads[i] into blocks[i], then the snapshot into `slot`; the step
  // launched next sees them. `keep_alive` owns the bytes (host tier blocks, store reads): a
  // backend that copies pinned bytes directly holds it until those copies ran, and the bytes are
  // never written while it lives. The default writes them whole, in stream order; the model
  // executor writes them layer by layer on the device's copy stream, and the next forward waits
  // for layer L's copies only before layer L (ModelCaches::import_layered).
  virtual void import_fetched(std::span<const kv::BlockId> blocks,
                              std::span<const std::span<const uint8_t>> payloads, int32_t slot,
                              std::span<const uint8_t> state,
                              const std::shared_ptr<const void>& keep_alive) {
    (void)keep_alive;  // import_block copies before it returns
    for (size_t i = 0; i < blocks.size(); ++i) import_block(blocks[i], payloads[i]);
    import_state(slot, state);
  }
};

}  // namespace deepinfer::sched
