// KvStoreWriter: writes full blocks to the store in the background (write-through), so the
// engine thread never waits on storage.
//
// submit() only queues: when the queue is full (blocks or bytes) the block is dropped and
// counted, because a block missing from a cache costs a recompute later while a blocked engine
// step costs every running request now. One worker thread drains the queue in order.
// The destructor stops accepting, writes what is queued, and joins.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "kv/kv_block_store.h"

namespace deepinfer::kv {

// One block to write. The payload is a view kept alive by `payload_owner`, so a host-tier
// buffer (or a pinned staging buffer) can be written without another copy.
struct KvStoreWrite {
  BlockHash hash = 0;
  BlockHash parent = 0;
  std::vector<int32_t> tokens;
  std::span<const uint8_t> payload;
  std::shared_ptr<const void> payload_owner;
  KvPutOptions options;

  // A write that owns its payload bytes.
  static KvStoreWrite owning(BlockHash hash, BlockHash parent, std::vector<int32_t> tokens,
                             std::vector<uint8_t> payload, KvPutOptions options = {});
  BlockKey key() const { return BlockKey{hash, parent, tokens}; }
};

struct KvStoreWriterConfig {
  size_t max_queue_blocks = 256;
  uint64_t max_queue_bytes = 1ULL << 30;  // payload bytes waiting to be written
};

struct KvStoreWriterStats {
  uint64_t submitted = 0;  // accepted into the queue
  uint64_t dropped = 0;    // refused: queue full or shutting down
  uint64_t written = 0;
  uint64_t already_present = 0;
  uint64_t failed = 0;  // put() failed (the store logged why) or threw
  uint64_t queued_blocks = 0;
  uint64_t queued_bytes = 0;
};

class KvStoreWriter {
 public:
  // Where a block goes; normally KvBlockStore::put. A function so tests can stand in a slow disk.
  using PutFn = std::function<PutResult(const KvStoreWrite&)>;

  explicit KvStoreWriter(KvBlockStore& store, KvStoreWriterConfig config = {});
  explicit KvStoreWriter(PutFn put, KvStoreWriterConfig config = {});
  KvStoreWriter(const KvStoreWriter&) = delete;
  KvStoreWriter& operator=(const KvStoreWriter&) = delete;
  ~KvStoreWriter();

  // Queues `write`; false (and counted as dropped) when the queue is full. Never blocks on I/O.
  bool submit(KvStoreWrite write);
  // Returns once every block accepted before the call has been written (or has failed).
  void flush();

  KvStoreWriterStats stats() const;

 private:
  void worker_loop();

  PutFn put_;
  KvStoreWriterConfig config_;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;  // the worker waits for blocks (or stop)
  std::condition_variable done_cv_;  // flush() waits for `completed_` to reach its ticket
  std::deque<KvStoreWrite> queue_;   // guarded by mutex_
  uint64_t queued_bytes_ = 0;        // guarded by mutex_
  uint64_t accepted_ = 0;            // guarded by mutex_; blocks ever accepted
  uint64_t completed_ = 0;           // guarded by mutex_; blocks taken and finished
  bool stop_ = false;                // guarded by mutex_
  KvStoreWriterStats stats_;         // guarded by mutex_ (queued_* filled in by stats())
  std::thread worker_;               // last: starts once everything above exists
};

// KvStoreSweeper: runs store.sweep() every `interval` on its own thread, so expiry and capacity
// eviction never run on the engine thread. Stops (and joins) in the destructor.
class KvStoreSweeper {
 public:
  KvStoreSweeper(KvBlockStore& store, std::chrono::milliseconds interval);
  KvStoreSweeper(const KvStoreSweeper&) = delete;
  KvStoreSweeper& operator=(const KvStoreSweeper&) = delete;
  ~KvStoreSweeper();

  uint64_t sweeps() const;

 private:
  KvBlockStore& store_;
  std::chrono::milliseconds interval_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;    // guarded by mutex_
  uint64_t sweeps_ = 0;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace deepinfer::kv
