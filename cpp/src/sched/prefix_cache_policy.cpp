#include "sched/prefix_cache_policy.h"

#include <algorithm>
#include <span>

#include "deepinfer/error.h"

namespace deepinfer::sched {

PrefixCachePolicy::PrefixCachePolicy(int block_size, bool enabled, int first_snapshot_slot,
                                     int num_snapshot_slots, int tail)
    : block_size_(block_size),
      enabled_(enabled && num_snapshot_slots > 0),
      tail_(std::max(1, tail)),
      snapshots_(first_snapshot_slot, num_snapshot_slots),
      index_(block_size) {}

void PrefixCachePolicy::extend_hashes(Sequence& seq, int num_full_blocks) const {
  const int bs = block_size_;
  while (static_cast<int>(seq.block_hashes.size()) < num_full_blocks) {
    const size_t b = seq.block_hashes.size();
    const kv::BlockHash parent = b == 0 ? kv::kRootHash : seq.block_hashes[b - 1];
    std::span<const int32_t> block(seq.tokens.data() + b * static_cast<size_t>(bs),
                                   static_cast<size_t>(bs));
    seq.block_hashes.push_back(kv::chain_hash(parent, block));
  }
}

int PrefixCachePolicy::hit_limit(const Sequence& seq) const {
  return std::max(0, seq.num_tokens() - tail_) / block_size_;
}

PrefixCachePolicy::Hit PrefixCachePolicy::lookup(Sequence& seq) {
  Hit hit;
  if (!enabled_) return hit;
  // Longest indexed prefix, never covering the tail, cut back to a block with a snapshot.
  const int bs = block_size_;
  const int limit = hit_limit(seq);
  extend_hashes(seq, limit);
  std::vector<kv::BlockId> matched = index_.match(
      std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(limit) * bs),
      std::span<const kv::BlockHash>(seq.block_hashes.data(), static_cast<size_t>(limit)));
  hit.indexed = matched;
  for (size_t k = matched.size(); k > 0; --k) {
    const int32_t snap = index_.snapshot(matched[k - 1]);
    if (snap >= 0) {
      hit.blocks.assign(matched.begin(), matched.begin() + static_cast<ptrdiff_t>(k));
      hit.snapshot = snap;
      break;
    }
  }
  return hit;
}

void PrefixCachePolicy::touch(const Hit& hit) {
  if (hit.blocks.empty()) return;
  auto it = snapshot_pos_.find(hit.blocks.back());
  if (it == snapshot_pos_.end()) return;
  snapshot_lru_.splice(snapshot_lru_.end(), snapshot_lru_, it->second);
}

int PrefixCachePolicy::checkpoint(const Sequence& seq) const {
  if (!enabled_) return 0;
  const int bs = block_size_;
  // The furthest point a later hit on this prompt may resume from (hit_limit).
  const int checkpoint = hit_limit(seq) * bs;
  return checkpoint > seq.num_computed ? checkpoint : 0;
}

int32_t PrefixCachePolicy::take_snapshot_slot() {
  if (std::optional<int32_t> s = snapshots_.allocate()) return *s;
  if (snapshot_lru_.empty()) return -1;  // every snapshot is still being written
  const kv::BlockId victim = snapshot_lru_.front();
  snapshot_lru_.pop_front();
  snapshot_pos_.erase(victim);
  return index_.set_snapshot(victim, -1);
}

void PrefixCachePolicy::release_snapshot_slot(int32_t slot) {
  if (slot >= 0) snapshots_.release(slot);
}

void PrefixCachePolicy::on_block_evicted(kv::BlockId block) {
  const int32_t snap = index_.erase_block(block);
  if (snap < 0) return;
  auto it = snapshot_pos_.find(block);
  if (it != snapshot_pos_.end()) {
    snapshot_lru_.erase(it->second);
    snapshot_pos_.erase(it);
  }
  snapshots_.release(snap);
}

void PrefixCachePolicy::adopt_fetched(Sequence& seq, int from, int to) {
  if (!enabled_) return;
  const int bs = block_size_;
  extend_hashes(seq, to);
  for (int b = from; b < to; ++b) {
    const auto i = static_cast<size_t>(b);
    const kv::BlockHash parent = b == 0 ? kv::kRootHash : seq.block_hashes[i - 1];
    index_.insert(seq.block_hashes[i], parent,
                  std::span<const int32_t>(seq.tokens.data() + i * bs, static_cast<size_t>(bs)),
                  seq.block_table[i]);
  }
}

bool PrefixCachePolicy::on_committed(Sequence& seq, int32_t snapshot, int snapshot_pos) {
  const int bs = block_size_;
  bool attached = snapshot < 0;
  if (enabled_) {
    const int full = std::min(seq.num_computed / bs, static_cast<int>(seq.block_table.size()));
    extend_hashes(seq, full);
    for (int b = seq.num_indexed_blocks; b < full; ++b) {
      const kv::BlockHash parent =
          b == 0 ? kv::kRootHash : seq.block_hashes[static_cast<size_t>(b) - 1];
      std::span<const int32_t> tokens(seq.tokens.data() + static_cast<size_t>(b) * bs,
                                      static_cast<size_t>(bs));
      index_.insert(seq.block_hashes[static_cast<size_t>(b)], parent, tokens,
                    seq.block_table[static_cast<size_t>(b)]);
    }
    seq.num_indexed_blocks = std::max(seq.num_indexed_blocks, full);
    if (snapshot >= 0 && snapshot_pos > 0 && snapshot_pos % bs == 0 && snapshot_pos / bs <= full) {
      const kv::BlockId block = seq.block_table[static_cast<size_t>(snapshot_pos / bs - 1)];
      if (index_.contains_block(block) && index_.snapshot(block) < 0) {
        index_.set_snapshot(block, snapshot);
        snapshot_pos_[block] = snapshot_lru_.insert(snapshot_lru_.end(), block);
        attached = true;
      }
    }
  }
  if (!attached) snapshots_.release(snapshot);
  return snapshot >= 0 && attached;
}

void PrefixCachePolicy::check_invariants() const {
  snapshots_.check_invariants();
  index_.check_invariants();
  if (static_cast<size_t>(snapshots_.num_used()) < snapshot_lru_.size()) {
    throw Error(ErrorCode::kInternal, "more attached snapshots than allocated snapshot slots");
  }
  for (kv::BlockId b : snapshot_lru_) {
    if (!index_.contains_block(b) || index_.snapshot(b) < 0) {
      throw Error(ErrorCode::kInternal,
                  "block " + std::to_string(b) + " is in the snapshot LRU but carries no snapshot");
    }
  }
}

}  // namespace deepinfer::sched
