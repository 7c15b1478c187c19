// KvManager: the KV blocks, live state slots and prefix cache of one engine, with the allocation
// rules the scheduler uses. Owned by the engine thread.
//
// Prefix-cache hits resume from state snapshots. Paged blocks hold the compressed KV, but the
// sliding-window rings and compressor rings of a sequence live in its state slot and cannot be
// rebuilt from blocks. So when a prompt is admitted, its prefill is cut at the checkpoint
// S = floor((prompt_len - 1) / 128) * 128 and the state slot is copied into a snapshot slot right
// after the chunk ending at S; the snapshot is attached to the block ending at S. A later prompt
// with the same first S tokens restores the snapshot into its own slot and computes only the rest.
// A hit is the longest run of indexed full blocks (never the whole prompt: the last prompt token
// must be computed to sample from it), shortened to the last block that carries a snapshot.
// Snapshots are evicted LRU when snapshot slots run out, and with their block when it is reused.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/prefix_index.h"
#include "kv/state_pool.h"
#include "sched/sequence.h"

namespace deepinfer::sched {

struct KvLayout {
  int num_blocks = 0;      // including block 0
  int num_live_slots = 0;  // including slot 0
  int num_snapshot_slots = 0;
  int block_size = 128;
  bool prefix_cache = true;
};

enum class AdmitStatus { kAdmitted, kLater, kNever };

struct Admission {
  AdmitStatus status = AdmitStatus::kLater;
  int hit_tokens = 0;
  int32_t restore_snapshot = -1;  // copy this snapshot slot into the sequence's slot first
};

class KvManager {
 public:
  explicit KvManager(const KvLayout& layout);

  const KvLayout& layout() const { return layout_; }
  const kv::BlockPool& blocks() const { return blocks_; }
  const kv::StatePool& live_slots() const { return live_; }
  const kv::StatePool& snapshot_slots() const { return snapshots_; }
  const kv::PrefixIndex& prefix_index() const { return index_; }

  // Gives `seq` (holding nothing) a state slot and blocks for its first num_tokens positions,
  // reusing cached prefix blocks. kLater: not enough free blocks or slots now; kNever: the
  // sequence needs more blocks than exist.
  Admission admit(Sequence& seq);
  // Grows the block table to cover positions [0, num_positions). False if no block is free.
  bool grow(Sequence& seq, int num_positions);
  // Blocks needed to hold `num_positions` positions.
  int blocks_for(int num_positions) const;
  // Returns the blocks (last first, so a prefix stays cached longest) and the slot.
  void release(Sequence& seq);

  // The prefill checkpoint of a newly admitted sequence (0: none); see the header comment.
  int snapshot_checkpoint(const Sequence& seq) const;
  // A free snapshot slot, evicting the least recently used snapshot if needed; -1 if none.
  int32_t take_snapshot_slot();
  void release_snapshot_slot(int32_t slot);

  // After a commit: offers the sequence's newly computed full blocks to the prefix index and, if
  // `snapshot` >= 0, attaches that snapshot (the state right after position `snapshot_pos`) to the
  // block ending there. A snapshot that cannot be attached is released.
  void on_committed(Sequence& seq, int32_t snapshot = -1, int snapshot_pos = 0);

  int num_cached_free_blocks() const;
  // Throws Error(kInternal): every block's count equals the number of live tables holding it.
  void check_invariants(const std::vector<const Sequence*>& holders) const;

 private:
  void extend_hashes(Sequence& seq, int num_full_blocks) const;
  void on_block_evicted(kv::BlockId block);
  void touch_snapshot(kv::BlockId block);

  KvLayout layout_;
  kv::BlockPool blocks_;
  kv::StatePool live_;
  kv::StatePool snapshots_;
  kv::PrefixIndex index_;
  std::list<kv::BlockId> snapshot_lru_;  // blocks carrying a snapshot, least recently used first
  std::unordered_map<kv::BlockId, std::list<kv::BlockId>::iterator> snapshot_pos_;
};

}  // namespace deepinfer::sched
