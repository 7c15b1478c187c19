// KvBlockStore: full KV blocks as files in a directory on any POSIX path (local disk, NFS, a FUSE
// mount), shared by several engine processes and kept across restarts. Format and guarantees:
// docs/kv_store.md; the file layout: kv/kv_store_format.h.
//
//   <root>/<fingerprint hex>/<first 2 hex of hash>/<hash hex>.kvb
//
// Guarantees:
// - A reader sees a whole file or none: a block is written to a uniquely named temp file in its
//   final directory and linked (or renamed) into place. The first writer of a key wins; later
//   puts of that key leave the file alone.
// - get() never returns wrong KV: header and payload checksums, the fingerprint, the chain hash,
//   the parent hash and the block's tokens are all checked. A torn or corrupt file is a miss, is
//   removed and is reported through the log callback; a key mismatch (hash collision) is a miss.
// - File times carry the retention metadata, so match_prefix and sweep need only stat(): mtime is
//   the expiry time (set before the file is published) and atime the last access (set by put
//   and get through futimens). This keeps LRU state with the file itself, visible to every
//   process and surviving restarts, with no sidecar to keep consistent; times set explicitly
//   work on noatime mounts too. If a file system loses these times the block only looks expired
//   or old, which costs a miss, never wrong KV; the header's expiry is authoritative for get().
//
// Thread-safe: every method may be called from any thread; counters are atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/block_key.h"
#include "kv/kv_store_format.h"

namespace deepinfer::kv {

// Wall-clock time in unix milliseconds. Wall time, not steady time: expiry must mean the same
// to every process sharing the directory and survive restarts.
using KvStoreClock = std::function<int64_t()>;
int64_t system_clock_ms();

using KvStoreLog = std::function<void(const std::string& line)>;

struct KvBlockStoreConfig {
  std::string root;             // created if missing
  uint64_t capacity_bytes = 0;  // bound enforced by sweep() over the whole root; 0: unbounded
  std::chrono::seconds agent_ttl = std::chrono::hours(24 * 3);
  std::chrono::seconds chat_ttl = std::chrono::hours(24 * 7);
  // fdatasync each file and fsync its directory before put() returns: durability across power
  // loss. Off by default: a lost block is a miss, and the store is a cache.
  bool fsync = false;
  // Temp files older than this (by ctime) are a crashed writer's leftovers; sweep() removes them.
  std::chrono::seconds stale_temp_age = std::chrono::hours(1);
};

struct KvPutOptions {
  TrafficClass traffic_class = TrafficClass::kChat;
  std::optional<std::chrono::seconds> ttl;  // overrides the class default
  uint64_t state_bytes = 0;  // trailing bytes of the payload that are a state snapshot
};

struct KvStoreBlock {
  std::vector<uint8_t> payload;
  uint64_t state_bytes = 0;
  TrafficClass traffic_class = TrafficClass::kChat;
  int64_t expires_ms = 0;
};

enum class PutResult { kWritten, kAlreadyPresent, kFailed };

struct KvStoreStats {
  uint64_t bytes_written = 0;  // whole files published by this object
  uint64_t bytes_read = 0;     // whole files returned by get()
  uint64_t puts_written = 0;
  uint64_t puts_existing = 0;  // key already stored (possibly by another process)
  uint64_t put_failures = 0;   // I/O errors (logged)
  uint64_t hits = 0;
  uint64_t misses = 0;           // every get() that returned nullopt
  uint64_t corrupt_removed = 0;  // bad files removed by get()
  uint64_t key_mismatches = 0;   // a file for another (parent, tokens) under the same hash
  uint64_t expired_removed = 0;  // by get() or sweep()
  uint64_t evictions = 0;        // removed by sweep() for capacity
  uint64_t fetch_count = 0;      // get() calls that found a file, with their latency
  uint64_t fetch_ns_total = 0;
  uint64_t fetch_ns_max = 0;
  // As of the last sweep(), over the whole root, plus files published here since.
  uint64_t size_bytes = 0;
  uint64_t files = 0;
};

struct SweepResult {
  uint64_t files = 0;  // block files left
  uint64_t bytes = 0;  // their bytes
  uint64_t expired_removed = 0;
  uint64_t evicted = 0;
  uint64_t stale_temps_removed = 0;
};

class KvBlockStore {
 public:
  // Creates <root>/<fingerprint hex>/ and records the fingerprint's description there
  // (fingerprint.txt, for people). Throws Error(kIo) naming the path if that fails.
  KvBlockStore(KvBlockStoreConfig config, KvStoreFingerprint fingerprint, KvStoreLog log = {},
               KvStoreClock clock = system_clock_ms);
  KvBlockStore(const KvBlockStore&) = delete;
  KvBlockStore& operator=(const KvBlockStore&) = delete;

  // Publishes one block atomically. I/O failures are logged and returned, never thrown.
  PutResult put(const BlockKey& key, std::span<const uint8_t> payload,
                const KvPutOptions& options = {});
  // The block's payload, or nullopt (absent, expired, corrupt, or stored for another key).
  std::optional<KvStoreBlock> get(const BlockKey& key);
  // How many leading blocks of `hashes` are stored and unexpired, from metadata only (one stat
  // per block, no data read). Optimistic: a block counted here may still fail get()'s checks.
  int match_prefix(std::span<const BlockHash> hashes) const;
  // Like match_prefix, with the file size of each leading block (a caller tells a block carrying
  // a state snapshot by its size; get() still has the last word). Same cost: one stat per block.
  std::vector<uint64_t> match_prefix_sizes(std::span<const BlockHash> hashes) const;
  // Removes expired block files and stale temp files under the whole root (every fingerprint),
  // then evicts least recently accessed blocks until the total is within capacity_bytes.
  SweepResult sweep();

  KvStoreStats stats() const;
  const KvStoreFingerprint& fingerprint() const { return fingerprint_; }
  const KvBlockStoreConfig& config() const { return config_; }
  // Where the block with this hash lives (whether or not it exists).
  std::string block_path(BlockHash hash) const;

 private:
  std::chrono::seconds ttl_for(const KvPutOptions& options) const;
  void report(const std::string& line) const;
  // Unlinks `path` if it is still the file open as `fd` (a writer may have replaced it).
  bool remove_if_same(const std::string& path, int fd) const;
  std::string temp_path(const std::string& dir, BlockHash hash);

  KvBlockStoreConfig config_;
  KvStoreFingerprint fingerprint_;
  KvStoreLog log_;
  KvStoreClock clock_;
  std::string dir_;      // <root>/<fingerprint hex>
  uint64_t temp_nonce_;  // random per object: temp names stay unique across hosts
  std::atomic<uint64_t> temp_counter_{0};

  struct Counters {
    std::atomic<uint64_t> bytes_written{0}, bytes_read{0}, puts_written{0}, puts_existing{0},
        put_failures{0}, hits{0}, misses{0}, corrupt_removed{0}, key_mismatches{0},
        expired_removed{0}, evictions{0}, fetch_count{0}, fetch_ns_total{0}, fetch_ns_max{0},
        size_bytes{0}, files{0};
  };
  mutable Counters counters_;
};

}  // namespace deepinfer::kv
