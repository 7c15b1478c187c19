#include "sched/kv_allocator.h"

#include <algorithm>
#include <exception>
#include <map>
#include <span>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer::sched {

KvAllocator::KvAllocator(const KvLayout& layout)
    : layout_(layout),
      blocks_(layout.num_blocks),
      live_(1, layout.num_live_slots - 1),
      prefix_(layout.block_size, layout.prefix_cache, layout.num_live_slots,
              layout.num_snapshot_slots, layout.hit_tail) {
  blocks_.set_eviction_listener([this](kv::BlockId b) { prefix_.on_block_evicted(b); });
}

int KvAllocator::blocks_for(int num_positions) const {
  return (num_positions + layout_.block_size - 1) / layout_.block_size;
}

Admission KvAllocator::admit(Sequence& seq) {
  DEEPINFER_CHECK(!seq.holds_resources(), "admit of a sequence that holds resources");
  const int bs = layout_.block_size;
  const int needed = blocks_for(seq.num_tokens());
  Admission result;
  seq.swa_valid_start = 0;  // set again by a bounded_replay tier hit (complete_fetch)
  seq.replay_end = 0;
  seq.num_written_blocks = 0;
  if (needed > blocks_.num_usable()) {
    result.status = AdmitStatus::kNever;
    return result;
  }
  PrefixCachePolicy::Hit hit = prefix_.lookup(seq);
  if (tiers_ != nullptr && !seq.skip_tiers) {
    if (std::optional<Admission> a = admit_from_tiers(seq, hit, needed)) return *a;
  }
  const std::vector<kv::BlockId>& hits = hit.blocks;
  // Hit blocks sitting on the free list stop being free once acquired.
  int hits_free = 0;
  for (kv::BlockId b : hits) hits_free += blocks_.is_free(b) ? 1 : 0;
  const int fresh = needed - static_cast<int>(hits.size());
  if (blocks_.num_free() - hits_free < fresh || live_.num_free() == 0) return result;  // kLater
  for (kv::BlockId b : hits) {
    blocks_.acquire(b);
    seq.block_table.push_back(b);
  }
  for (int i = 0; i < fresh; ++i) seq.block_table.push_back(*blocks_.allocate());
  seq.state_slot = *live_.allocate();
  seq.num_computed = static_cast<int>(hits.size()) * bs;
  seq.num_indexed_blocks = static_cast<int>(hits.size());
  prefix_.touch(hit);
  result.status = AdmitStatus::kAdmitted;
  result.restore_snapshot = hit.snapshot;
  result.hit_tokens = seq.num_computed;
  return result;
}

std::optional<Admission> KvAllocator::admit_from_tiers(Sequence& seq,
                                                       const PrefixCachePolicy::Hit& hit,
                                                       int needed) {
  // The blocks a hit may cover: never the prompt's tail (lookup extended these hashes).
  const int limit = prefix_.hit_limit(seq);
  const int gpu_hit = static_cast<int>(hit.blocks.size());
  if (!prefix_.enabled() || limit <= gpu_hit) return std::nullopt;
  const KvTiers::Plan plan = tiers_->plan(
      std::span<const kv::BlockHash>(seq.block_hashes).first(static_cast<size_t>(limit)),
      static_cast<int>(hit.indexed.size()), gpu_hit);
  if (plan.num_blocks == 0) return std::nullopt;
  // The blocks this plan reads (only the last one's snapshot when the GPU holds them all): when a
  // fetch under way reads any of them, wait for it rather than read them twice.
  const int first_read = std::min(plan.reuse, plan.num_blocks - 1);
  const KvTiers::FetchId reading =
      tiers_->fetch_reading(std::span<const kv::BlockHash>(seq.block_hashes)
                                .subspan(static_cast<size_t>(first_read),
                                         static_cast<size_t>(plan.num_blocks - first_read)));
  if (reading != 0) {
    seq.fetch_wait = reading;
    return Admission{AdmitStatus::kWaitFetch};
  }
  int reused_free = 0;
  for (int i = 0; i < plan.reuse; ++i)
    reused_free += blocks_.is_free(hit.indexed[static_cast<size_t>(i)]) ? 1 : 0;
  const int fresh = needed - plan.reuse;
  // The GPU hit alone would need more fresh blocks, so it would not fit either.
  if (blocks_.num_free() - reused_free < fresh || live_.num_free() == 0) return Admission{};
  // The blocks and the slot are free, so no step in flight reads or writes them; they are the
  // fetch's until it finishes or the request goes.
  for (int i = 0; i < plan.reuse; ++i) {
    blocks_.acquire(hit.indexed[static_cast<size_t>(i)]);
    seq.block_table.push_back(hit.indexed[static_cast<size_t>(i)]);
  }
  for (int i = 0; i < fresh; ++i) seq.block_table.push_back(*blocks_.allocate());
  seq.state_slot = *live_.allocate();
  try {
    seq.tier_fetch = tiers_->start_fetch(seq, plan);
  } catch (const std::exception& e) {
    // The tiers are an optimization: a fetch that cannot even start (its setup failed) is a
    // miss, and the request recomputes past its GPU hit, which `hit` still describes (its blocks
    // were acquired here, so nothing evicted them).
    release(seq);
    seq.skip_tiers = true;
    tiers_->note_fetch_failure(plan.num_blocks - plan.gpu_hit,
                               std::string("fetch setup failed: ") + e.what());
    return std::nullopt;
  }
  Admission a = poll_fetch(seq);  // finished already when every block was in host memory
  if (a.status == AdmitStatus::kLater) return std::nullopt;  // failed: recompute past the GPU hit
  return a;
}

Admission KvAllocator::poll_fetch(Sequence& seq) {
  DEEPINFER_CHECK(seq.tier_fetch != 0, "poll of a sequence without a tier fetch");
  KvTiers::Fetched fetched;
  switch (tiers_->finish_fetch(seq, seq.tier_fetch, fetched)) {
    case KvTiers::FetchState::kPending:
      return Admission{AdmitStatus::kFetching};
    case KvTiers::FetchState::kFailed: {
      seq.tier_fetch = 0;
      release(seq);
      seq.skip_tiers = true;
      return Admission{};
    }
    case KvTiers::FetchState::kReady:
      break;
  }
  seq.tier_fetch = 0;
  try {
    return complete_fetch(seq, fetched);
  } catch (const std::exception& e) {
    // The import into the device failed part-way: the blocks it wrote are fresh ones (never the
    // reused GPU blocks) and not yet indexed, so releasing them discards the partial bytes.
    release(seq);
    seq.skip_tiers = true;
    tiers_->note_fetch_failure(fetched.num_blocks - fetched.reuse,
                               std::string("import failed: ") + e.what());
    return Admission{};
  }
}

bool KvAllocator::fetch_waiting(Sequence& seq) const {
  DEEPINFER_CHECK(seq.fetch_wait != 0, "fetch_waiting of a sequence that waits for no fetch");
  if (tiers_ != nullptr && tiers_->fetch_live(seq.fetch_wait)) return true;
  seq.fetch_wait = 0;
  return false;
}

Admission KvAllocator::complete_fetch(Sequence& seq, const KvTiers::Fetched& fetched) {
  // Enqueued now, ahead of the step that computes the rest of the prompt.
  tiers_->import(fetched,
                 std::span<const kv::BlockId>(seq.block_table)
                     .subspan(static_cast<size_t>(fetched.reuse),
                              static_cast<size_t>(fetched.num_blocks - fetched.reuse)),
                 seq.state_slot);
  prefix_.adopt_fetched(seq, fetched.reuse, fetched.num_blocks);
  const int hit = fetched.num_blocks * layout_.block_size;
  seq.num_computed = hit;
  seq.num_indexed_blocks = fetched.num_blocks;
  if (!tiers_->window_state_exact()) {
    // No snapshot: the slot was zeroed by the import; the last kReplayTokens before the hit are
    // computed again with their windows confined to them (docs/kv_store.md#window-state-on-a-hit).
    static_assert(kReplayTokens % kv::kBlockSize == 0, "a replay must start on a block boundary");
    seq.num_computed = std::max(0, hit - kReplayTokens);
    seq.swa_valid_start = seq.num_computed;
    seq.replay_end = hit;
  }
  Admission result;
  result.status = AdmitStatus::kAdmitted;
  result.hit_tokens = hit;  // the tokens the tiers supplied (the replay is counted as computed)
  return result;
}

void KvAllocator::on_committed(Sequence& seq, int32_t snapshot, int snapshot_pos) {
  const bool attached = prefix_.on_committed(seq, snapshot, snapshot_pos);
  if (tiers_ == nullptr) return;
  const int bs = layout_.block_size;
  if (attached) {
    tiers_->write_through(seq, snapshot_pos / bs, snapshot);
    seq.num_written_blocks = std::max(seq.num_written_blocks, snapshot_pos / bs);
  }
  if (tiers_->window_state_exact() || !prefix_.enabled()) return;
  // bounded_replay stores no snapshot, so the tiers need no checkpoint: once the prompt is
  // committed up to the point a hit may cover (its tail stays to compute, as for the checkpoint),
  // its full blocks go through. This covers a replayed sequence, which takes no checkpoint (its
  // state is approximate and must not become a GPU snapshot), so the next turn of an agent-style
  // conversation hits this turn's blocks too (docs/kv_store.md#window-state-on-a-hit). Prompt
  // blocks below num_computed hold committed tokens only, never drafts.
  const int prompt_blocks = std::max(0, seq.num_prompt_tokens - prefix_.tail()) / bs;
  // A sequence that finished in this commit may have released its blocks already.
  if (prompt_blocks > seq.num_written_blocks && seq.num_computed >= prompt_blocks * bs &&
      static_cast<int>(seq.block_table.size()) >= prompt_blocks) {
    tiers_->write_through(seq, prompt_blocks, -1);
    seq.num_written_blocks = prompt_blocks;
  }
}

bool KvAllocator::grow(Sequence& seq, int num_positions) {
  const int needed = blocks_for(num_positions);
  while (static_cast<int>(seq.block_table.size()) < needed) {
    std::optional<kv::BlockId> b = blocks_.allocate();
    if (!b) return false;
    seq.block_table.push_back(*b);
  }
  return true;
}

void KvAllocator::release(Sequence& seq) {
  if (seq.tier_fetch != 0) tiers_->cancel_fetch(seq.tier_fetch);
  seq.tier_fetch = 0;
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) blocks_.release(*it);
  seq.block_table.clear();
  if (seq.state_slot >= 0) live_.release(seq.state_slot);
  seq.state_slot = -1;
  seq.num_indexed_blocks = 0;
}

int KvAllocator::num_cached_free_blocks() const {
  int n = 0;
  for (kv::BlockId b = 1; b < blocks_.num_blocks(); ++b) {
    if (blocks_.is_free(b) && prefix_.index().contains_block(b)) ++n;
  }
  return n;
}

void KvAllocator::check_invariants(const std::vector<const Sequence*>& holders) const {
  blocks_.check_invariants();
  live_.check_invariants();
  prefix_.check_invariants();
  std::map<kv::BlockId, int> refs;
  int slots = 0;
  int fetching = 0;
  for (const Sequence* s : holders) {
    fetching += s->tier_fetch != 0 ? 1 : 0;
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
  // A fetch outlives its request only as a leak: release cancels it.
  const int fetches = tiers_ != nullptr ? tiers_->num_fetches() : 0;
  if (fetches != fetching) {
    throw Error(ErrorCode::kInternal, std::to_string(fetches) + " tier fetches under way but " +
                                          std::to_string(fetching) + " sequences wait for one");
  }
  if (slots != live_.num_used()) {
    throw Error(ErrorCode::kInternal, std::to_string(live_.num_used()) +
                                          " state slots allocated but " + std::to_string(slots) +
                                          " sequences hold one");
  }
}

}  // namespace deepinfer::sched
