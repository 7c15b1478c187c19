// Timing instrumentation of the small-batch decode attention: the mma.sync kernel's 16-head
// blocks (sm80/attention_mma.cu) and the separate combine after them (attention_combine.cu).
// Where a B = 1 call's time goes: how late each block starts and leaves its wait, its phases,
// and the gap between the last split's end and the combine's start. Only the trace
// instantiations record (a template flag; the default instantiations have no trace code). A
// traced call writes, for each of the first `blocks` split blocks, kMmaTraceWords int64 words
// (clock64 stamps of thread 0, %globaltimer at entry, after the wait and at the end, %smid), and
// for each of the first `combines` combine blocks kCombineTraceWords more after them; the host
// turns them into per-phase cycles and a timeline (summarize_mma_trace). Plain C++: the layout is
// shared by the kernels, the backend and the host summary (tests/cpp checks the latter).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "cuda/common/trace_stats.h"

namespace deepinfer::cuda {

// Where a traced call writes: `stamps` (device memory, mma_trace_words(blocks, combines) words,
// any content: every word of a traced block's record is written). Split blocks are numbered
// x + gridDim.x (y + gridDim.y z), combine blocks x + gridDim.x y. stamps == nullptr: no trace.
struct MmaTraceBuffer {
  int64_t* stamps = nullptr;
  int blocks = 0;
  int combines = 0;
};

// A split block's record, in the kernel's order.
enum MmaTraceWord : int {
  kMmaTraceEntry = 0,   // clock64 at entry
  kMmaTraceTable,       // the layout read and the block-table row staged (before the wait)
  kMmaTraceWaited,      // the wait for the previous kernel returned
  kMmaTraceTopk,        // the first key's address known (after its top-k value came back)
  kMmaTraceIssued,      // the first tile's copies issued
  kMmaTraceQuery,       // q's rows staged in shared memory
  kMmaTraceFirstTile,   // tile 0 landed, decoded and published (the loop's first barrier)
  kMmaTraceScores,      // tile 0's partial logits written, every warp past their barrier
  kMmaTraceGathered,    // tile 0's logits summed over the slices, in thread 0's registers
  kMmaTraceSoftmax,     // tile 0's online softmax done
  kMmaTraceValues,      // tile 0's P V accumulated
  kMmaTraceLoop,        // the key loop done
  kMmaTraceStored,      // the output or the split's partials stored
  kMmaTraceTimerEntry,  // %globaltimer (ns) at entry
  kMmaTraceTimerWaited,
  kMmaTraceTimerEnd,  // %globaltimer at kMmaTraceStored
  kMmaTraceSm,        // %smid
  kMmaTraceTiles,     // the block's key tiles
  // Thread 0's L2 load of a line no kernel writes (its first head's sink), issued just before the
  // top-k value's load: back at this stamp. Against kMmaTraceTopk it tells the wait's after-effects
  // from the top-k line's own latency.
  kMmaTraceProbe,
  kMmaTraceWords,  // the record's length
};

// A combine block's record.
enum CombineTraceWord : int {
  kCombineTraceTimerEntry = 0,  // %globaltimer at entry
  kCombineTraceTimerWaited,     // the wait for the split kernel returned
  kCombineTraceTimerEnd,        // the block's outputs stored
  kCombineTraceEntry,           // clock64 at entry
  kCombineTraceWaited,
  kCombineTraceLoaded,  // the statistics summed (the first partial sums in flight before)
  kCombineTraceEnd,
  kCombineTraceSm,
  kCombineTraceWords = 8,
};

constexpr int64_t mma_trace_words(int blocks, int combines) {
  return int64_t{blocks} * kMmaTraceWords + int64_t{combines} * kCombineTraceWords;
}

// The split blocks' phases: the cycles between consecutive stamps of thread 0.
enum MmaTracePhase : int {
  kMmaPhaseTable = 0,  // entry -> table
  kMmaPhaseWait,       // table -> waited (how long the block sat before its inputs were ready)
  kMmaPhaseTopk,       // waited -> the first key's address (its top-k value's round trip)
  kMmaPhaseIssue,      // -> the first tile's copies issued
  kMmaPhaseQuery,      // -> q staged
  kMmaPhaseFirstTile,  // q staged -> tile 0 published
  kMmaPhaseScores,     // -> tile 0's S = Q K^T over each warp's slice, and the barrier after
  kMmaPhaseGathered,   // -> the slices' sums (the second barrier and the reads)
  kMmaPhaseSoftmax,    // -> tile 0's online softmax
  kMmaPhaseValues,     // -> tile 0's P V
  kMmaPhaseLoop,       // -> the loop done (the later tiles)
  kMmaPhaseStore,      // loop done -> stored
  kMmaPhaseAfterWait,  // waited -> stored
  kMmaPhases,
};
static_assert(int{kMmaTraceStored} == int{kMmaTraceEntry} + int{kMmaPhaseStore} + 1,
              "the phases follow the words");

inline const char* mma_trace_phase_name(int phase) {
  static constexpr std::array<const char*, kMmaPhases> kNames = {
      "table",    "wait",    "topk",   "issue", "query", "first_tile", "scores",
      "gathered", "softmax", "values", "loop",  "store", "after_wait"};
  return phase >= 0 && phase < kMmaPhases ? kNames[static_cast<size_t>(phase)] : "?";
}

// The combine blocks' phases.
enum CombineTracePhase : int {
  kCombinePhaseWait = 0,  // entry -> waited
  kCombinePhaseLoad,      // waited -> statistics summed
  kCombinePhaseSum,       // -> outputs stored
  kCombinePhases,
};

inline const char* combine_trace_phase_name(int phase) {
  static constexpr std::array<const char*, kCombinePhases> kNames = {"wait", "load", "sum"};
  return phase >= 0 && phase < kCombinePhases ? kNames[static_cast<size_t>(phase)] : "?";
}

// Where the blocks ran (their %smid): whether combine blocks shared an SM with each other or with
// a split block, and the combine's load phase (mean cycles) on an SM of its own against one it
// shared with another combine block: whether the combine's loads are limited per SM.
struct TracePlacement {
  int split_sms = 0;              // distinct SMs of the split blocks
  int combine_sms = 0;            // distinct SMs of the combine blocks
  int combine_max_per_sm = 0;     // the most combine blocks on one SM
  int combines_on_split_sms = 0;  // combine blocks on an SM that also ran a split block
  int combines_alone = 0;         // combine blocks with no other combine block on their SM
  double load_alone_mean = 0;     // their load phase
  double load_shared_mean = 0;    // the load phase of the others
};

// First and last of one event over the blocks, ns after the call's first split-block entry.
struct TraceSpan {
  int64_t first = 0;
  int64_t last = 0;
};

struct MmaTraceSummary {
  int blocks = 0;        // split blocks with a record
  int combines = 0;      // combine blocks with a record
  double clock_ghz = 0;  // cycles per ns of the split blocks (entry to stored against the timer)
  std::array<TracePhaseStats, kMmaPhases> phases{};
  std::array<TracePhaseStats, kCombinePhases> combine_phases{};
  TracePhaseStats probe;  // waited -> kMmaTraceProbe
  // The timeline, ns after the first split block's entry.
  TraceSpan entry, waited, end;                          // split blocks
  TraceSpan combine_entry, combine_waited, combine_end;  // combine blocks
  TracePlacement placement;
};

namespace mma_trace_detail {

inline void widen(TraceSpan& s, bool first_seen, int64_t v) {
  s.first = first_seen ? v : std::min(s.first, v);
  s.last = first_seen ? v : std::max(s.last, v);
}

// A record's %smid as an index: below a few hundred on every GPU; anything else (a corrupt
// record) is left out of the placement (-1).
constexpr int64_t kMaxTraceSms = 1024;

inline int64_t sm_slot(int64_t sm) {
  return sm >= 0 && sm < kMaxTraceSms ? sm : -1;
}

// The placement of the records that summarize_mma_trace kept (`split` and `combine`: theirs).
inline TracePlacement placement(const std::vector<const int64_t*>& split,
                                const std::vector<const int64_t*>& combine) {
  TracePlacement p;
  std::vector<int> splits_on(kMaxTraceSms, 0), combines_on(kMaxTraceSms, 0);
  const auto at = [](std::vector<int>& on, int64_t slot) -> int& {
    return on[static_cast<size_t>(slot)];
  };
  for (const int64_t* r : split) {
    const int64_t slot = sm_slot(r[kMmaTraceSm]);
    if (slot >= 0 && at(splits_on, slot)++ == 0) ++p.split_sms;
  }
  for (const int64_t* r : combine) {
    const int64_t slot = sm_slot(r[kCombineTraceSm]);
    if (slot >= 0 && at(combines_on, slot)++ == 0) ++p.combine_sms;
  }
  double alone = 0, shared = 0;
  int combines_shared = 0;
  for (const int64_t* r : combine) {
    const int64_t slot = sm_slot(r[kCombineTraceSm]);
    if (slot < 0) continue;
    const int sharing = at(combines_on, slot);
    p.combine_max_per_sm = std::max(p.combine_max_per_sm, sharing);
    if (at(splits_on, slot) > 0) ++p.combines_on_split_sms;
    const auto load = static_cast<double>(r[kCombineTraceLoaded] - r[kCombineTraceWaited]);
    if (sharing == 1) {
      ++p.combines_alone;
      alone += load;
    } else {
      ++combines_shared;
      shared += load;
    }
  }
  p.load_alone_mean = p.combines_alone > 0 ? alone / p.combines_alone : 0.0;
  p.load_shared_mean = combines_shared > 0 ? shared / combines_shared : 0.0;
  return p;
}

}  // namespace mma_trace_detail

// `words`: the host copy of a traced call's buffer (mma_trace_words(blocks, combines) words). A
// record whose last stamp does not follow its entry is not a traced block and is skipped; the
// stamps of a block without keys (top-k to values) are 0 and their phases skipped.
inline MmaTraceSummary summarize_mma_trace(const std::vector<int64_t>& words, int blocks,
                                           int combines) {
  using mma_trace_detail::widen;
  MmaTraceSummary s;
  if (std::ssize(words) < mma_trace_words(blocks, combines)) return s;
  double ns = 0, cycles = 0;
  int64_t origin = 0;
  for (int b = 0; b < blocks; ++b) {
    const int64_t* r = words.data() + b * int64_t{kMmaTraceWords};
    if (r[kMmaTraceStored] <= r[kMmaTraceEntry]) continue;
    origin = s.blocks == 0 ? r[kMmaTraceTimerEntry] : std::min(origin, r[kMmaTraceTimerEntry]);
    ++s.blocks;
  }
  int seen = 0;
  std::vector<const int64_t*> split_records, combine_records;
  for (int b = 0; b < blocks; ++b) {
    const int64_t* r = words.data() + b * int64_t{kMmaTraceWords};
    if (r[kMmaTraceStored] <= r[kMmaTraceEntry]) continue;
    split_records.push_back(r);
    cycles += static_cast<double>(r[kMmaTraceStored] - r[kMmaTraceEntry]);
    ns += static_cast<double>(r[kMmaTraceTimerEnd] - r[kMmaTraceTimerEntry]);
    for (int p = kMmaPhaseTable; p <= kMmaPhaseStore; ++p) {
      const int64_t from = r[kMmaTraceEntry + p];
      const int64_t to = r[kMmaTraceTable + p];
      if (from != 0 && to != 0) s.phases[static_cast<size_t>(p)].add(b, to - from);
    }
    s.phases[kMmaPhaseAfterWait].add(b, r[kMmaTraceStored] - r[kMmaTraceWaited]);
    if (r[kMmaTraceProbe] != 0) s.probe.add(b, r[kMmaTraceProbe] - r[kMmaTraceWaited]);
    const bool first = seen++ == 0;
    widen(s.entry, first, r[kMmaTraceTimerEntry] - origin);
    widen(s.waited, first, r[kMmaTraceTimerWaited] - origin);
    widen(s.end, first, r[kMmaTraceTimerEnd] - origin);
  }
  const int64_t* combine = words.data() + int64_t{blocks} * kMmaTraceWords;
  for (int c = 0; c < combines && s.blocks > 0; ++c) {
    const int64_t* r = combine + c * int64_t{kCombineTraceWords};
    if (r[kCombineTraceEnd] <= r[kCombineTraceEntry]) continue;
    combine_records.push_back(r);
    const bool first = s.combines++ == 0;
    s.combine_phases[kCombinePhaseWait].add(c, r[kCombineTraceWaited] - r[kCombineTraceEntry]);
    s.combine_phases[kCombinePhaseLoad].add(c, r[kCombineTraceLoaded] - r[kCombineTraceWaited]);
    s.combine_phases[kCombinePhaseSum].add(c, r[kCombineTraceEnd] - r[kCombineTraceLoaded]);
    widen(s.combine_entry, first, r[kCombineTraceTimerEntry] - origin);
    widen(s.combine_waited, first, r[kCombineTraceTimerWaited] - origin);
    widen(s.combine_end, first, r[kCombineTraceTimerEnd] - origin);
  }
  for (TracePhaseStats& p : s.phases) p.finish();
  for (TracePhaseStats& p : s.combine_phases) p.finish();
  s.probe.finish();
  s.placement = mma_trace_detail::placement(split_records, combine_records);
  s.clock_ghz = ns > 0 ? cycles / ns : 0.0;
  return s;
}

}  // namespace deepinfer::cuda
