#include "kv/kv_block_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <random>
#include <system_error>

#include "common/unique_fd.h"
#include "common/xxh64.h"
#include "deepinfer/error.h"

namespace deepinfer::kv {

namespace {

namespace fs = std::filesystem;

constexpr const char* kBlockSuffix = ".kvb";
constexpr const char* kTempSuffix = ".tmp";
// A header claiming more tokens than this is corrupt (a block holds a few hundred at most); it
// keeps a flipped count from asking for a huge allocation before the checksum can be tested.
constexpr uint32_t kMaxTokens = 1u << 16;

std::string os_reason(int err) {
  return std::generic_category().message(err);
}

int64_t to_ms(const struct timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
}

struct timespec from_ms(int64_t ms) {
  struct timespec t {};
  t.tv_sec = static_cast<time_t>(ms / 1000);
  t.tv_nsec = static_cast<long>((ms % 1000) * 1000000);
  return t;
}

bool ends_with(const std::string& s, const char* suffix) {
  const std::string_view sv(suffix);
  return s.size() >= sv.size() && s.compare(s.size() - sv.size(), sv.size(), sv) == 0;
}

bool is_hex(const std::string& s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Reads exactly `size` bytes at `offset`; false on a short file or an error (errno kept).
bool pread_full(int fd, void* buf, size_t size, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(buf);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = 0;  // end of file: the file is shorter than its header says
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

bool write_full(int fd, const void* buf, size_t size) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

int open_retry(const char* path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// Unlinks a temp file on every path out of put() unless it was consumed by rename().
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  std::string path_;
};

void fsync_dir(const std::string& dir) {
  UniqueFd fd(open_retry(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.valid()) ::fsync(fd.get());
}

// The entries of `dir` (names only). Errors (a directory removed by a concurrent sweep, no
// permission) end the listing early: sweeping is best effort and runs again later.
std::vector<std::string> list_names(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  return names;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void atomic_max(std::atomic<uint64_t>& target, uint64_t value) {
  uint64_t cur = target.load(std::memory_order_relaxed);
  while (cur < value && !target.compare_exchange_weak(cur, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

int64_t system_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

KvBlockStore::KvBlockStore(KvBlockStoreConfig config, KvStoreFingerprint fingerprint,
                           KvStoreLog log, KvStoreClock clock)
    : config_(std::move(config)),
      fingerprint_(std::move(fingerprint)),
      log_(std::move(log)),
      clock_(clock ? std::move(clock) : KvStoreClock(system_clock_ms)),
      dir_((fs::path(config_.root) / fingerprint_.hex()).string()),
      temp_nonce_((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {
  if (config_.root.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "KvBlockStore: root directory must be set");
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) {
    throw Error(ErrorCode::kIo, "KvBlockStore: cannot create directory " + dir_ + ": " +
                                    (ec ? ec.message() : "exists and is not a directory"));
  }
  // For people reading the directory; best effort, and written once by whoever comes first.
  const std::string description_path = dir_ + "/fingerprint.txt";
  if (::access(description_path.c_str(), F_OK) != 0) {
    const std::string tmp = temp_path(dir_, fingerprint_.digest());
    TempFile temp(tmp);
    UniqueFd fd(open_retry(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.valid() &&
        write_full(fd.get(), fingerprint_.description().data(),
                   fingerprint_.description().size()) &&
        fd.close() == 0 && ::link(tmp.c_str(), description_path.c_str()) != 0 && errno != EEXIST) {
      report("kv store: cannot write " + description_path + ": " + os_reason(errno));
    }
  }
}

std::string KvBlockStore::block_path(BlockHash hash) const {
  const std::string hex = hex64(hash);
  return dir_ + "/" + hex.substr(0, 2) + "/" + hex + kBlockSuffix;
}

std::string KvBlockStore::temp_path(const std::string& dir, BlockHash hash) {
  // Unique across threads (counter), processes and hosts (random nonce per store object).
  const uint64_t n = temp_counter_.fetch_add(1, std::memory_order_relaxed);
  return dir + "/" + hex64(hash) + "." + hex64(temp_nonce_) + "." + std::to_string(n) + kTempSuffix;
}

std::chrono::seconds KvBlockStore::ttl_for(const KvPutOptions& options) const {
  if (options.ttl) return *options.ttl;
  return options.traffic_class == TrafficClass::kAgent ? config_.agent_ttl : config_.chat_ttl;
}

void KvBlockStore::report(const std::string& line) const {
  if (log_) log_(line);
}

bool KvBlockStore::remove_if_same(const std::string& path, int fd) const {
  struct stat open_st {
  }, path_st{};
  if (::fstat(fd, &open_st) != 0 || ::stat(path.c_str(), &path_st) != 0) return false;
  if (open_st.st_dev != path_st.st_dev || open_st.st_ino != path_st.st_ino) return false;
  return ::unlink(path.c_str()) == 0;
}

PutResult KvBlockStore::put(const BlockKey& key, std::span<const uint8_t> payload,
                            const KvPutOptions& options) {
  const std::string path = block_path(key.hash);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    // An expired file the sweeper has not removed yet must not block a fresh copy (the mtime
    // holds the expiry).
    const int64_t expires_ms = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 +
                               static_cast<int64_t>(st.st_mtim.tv_nsec) / 1000000;
    if (expires_ms > clock_() || ::unlink(path.c_str()) != 0) {
      counters_.puts_existing.fetch_add(1, std::memory_order_relaxed);
      return PutResult::kAlreadyPresent;
    }
  }
  if (options.state_bytes > payload.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "KvBlockStore::put: state_bytes " + std::to_string(options.state_bytes) +
                    " exceeds payload bytes " + std::to_string(payload.size()));
  }

  const int64_t now = clock_();
  KvBlockHeader header;
  header.fingerprint = fingerprint_.digest();
  header.hash = key.hash;
  header.parent = key.parent;
  header.payload_bytes = payload.size();
  header.state_bytes = options.state_bytes;
  header.traffic_class = options.traffic_class;
  header.created_ms = now;
  header.expires_ms =
      now + std::chrono::duration_cast<std::chrono::milliseconds>(ttl_for(options)).count();
  header.payload_checksum = xxh64(payload);
  const std::vector<uint8_t> prefix = encode_block_prefix(header, key.tokens);

  const std::string dir = fs::path(path).parent_path().string();
  TempFile temp(temp_path(dir, key.hash));
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  UniqueFd fd(open_retry(temp.path().c_str(), flags, 0644));
  if (!fd.valid() && errno == ENOENT) {
    // First block in this fan-out directory (or someone removed it): create it and retry.
    if (::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) {
      fd = UniqueFd(open_retry(temp.path().c_str(), flags, 0644));
    }
  }
  auto fail = [&](const char* what) {
    report("kv store: cannot " + std::string(what) + " " + temp.path() + ": " + os_reason(errno));
    counters_.put_failures.fetch_add(1, std::memory_order_relaxed);
    return PutResult::kFailed;
  };
  if (!fd.valid()) return fail("create");
  if (!write_full(fd.get(), prefix.data(), prefix.size()) ||
      !write_full(fd.get(), payload.data(), payload.size())) {
    return fail("write");
  }
  if (config_.fsync && ::fdatasync(fd.get()) != 0) return fail("fdatasync");
  // Retention metadata in the file times (see the header comment): atime = last access,
  // mtime = expiry. Set after the writes so that they do not move mtime again.
  const struct timespec times[2] = {from_ms(now), from_ms(header.expires_ms)};
  if (::futimens(fd.get(), times) != 0) return fail("set times of");
  if (const int err = fd.close(); err != 0) {
    errno = err;
    return fail("close");
  }

  // link() publishes without replacing: a concurrent writer of the same key that got there first
  // keeps its file. Where hard links are not supported (some FUSE file systems), rename():
  // readers still see only whole files, but the last of two racing writers replaces the first.
  if (::link(temp.path().c_str(), path.c_str()) != 0) {
    const int err = errno;
    if (err == EEXIST) {
      counters_.puts_existing.fetch_add(1, std::memory_order_relaxed);
      return PutResult::kAlreadyPresent;
    }
    const bool no_links = err == EPERM || err == ENOTSUP || err == EOPNOTSUPP || err == ENOSYS ||
                          err == EMLINK || err == EXDEV;
    if (!no_links) {
      errno = err;
      return fail("link");
    }
    if (::rename(temp.path().c_str(), path.c_str()) != 0) return fail("rename");
    temp.release();
  }
  if (config_.fsync) fsync_dir(dir);

  const uint64_t file_bytes = prefix.size() + payload.size();
  counters_.puts_written.fetch_add(1, std::memory_order_relaxed);
  counters_.bytes_written.fetch_add(file_bytes, std::memory_order_relaxed);
  counters_.size_bytes.fetch_add(file_bytes, std::memory_order_relaxed);
  counters_.files.fetch_add(1, std::memory_order_relaxed);
  return PutResult::kWritten;
}

std::optional<KvStoreBlock> KvBlockStore::get(const BlockKey& key) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = block_path(key.hash);
  auto miss = [&]() -> std::optional<KvStoreBlock> {
    counters_.misses.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  };

  UniqueFd fd(open_retry(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) {
    if (errno != ENOENT) report("kv store: cannot open " + path + ": " + os_reason(errno));
    return miss();
  }
  auto record_fetch = [&] {
    const auto ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    counters_.fetch_count.fetch_add(1, std::memory_order_relaxed);
    counters_.fetch_ns_total.fetch_add(ns, std::memory_order_relaxed);
    atomic_max(counters_.fetch_ns_max, ns);
  };
  auto corrupt = [&](const std::string& why) -> std::optional<KvStoreBlock> {
    record_fetch();
    const bool removed = remove_if_same(path, fd.get());
    if (removed) counters_.corrupt_removed.fetch_add(1, std::memory_order_relaxed);
    report("kv store: bad block file " + path + ": " + why +
           (removed ? "; removed" : "; already replaced or removed"));
    return miss();
  };
  auto io_error = [&](const char* what) -> std::optional<KvStoreBlock> {
    // errno 0 means end of file: the file is shorter than it must be.
    if (errno == 0) return corrupt(std::string("truncated while reading ") + what);
    record_fetch();
    report(std::string("kv store: cannot read ") + what + " of " + path + ": " + os_reason(errno));
    return miss();
  };

  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return io_error("status");
  if (!S_ISREG(st.st_mode)) return corrupt("not a regular file");
  const auto file_size = static_cast<uint64_t>(st.st_size);

  std::array<uint8_t, kKvBlockHeaderBytes> head{};
  if (!pread_full(fd.get(), head.data(), head.size(), 0)) return io_error("the header");
  std::string why;
  std::optional<KvBlockHeader> h = decode_block_header_fields(head, why);
  if (!h) return corrupt(why);
  if (h->num_tokens > kMaxTokens || h->file_bytes() != file_size) {
    return corrupt("file is " + std::to_string(file_size) + " bytes, its header describes " +
                   (h->num_tokens > kMaxTokens ? std::string("an impossible token count")
                                               : std::to_string(h->file_bytes())));
  }
  std::vector<uint8_t> token_bytes(4ULL * h->num_tokens);
  if (!pread_full(fd.get(), token_bytes.data(), token_bytes.size(), kKvBlockHeaderBytes)) {
    return io_error("the tokens");
  }
  if (!header_checksum_matches(head, token_bytes, h->header_checksum)) {
    return corrupt("header checksum mismatch");
  }
  if (h->fingerprint != fingerprint_.digest()) {
    return corrupt("fingerprint " + hex64(h->fingerprint) + ", expected " + fingerprint_.hex() +
                   " (written by an engine with another model or KV layout)");
  }
  if (h->hash != key.hash) {
    return corrupt("holds block " + hex64(h->hash) + ", not " + hex64(key.hash));
  }
  if (h->expires_ms <= clock_()) {
    record_fetch();
    if (remove_if_same(path, fd.get())) {
      counters_.expired_removed.fetch_add(1, std::memory_order_relaxed);
    }
    return miss();
  }
  if (!key.same_block(h->parent, decode_tokens(token_bytes))) {
    // A chain-hash collision or a caller asking with other tokens: the file is fine for its own
    // key, so it stays.
    record_fetch();
    counters_.key_mismatches.fetch_add(1, std::memory_order_relaxed);
    report("kv store: " + path + " holds another prefix under the same hash (parent or tokens " +
           "differ); treated as a miss");
    return miss();
  }

  KvStoreBlock block;
  block.payload.resize(h->payload_bytes);
  const uint64_t payload_offset = kKvBlockHeaderBytes + token_bytes.size();
  if (!pread_full(fd.get(), block.payload.data(), block.payload.size(), payload_offset)) {
    return io_error("the payload");
  }
  if (xxh64(block.payload) != h->payload_checksum) return corrupt("payload checksum mismatch");
  block.state_bytes = h->state_bytes;
  block.traffic_class = h->traffic_class;
  block.expires_ms = h->expires_ms;

  // The access time drives LRU eviction; mtime (the expiry) stays. A failure (read-only mount)
  // only weakens LRU order.
  const struct timespec times[2] = {from_ms(clock_()), {0, UTIME_OMIT}};
  ::futimens(fd.get(), times);

  record_fetch();
  counters_.hits.fetch_add(1, std::memory_order_relaxed);
  counters_.bytes_read.fetch_add(file_size, std::memory_order_relaxed);
  return block;
}

int KvBlockStore::match_prefix(std::span<const BlockHash> hashes) const {
  return static_cast<int>(match_prefix_sizes(hashes).size());
}

std::vector<uint64_t> KvBlockStore::match_prefix_sizes(std::span<const BlockHash> hashes) const {
  const int64_t now = clock_();
  std::vector<uint64_t> sizes;
  for (const BlockHash hash : hashes) {
    struct stat st {};
    if (::stat(block_path(hash).c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) < kKvBlockHeaderBytes || to_ms(st.st_mtim) <= now) {
      break;
    }
    sizes.push_back(static_cast<uint64_t>(st.st_size));
  }
  return sizes;
}

SweepResult KvBlockStore::sweep() {
  struct Entry {
    std::string path;
    uint64_t bytes;
    int64_t atime_ms;
  };
  const int64_t now = clock_();
  const int64_t now_real = system_clock_ms();  // temp ages are real (ctime cannot be injected)
  const int64_t temp_age_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(config_.stale_temp_age).count();
  SweepResult result;
  std::vector<Entry> live;

  // <root>/<16 hex>/<2 hex>/<file>; anything else under root is not ours and is left alone.
  for (const std::string& fp_name : list_names(config_.root)) {
    const std::string fp_dir = config_.root + "/" + fp_name;
    if (!is_hex(fp_name, 16) || !is_dir(fp_dir)) continue;
    for (const std::string& fan_name : list_names(fp_dir)) {
      const std::string fan_dir = fp_dir + "/" + fan_name;
      if (!is_hex(fan_name, 2) || !is_dir(fan_dir)) continue;
      for (const std::string& name : list_names(fan_dir)) {
        const std::string path = fan_dir + "/" + name;
        const bool block = ends_with(name, kBlockSuffix);
        if (!block && !ends_with(name, kTempSuffix)) continue;
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (!block) {
          if (now_real - to_ms(st.st_ctim) > temp_age_ms && ::unlink(path.c_str()) == 0) {
            ++result.stale_temps_removed;
          }
          continue;
        }
        if (to_ms(st.st_mtim) <= now) {
          if (::unlink(path.c_str()) == 0) ++result.expired_removed;
          continue;
        }
        live.push_back({path, static_cast<uint64_t>(st.st_size), to_ms(st.st_atim)});
      }
    }
  }

  uint64_t total = 0;
  for (const Entry& e : live) total += e.bytes;
  if (config_.capacity_bytes > 0 && total > config_.capacity_bytes) {
    // Least recently accessed first; the path breaks ties so the order is deterministic.
    std::sort(live.begin(), live.end(), [](const Entry& a, const Entry& b) {
      return a.atime_ms != b.atime_ms ? a.atime_ms < b.atime_ms : a.path < b.path;
    });
    size_t i = 0;
    for (; i < live.size() && total > config_.capacity_bytes; ++i) {
      // Another process may have removed it already; the bytes are gone either way.
      if (::unlink(live[i].path.c_str()) == 0) ++result.evicted;
      total -= live[i].bytes;
    }
    live.erase(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(i));
  }
  result.files = live.size();
  result.bytes = total;

  counters_.expired_removed.fetch_add(result.expired_removed, std::memory_order_relaxed);
  counters_.evictions.fetch_add(result.evicted, std::memory_order_relaxed);
  counters_.size_bytes.store(result.bytes, std::memory_order_relaxed);
  counters_.files.store(result.files, std::memory_order_relaxed);
  return result;
}

KvStoreStats KvBlockStore::stats() const {
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  KvStoreStats s;
  s.bytes_written = ld(counters_.bytes_written);
  s.bytes_read = ld(counters_.bytes_read);
  s.puts_written = ld(counters_.puts_written);
  s.puts_existing = ld(counters_.puts_existing);
  s.put_failures = ld(counters_.put_failures);
  s.hits = ld(counters_.hits);
  s.misses = ld(counters_.misses);
  s.corrupt_removed = ld(counters_.corrupt_removed);
  s.key_mismatches = ld(counters_.key_mismatches);
  s.expired_removed = ld(counters_.expired_removed);
  s.evictions = ld(counters_.evictions);
  s.fetch_count = ld(counters_.fetch_count);
  s.fetch_ns_total = ld(counters_.fetch_ns_total);
  s.fetch_ns_max = ld(counters_.fetch_ns_max);
  s.size_bytes = ld(counters_.size_bytes);
  s.files = ld(counters_.files);
  return s;
}

}  // namespace deepinfer::kv
