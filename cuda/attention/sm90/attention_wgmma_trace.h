// Timing instrumentation of the warp-specialised Hopper attention kernel
// (sm90/attention_wgmma_overlap.cu): where a block's time goes, per role and per key tile. Only
// the kernel's trace instantiations record (a template flag; the default instantiations have no
// trace code at all). A traced launch writes, for each of its first `ctas` blocks, a record of
// clock64 stamps taken by the first thread of each warpgroup at fixed points of its loop (the
// events below) into a device buffer of overlap_trace_words(ctas) int64 words; the host turns
// them into mean waiting and working times per tile (summarize_overlap_trace). Plain C++: the
// layout is shared by the kernel, the backend and the host summary (tests/cpp checks the latter).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer::cuda {

// Where a traced launch writes: `stamps` (device memory, overlap_trace_words(ctas) int64 words,
// any content: every word a traced block owns is written) for blocks 0 .. ctas - 1 in the order
// x + gridDim.x (y + gridDim.y z). stamps == nullptr: no trace (the ordinary kernels).
struct OverlapTraceBuffer {
  int64_t* stamps = nullptr;
  int ctas = 0;
  int ablate = 0;  // OverlapAblation bits: work the traced blocks skip
};

// What a traced launch may leave out (cuda_op_bench --only attention-trace --ablate BITS), to see
// which role's work sets the pace: the output is wrong then, the timing tells what the skipped
// work cost. Only the trace instantiations read it.
enum OverlapAblation : int {
  kAblateDecode = 1,   // producer: no fp8 decode (the tile is fenced and published as it is)
  kAblateLoads = 2,    // producer: no record loads or address steps after tile 0's
  kAblateSoftmax = 4,  // scorer: no softmax (P left as it is, alpha 1)
  kAblateValues = 8,   // both consumers: no P.V products (empty wgmma groups)
};

// Tiles a block records (later tiles run untimed).
constexpr int kOverlapTraceTiles = 32;

// The header of a block's record.
enum OverlapTraceHeader : int {
  kTraceSm = 0,            // %smid
  kTraceTiles,             // the block's key tiles
  kTraceClockStart,        // clock64 at entry (the scorer's first thread)
  kTraceTimerStart,        // %globaltimer (ns) at entry, same thread
  kTraceClockPrologue,     // the scorer past the start barrier (q in shared memory)
  kTraceClockLoopEnd,      // the scorer's last values issued (before the final wait)
  kTraceClockEnd,          // the scorer's output stored
  kTraceTimerEnd,          // %globaltimer at kTraceClockEnd
  kTraceClockValueEnd,     // the value warpgroup's output stored
  kTraceClockProducerEnd,  // the producer's last tile published (and its loop left)
  // Inside the prologue and the epilogue:
  kTraceClockKeys,               // the scorer past the block's key list (its length known)
  kTraceClockQuery,              // the scorer's share of q loaded and stored
  kTraceClockProducerAddresses,  // the producer's tile-0 row resolved (its loads next)
  kTraceClockValuesDone,         // the scorer's last values done (after kTraceClockLoopEnd)
  kTraceClockOutputReady,        // the scorer past the barrier after both warpgroups' values
  kOverlapTraceHeaderWords = 16,
};

// Per-tile events, kOverlapTraceTiles stamps each, in this order after the header.
enum OverlapTraceEvent : int {
  // The producer, at tile i: loop top; buffer free (tile i - 2 consumed); tile i's records
  // landed in registers (fp8; bf16: the copies landed); tile i published (decoded, fenced,
  // arrived); tile i + 1's loads issued and addresses advanced.
  kProducerTop = 0,
  kProducerFree,
  kProducerLanded,
  kProducerPublished,
  kProducerIssued,
  // The scorer: loop top; tile i full; the values of tile i - 1 done (its buffer released);
  // S of tile i done; P[b] free (warpgroup 1 done with tile i - 2's); P and alpha published;
  // the values of tile i issued.
  kScorerTop,
  kScorerFull,
  kScorerPrevValues,
  kScorerScores,
  kScorerProbsFree,
  kScorerPublished,
  kScorerIssued,
  // The value warpgroup: loop top; P of tile i ready; its values of tile i done.
  kValueTop,
  kValueReady,
  kValueDone,
  kOverlapTraceEvents,
};

constexpr int64_t kOverlapTraceWordsPerCta =
    kOverlapTraceHeaderWords + int64_t{kOverlapTraceEvents} * kOverlapTraceTiles;

constexpr int64_t overlap_trace_words(int ctas) {
  return int64_t{ctas} * kOverlapTraceWordsPerCta;
}

// Mean cycles per tile of each interval, over the traced blocks and their tiles 1 .. n - 2 (the
// steady state: the first tile waits for the prologue, the last has no successor), and the
// block-level phases in cycles. clock_ghz: cycles per ns measured by the blocks themselves
// (clock64 against %globaltimer over their lifetime).
struct OverlapTraceSummary {
  int ctas = 0;       // blocks with a record
  double tiles = 0;   // mean key tiles per block
  double steady = 0;  // steady-state tiles summed over blocks (the means' sample size)
  double clock_ghz = 0;
  double block_cycles = 0;     // entry to output stored (scorer)
  double prologue_cycles = 0;  // entry to the start barrier
  double loop_cycles = 0;      // start barrier to the last values issued
  double epilogue_cycles = 0;  // last values issued to output stored
  // The prologue's parts, from entry: the key list known; q stored (the scorer); tile 0's row
  // resolved (tiles 1..4 in the pipeline), its records landed, it published (the producer's
  // first thread); tile 0 full (the scorer). The epilogue's, from the last values issued: the
  // scorer's last values done; both warpgroups' values done (the ilp variant's output barrier;
  // 0 for wgmma_overlap, which has none). The rest is the output staged and stored.
  double prologue_keys = 0, prologue_query = 0, first_addresses = 0, first_landed = 0,
         first_published = 0, first_full = 0;
  double epilogue_values = 0, epilogue_ready = 0;
  // Producer.
  double producer_wait_free = 0, producer_wait_landed = 0, producer_decode = 0, producer_issue = 0,
         producer_period = 0;
  // Scorer.
  double scorer_wait_full = 0, scorer_wait_prev_values = 0, scorer_wait_scores = 0,
         scorer_wait_probs_free = 0, scorer_softmax = 0, scorer_issue_values = 0, scorer_period = 0;
  // Value warpgroup.
  double value_wait_probs = 0, value_products = 0, value_release = 0, value_period = 0;
};

// `words`: the host copy of a traced launch's buffer (overlap_trace_words(ctas) words).
inline OverlapTraceSummary summarize_overlap_trace(const std::vector<int64_t>& words, int ctas) {
  OverlapTraceSummary s;
  double ns = 0, cycles = 0;
  auto at = [&](int cta, int event, int tile) {
    return words[static_cast<size_t>(cta * kOverlapTraceWordsPerCta + kOverlapTraceHeaderWords +
                                     int64_t{event} * kOverlapTraceTiles + tile)];
  };
  for (int c = 0; c < ctas; ++c) {
    const int64_t* h = words.data() + c * kOverlapTraceWordsPerCta;
    const int tiles = static_cast<int>(std::min<int64_t>(h[kTraceTiles], kOverlapTraceTiles));
    if (h[kTraceClockEnd] <= h[kTraceClockStart]) continue;  // not a traced block
    ++s.ctas;
    s.tiles += static_cast<double>(h[kTraceTiles]);
    ns += static_cast<double>(h[kTraceTimerEnd] - h[kTraceTimerStart]);
    cycles += static_cast<double>(h[kTraceClockEnd] - h[kTraceClockStart]);
    s.block_cycles += static_cast<double>(h[kTraceClockEnd] - h[kTraceClockStart]);
    s.prologue_cycles += static_cast<double>(h[kTraceClockPrologue] - h[kTraceClockStart]);
    s.loop_cycles += static_cast<double>(h[kTraceClockLoopEnd] - h[kTraceClockPrologue]);
    s.epilogue_cycles += static_cast<double>(h[kTraceClockEnd] - h[kTraceClockLoopEnd]);
    const auto since_start = [&](int64_t v) {
      return static_cast<double>(v - h[kTraceClockStart]);
    };
    s.prologue_keys += since_start(h[kTraceClockKeys]);
    s.prologue_query += since_start(h[kTraceClockQuery]);
    s.first_addresses += since_start(h[kTraceClockProducerAddresses]);
    if (tiles > 0) {
      s.first_landed += since_start(at(c, kProducerLanded, 0));
      s.first_published += since_start(at(c, kProducerPublished, 0));
      s.first_full += since_start(at(c, kScorerFull, 0));
    }
    s.epilogue_values += static_cast<double>(h[kTraceClockValuesDone] - h[kTraceClockLoopEnd]);
    if (h[kTraceClockOutputReady] != 0) {  // the ilp variant's barrier (wgmma_overlap: none)
      s.epilogue_ready += static_cast<double>(h[kTraceClockOutputReady] - h[kTraceClockLoopEnd]);
    }
    for (int i = 1; i + 1 < tiles; ++i) {
      s.steady += 1;
      auto d = [&](int from, int to) { return static_cast<double>(at(c, to, i) - at(c, from, i)); };
      auto period = [&](int event) {
        return static_cast<double>(at(c, event, i + 1) - at(c, event, i));
      };
      s.producer_wait_free += d(kProducerTop, kProducerFree);
      s.producer_wait_landed += d(kProducerFree, kProducerLanded);
      s.producer_decode += d(kProducerLanded, kProducerPublished);
      s.producer_issue += d(kProducerPublished, kProducerIssued);
      s.producer_period += period(kProducerTop);
      s.scorer_wait_full += d(kScorerTop, kScorerFull);
      s.scorer_wait_prev_values += d(kScorerFull, kScorerPrevValues);
      s.scorer_wait_scores += d(kScorerPrevValues, kScorerScores);
      s.scorer_wait_probs_free += d(kScorerScores, kScorerProbsFree);
      s.scorer_softmax += d(kScorerProbsFree, kScorerPublished);
      s.scorer_issue_values += d(kScorerPublished, kScorerIssued);
      s.scorer_period += period(kScorerTop);
      s.value_wait_probs += d(kValueTop, kValueReady);
      s.value_products += d(kValueReady, kValueDone);
      s.value_release += static_cast<double>(at(c, kValueTop, i + 1) - at(c, kValueDone, i));
      s.value_period += period(kValueTop);
    }
  }
  if (s.ctas == 0) return s;
  s.clock_ghz = ns > 0 ? cycles / ns : 0.0;
  for (double* v :
       {&s.tiles, &s.block_cycles, &s.prologue_cycles, &s.loop_cycles, &s.epilogue_cycles,
        &s.prologue_keys, &s.prologue_query, &s.first_addresses, &s.first_landed,
        &s.first_published, &s.first_full, &s.epilogue_values, &s.epilogue_ready}) {
    *v /= s.ctas;
  }
  if (s.steady > 0) {
    for (double* v : {&s.producer_wait_free, &s.producer_wait_landed, &s.producer_decode,
                      &s.producer_issue, &s.producer_period, &s.scorer_wait_full,
                      &s.scorer_wait_prev_values, &s.scorer_wait_scores, &s.scorer_wait_probs_free,
                      &s.scorer_softmax, &s.scorer_issue_values, &s.scorer_period,
                      &s.value_wait_probs, &s.value_products, &s.value_release, &s.value_period}) {
      *v /= s.steady;
    }
  }
  return s;
}

}  // namespace deepinfer::cuda
