// PrefixCachePolicy: what the prefix cache keeps, and how much of a new prompt it serves.
//
// Paged blocks hold the compressed KV, but the sliding-window rings and compressor rings of a
// sequence live in its state slot and cannot be rebuilt from blocks. So a hit resumes from a
// state snapshot: when a prompt is admitted, its prefill is cut at the checkpoint
// S = floor((prompt_len - tail) / B) * B (B = block size, tail below) and the state slot is copied
// into a snapshot slot right after the chunk ending at S; the snapshot is attached to the block
// ending at S. A later prompt with the same first S tokens restores the snapshot into its own slot
// and computes only the rest. A hit is the longest run of indexed full blocks (never the whole
// prompt: the last prompt token must be computed to sample from it), shortened to the last block
// that carries a snapshot. Under DeepSeek-V4.1's YOCO prefill truncation a hit also leaves the last
// `tail` prompt tokens (the keep count) to compute: the consumer layers' rings there depend on
// where the prompt ends, so a snapshot of another prompt's prefill cannot supply them, and a hit
// then equals a cold run. Snapshots are evicted LRU when snapshot slots run out, and with their
// block when the block pool reuses it (on_block_evicted).
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/prefix_index.h"
#include "kv/state_pool.h"
#include "sched/sequence.h"

namespace deepinfer::sched {

class PrefixCachePolicy {
 public:
  // Snapshot slots are ids [first_snapshot_slot, + num_snapshot_slots). Without snapshot slots
  // (or with `enabled` false) nothing is indexed and every lookup misses.
  // `tail` (>= 1): the prompt tokens a hit never covers.
  PrefixCachePolicy(int block_size, bool enabled, int first_snapshot_slot, int num_snapshot_slots,
                    int tail = 1);

  bool enabled() const { return enabled_; }
  int tail() const { return tail_; }  // the prompt tokens a hit never covers
  // The most full blocks of `seq`'s prompt a hit may cover (the tail stays to compute).
  int hit_limit(const Sequence& seq) const;

  struct Hit {
    std::vector<kv::BlockId> blocks;  // indexed blocks holding the prompt's first blocks
    int32_t snapshot = -1;            // snapshot slot holding the state right after them
    // Every indexed leading block of the prompt (`blocks` is its prefix that ends at a snapshot);
    // the host and store tiers may supply a snapshot further along.
    std::vector<kv::BlockId> indexed;
  };
  // The cached prefix `seq` (holding nothing yet) may start from; extends its block hashes.
  Hit lookup(Sequence& seq);
  // The hit was taken: its snapshot becomes the most recently used.
  void touch(const Hit& hit);

  // The prefill checkpoint of a newly admitted sequence (0: none); see the header comment.
  int checkpoint(const Sequence& seq) const;
  // A free snapshot slot, evicting the least recently used snapshot if needed; -1 if none.
  int32_t take_snapshot_slot();
  void release_snapshot_slot(int32_t slot);  // ignores -1

  // After a commit: offers the sequence's newly computed full blocks to the index and, if
  // `snapshot` >= 0, attaches that snapshot (the state right after position `snapshot_pos`) to the
  // block ending there. A snapshot that cannot be attached is released. Returns whether
  // `snapshot` was attached (the tiers then write the prefix through).
  bool on_committed(Sequence& seq, int32_t snapshot, int snapshot_pos);
  // After a tier fetch into seq's blocks [from, to): indexes them. The fetched state goes into
  // the sequence's own slot and is not kept as a snapshot: a snapshot slot taken now could be the
  // one an earlier admission of the same plan restores from (its copy runs at launch, after this
  // import). A repeat of the prompt finds the KV here and reads only the state from the tier.
  void adopt_fetched(Sequence& seq, int from, int to);
  // The block pool is reusing `block`: forget it and free the snapshot it carried.
  void on_block_evicted(kv::BlockId block);

  const kv::PrefixIndex& index() const { return index_; }
  const kv::StatePool& snapshot_slots() const { return snapshots_; }
  // Throws Error(kInternal) on an inconsistent index, snapshot pool or LRU.
  void check_invariants() const;

 private:
  void extend_hashes(Sequence& seq, int num_full_blocks) const;

  int block_size_;
  bool enabled_;
  int tail_;
  kv::StatePool snapshots_;
  kv::PrefixIndex index_;
  std::list<kv::BlockId> snapshot_lru_;  // blocks carrying a snapshot, least recently used first
  std::unordered_map<kv::BlockId, std::list<kv::BlockId>::iterator> snapshot_pos_;
};

}  // namespace deepinfer::sched
