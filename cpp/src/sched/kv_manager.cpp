#include "sched/kv_manager.h"

#include <algorithm>
#include <map>
#include <span>

#include "deepinfer/error.h"

namespace deepinfer::sched {

KvManager::KvManager(const KvLayout& layout)
    : layout_(layout),
      blocks_(layout.num_blocks),
      live_(1, layout.num_live_slots - 1),
      snapshots_(layout.num_live_slots, layout.num_snapshot_slots),
      index_(layout.block_size) {
  blocks_.set_eviction_listener([this](kv::BlockId b) { on_block_evicted(b); });
}

int KvManager::blocks_for(int num_positions) const {
  return (num_positions + layout_.block_size - 1) / layout_.block_size;
}

void KvManager::extend_hashes(Sequence& seq, int num_full_blocks) const {
  const int bs = layout_.block_size;
  while (static_cast<int>(seq.block_hashes.size()) < num_full_blocks) {
    const size_t b = seq.block_hashes.size();
    const kv::BlockHash parent = b == 0 ? kv::kRootHash : seq.block_hashes[b - 1];
    std::span<const int32_t> block(seq.tokens.data() + b * static_cast<size_t>(bs),
                                   static_cast<size_t>(bs));
    seq.block_hashes.push_back(kv::chain_hash(parent, block));
  }
}

Admission KvManager::admit(Sequence& seq) {
  DEEPINFER_CHECK(!seq.holds_resources(), "admit of a sequence that holds resources");
  const int bs = layout_.block_size;
  const int needed = blocks_for(seq.num_tokens());
  Admission result;
  if (needed > blocks_.num_usable()) {
    result.status = AdmitStatus::kNever;
    return result;
  }
  // Longest indexed prefix, never covering the last token, cut back to a block with a snapshot.
  std::vector<kv::BlockId> hits;
  if (layout_.prefix_cache && layout_.num_snapshot_slots > 0) {
    const int limit = (seq.num_tokens() - 1) / bs;
    extend_hashes(seq, limit);
    std::vector<kv::BlockId> matched = index_.match(
        std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(limit) * bs),
        std::span<const kv::BlockHash>(seq.block_hashes.data(), static_cast<size_t>(limit)));
    for (size_t k = matched.size(); k > 0; --k) {
      int32_t snap = index_.snapshot(matched[k - 1]);
      if (snap >= 0) {
        hits.assign(matched.begin(), matched.begin() + static_cast<ptrdiff_t>(k));
        result.restore_snapshot = snap;
        break;
      }
    }
  }
  // Hit blocks sitting on the free list stop being free once acquired.
  int hits_free = 0;
  for (kv::BlockId b : hits) hits_free += blocks_.is_free(b) ? 1 : 0;
  const int fresh = needed - static_cast<int>(hits.size());
  if (blocks_.num_free() - hits_free < fresh || live_.num_free() == 0) {
    result.restore_snapshot = -1;
    return result;  // kLater
  }
  for (kv::BlockId b : hits) {
    blocks_.acquire(b);
    seq.block_table.push_back(b);
  }
  for (int i = 0; i < fresh; ++i) seq.block_table.push_back(*blocks_.allocate());
  seq.state_slot = *live_.allocate();
  seq.num_computed = static_cast<int>(hits.size()) * bs;
  seq.num_indexed_blocks = static_cast<int>(hits.size());
  if (!hits.empty()) touch_snapshot(hits.back());
  result.status = AdmitStatus::kAdmitted;
  result.hit_tokens = seq.num_computed;
  return result;
}

bool KvManager::grow(Sequence& seq, int num_positions) {
  const int needed = blocks_for(num_positions);
  while (static_cast<int>(seq.block_table.size()) < needed) {
    std::optional<kv::BlockId> b = blocks_.allocate();
    if (!b) return false;
    seq.block_table.push_back(*b);
  }
  return true;
}

void KvManager::release(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) blocks_.release(*it);
  seq.block_table.clear();
  if (seq.state_slot >= 0) live_.release(seq.state_slot);
  seq.state_slot = -1;
  seq.num_indexed_blocks = 0;
}

int KvManager::snapshot_checkpoint(const Sequence& seq) const {
  if (!layout_.prefix_cache || layout_.num_snapshot_slots == 0) return 0;
  const int bs = layout_.block_size;
  const int checkpoint = (seq.num_tokens() - 1) / bs * bs;
  return checkpoint > seq.num_computed ? checkpoint : 0;
}

int32_t KvManager::take_snapshot_slot() {
  if (std::optional<int32_t> s = snapshots_.allocate()) return *s;
  if (snapshot_lru_.empty()) return -1;  // every snapshot is still being written
  const kv::BlockId victim = snapshot_lru_.front();
  snapshot_lru_.pop_front();
  snapshot_pos_.erase(victim);
  return index_.set_snapshot(victim, -1);
}

void KvManager::release_snapshot_slot(int32_t slot) {
  if (slot >= 0) snapshots_.release(slot);
}

void KvManager::touch_snapshot(kv::BlockId block) {
  auto it = snapshot_pos_.find(block);
  if (it == snapshot_pos_.end()) return;
  snapshot_lru_.splice(snapshot_lru_.end(), snapshot_lru_, it->second);
}

void KvManager::on_block_evicted(kv::BlockId block) {
  const int32_t snap = index_.erase_block(block);
  if (snap < 0) return;
  auto it = snapshot_pos_.find(block);
  if (it != snapshot_pos_.end()) {
    snapshot_lru_.erase(it->second);
    snapshot_pos_.erase(it);
  }
  snapshots_.release(snap);
}

void KvManager::on_committed(Sequence& seq, int32_t snapshot, int snapshot_pos) {
  const int bs = layout_.block_size;
  bool attached = snapshot < 0;
  if (layout_.prefix_cache) {
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
}

int KvManager::num_cached_free_blocks() const {
  int n = 0;
  for (kv::BlockId b = 1; b < blocks_.num_blocks(); ++b) {
    if (blocks_.is_free(b) && index_.contains_block(b)) ++n;
  }
  return n;
}

void KvManager::check_invariants(const std::vector<const Sequence*>& holders) const {
  blocks_.check_invariants();
  live_.check_invariants();
  snapshots_.check_invariants();
  index_.check_invariants();
  std::map<kv::BlockId, int> refs;
  int slots = 0;
  for (const Sequence* s : holders) {
    for (kv::BlockId b : s->block_table) ++refs[b];
    if (s->state_slot >= 0) {
      ++slots;
      if (!live_.is_allocated(s->state_slot)) {
        throw Error(ErrorCode::kInternal, "sequence " + std::to_string(s->id) +
                                              " holds state slot " + std::to_string(s->state_slot) +
                                              " that is not allocated");
      }
    }
  }
  for (kv::BlockId b = 1; b < blocks_.num_blocks(); ++b) {
    auto it = refs.find(b);
    const int want = it == refs.end() ? 0 : it->second;
    if (blocks_.ref_count(b) != want) {
      throw Error(ErrorCode::kInternal, "block " + std::to_string(b) + " has ref count " +
                                            std::to_string(blocks_.ref_count(b)) + " but " +
                                            std::to_string(want) + " live block tables hold it");
    }
  }
  if (refs.count(0) != 0) throw Error(ErrorCode::kInternal, "block 0 was handed out");
  if (slots != live_.num_used()) {
    throw Error(ErrorCode::kInternal, std::to_string(live_.num_used()) +
                                          " state slots allocated but " + std::to_string(slots) +
                                          " sequences hold one");
  }
  if (static_cast<size_t>(snapshots_.num_used()) < snapshot_lru_.size()) {
    throw Error(ErrorCode::kInternal, "more attached snapshots than allocated snapshot slots");
  }
}

}  // namespace deepinfer::sched
