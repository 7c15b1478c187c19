// KvTiers: the host-memory cache and the persistent store behind the GPU prefix cache
// (docs/kv_store.md#the-engine-and-the-tiers). Owned by the engine thread.
//
// Write-through: when the prefix cache attaches a state snapshot to a prompt's checkpoint block
// (PrefixCachePolicy::on_committed), the blocks up to it are exported: the copies are enqueued on
// the device stream behind the steps already launched, and once their event has completed (poll,
// never waiting) each block goes into the host tier and to the store writer's queue. The
// checkpoint block carries the snapshot in its payload (KvPutOptions::state_bytes), so a hit can
// resume there. Only committed, full blocks are ever written.
//
// Hits: at admission, when the GPU index serves less than the tiers could, `plan` matches the
// prompt's chain hashes against both tiers from metadata only (host map, store stat), picks the
// longest covered prefix whose last block carries a snapshot, and `fetch` reads those payloads
// (store -> host). The allocator then imports them into fresh blocks and the snapshot into a slot.
// A block that fails its checks (corrupt or truncated file, key mismatch) makes the whole fetch a
// miss: the request recomputes from the GPU hit.
//
// Known limit of this slice: the fetch reads the files on the engine thread inside admission
// (synchronous); fetching states and layer-wise overlap come later.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "deepinfer/backend.h"
#include "kv/cache_geometry.h"
#include "kv/host_block_cache.h"
#include "kv/kv_block_store.h"
#include "kv/kv_store_writer.h"
#include "sched/kv_transfer.h"
#include "sched/sequence.h"

namespace deepinfer::sched {

struct KvTiersConfig {
  uint64_t host_bytes = 0;  // 0: no host tier
  std::string store_path;   // "": no store
  uint64_t store_capacity_bytes = 0;
  kv::TrafficClass traffic_class = kv::TrafficClass::kChat;
  // Fingerprint fields (KvStoreFingerprint::Layout): which weights and config, the KV dtype, and
  // what the snapshot bytes mean.
  std::string model_identity;
  std::string kv_dtype;
  std::string state_layout;
  int block_size = kv::kBlockSize;
  std::chrono::milliseconds sweep_interval{std::chrono::minutes(5)};
};

struct KvTierCounters {
  // Hit tokens the tiers added to the GPU index's own hit, by tier: a fetched block counts for
  // the tier it came from; a block the GPU held but could not resume after (its snapshot was
  // gone) counts for the tier that supplied the snapshot.
  uint64_t host_hit_tokens = 0;
  uint64_t store_hit_tokens = 0;
  uint64_t store_bytes_read = 0;
  uint64_t store_bytes_written = 0;
  uint64_t blocks_exported = 0;  // blocks copied out of the device for write-through
  uint64_t fetch_failures = 0;   // planned tier hits that fell back to recompute
};

class KvTiers {
 public:
  // Throws Error(kIo) naming the store directory when it cannot be created.
  KvTiers(const KvTiersConfig& config, KvTransfer& transfer);
  KvTiers(const KvTiers&) = delete;
  KvTiers& operator=(const KvTiers&) = delete;
  // Publishes pending exports (waiting for their copies), then the writer drains its queue.
  ~KvTiers();

  enum class Tier : uint8_t { kHost, kStore };
  // A hit the tiers can serve: the prompt's blocks [0, num_blocks), of which [0, reuse) are held
  // by the GPU index and [reuse, num_blocks) come from `sources`; the state after block
  // num_blocks - 1 comes from `snapshot_source`.
  struct Plan {
    int num_blocks = 0;  // 0: no plan
    int reuse = 0;
    int gpu_hit = 0;  // what the GPU index served alone (blocks)
    std::vector<Tier> sources;
    Tier snapshot_source = Tier::kHost;
  };
  // From metadata only. `hashes`: the chain hashes of the prompt's blocks that a hit may cover;
  // `gpu_indexed`: how many of them the GPU index holds; `gpu_hit`: the GPU's own hit (blocks).
  // A plan is returned only when it serves more than gpu_hit blocks.
  Plan plan(std::span<const kv::BlockHash> hashes, int gpu_indexed, int gpu_hit) const;

  // The payloads a plan names, checked (sizes, keys, store checksums); they stay valid while this
  // object lives.
  struct Fetched {
    std::vector<std::span<const uint8_t>> blocks;  // KV of blocks [reuse, num_blocks)
    std::span<const uint8_t> state;                // snapshot after block num_blocks - 1
    std::vector<std::shared_ptr<const void>> owners;
  };
  // Reads the plan's blocks (a store block is also put into the host tier). nullopt, counted,
  // when any of them is missing or fails a check: the caller recomputes instead.
  std::optional<Fetched> fetch(const Sequence& seq, const Plan& plan);
  // Enqueues the fetched bytes into the device: blocks[i] into `blocks[i]`, the state into `slot`.
  void import(const Fetched& fetched, std::span<const kv::BlockId> blocks, int32_t slot);

  // Exports blocks [0, num_blocks) of `seq` (committed and full), the last one with the state
  // snapshot held by `snapshot_slot`; blocks the tiers already hold are skipped.
  void write_through(const Sequence& seq, int num_blocks, int32_t snapshot_slot);
  // Publishes the exports whose copies have completed, in order, without waiting.
  void poll();
  // Publishes every pending export (waiting for its copies) and waits for the store writer.
  void flush();

  KvTierCounters counters() const;
  bool has_host() const { return host_ != nullptr; }
  bool has_store() const { return store_ != nullptr; }

 private:
  struct ExportedBlock {
    kv::BlockHash hash = 0;
    kv::BlockHash parent = 0;
    std::vector<int32_t> tokens;
    std::shared_ptr<std::vector<uint8_t>> payload;
    uint64_t state_bytes = 0;
  };
  struct PendingExport {
    std::unique_ptr<Event> done;
    std::vector<ExportedBlock> blocks;
    kv::TrafficClass traffic_class = kv::TrafficClass::kChat;  // the request's retention
  };
  kv::BlockKey key_of(const Sequence& seq, int block) const;
  // Whether the tiers already hold the block well enough (with a snapshot when one is asked).
  // Store only: a damaged file under the key is removed (through get) and counts as not held.
  bool held(const kv::BlockKey& key, bool with_snapshot);
  void publish(PendingExport& pending);
  void touch_chain_head_last(const Sequence& seq, int num_blocks);
  uint64_t store_file_bytes(bool with_snapshot) const;

  KvTiersConfig config_;
  KvTransfer& transfer_;
  uint64_t kv_bytes_;
  uint64_t state_bytes_;
  std::unique_ptr<kv::HostBlockCache> host_;
  std::unique_ptr<kv::KvBlockStore> store_;
  std::unique_ptr<kv::KvStoreWriter> writer_;    // after store_: drains into it on destruction
  std::unique_ptr<kv::KvStoreSweeper> sweeper_;  // likewise
  std::deque<PendingExport> pending_;            // oldest first
  std::unordered_set<kv::BlockHash> pending_hashes_;
  KvTierCounters counters_;
};

}  // namespace deepinfer::sched
