// KvTiers: the host-memory cache and the persistent store behind the GPU prefix cache
// (docs/kv_store.md#the-engine-and-the-tiers). Owned by the engine thread, apart from the fetch
// pool's threads, which only read the store into buffers their fetch owns.
//
// Write-through: when the prefix cache attaches a state snapshot to a prompt's checkpoint block
// (PrefixCachePolicy::on_committed), the blocks up to it are exported: the copies are enqueued on
// the device stream behind the steps already launched, and once their event has completed (poll,
// never waiting) each block goes into the host tier and to the store writer's queue. The
// checkpoint block carries the snapshot in its payload (KvPutOptions::state_bytes), so a hit can
// resume there. Only committed, full blocks are ever written.
//
// Hits: at admission, when the GPU index serves less than the tiers could, `plan` matches the
// prompt's chain hashes against both tiers from metadata only (host map, store stat) and picks the
// longest covered prefix whose last block carries a snapshot. `start_fetch` takes the host
// blocks at once (memory) and queues the store blocks for the fetch pool, whose threads read the
// files while the engine keeps stepping; the request waits in the fetching state
// (SeqState::kFetching) holding the blocks and the slot the hit needs. `finish_fetch`, polled by
// the engine thread, hands over the payloads once every block is read; the allocator imports them
// into those blocks and the snapshot into the slot. A block that fails its checks (corrupt or
// truncated file, key mismatch) makes the whole fetch a miss: the request recomputes from the GPU
// hit. A cancelled fetch (its request aborted) is dropped: the pool's thread finishes into
// buffers the fetch owns and nobody reads them.
//
// Dedupe: while a fetch is under way, the chain hashes of the blocks it reads map to it
// (`fetch_reading`). A request whose plan would read any of them does not start a second fetch:
// the allocator has it wait, holding nothing, until that fetch is finished or cancelled; its next
// admission then takes the adopted blocks from the GPU index and fetches only what is left.
//
// Memory: the host tier's blocks live in one arena of host_bytes allocated once through
// KvTransfer::allocate_host_arena (pinned on CUDA). Write-through exports copy from the device
// straight into blocks carved from it (adopted by the tier when published, shared with the store
// writer), and imports copy from them straight to the device; a block's shared owner keeps its
// memory from being reused while such a copy or a store write still reads it.
//
// Import: the host -> device copy of a finished fetch goes through KvTransfer::import_fetched;
// the model executor issues it layer by layer on the device's copy stream, and the next forward
// waits for layer L's copies only before layer L (ModelCaches::import_layered).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
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
  int fetch_threads = 2;  // the fetch pool's threads (store reads); used only with a store
  // false (kv_window_state bounded_replay): blocks are stored without the state snapshot, so a
  // hit may end at any stored block; the fetch then carries no state and `import` zeroes the
  // slot (the request replays the window, KvAllocator::complete_fetch).
  bool window_state_exact = true;
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
  // The host tier's arena (kv_host_cache_bytes) when it is pinned memory; 0 when it is ordinary
  // memory (the CPU backend) or there is no host tier.
  uint64_t host_pinned_bytes = 0;
  // Fetches that read the store on the pool (finished, failed or not; cancelled ones excluded),
  // and their time from admission until the last block was read.
  uint64_t fetches = 0;
  double fetch_seconds_total = 0;
  double fetch_seconds_max = 0;
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

  // The payloads of a finished fetch, checked (sizes, keys, store checksums); they stay valid
  // while this object lives (`owners` hold them).
  struct Fetched {
    int reuse = 0;       // the plan's blocks [reuse, num_blocks) are in `blocks`
    int num_blocks = 0;  // the state is the snapshot after block num_blocks - 1
    std::vector<std::span<const uint8_t>> blocks;
    std::span<const uint8_t> state;
    std::vector<std::shared_ptr<const void>> owners;
  };
  using FetchId = uint64_t;  // 0: none
  // Starts reading the plan's blocks for `seq`: host blocks are taken now, store blocks are read
  // by the fetch pool. Never blocks on I/O.
  FetchId start_fetch(const Sequence& seq, const Plan& plan);
  enum class FetchState { kPending, kReady, kFailed };
  // Non-blocking. kReady: `out` holds the payloads (a store block also goes into the host tier,
  // and the hit is counted); kFailed: counted and logged, the caller recomputes. Either ends the
  // fetch. `seq` is the one the fetch was started for.
  FetchState finish_fetch(const Sequence& seq, FetchId id, Fetched& out);
  // Drops a fetch that has not finished (its request is gone); the pool skips or discards it.
  void cancel_fetch(FetchId id);
  // Fetches started and not yet finished or cancelled.
  int num_fetches() const { return static_cast<int>(fetches_.size()); }
  bool fetch_live(FetchId id) const { return fetches_.count(id) != 0; }
  // The fetch under way that reads any of the blocks with these chain hashes (0: none).
  FetchId fetch_reading(std::span<const kv::BlockHash> hashes) const;
  // Waits up to `timeout` for any fetch to become finishable (the engine has nothing else to do).
  void wait_for_fetch(std::chrono::microseconds timeout);
  // Test hook: while held, the pool starts no read, so fetches stay pending deterministically.
  void hold_fetches(bool hold);
  // Test hooks for planted faults and concurrency checks: `before_setup` runs at the start of
  // start_fetch (engine thread), `before_read` on a pool thread before each store block is read
  // (with the block's chain hash). Either may throw or block. Set them while no fetch is queued.
  struct FetchTestHooks {
    std::function<void()> before_setup;
    std::function<void(kv::BlockHash)> before_read;
  };
  void set_fetch_test_hooks(FetchTestHooks hooks);
  // Counts and logs a planned hit that failed outside a fetch's own reads (its setup threw, or
  // the import of its payloads did): the caller has released what it reserved and recomputes.
  void note_fetch_failure(int blocks, const std::string& why);
  // The fetch pool's threads (0 without a store).
  int fetch_pool_size() const { return static_cast<int>(pool_.size()); }
  // Enqueues the fetched bytes into the device: blocks[i] into `blocks[i]`, the state into `slot`.
  void import(const Fetched& fetched, std::span<const kv::BlockId> blocks, int32_t slot);

  // Exports blocks [0, num_blocks) of `seq` (committed and full), the last one with the state
  // snapshot held by `snapshot_slot` (-1 under bounded_replay, which stores none); blocks the
  // tiers already hold are skipped.
  void write_through(const Sequence& seq, int num_blocks, int32_t snapshot_slot);
  // Publishes the exports whose copies have completed, in order, without waiting.
  void poll();
  // Publishes every pending export (waiting for its copies) and waits for the store writer.
  void flush();

  KvTierCounters counters() const;
  bool has_host() const { return host_ != nullptr; }
  bool has_store() const { return store_ != nullptr; }
  bool window_state_exact() const { return config_.window_state_exact; }

 private:
  struct ExportedBlock {
    kv::BlockHash hash = 0;
    kv::BlockHash parent = 0;
    std::vector<int32_t> tokens;
    std::span<uint8_t> payload;            // in `owner`'s memory
    std::shared_ptr<const void> owner;     // `block`, or a vector when the arena had no room
    std::shared_ptr<kv::HostBlock> block;  // the host tier's block the export fills, if any
    uint64_t state_bytes = 0;
  };
  struct PendingExport {
    std::unique_ptr<Event> done;
    std::vector<ExportedBlock> blocks;
    kv::TrafficClass traffic_class = kv::TrafficClass::kChat;  // the request's retention
  };
  // One block a fetch reads; `bytes` points into `owner`. A store item is written by the pool's
  // thread and read by the engine thread only after the fetch is marked done (under mu_).
  struct FetchItem {
    int block = 0;
    Tier tier = Tier::kHost;
    bool with_state = false;
    kv::BlockHash hash = 0;
    kv::BlockHash parent = 0;
    std::vector<int32_t> tokens;
    std::shared_ptr<const void> owner;
    std::span<const uint8_t> bytes;
  };
  struct FetchJob {
    Plan plan;
    std::vector<FetchItem> items;
    std::chrono::steady_clock::time_point started;
    bool queued = false;  // read by the pool (else finished at start)
    // Guarded by mu_:
    bool done = false;
    bool cancelled = false;
    std::string failure;  // "": every item read
    std::chrono::steady_clock::time_point finished;
  };
  // Reads a store item and checks its payload; "" on success, else why not.
  std::string read_store(FetchItem& item);
  std::string take_host(FetchItem& item);
  void fetch_worker();
  void stop_fetch_pool();
  kv::BlockKey key_of(const Sequence& seq, int block) const;
  // Whether the tiers already hold the block well enough (with a snapshot when one is asked).
  // Store only: a damaged file under the key is removed (through get) and counts as not held.
  bool held(const kv::BlockKey& key, bool with_snapshot);
  void publish(PendingExport& pending);
  void touch_chain_head_last(const Sequence& seq, int num_blocks);
  // Drops a fetch from fetches_ and reading_ (engine thread).
  void forget_fetch(FetchId id, const FetchJob& job);
  uint64_t store_file_bytes(bool with_snapshot) const;

  KvTiersConfig config_;
  KvTransfer& transfer_;
  uint64_t kv_bytes_;
  uint64_t state_bytes_;  // of the snapshot the tiers store (0 in bounded_replay)
  std::unique_ptr<kv::HostBlockCache> host_;
  std::unique_ptr<kv::KvBlockStore> store_;
  std::unique_ptr<kv::KvStoreWriter> writer_;    // after store_: drains into it on destruction
  std::unique_ptr<kv::KvStoreSweeper> sweeper_;  // likewise
  std::deque<PendingExport> pending_;            // oldest first
  std::unordered_set<kv::BlockHash> pending_hashes_;
  KvTierCounters counters_;

  // Fetches (engine thread), and the pool's queue and flags (mu_).
  std::unordered_map<FetchId, std::shared_ptr<FetchJob>> fetches_;
  FetchId next_fetch_ = 1;
  std::unordered_map<kv::BlockHash, FetchId> reading_;  // a block's chain hash -> its fetch
  std::mutex mu_;
  std::condition_variable work_cv_;  // the pool waits for work (or stop, or release)
  std::condition_variable done_cv_;  // wait_for_fetch waits for a fetch to be done
  std::deque<std::shared_ptr<FetchJob>> queue_;
  bool stop_ = false;
  bool held_ = false;
  FetchTestHooks hooks_;           // before_read is copied under mu_ by the pool
  std::vector<std::thread> pool_;  // joined by the destructor before the store goes
};

}  // namespace deepinfer::sched
