// KvAllocator: the KV blocks and live state slots of one engine's sequences, with the allocation
// rules the scheduler uses (admission, growth, release), consulting the PrefixCachePolicy for
// blocks a prompt can reuse. Owned by the engine thread.
#pragma once

#include <optional>
#include <vector>

#include "kv/block_pool.h"
#include "kv/cache_geometry.h"
#include "kv/state_pool.h"
#include "sched/kv_tiers.h"
#include "sched/prefix_cache_policy.h"
#include "sched/sequence.h"

namespace deepinfer::sched {

// Tokens a kv_window_state bounded_replay hit recomputes before the hit point: one block, so the
// replay starts on a block boundary (a multiple of every compression ratio: each compressor window
// is closed there, and the replay writes no paged block, only the state slot).
inline constexpr int kReplayTokens = kv::kBlockSize;

struct KvLayout {
  int num_blocks = 0;      // including block 0
  int num_live_slots = 0;  // including slot 0
  int num_snapshot_slots = 0;
  int block_size = kv::kBlockSize;
  bool prefix_cache = true;
  int hit_tail = 1;  // the prompt tokens a prefix-cache hit never covers (PrefixCachePolicy)
};

// kFetching: admitted on a tier hit whose blocks are still being read (poll_fetch finishes it).
// kWaitFetch: not admitted, holding nothing: another request's fetch is reading blocks the tier
// hit needs (seq.fetch_wait); admit again once fetch_waiting says it is over.
enum class AdmitStatus { kAdmitted, kFetching, kWaitFetch, kLater, kNever };

struct Admission {
  AdmitStatus status = AdmitStatus::kLater;
  int hit_tokens = 0;
  int32_t restore_snapshot = -1;  // copy this snapshot slot into the sequence's slot first
};

class KvAllocator {
 public:
  explicit KvAllocator(const KvLayout& layout);

  const KvLayout& layout() const { return layout_; }
  const kv::BlockPool& blocks() const { return blocks_; }
  const kv::StatePool& live_slots() const { return live_; }
  PrefixCachePolicy& prefix_cache() { return prefix_; }
  const PrefixCachePolicy& prefix_cache() const { return prefix_; }
  // The host and store tiers behind the prefix cache (not owned; null: none). Set before the
  // first admission.
  void set_tiers(KvTiers* tiers) { tiers_ = tiers; }

  // Gives `seq` (holding nothing) a state slot and blocks for its first num_tokens positions,
  // reusing cached prefix blocks. kLater: not enough free blocks or slots now; kNever: the
  // sequence needs more blocks than exist. With tiers, a longer prefix than the GPU index holds
  // is fetched from them into fresh blocks and the sequence's slot: at once when every block is
  // in host memory, else kFetching (the blocks and slot are reserved; poll_fetch finishes it).
  Admission admit(Sequence& seq);
  // Non-blocking, for a kFetching sequence. kAdmitted: the fetched bytes are imported and the
  // hit is in `hit_tokens`; kFetching: still reading; kLater: the fetch failed, everything it
  // held is released and the sequence is to be admitted again from the GPU index alone.
  Admission poll_fetch(Sequence& seq);
  // For a kWaitFetch sequence: whether the fetch it waits for is still under way; once it is not
  // (adopted, failed or cancelled), clears seq.fetch_wait and the sequence is admitted again.
  bool fetch_waiting(Sequence& seq) const;
  // After a commit: the prefix cache takes the sequence's new full blocks and `snapshot`; once a
  // snapshot is attached, the tiers write the prefix through. Under kv_window_state
  // bounded_replay the tiers also take the full prompt blocks once the prompt is committed up to
  // its hit limit, snapshot or not (a replayed sequence takes none).
  void on_committed(Sequence& seq, int32_t snapshot, int snapshot_pos);
  // Grows the block table to cover positions [0, num_positions). False if no block is free.
  bool grow(Sequence& seq, int num_positions);
  // Blocks needed to hold `num_positions` positions.
  int blocks_for(int num_positions) const;
  // Returns the blocks (last first, so a prefix stays cached longest) and the slot; cancels a
  // tier fetch still under way.
  void release(Sequence& seq);

  int num_cached_free_blocks() const;  // free blocks still holding an indexed prefix
  // Throws Error(kInternal): every block's count equals the number of live tables holding it.
  void check_invariants(const std::vector<const Sequence*>& holders) const;

 private:
  // Admission from the tiers when they serve more than `hit`; nullopt: use the GPU hit.
  std::optional<Admission> admit_from_tiers(Sequence& seq, const PrefixCachePolicy::Hit& hit,
                                            int needed);
  // Imports a finished fetch into seq's reserved blocks and slot and indexes the blocks.
  Admission complete_fetch(Sequence& seq, const KvTiers::Fetched& fetched);

  KvLayout layout_;
  kv::BlockPool blocks_;
  kv::StatePool live_;
  PrefixCachePolicy prefix_;
  KvTiers* tiers_ = nullptr;
};

}  // namespace deepinfer::sched
