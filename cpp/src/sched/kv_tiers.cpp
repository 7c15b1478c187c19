#include "sched/kv_tiers.h"

#include <algorithm>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "deepinfer/error.h"
#include "kv/kv_store_format.h"

namespace deepinfer::sched {

namespace {

// The store reports bad files and I/O errors as lines; there is no engine log yet, so they go to
// stderr, where an operator sees which file was removed and why.
void log_store_line(const std::string& line) {
  std::cerr << "deepinfer: " << line << '\n';
}

}  // namespace

KvTiers::KvTiers(const KvTiersConfig& config, KvTransfer& transfer)
    : config_(config),
      transfer_(transfer),
      kv_bytes_(static_cast<uint64_t>(transfer.block_bytes())),
      state_bytes_(config.window_state_exact ? static_cast<uint64_t>(transfer.state_bytes()) : 0) {
  if (config.host_bytes > 0) {
    // One arena of the configured size, allocated once (pinned on CUDA): exports land in it and
    // imports read from it without a staging copy.
    HostBuffer arena;
    try {
      arena = transfer.allocate_host_arena(config.host_bytes);
    } catch (const Error& e) {
      throw Error(e.code(), "KV host tier: cannot allocate its arena of " +
                                std::to_string(config.host_bytes) +
                                " bytes (kv_host_cache_bytes): " + e.what() +
                                "; lower kv_host_cache_bytes or free host memory");
    }
    host_ = std::make_unique<kv::HostBlockCache>(
        config.host_bytes, std::make_shared<kv::ArenaHostAllocator>(std::move(arena)));
  }
  if (!config.store_path.empty()) {
    kv::KvBlockStoreConfig sc;
    sc.root = config.store_path;
    sc.capacity_bytes = config.store_capacity_bytes;
    kv::KvStoreFingerprint::Layout layout;
    layout.model = config.model_identity;
    layout.kv_dtype = config.kv_dtype;
    layout.block_size = config.block_size;
    layout.layer_bytes = transfer.block_bytes_per_layer();
    layout.extra = config.state_layout;
    store_ = std::make_unique<kv::KvBlockStore>(sc, kv::KvStoreFingerprint::from_layout(layout),
                                                log_store_line);
    writer_ = std::make_unique<kv::KvStoreWriter>(*store_);
    sweeper_ = std::make_unique<kv::KvStoreSweeper>(*store_, config.sweep_interval);
    try {
      for (int i = 0; i < std::max(config.fetch_threads, 1); ++i)
        pool_.emplace_back([this] { fetch_worker(); });
    } catch (...) {
      stop_fetch_pool();  // the destructor will not run: join what started
      throw;
    }
  }
}

KvTiers::~KvTiers() {
  // Reads under way finish first; queued ones are dropped with their requests.
  stop_fetch_pool();
  try {
    flush();
  } catch (const std::exception& e) {
    // The device failed under a pending export: those blocks are simply not cached.
    log_store_line(std::string("write-through at shutdown failed: ") + e.what());
  }
}

kv::BlockKey KvTiers::key_of(const Sequence& seq, int block) const {
  const auto b = static_cast<size_t>(block);
  const auto bs = static_cast<size_t>(config_.block_size);
  return kv::BlockKey{seq.block_hashes[b], b == 0 ? kv::kRootHash : seq.block_hashes[b - 1],
                      std::span<const int32_t>(seq.tokens.data() + b * bs, bs)};
}

uint64_t KvTiers::store_file_bytes(bool with_snapshot) const {
  return kv::kKvBlockHeaderBytes + 4ULL * static_cast<uint64_t>(config_.block_size) + kv_bytes_ +
         (with_snapshot ? state_bytes_ : 0);
}

KvTiers::Plan KvTiers::plan(std::span<const kv::BlockHash> hashes, int gpu_indexed,
                            int gpu_hit) const {
  Plan p;
  if (static_cast<int>(hashes.size()) <= gpu_hit) return p;
  const std::vector<uint64_t> host =
      host_ ? host_->match_prefix_sizes(hashes) : std::vector<uint64_t>{};
  std::vector<uint64_t> store =
      store_ ? store_->match_prefix_sizes(hashes) : std::vector<uint64_t>{};
  // A file of another size is damaged (get() would refuse it): the usable run ends before it.
  const auto bad = std::find_if(store.begin(), store.end(), [&](uint64_t n) {
    return n != store_file_bytes(false) && n != store_file_bytes(true);
  });
  store.erase(bad, store.end());
  const auto in = [](const std::vector<uint64_t>& sizes, int i) {
    return i < static_cast<int>(sizes.size());
  };
  // Each tier holds a leading run of the chain, so together they cover the longest run.
  const int covered =
      std::max({gpu_indexed, static_cast<int>(host.size()), static_cast<int>(store.size())});
  for (int k = covered; k > gpu_hit; --k) {
    const int last = k - 1;
    const size_t l = static_cast<size_t>(last);
    Tier snapshot;
    if (state_bytes_ == 0) {
      // bounded_replay: no snapshot to find; the covered run is the hit (its last block from
      // where it is read, or the GPU's own).
      snapshot = in(host, last) ? Tier::kHost : Tier::kStore;
    } else if (in(host, last) && host[l] == kv_bytes_ + state_bytes_) {
      snapshot = Tier::kHost;
    } else if (in(store, last) && store[l] == store_file_bytes(true)) {
      snapshot = Tier::kStore;
    } else {
      continue;
    }
    p.num_blocks = k;
    p.reuse = std::min(gpu_indexed, k);
    p.gpu_hit = gpu_hit;
    p.snapshot_source = snapshot;
    for (int i = p.reuse; i < k; ++i)
      p.sources.push_back(i == last ? snapshot : in(host, i) ? Tier::kHost : Tier::kStore);
    return p;
  }
  return p;
}

std::string KvTiers::take_host(FetchItem& item) {
  const kv::BlockKey key{item.hash, item.parent, item.tokens};
  std::shared_ptr<const kv::HostBlock> block = host_->lookup(key);
  if (!block) return "block " + std::to_string(item.block) + " left the host tier";
  const uint64_t n = block->bytes().size();
  const uint64_t full = kv_bytes_ + state_bytes_;
  if (item.with_state ? n != full : (n != kv_bytes_ && n != full))
    return "host block " + std::to_string(item.block) + " has " + std::to_string(n) + " bytes";
  item.bytes = block->bytes();
  item.owner = std::move(block);
  return "";
}

std::string KvTiers::read_store(FetchItem& item) {
  const kv::BlockKey key{item.hash, item.parent, item.tokens};
  std::optional<kv::KvStoreBlock> got = store_->get(key);
  if (!got) return "store block " + std::to_string(item.block) + " is missing or damaged";
  const uint64_t n = got->payload.size();
  const bool plain = n == kv_bytes_ && got->state_bytes == 0;
  const bool snap = n == kv_bytes_ + state_bytes_ && got->state_bytes == state_bytes_;
  if (item.with_state ? !snap : !(plain || snap)) {
    return "store block " + std::to_string(item.block) + " has a payload of " + std::to_string(n) +
           " bytes (state " + std::to_string(got->state_bytes) + ")";
  }
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(got->payload));
  item.bytes = std::span<const uint8_t>(*owner);
  item.owner = std::move(owner);
  return "";
}

KvTiers::FetchId KvTiers::start_fetch(const Sequence& seq, const Plan& plan) {
  DEEPINFER_CHECK(plan.num_blocks > 0 && plan.reuse <= plan.num_blocks &&
                      plan.sources.size() == static_cast<size_t>(plan.num_blocks - plan.reuse),
                  "fetch of an empty or inconsistent plan");
  if (hooks_.before_setup) hooks_.before_setup();
  auto job = std::make_shared<FetchJob>();
  job->plan = plan;
  job->started = std::chrono::steady_clock::now();
  const int last = plan.num_blocks - 1;
  auto add = [&](int i, Tier tier, bool with_state) {
    const kv::BlockKey key = key_of(seq, i);
    FetchItem& item = job->items.emplace_back();
    item.block = i;
    item.tier = tier;
    item.with_state = with_state;
    item.hash = key.hash;
    item.parent = key.parent;
    item.tokens.assign(key.tokens.begin(), key.tokens.end());
  };
  for (int i = plan.reuse; i < plan.num_blocks; ++i)
    add(i, plan.sources[static_cast<size_t>(i - plan.reuse)], i == last);
  // The GPU holds the KV; only its snapshot is gone (bounded_replay needs none: nothing to read).
  if (plan.reuse == plan.num_blocks && state_bytes_ > 0) add(last, plan.snapshot_source, true);
  // Host blocks are memory: taken now, so that the host tier's LRU cannot drop them meanwhile.
  for (FetchItem& item : job->items) {
    if (item.tier != Tier::kHost) continue;
    job->failure = take_host(item);
    if (!job->failure.empty()) break;
  }
  const bool reads_store =
      std::any_of(job->items.begin(), job->items.end(),
                  [](const FetchItem& item) { return item.tier == Tier::kStore; });
  const FetchId id = next_fetch_++;
  const bool queue = job->failure.empty() && reads_store;
  if (!queue) {
    job->done = true;  // never shared with the pool
    job->finished = job->started;
  }
  // Registered and queued together or not at all: a fetch that is known but never queued would
  // keep its request fetching forever.
  try {
    fetches_.emplace(id, job);
    for (const FetchItem& item : job->items) reading_.emplace(item.hash, id);
    if (queue) {
      job->queued = true;
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(job);
    }
  } catch (...) {
    forget_fetch(id, *job);
    throw;
  }
  if (queue) work_cv_.notify_one();
  return id;
}

void KvTiers::forget_fetch(FetchId id, const FetchJob& job) {
  fetches_.erase(id);
  for (const FetchItem& item : job.items) {
    auto it = reading_.find(item.hash);
    if (it != reading_.end() && it->second == id) reading_.erase(it);
  }
}

KvTiers::FetchId KvTiers::fetch_reading(std::span<const kv::BlockHash> hashes) const {
  if (reading_.empty()) return 0;
  for (kv::BlockHash h : hashes) {
    auto it = reading_.find(h);
    if (it != reading_.end()) return it->second;
  }
  return 0;
}

void KvTiers::fetch_worker() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [this] { return stop_ || (!held_ && !queue_.empty()); });
    if (stop_) return;
    std::shared_ptr<FetchJob> job = std::move(queue_.front());
    queue_.pop_front();
    if (job->cancelled) continue;
    const std::function<void(kv::BlockHash)> before_read = hooks_.before_read;
    lock.unlock();
    // Only this thread touches the job's items until `done` is set under the lock.
    std::string failure;
    for (FetchItem& item : job->items) {
      if (item.tier != Tier::kStore) continue;
      try {
        if (before_read) before_read(item.hash);
        failure = read_store(item);
      } catch (const std::exception& e) {
        failure = std::string("store read failed: ") + e.what();
      }
      if (!failure.empty()) break;
    }
    const auto finished = std::chrono::steady_clock::now();
    lock.lock();
    job->failure = std::move(failure);
    job->finished = finished;
    job->done = true;
    done_cv_.notify_all();
  }
}

KvTiers::FetchState KvTiers::finish_fetch(const Sequence& seq, FetchId id, Fetched& out) {
  auto it = fetches_.find(id);
  DEEPINFER_CHECK(it != fetches_.end(), "finish of an unknown fetch");
  std::shared_ptr<FetchJob> job = it->second;
  if (job->queued) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!job->done) return FetchState::kPending;
  }
  forget_fetch(id, *job);
  const Plan& plan = job->plan;
  if (job->queued) {
    const double seconds = std::chrono::duration<double>(job->finished - job->started).count();
    ++counters_.fetches;
    counters_.fetch_seconds_total += seconds;
    counters_.fetch_seconds_max = std::max(counters_.fetch_seconds_max, seconds);
  }
  if (!job->failure.empty()) {
    note_fetch_failure(plan.num_blocks - plan.gpu_hit, job->failure);
    return FetchState::kFailed;
  }
  out = Fetched{};
  out.reuse = plan.reuse;
  out.num_blocks = plan.num_blocks;
  const int last = plan.num_blocks - 1;
  for (size_t k = 0; k < job->items.size(); ++k) {
    FetchItem& item = job->items[k];
    // A store block goes into the host tier: the next hit on it is served from memory. Copied
    // into an arena block first, so this import reads it from there too (pinned on CUDA: a
    // direct copy instead of a staged one); the store read's buffer is freed.
    if (item.tier == Tier::kStore && host_) {
      const kv::BlockKey key{item.hash, item.parent, item.tokens};
      if (std::shared_ptr<kv::HostBlock> block = host_->make_block(key, item.bytes.size())) {
        std::copy(item.bytes.begin(), item.bytes.end(), block->mutable_bytes().begin());
        item.bytes = block->bytes();
        item.owner = block;
        host_->insert_block(std::move(block));  // a key held already keeps its own block
      } else {
        host_->insert(key, item.bytes);
      }
    }
    const bool only_state = plan.reuse == plan.num_blocks;
    if (!only_state) out.blocks.push_back(item.bytes.first(kv_bytes_));
    if (item.block == last && item.with_state) out.state = item.bytes.subspan(kv_bytes_);
    out.owners.push_back(std::move(item.owner));
  }
  auto count = [&](Tier t, int blocks) {
    uint64_t& n = t == Tier::kHost ? counters_.host_hit_tokens : counters_.store_hit_tokens;
    n += static_cast<uint64_t>(blocks) * static_cast<uint64_t>(config_.block_size);
  };
  if (state_bytes_ > 0) count(plan.snapshot_source, plan.reuse - plan.gpu_hit);
  for (Tier t : plan.sources) count(t, 1);
  touch_chain_head_last(seq, plan.num_blocks);
  return FetchState::kReady;
}

void KvTiers::cancel_fetch(FetchId id) {
  auto it = fetches_.find(id);
  if (it == fetches_.end()) return;
  {
    // The pool skips it if not yet started; a read under way finishes into the job's own
    // buffers, freed with the pool's last reference.
    std::lock_guard<std::mutex> lock(mu_);
    it->second->cancelled = true;
  }
  std::shared_ptr<FetchJob> job = it->second;
  forget_fetch(id, *job);
}

void KvTiers::wait_for_fetch(std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait_for(lock, timeout, [this] {
    for (const auto& [id, job] : fetches_)
      if (job->done) return true;
    return fetches_.empty();
  });
}

void KvTiers::hold_fetches(bool hold) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = hold;
  }
  work_cv_.notify_all();
}

void KvTiers::set_fetch_test_hooks(FetchTestHooks hooks) {
  std::lock_guard<std::mutex> lock(mu_);
  hooks_ = std::move(hooks);
}

void KvTiers::note_fetch_failure(int blocks, const std::string& why) {
  ++counters_.fetch_failures;
  log_store_line("KV tier fetch of " + std::to_string(blocks) + " blocks failed (" + why +
                 "); the request recomputes them");
}

void KvTiers::stop_fetch_pool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  work_cv_.notify_all();
  for (std::thread& t : pool_) t.join();
  pool_.clear();
}

// A hit needs a chain's blocks from its first one, so under LRU the head must outlive the tail:
// touch the chain from its last block back to block 0, which leaves block 0 the most recent.
void KvTiers::touch_chain_head_last(const Sequence& seq, int num_blocks) {
  if (!host_) return;
  for (int i = num_blocks - 1; i >= 0; --i) host_->lookup(key_of(seq, i));
}

void KvTiers::import(const Fetched& fetched, std::span<const kv::BlockId> blocks, int32_t slot) {
  DEEPINFER_CHECK(blocks.size() == fetched.blocks.size(),
                  "import of fetched KV into a different number of blocks");
  // One owner for all the payloads: a direct (pinned) copy holds it until the copies ran, so a
  // host block evicted meanwhile keeps its arena memory until then.
  auto keep_alive =
      std::make_shared<const std::vector<std::shared_ptr<const void>>>(fetched.owners);
  if (state_bytes_ == 0) {
    // bounded_replay: no snapshot; the slot starts zeroed and the replay rebuilds its rings.
    const std::vector<uint8_t> zeros(static_cast<size_t>(transfer_.state_bytes()), 0);
    transfer_.import_fetched(blocks, fetched.blocks, slot, zeros, keep_alive);
    return;
  }
  transfer_.import_fetched(blocks, fetched.blocks, slot, fetched.state, keep_alive);
}

bool KvTiers::held(const kv::BlockKey& key, bool with_snapshot) {
  const std::span<const kv::BlockHash> one(&key.hash, 1);
  if (host_) {
    const std::vector<uint64_t> sizes = host_->match_prefix_sizes(one);
    return !sizes.empty() && (!with_snapshot || sizes[0] == kv_bytes_ + state_bytes_);
  }
  // Store only: a stored block is never replaced (the first writer wins), so writing it again,
  // snapshot or not, gains nothing.
  const std::vector<uint64_t> sizes = store_->match_prefix_sizes(one);
  if (sizes.empty()) return false;
  if (sizes[0] == store_file_bytes(false) || sizes[0] == store_file_bytes(true)) return true;
  // A damaged file (truncated, say) would keep the fresh block out forever: get() removes it.
  store_->get(key);
  return false;
}

void KvTiers::write_through(const Sequence& seq, int num_blocks, int32_t snapshot_slot) {
  DEEPINFER_CHECK(num_blocks >= 1 && static_cast<size_t>(num_blocks) <= seq.block_hashes.size() &&
                      static_cast<size_t>(num_blocks) <= seq.block_table.size() &&
                      num_blocks * config_.block_size <= seq.num_computed,
                  "write-through of blocks that are not committed and full");
  // An exact-mode block without its snapshot would store a state nobody computed.
  DEEPINFER_CHECK(snapshot_slot >= 0 || state_bytes_ == 0,
                  "write-through without a state snapshot under kv_window_state exact");
  PendingExport pending;
  const std::string& retention = seq.params.kv_retention;
  pending.traffic_class = retention.empty()      ? config_.traffic_class
                          : retention == "agent" ? kv::TrafficClass::kAgent
                                                 : kv::TrafficClass::kChat;
  for (int i = 0; i < num_blocks; ++i) {
    const bool last = i == num_blocks - 1;
    const kv::BlockKey key = key_of(seq, i);
    if (pending_hashes_.contains(key.hash) || held(key, last)) continue;
    ExportedBlock b;
    b.hash = key.hash;
    b.parent = key.parent;
    b.tokens.assign(key.tokens.begin(), key.tokens.end());
    b.state_bytes = last ? state_bytes_ : 0;
    const size_t size = kv_bytes_ + b.state_bytes;
    // Straight into the host tier's arena (a device copy into pinned memory, adopted at publish
    // without a copy); ordinary memory when there is no host tier or its arena has no room.
    if (host_) b.block = host_->make_block(key, size);
    if (b.block) {
      b.payload = b.block->mutable_bytes();
      b.owner = b.block;
    } else {
      auto bytes = std::make_shared<std::vector<uint8_t>>(size);
      b.payload = std::span<uint8_t>(*bytes);
      b.owner = std::move(bytes);
    }
    transfer_.export_block(seq.block_table[static_cast<size_t>(i)],
                           b.state_bytes > 0 ? snapshot_slot : -1, b.payload, b.owner);
    pending_hashes_.insert(b.hash);
    pending.blocks.push_back(std::move(b));
  }
  if (pending.blocks.empty()) return;
  counters_.blocks_exported += pending.blocks.size();
  pending.done = transfer_.record_event();
  pending_.push_back(std::move(pending));
}

void KvTiers::publish(PendingExport& pending) {
  // Into the host tier tail first, so that under LRU a chain's head (which every hit needs)
  // is the most recent of its blocks.
  for (auto it = pending.blocks.rbegin(); host_ && it != pending.blocks.rend(); ++it) {
    const ExportedBlock& b = *it;
    const kv::BlockKey key{b.hash, b.parent, b.tokens};
    // A copy without the snapshot gives way to one with it (a hit needs the snapshot).
    const std::vector<uint64_t> sizes = host_->match_prefix_sizes({&b.hash, 1});
    if (!sizes.empty() && sizes[0] != b.payload.size() && b.state_bytes > 0) host_->erase(b.hash);
    if (b.block) {
      host_->insert_block(b.block);  // adopted: the store writer shares the same bytes
    } else {
      host_->insert(key, b.payload);
    }
  }
  for (ExportedBlock& b : pending.blocks) {
    pending_hashes_.erase(b.hash);
    if (writer_) {
      kv::KvStoreWrite w;
      w.hash = b.hash;
      w.parent = b.parent;
      w.tokens = std::move(b.tokens);
      w.payload = b.payload;
      w.payload_owner = b.owner;
      w.options.traffic_class = pending.traffic_class;
      w.options.state_bytes = b.state_bytes;
      writer_->submit(std::move(w));  // a full queue drops it: a later miss recomputes
    }
  }
}

void KvTiers::poll() {
  while (!pending_.empty() && pending_.front().done->query()) {
    publish(pending_.front());
    pending_.pop_front();
  }
}

void KvTiers::flush() {
  while (!pending_.empty()) {
    pending_.front().done->wait();
    publish(pending_.front());
    pending_.pop_front();
  }
  if (writer_) writer_->flush();
}

KvTierCounters KvTiers::counters() const {
  KvTierCounters c = counters_;
  if (host_) {
    const kv::HostBlockCacheStats h = host_->stats();
    c.host_pinned_bytes = h.arena_pinned ? h.arena_bytes : 0;
  }
  if (store_) {
    const kv::KvStoreStats s = store_->stats();
    c.store_bytes_read = s.bytes_read;
    c.store_bytes_written = s.bytes_written;
  }
  return c;
}

}  // namespace deepinfer::sched
