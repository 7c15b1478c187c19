// KV block store and host tier throughput on the host:
//
//  1. put: blocks written synchronously by one thread (temp file, write, link), GB/s of payload.
//  2. writer: the same through KvStoreWriter (the engine thread only queues), GB/s end to end.
//  3. get: blocks read back with header, fingerprint, token and checksum verification, GB/s.
//     Warm page cache (the files were just written); cold reads need a cache drop, which needs
//     root, so they are not measured here.
//  4. match_prefix: metadata-only probe, microseconds per block (one stat each).
//  5. sweep: listing and stat of every file, milliseconds.
//  6. xxh64 alone and the host tier (insert copy, lookup) GB/s, for scale.
//
// A V4-Flash-shaped 128-token block is a few hundred KB of KV over all layers (default 600 KB).
//
// Usage: kv_store_bench [--dir PATH (default: a fresh temp dir, removed after)] [--block-kb 600]
//                       [--blocks 512] [--fsync 0|1]
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "common/xxh64.h"
#include "kv/host_block_cache.h"
#include "kv/kv_block_store.h"
#include "kv/kv_store_writer.h"
#include "kv/prefix_index.h"

namespace {

using namespace deepinfer;
using namespace deepinfer::kv;
using Clock = std::chrono::steady_clock;

const char* arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Removes the benchmark's own temp directory on every path out of main.
class OwnedDir {
 public:
  explicit OwnedDir(std::string path) : path_(std::move(path)) {}
  OwnedDir(const OwnedDir&) = delete;
  OwnedDir& operator=(const OwnedDir&) = delete;
  ~OwnedDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }

 private:
  std::string path_;
};

struct Blocks {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<BlockHash> hashes, parents;
  std::vector<uint8_t> payload;  // one payload shared by all blocks (content is irrelevant)

  Blocks(int n, size_t bytes, int32_t seed) : payload(bytes) {
    BlockHash parent = kRootHash;
    for (int b = 0; b < n; ++b) {
      std::vector<int32_t> t(128);
      for (int i = 0; i < 128; ++i) t[static_cast<size_t>(i)] = seed * 1000003 + b * 128 + i;
      hashes.push_back(chain_hash(parent, t));
      parents.push_back(parent);
      tokens.push_back(std::move(t));
      parent = hashes.back();
    }
    uint64_t x = 88172645463325252ULL;
    for (auto& v : payload) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      v = static_cast<uint8_t>(x);
    }
  }
  BlockKey key(size_t b) const { return {hashes[b], parents[b], tokens[b]}; }
};

}  // namespace

int main(int argc, char** argv) {
  const size_t block_bytes =
      std::strtoull(arg(argc, argv, "--block-kb", "600"), nullptr, 10) * 1000;
  const int n = std::atoi(arg(argc, argv, "--blocks", "512"));
  const bool fsync = std::atoi(arg(argc, argv, "--fsync", "0")) != 0;
  std::string dir = arg(argc, argv, "--dir", "");
  std::unique_ptr<OwnedDir> owned;
  if (dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kv_store_bench_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
    owned = std::make_unique<OwnedDir>(dir);
  }
  const double gb = static_cast<double>(block_bytes) * n / 1e9;
  std::printf("kv_store_bench: dir %s, %d blocks of %zu bytes (%.2f GB), fsync %s\n", dir.c_str(),
              n, block_bytes, gb, fsync ? "on" : "off");

  KvBlockStoreConfig config;
  config.root = dir;
  config.fsync = fsync;
  const auto fp = KvStoreFingerprint::from_layout({"bench", "fp8_e4m3", 128, {block_bytes}, ""});
  KvBlockStore store(config, fp,
                     [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });

  // 1. Synchronous put.
  const Blocks a(n, block_bytes, 1);
  auto t0 = Clock::now();
  for (size_t b = 0; b < a.hashes.size(); ++b) store.put(a.key(b), a.payload);
  double s = seconds_since(t0);
  std::printf("put      %8.2f GB/s  %8.1f us/block\n", gb / s, s * 1e6 / n);

  // 2. Through the async writer: submit cost on the caller, then throughput to the flush.
  const Blocks w(n, block_bytes, 2);
  {
    KvStoreWriterConfig wc;
    wc.max_queue_blocks = static_cast<size_t>(n);
    wc.max_queue_bytes = static_cast<uint64_t>(n) * block_bytes;
    KvStoreWriter writer(store, wc);
    auto shared = std::make_shared<const std::vector<uint8_t>>(w.payload);
    t0 = Clock::now();
    for (size_t b = 0; b < w.hashes.size(); ++b) {
      KvStoreWrite write;
      write.hash = w.hashes[b];
      write.parent = w.parents[b];
      write.tokens = w.tokens[b];
      write.payload = *shared;
      write.payload_owner = shared;
      writer.submit(std::move(write));
    }
    const double submit_s = seconds_since(t0);
    writer.flush();
    s = seconds_since(t0);
    std::printf("writer   %8.2f GB/s  submit %.2f us/block on the caller, dropped %llu\n", gb / s,
                submit_s * 1e6 / n, static_cast<unsigned long long>(writer.stats().dropped));
  }

  // 3. Verified get.
  t0 = Clock::now();
  size_t hits = 0;
  for (size_t b = 0; b < a.hashes.size(); ++b) hits += store.get(a.key(b)).has_value();
  s = seconds_since(t0);
  std::printf("get      %8.2f GB/s  %8.1f us/block (%zu/%d hits, warm page cache)\n", gb / s,
              s * 1e6 / n, hits, n);

  // 4. Metadata-only match.
  t0 = Clock::now();
  const int reps = 20;
  int matched = 0;
  for (int r = 0; r < reps; ++r) matched = store.match_prefix(a.hashes);
  s = seconds_since(t0);
  std::printf("match    %8.2f us/block (%d of %d blocks matched)\n", s * 1e6 / (reps * n), matched,
              n);

  // 5. Sweep of the whole store (nothing expired, no capacity bound).
  t0 = Clock::now();
  const SweepResult swept = store.sweep();
  s = seconds_since(t0);
  std::printf("sweep    %8.2f ms for %llu files (%.2f GB)\n", s * 1e3,
              static_cast<unsigned long long>(swept.files), static_cast<double>(swept.bytes) / 1e9);

  // 6. Checksum and host tier, for scale.
  t0 = Clock::now();
  uint64_t sink = 0;
  for (int b = 0; b < n; ++b)
    sink ^= xxh64(a.payload.data(), a.payload.size(), static_cast<uint64_t>(b));
  s = seconds_since(t0);
  std::printf("xxh64    %8.2f GB/s (%016llx)\n", gb / s, static_cast<unsigned long long>(sink));

  HostBlockCache host(static_cast<uint64_t>(n) * block_bytes);
  t0 = Clock::now();
  for (size_t b = 0; b < a.hashes.size(); ++b) host.insert(a.key(b), a.payload);
  s = seconds_since(t0);
  std::printf("host ins %8.2f GB/s (copy into aligned host memory)\n", gb / s);
  t0 = Clock::now();
  size_t host_hits = 0;
  for (size_t b = 0; b < a.hashes.size(); ++b) host_hits += host.lookup(a.key(b)) != nullptr;
  s = seconds_since(t0);
  std::printf("host get %8.2f us/block (%zu hits, no copy: a handle)\n", s * 1e6 / n, host_hits);

  const KvStoreStats st = store.stats();
  std::printf("store stats: written %.2f GB, read %.2f GB, fetch avg %.1f us max %.1f us\n",
              static_cast<double>(st.bytes_written) / 1e9, static_cast<double>(st.bytes_read) / 1e9,
              st.fetch_count ? static_cast<double>(st.fetch_ns_total) / st.fetch_count / 1e3 : 0.0,
              static_cast<double>(st.fetch_ns_max) / 1e3);
  return 0;
}
