#include "sched/kv_tiers.h"

#include <algorithm>
#include <exception>
#include <iostream>
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
      state_bytes_(static_cast<uint64_t>(transfer.state_bytes())) {
  if (config.host_bytes > 0) host_ = std::make_unique<kv::HostBlockCache>(config.host_bytes);
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
  }
}

KvTiers::~KvTiers() {
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
    if (in(host, last) && host[l] == kv_bytes_ + state_bytes_) {
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

std::optional<KvTiers::Fetched> KvTiers::fetch(const Sequence& seq, const Plan& plan) {
  DEEPINFER_CHECK(plan.num_blocks > 0 && plan.reuse <= plan.num_blocks, "fetch of an empty plan");
  Fetched f;
  // The payload of block `i` from `tier`, checked to hold its KV (and a snapshot if `with_state`).
  auto read = [&](int i, Tier tier, bool with_state) -> std::optional<std::span<const uint8_t>> {
    const kv::BlockKey key = key_of(seq, i);
    const uint64_t full = kv_bytes_ + state_bytes_;
    if (tier == Tier::kHost) {
      std::shared_ptr<const kv::HostBlock> block = host_->lookup(key);
      if (!block) return std::nullopt;
      const uint64_t n = block->bytes().size();
      if (with_state ? n != full : (n != kv_bytes_ && n != full)) return std::nullopt;
      f.owners.push_back(block);
      return block->bytes();
    }
    std::optional<kv::KvStoreBlock> got = store_->get(key);
    if (!got) return std::nullopt;
    const uint64_t n = got->payload.size();
    const bool plain = n == kv_bytes_ && got->state_bytes == 0;
    const bool snap = n == full && got->state_bytes == state_bytes_;
    if (with_state ? !snap : !(plain || snap)) return std::nullopt;
    auto owner = std::make_shared<std::vector<uint8_t>>(std::move(got->payload));
    if (host_) host_->insert(key, *owner);  // the next hit on it is served from memory
    f.owners.push_back(owner);
    return std::span<const uint8_t>(*owner);
  };
  const int last = plan.num_blocks - 1;
  for (int i = plan.reuse; i < plan.num_blocks; ++i) {
    const bool with_state = i == last;
    std::optional<std::span<const uint8_t>> p =
        read(i, plan.sources[static_cast<size_t>(i - plan.reuse)], with_state);
    if (!p) {
      ++counters_.fetch_failures;
      return std::nullopt;
    }
    f.blocks.push_back(p->first(kv_bytes_));
    if (with_state) f.state = p->subspan(kv_bytes_);
  }
  if (plan.reuse == plan.num_blocks) {  // the GPU holds the KV; only its snapshot is gone
    std::optional<std::span<const uint8_t>> p = read(last, plan.snapshot_source, true);
    if (!p) {
      ++counters_.fetch_failures;
      return std::nullopt;
    }
    f.state = p->subspan(kv_bytes_);
  }
  auto count = [&](Tier t, int blocks) {
    uint64_t& n = t == Tier::kHost ? counters_.host_hit_tokens : counters_.store_hit_tokens;
    n += static_cast<uint64_t>(blocks) * static_cast<uint64_t>(config_.block_size);
  };
  count(plan.snapshot_source, plan.reuse - plan.gpu_hit);
  for (Tier t : plan.sources) count(t, 1);
  touch_chain_head_last(seq, plan.num_blocks);
  return f;
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
  for (size_t i = 0; i < blocks.size(); ++i) transfer_.import_block(blocks[i], fetched.blocks[i]);
  transfer_.import_state(slot, fetched.state);
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
    b.payload = std::make_shared<std::vector<uint8_t>>(kv_bytes_ + b.state_bytes);
    transfer_.export_block(seq.block_table[static_cast<size_t>(i)], last ? snapshot_slot : -1,
                           *b.payload, b.payload);
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
    if (!sizes.empty() && sizes[0] != b.payload->size() && b.state_bytes > 0) host_->erase(b.hash);
    host_->insert(key, *b.payload);
  }
  for (ExportedBlock& b : pending.blocks) {
    pending_hashes_.erase(b.hash);
    if (writer_) {
      kv::KvStoreWrite w;
      w.hash = b.hash;
      w.parent = b.parent;
      w.tokens = std::move(b.tokens);
      w.payload = std::span<const uint8_t>(*b.payload);
      w.payload_owner = b.payload;
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
  if (store_) {
    const kv::KvStoreStats s = store_->stats();
    c.store_bytes_read = s.bytes_read;
    c.store_bytes_written = s.bytes_written;
  }
  return c;
}

}  // namespace deepinfer::sched
