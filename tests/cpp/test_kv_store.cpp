// The persistent KV block store: file format and checksum, round trip and restart, every kind of
// bad file (truncated, flipped byte, foreign fingerprint) as a logged miss that removes the file,
// writers sharing a directory from threads and from another process, TTL expiry per traffic
// class, LRU capacity eviction, metadata-only prefix match, and the async writer's queue.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/xxh64.h"
#include "deepinfer/error.h"
#include "kv/kv_block_store.h"
#include "kv/kv_store_format.h"
#include "kv/kv_store_writer.h"
#include "kv/prefix_index.h"
#include "temp_dir.h"

namespace deepinfer::kv {
namespace {

namespace fs = std::filesystem;
using std::chrono::hours;
using std::chrono::milliseconds;

constexpr int kTokens = 128;
constexpr int64_t kDayMs = 24LL * 3600 * 1000;
constexpr int64_t kStartMs = 1'700'000'000'000;  // a fixed wall-clock instant

// A chain of `n` blocks: tokens, hashes and parents as the GPU prefix index computes them.
struct Chain {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<BlockHash> hashes;
  std::vector<BlockHash> parents;

  explicit Chain(int n, int32_t seed = 1) {
    BlockHash parent = kRootHash;
    for (int b = 0; b < n; ++b) {
      std::vector<int32_t> t(kTokens);
      for (int i = 0; i < kTokens; ++i) t[static_cast<size_t>(i)] = seed * 100003 + b * 997 + i;
      const BlockHash h = chain_hash(parent, t);
      tokens.push_back(std::move(t));
      hashes.push_back(h);
      parents.push_back(parent);
      parent = h;
    }
  }
  BlockKey key(int b) const {
    const auto i = static_cast<size_t>(b);
    return BlockKey{hashes[i], parents[i], tokens[i]};
  }
};

// Deterministic payload bytes for a key (and a writer id, for racing writers).
std::vector<uint8_t> payload_for(BlockHash hash, size_t bytes, uint32_t writer = 0) {
  std::vector<uint8_t> p(bytes);
  uint64_t x = hash ^ (0x9e3779b97f4a7c15ULL * (writer + 1));
  for (auto& b : p) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    b = static_cast<uint8_t>(x >> 56);
  }
  return p;
}

KvStoreFingerprint test_fingerprint(const std::string& dtype = "bf16") {
  return KvStoreFingerprint::from_layout({"test-model-config", dtype, kTokens, {4096, 4096}, ""});
}

// A store's collaborators for tests: an injected clock and a log that keeps its lines.
struct Harness {
  std::shared_ptr<std::atomic<int64_t>> now = std::make_shared<std::atomic<int64_t>>(kStartMs);
  std::shared_ptr<std::mutex> log_mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<std::string>> lines = std::make_shared<std::vector<std::string>>();

  KvStoreClock clock() const {
    return [now = now] { return now->load(); };
  }
  KvStoreLog log() const {
    return [m = log_mutex, l = lines](const std::string& line) {
      std::lock_guard<std::mutex> lock(*m);
      l->push_back(line);
    };
  }
  std::vector<std::string> log_lines() const {
    std::lock_guard<std::mutex> lock(*log_mutex);
    return *lines;
  }
  void advance(int64_t ms) { now->fetch_add(ms); }

  std::unique_ptr<KvBlockStore> store(const std::string& root, uint64_t capacity = 0,
                                      const KvStoreFingerprint& fp = test_fingerprint()) const {
    KvBlockStoreConfig config;
    config.root = root;
    config.capacity_bytes = capacity;
    return std::make_unique<KvBlockStore>(config, fp, log(), clock());
  }
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

bool log_mentions(const Harness& h, const std::string& path, const std::string& what) {
  for (const std::string& line : h.log_lines()) {
    if (line.find(path) != std::string::npos && line.find(what) != std::string::npos) return true;
  }
  return false;
}

TEST(KvStoreChecksum, Xxh64MatchesPublishedVectors) {
  EXPECT_EQ(xxh64(""), 0xef46db3751d8e999ULL);
  EXPECT_EQ(xxh64("a"), 0xd24ec4f1a98c6e5bULL);
  EXPECT_EQ(xxh64("abc"), 0x44bc2cf5ad770999ULL);
  // 39 bytes: exercises the 32-byte stripes and every tail path.
  EXPECT_EQ(xxh64("Nobody inspects the spammish repetition"), 0xfbcea83c8a378bf1ULL);
  EXPECT_NE(xxh64("abc", 1), xxh64("abc", 0));
}

TEST(KvStoreFingerprint, EveryLayoutFieldSeparatesStores) {
  const KvStoreFingerprint::Layout base{"cfg-hash", "bf16", 128, {1000, 2000}, ""};
  const auto fp = KvStoreFingerprint::from_layout(base);
  EXPECT_EQ(fp, KvStoreFingerprint::from_layout(base));
  EXPECT_EQ(fp.hex().size(), 16u);
  auto differs = [&](auto mutate) {
    KvStoreFingerprint::Layout l = base;
    mutate(l);
    return !(KvStoreFingerprint::from_layout(l) == fp);
  };
  EXPECT_TRUE(differs([](auto& l) { l.model = "other"; }));
  EXPECT_TRUE(differs([](auto& l) { l.kv_dtype = "fp8_e4m3"; }));
  EXPECT_TRUE(differs([](auto& l) { l.block_size = 64; }));
  EXPECT_TRUE(differs([](auto& l) { l.layer_bytes = {2000, 1000}; }));
  EXPECT_TRUE(differs([](auto& l) { l.layer_bytes.push_back(0); }));
  EXPECT_TRUE(differs([](auto& l) { l.extra = "tp=2"; }));
}

TEST(KvBlockStore, RoundTripWithStateSnapshot) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(1);
  const auto payload = payload_for(chain.hashes[0], 10000);
  KvPutOptions opts;
  opts.traffic_class = TrafficClass::kAgent;
  opts.state_bytes = 1000;
  EXPECT_EQ(store->put(chain.key(0), payload, opts), PutResult::kWritten);

  const std::string path = store->block_path(chain.hashes[0]);
  EXPECT_EQ(path, dir.path() + "/" + test_fingerprint().hex() + "/" +
                      hex64(chain.hashes[0]).substr(0, 2) + "/" + hex64(chain.hashes[0]) + ".kvb");
  const uint64_t file_bytes = kKvBlockHeaderBytes + 4 * kTokens + payload.size();
  EXPECT_EQ(fs::file_size(path), file_bytes);
  EXPECT_TRUE(fs::exists(dir.path() + "/" + test_fingerprint().hex() + "/fingerprint.txt"));

  auto got = store->get(chain.key(0));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->payload, payload);
  EXPECT_EQ(got->state_bytes, 1000u);
  EXPECT_EQ(got->traffic_class, TrafficClass::kAgent);
  EXPECT_EQ(got->expires_ms, kStartMs + 3 * kDayMs);

  const KvStoreStats s = store->stats();
  EXPECT_EQ(s.puts_written, 1u);
  EXPECT_EQ(s.bytes_written, file_bytes);
  EXPECT_EQ(s.bytes_read, file_bytes);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(s.fetch_count, 1u);
  EXPECT_EQ(s.files, 1u);
  EXPECT_EQ(s.size_bytes, file_bytes);
  // No temp file is left behind.
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 2);  // the block and fingerprint.txt
  EXPECT_TRUE(h.log_lines().empty());
}

TEST(KvBlockStore, PutStateBytesPastPayloadThrows) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(1);
  KvPutOptions opts;
  opts.state_bytes = 11;
  EXPECT_THROW(store->put(chain.key(0), std::vector<uint8_t>(10), opts), Error);
}

TEST(KvBlockStore, NewStoreOnSameDirectorySeesBlocksAfterRestart) {
  test::TempDir dir;
  Harness h;
  const Chain chain(4);
  {
    auto store = h.store(dir.path());
    for (int b = 0; b < 4; ++b) {
      ASSERT_EQ(store->put(chain.key(b), payload_for(chain.hashes[b], 5000)), PutResult::kWritten);
    }
  }
  auto restarted = h.store(dir.path());
  EXPECT_EQ(restarted->match_prefix(chain.hashes), 4);
  for (int b = 0; b < 4; ++b) {
    auto got = restarted->get(chain.key(b));
    ASSERT_TRUE(got.has_value()) << b;
    EXPECT_EQ(got->payload, payload_for(chain.hashes[b], 5000));
  }
  const SweepResult swept = restarted->sweep();
  EXPECT_EQ(swept.files, 4u);
  EXPECT_EQ(restarted->stats().files, 4u);
}

TEST(KvBlockStore, FirstWriterWinsAndLaterPutsLeaveTheFileAlone) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(1);
  const auto first = payload_for(chain.hashes[0], 3000, 0);
  ASSERT_EQ(store->put(chain.key(0), first), PutResult::kWritten);
  EXPECT_EQ(store->put(chain.key(0), payload_for(chain.hashes[0], 3000, 1)),
            PutResult::kAlreadyPresent);
  EXPECT_EQ(store->get(chain.key(0))->payload, first);
  EXPECT_EQ(store->stats().puts_existing, 1u);
}

TEST(KvBlockStore, AnotherFingerprintNeverSeesTheBlocks) {
  test::TempDir dir;
  Harness h;
  const Chain chain(2);
  auto bf16 = h.store(dir.path(), 0, test_fingerprint("bf16"));
  auto fp8 = h.store(dir.path(), 0, test_fingerprint("fp8_e4m3"));
  ASSERT_EQ(bf16->put(chain.key(0), payload_for(chain.hashes[0], 2000)), PutResult::kWritten);
  ASSERT_EQ(bf16->put(chain.key(1), payload_for(chain.hashes[1], 2000)), PutResult::kWritten);
  EXPECT_EQ(fp8->match_prefix(chain.hashes), 0);
  EXPECT_FALSE(fp8->get(chain.key(0)).has_value());
  // Invisible, not removed: the other engine still has its blocks.
  EXPECT_EQ(bf16->match_prefix(chain.hashes), 2);
  EXPECT_TRUE(bf16->get(chain.key(0)).has_value());
}

TEST(KvBlockStore, FileInTheWrongFingerprintDirectoryIsAMissAndRemoved) {
  test::TempDir dir;
  Harness h;
  const Chain chain(1);
  auto bf16 = h.store(dir.path(), 0, test_fingerprint("bf16"));
  auto fp8 = h.store(dir.path(), 0, test_fingerprint("fp8_e4m3"));
  ASSERT_EQ(bf16->put(chain.key(0), payload_for(chain.hashes[0], 2000)), PutResult::kWritten);
  const std::string wrong = fp8->block_path(chain.hashes[0]);
  fs::create_directories(fs::path(wrong).parent_path());
  fs::copy_file(bf16->block_path(chain.hashes[0]), wrong);

  EXPECT_FALSE(fp8->get(chain.key(0)).has_value());
  EXPECT_FALSE(fs::exists(wrong));
  EXPECT_EQ(fp8->stats().corrupt_removed, 1u);
  EXPECT_TRUE(log_mentions(h, wrong, "fingerprint"));
  EXPECT_TRUE(bf16->get(chain.key(0)).has_value());  // the original is untouched
}

TEST(KvBlockStore, FileUnderAnotherHashIsAMissAndRemoved) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(2);
  ASSERT_EQ(store->put(chain.key(0), payload_for(chain.hashes[0], 2000)), PutResult::kWritten);
  const std::string wrong = store->block_path(chain.hashes[1]);
  fs::create_directories(fs::path(wrong).parent_path());
  fs::copy_file(store->block_path(chain.hashes[0]), wrong);
  EXPECT_FALSE(store->get(chain.key(1)).has_value());
  EXPECT_FALSE(fs::exists(wrong));
  EXPECT_TRUE(log_mentions(h, wrong, "holds block"));
}

// Writes one block, damages its file with `damage`, and checks that get() is a logged miss that
// removed the file and that a rewrite then works again.
void expect_damage_detected(const std::string& name,
                            const std::function<void(std::vector<uint8_t>&)>& damage,
                            const std::string& log_words) {
  SCOPED_TRACE(name);
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(1);
  const auto payload = payload_for(chain.hashes[0], 4000);
  ASSERT_EQ(store->put(chain.key(0), payload), PutResult::kWritten);
  const std::string path = store->block_path(chain.hashes[0]);
  std::vector<uint8_t> bytes = read_file(path);
  damage(bytes);
  write_file(path, bytes);

  EXPECT_FALSE(store->get(chain.key(0)).has_value());
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(store->stats().corrupt_removed, 1u);
  EXPECT_EQ(store->stats().misses, 1u);
  EXPECT_TRUE(log_mentions(h, path, log_words))
      << "log: " << (h.log_lines().empty() ? "" : h.log_lines()[0]);
  ASSERT_EQ(store->put(chain.key(0), payload), PutResult::kWritten);
  EXPECT_EQ(store->get(chain.key(0))->payload, payload);
}

TEST(KvBlockStore, TruncatedFilesAreMissesRemovedAndLogged) {
  expect_damage_detected(
      "empty", [](auto& b) { b.clear(); }, "truncated");
  expect_damage_detected(
      "half header", [](auto& b) { b.resize(kKvBlockHeaderBytes / 2); }, "truncated");
  expect_damage_detected(
      "header only", [](auto& b) { b.resize(kKvBlockHeaderBytes); }, "bytes");
  expect_damage_detected(
      "one payload byte short", [](auto& b) { b.pop_back(); }, "bytes");
  expect_damage_detected(
      "one byte too many", [](auto& b) { b.push_back(0); }, "bytes");
}

TEST(KvBlockStore, FlippedPayloadByteIsAMissRemovedAndLogged) {
  const size_t payload_at = kKvBlockHeaderBytes + 4 * kTokens;
  for (size_t off : {payload_at, payload_at + 1777, payload_at + 3999}) {
    expect_damage_detected(
        "payload byte " + std::to_string(off), [off](auto& b) { b[off] ^= 1; }, "payload checksum");
  }
}

TEST(KvBlockStore, FlippedHeaderOrTokenByteIsAMissRemovedAndLogged) {
  // Every header byte, and bytes of the token section: each is caught by a field check or by
  // the header checksum; none is ever read as a valid block.
  for (size_t off = 0; off < kKvBlockHeaderBytes + 4 * kTokens; off += (off < 96 ? 1 : 61)) {
    expect_damage_detected(
        "header byte " + std::to_string(off), [off](auto& b) { b[off] ^= 0x40; }, "bad block file");
  }
}

TEST(KvBlockStore, OtherTokensUnderTheSameHashAreAMissButKeepTheFile) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(1);
  ASSERT_EQ(store->put(chain.key(0), payload_for(chain.hashes[0], 1000)), PutResult::kWritten);
  std::vector<int32_t> other = chain.tokens[0];
  other[5] += 1;
  EXPECT_FALSE(store->get(BlockKey{chain.hashes[0], chain.parents[0], other}).has_value());
  EXPECT_FALSE(store->get(BlockKey{chain.hashes[0], chain.parents[0] + 1, chain.tokens[0]}));
  EXPECT_EQ(store->stats().key_mismatches, 2u);
  EXPECT_EQ(store->stats().corrupt_removed, 0u);
  EXPECT_TRUE(store->get(chain.key(0)).has_value());
}

TEST(KvBlockStore, TtlExpiryPerTrafficClass) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain agent(1, 1), chat(1, 2), custom(1, 3);
  KvPutOptions a;
  a.traffic_class = TrafficClass::kAgent;
  KvPutOptions c;  // chat by default
  KvPutOptions one_hour;
  one_hour.ttl = hours(1);
  ASSERT_EQ(store->put(agent.key(0), payload_for(agent.hashes[0], 100), a), PutResult::kWritten);
  ASSERT_EQ(store->put(chat.key(0), payload_for(chat.hashes[0], 100), c), PutResult::kWritten);
  ASSERT_EQ(store->put(custom.key(0), payload_for(custom.hashes[0], 100), one_hour),
            PutResult::kWritten);

  h.advance(3600 * 1000 - 1);
  EXPECT_EQ(store->match_prefix(custom.hashes), 1);
  h.advance(1);
  EXPECT_EQ(store->match_prefix(custom.hashes), 0);
  EXPECT_FALSE(store->get(custom.key(0)).has_value());
  EXPECT_FALSE(fs::exists(store->block_path(custom.hashes[0])));  // get removed it

  h.advance(3 * kDayMs - 3600 * 1000 - 1);  // 1 ms before the agent TTL
  EXPECT_EQ(store->match_prefix(agent.hashes), 1);
  EXPECT_TRUE(store->get(agent.key(0)).has_value());
  h.advance(1);
  EXPECT_EQ(store->match_prefix(agent.hashes), 0);
  EXPECT_EQ(store->match_prefix(chat.hashes), 1);
  SweepResult swept = store->sweep();
  EXPECT_EQ(swept.expired_removed, 1u);
  EXPECT_FALSE(fs::exists(store->block_path(agent.hashes[0])));
  EXPECT_EQ(swept.files, 1u);

  h.advance(4 * kDayMs);  // 7 days after the put
  EXPECT_EQ(store->match_prefix(chat.hashes), 0);
  swept = store->sweep();
  EXPECT_EQ(swept.expired_removed, 1u);
  EXPECT_EQ(swept.files, 0u);
  EXPECT_EQ(store->stats().expired_removed, 3u);
}

TEST(KvBlockStore, AnExpiredFileDoesNotBlockAFreshCopy) {
  // Expired but not swept yet: a put replaces it instead of reporting it present.
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(1, 9);
  KvPutOptions one_hour;
  one_hour.ttl = hours(1);
  ASSERT_EQ(store->put(chain.key(0), payload_for(chain.hashes[0], 100), one_hour),
            PutResult::kWritten);
  EXPECT_EQ(store->put(chain.key(0), payload_for(chain.hashes[0], 100), one_hour),
            PutResult::kAlreadyPresent);
  h.advance(3600 * 1000);
  EXPECT_EQ(store->match_prefix(chain.hashes), 0);
  EXPECT_EQ(store->put(chain.key(0), payload_for(chain.hashes[0], 100), one_hour),
            PutResult::kWritten);
  EXPECT_EQ(store->match_prefix(chain.hashes), 1);
  EXPECT_TRUE(store->get(chain.key(0)).has_value());
}

TEST(KvBlockStore, MatchPrefixStopsAtTheFirstMissingOrExpiredBlock) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(6);
  for (int b : {0, 1, 2, 4, 5}) {
    KvPutOptions o;
    o.ttl = b == 1 ? hours(1) : hours(10);
    ASSERT_EQ(store->put(chain.key(b), payload_for(chain.hashes[b], 100), o), PutResult::kWritten);
  }
  EXPECT_EQ(store->match_prefix(chain.hashes), 3);  // block 3 is missing
  EXPECT_EQ(store->match_prefix(std::span(chain.hashes).subspan(4)), 2);
  EXPECT_EQ(store->match_prefix({}), 0);
  h.advance(2 * 3600 * 1000);
  EXPECT_EQ(store->match_prefix(chain.hashes), 1);  // block 1 expired
  EXPECT_EQ(store->stats().bytes_read, 0u);         // metadata only
}

TEST(KvBlockStore, SweepEvictsLeastRecentlyAccessedToCapacity) {
  test::TempDir dir;
  Harness h;
  const Chain chain(5);
  const size_t payload = 1000;
  const uint64_t file_bytes = kKvBlockHeaderBytes + 4 * kTokens + payload;
  auto store = h.store(dir.path(), 3 * file_bytes);
  for (int b = 0; b < 5; ++b) {
    ASSERT_EQ(store->put(chain.key(b), payload_for(chain.hashes[b], payload)), PutResult::kWritten);
    h.advance(1000);
  }
  ASSERT_TRUE(store->get(chain.key(0)).has_value());  // block 0 becomes the most recent
  h.advance(1000);
  ASSERT_TRUE(store->get(chain.key(3)).has_value());

  const SweepResult swept = store->sweep();
  EXPECT_EQ(swept.evicted, 2u);
  EXPECT_EQ(swept.files, 3u);
  EXPECT_EQ(swept.bytes, 3 * file_bytes);
  for (int b = 0; b < 5; ++b) {
    const bool kept = b == 0 || b == 3 || b == 4;
    EXPECT_EQ(fs::exists(store->block_path(chain.hashes[b])), kept) << b;
  }
  EXPECT_EQ(store->stats().evictions, 2u);
  EXPECT_EQ(store->stats().size_bytes, 3 * file_bytes);
  // Within capacity: nothing more goes.
  EXPECT_EQ(store->sweep().evicted, 0u);
}

TEST(KvBlockStore, SweepRemovesStaleTempFilesAndLeavesForeignFilesAlone) {
  test::TempDir dir;
  Harness h;
  KvBlockStoreConfig config;
  config.root = dir.path();
  config.stale_temp_age = std::chrono::seconds(0);
  KvBlockStore store(config, test_fingerprint(), h.log(), h.clock());
  const std::string fan = dir.path() + "/" + test_fingerprint().hex() + "/ab";
  fs::create_directories(fan);
  write_file(fan + "/abababababababab.0123.0.tmp", {1, 2, 3});
  write_file(dir.path() + "/README", {1});
  write_file(fan + "/notes.txt", {1});
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(store.sweep().stale_temps_removed, 1u);
  EXPECT_FALSE(fs::exists(fan + "/abababababababab.0123.0.tmp"));
  EXPECT_TRUE(fs::exists(dir.path() + "/README"));
  EXPECT_TRUE(fs::exists(fan + "/notes.txt"));
}

// Readers racing writers of the same keys see either nothing or exactly one writer's bytes.
void expect_exact_or_miss(KvBlockStore& store, const Chain& chain, size_t bytes,
                          std::atomic<int>& bad) {
  for (int b = 0; b < static_cast<int>(chain.hashes.size()); ++b) {
    auto got = store.get(chain.key(b));
    if (!got) continue;
    const auto h = chain.hashes[static_cast<size_t>(b)];
    if (got->payload != payload_for(h, bytes, 0) && got->payload != payload_for(h, bytes, 1)) {
      ++bad;
    }
  }
}

TEST(KvBlockStore, TwoStoresOnOneDirectoryFromThreads) {
  test::TempDir dir;
  Harness h;
  const Chain chain(64);
  const size_t bytes = 20000;
  auto a = h.store(dir.path());
  auto b = h.store(dir.path());
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  auto writer = [&](KvBlockStore& s, uint32_t id) {
    for (int k = 0; k < 64; ++k) {
      const auto hash = chain.hashes[static_cast<size_t>(k)];
      EXPECT_NE(s.put(chain.key(k), payload_for(hash, bytes, id)), PutResult::kFailed);
    }
  };
  std::thread reader([&] {
    while (!done.load()) expect_exact_or_miss(*a, chain, bytes, bad);
  });
  std::thread wa(writer, std::ref(*a), 0u), wb(writer, std::ref(*b), 1u);
  wa.join();
  wb.join();
  done = true;
  reader.join();
  expect_exact_or_miss(*b, chain, bytes, bad);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(a->stats().puts_written + b->stats().puts_written, 64u);
  EXPECT_EQ(a->stats().corrupt_removed + b->stats().corrupt_removed, 0u);
  EXPECT_EQ(a->match_prefix(chain.hashes), 64);
  // One file per key, no temp files left.
  EXPECT_EQ(a->sweep().files, 64u);
  size_t temps = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
    temps += e.path().extension() == ".tmp";
  }
  EXPECT_EQ(temps, 0u);
  EXPECT_TRUE(h.log_lines().empty());
}

TEST(KvBlockStore, ForkedProcessWritesTheSameKeysConcurrently) {
  test::TempDir dir;
  const Chain chain(48);
  const size_t bytes = 50000;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Another engine process: its own store object on the same directory.
    int rc = 0;
    try {
      KvBlockStoreConfig config;
      config.root = dir.path();
      KvBlockStore store(config, test_fingerprint());
      for (int k = 47; k >= 0; --k) {
        if (store.put(chain.key(k), payload_for(chain.hashes[static_cast<size_t>(k)], bytes, 1)) ==
            PutResult::kFailed) {
          rc = 1;
        }
      }
    } catch (...) {
      rc = 2;
    }
    ::_exit(rc);
  }
  Harness h;
  auto store = h.store(dir.path());
  std::atomic<int> bad{0};
  for (int k = 0; k < 48; ++k) {
    EXPECT_NE(store->put(chain.key(k), payload_for(chain.hashes[static_cast<size_t>(k)], bytes, 0)),
              PutResult::kFailed);
    expect_exact_or_miss(*store, chain, bytes, bad);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  expect_exact_or_miss(*store, chain, bytes, bad);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(store->match_prefix(chain.hashes), 48);
  EXPECT_EQ(store->stats().corrupt_removed, 0u);
  EXPECT_EQ(store->sweep().files, 48u);
}

TEST(KvBlockStore, UnwritableRootIsAnErrorNamingThePath) {
  test::TempDir dir;
  write_file(dir.file("plain"), {1});
  KvBlockStoreConfig config;
  config.root = dir.file("plain");
  try {
    KvBlockStore store(config, test_fingerprint());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find(dir.file("plain")), std::string::npos) << e.what();
  }
}

// A put function that blocks until released, standing in for a slow disk.
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  int entered = 0;
  std::vector<BlockHash> order;

  KvStoreWriter::PutFn put_fn() {
    return [this](const KvStoreWrite& w) {
      std::unique_lock<std::mutex> lock(m);
      ++entered;
      order.push_back(w.hash);
      cv.notify_all();
      cv.wait(lock, [&] { return open; });
      return PutResult::kWritten;
    };
  }
  void wait_entered(int n) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return entered >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(m);
    open = true;
    cv.notify_all();
  }
};

TEST(KvStoreWriter, WritesInTheBackgroundAndFlushWaits) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(16);
  KvStoreWriter writer(*store);
  for (int b = 0; b < 16; ++b) {
    const auto i = static_cast<size_t>(b);
    EXPECT_TRUE(writer.submit(KvStoreWrite::owning(
        chain.hashes[i], chain.parents[i], chain.tokens[i], payload_for(chain.hashes[i], 8000))));
  }
  writer.flush();
  EXPECT_EQ(store->match_prefix(chain.hashes), 16);
  const KvStoreWriterStats s = writer.stats();
  EXPECT_EQ(s.submitted, 16u);
  EXPECT_EQ(s.written, 16u);
  EXPECT_EQ(s.dropped, 0u);
  EXPECT_EQ(s.queued_blocks, 0u);
  EXPECT_EQ(store->get(chain.key(7))->payload, payload_for(chain.hashes[7], 8000));
  // A second submission of the same blocks finds them present.
  EXPECT_TRUE(writer.submit(KvStoreWrite::owning(chain.hashes[0], chain.parents[0], chain.tokens[0],
                                                 payload_for(chain.hashes[0], 8))));
  writer.flush();
  EXPECT_EQ(writer.stats().already_present, 1u);
}

TEST(KvStoreWriter, FullQueueDropsAndCountsWithoutBlocking) {
  Gate gate;
  KvStoreWriterConfig config;
  config.max_queue_blocks = 2;
  KvStoreWriter writer(gate.put_fn(), config);
  auto write = [](BlockHash h) { return KvStoreWrite::owning(h, 0, {}, std::vector<uint8_t>(10)); };
  ASSERT_TRUE(writer.submit(write(1)));
  gate.wait_entered(1);  // the worker holds block 1: the queue is empty again
  EXPECT_TRUE(writer.submit(write(2)));
  EXPECT_TRUE(writer.submit(write(3)));
  EXPECT_FALSE(writer.submit(write(4)));  // full: dropped at once
  EXPECT_FALSE(writer.submit(write(5)));
  KvStoreWriterStats s = writer.stats();
  EXPECT_EQ(s.dropped, 2u);
  EXPECT_EQ(s.queued_blocks, 2u);
  EXPECT_EQ(s.queued_bytes, 20u);

  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    writer.flush();
    flushed = true;
  });
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_FALSE(flushed.load());  // flush waits for the blocked write
  gate.release();
  flusher.join();
  s = writer.stats();
  EXPECT_EQ(s.written, 3u);
  EXPECT_EQ(s.submitted, 3u);
  EXPECT_EQ(gate.order, (std::vector<BlockHash>{1, 2, 3}));
}

TEST(KvStoreWriter, ByteBoundDropsLargeBacklogs) {
  Gate gate;
  KvStoreWriterConfig config;
  config.max_queue_bytes = 100;
  KvStoreWriter writer(gate.put_fn(), config);
  auto write = [](BlockHash h, size_t n) {
    return KvStoreWrite::owning(h, 0, {}, std::vector<uint8_t>(n));
  };
  ASSERT_TRUE(writer.submit(write(1, 10)));
  gate.wait_entered(1);
  EXPECT_TRUE(writer.submit(write(2, 500)));  // alone in the queue: a big block still goes
  EXPECT_FALSE(writer.submit(write(3, 1)));   // over the bound behind it
  gate.release();
  writer.flush();
  EXPECT_EQ(writer.stats().dropped, 1u);
  EXPECT_EQ(writer.stats().written, 2u);
}

TEST(KvStoreWriter, DestructorWritesWhatIsQueued) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(8);
  {
    KvStoreWriter writer(*store);
    for (int b = 0; b < 8; ++b) {
      const auto i = static_cast<size_t>(b);
      writer.submit(KvStoreWrite::owning(chain.hashes[i], chain.parents[i], chain.tokens[i],
                                         payload_for(chain.hashes[i], 30000)));
    }
  }
  EXPECT_EQ(store->match_prefix(chain.hashes), 8);
}

TEST(KvStoreWriter, AThrowingPutCountsAsFailedAndTheWorkerGoesOn) {
  int calls = 0;
  KvStoreWriter writer([&](const KvStoreWrite& w) {
    ++calls;
    if (w.hash == 1) throw Error(ErrorCode::kInvalidArgument, "bad block");
    return PutResult::kWritten;
  });
  writer.submit(KvStoreWrite::owning(1, 0, {}, {}));
  writer.submit(KvStoreWrite::owning(2, 0, {}, {}));
  writer.flush();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(writer.stats().failed, 1u);
  EXPECT_EQ(writer.stats().written, 1u);
}

TEST(KvStoreSweeper, SweepsPeriodicallyOffTheCallerThread) {
  test::TempDir dir;
  Harness h;
  auto store = h.store(dir.path());
  const Chain chain(1);
  KvPutOptions o;
  o.ttl = std::chrono::seconds(1);
  ASSERT_EQ(store->put(chain.key(0), payload_for(chain.hashes[0], 10), o), PutResult::kWritten);
  h.advance(2000);
  KvStoreSweeper sweeper(*store, milliseconds(1));
  // The sweep counts itself after it has removed the file: wait for both.
  for (int i = 0;
       i < 2000 && (fs::exists(store->block_path(chain.hashes[0])) || sweeper.sweeps() == 0); ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_FALSE(fs::exists(store->block_path(chain.hashes[0])));
  EXPECT_GE(sweeper.sweeps(), 1u);
}

}  // namespace
}  // namespace deepinfer::kv
