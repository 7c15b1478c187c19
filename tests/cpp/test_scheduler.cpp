// The Scheduler alone, driven by hand: the plans it emits and how it commits them. No executor:
// each test plays the device by passing StepResults back in launch order.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/cache_geometry.h"
#include "sched/kv_allocator.h"
#include "sched/scheduler.h"
#include "sched_test_util.h"

namespace deepinfer::sched {
namespace {

using Outcome = Scheduler::Outcome;
constexpr int32_t kEos = 1;

struct Options {
  int num_blocks = 64;
  int max_num_seqs = 8;
  int max_num_batched_tokens = 256;
  int max_model_len = 4096;
  int num_snapshot_slots = 0;
  PreemptionMode preemption = PreemptionMode::kRecompute;
  std::string speculative_budget = "fixed";
  bool zero_overhead = true;
};

// A scheduler over its own allocator, with the outputs it produced so far.
class Harness {
 public:
  explicit Harness(const Options& o)
      : kv_(KvLayout{o.num_blocks, /*num_live_slots=*/o.max_num_seqs + 3, o.num_snapshot_slots,
                     kv::kBlockSize, o.num_snapshot_slots > 0}),
        scheduler_(config(o), {kEos}, kv_) {}

  RequestId add(std::vector<int32_t> prompt, int max_tokens = 8) {
    auto s = std::make_unique<Sequence>();
    s->id = next_id_++;
    s->arrival = s->id;
    s->params.temperature = 0.0f;
    s->params.max_tokens = max_tokens;
    s->num_prompt_tokens = static_cast<int>(prompt.size());
    s->tokens = std::move(prompt);
    s->tokens.reserve(s->tokens.size() + static_cast<size_t>(max_tokens));
    const RequestId id = s->id;
    scheduler_.add(std::move(s));
    return id;
  }
  Outcome schedule(StepPlan& plan) {
    const Outcome o = scheduler_.schedule(plan, out);
    scheduler_.check_invariants();
    return o;
  }
  // Commits `plan` as if the device sampled `tokens` (one per sampling row, in row order).
  void commit(const StepPlan& plan, std::vector<int32_t> tokens) {
    StepResult result;
    result.tokens = std::move(tokens);
    scheduler_.commit(plan, result, out);
    scheduler_.check_invariants();
  }
  // Commits an executor's result: `tokens` with `counts` per sampling row (empty: one each), and
  // the drafts it made past each row with their probabilities (speculative_method "mtp").
  void commit_drafts(const StepPlan& plan, std::vector<int32_t> tokens, std::vector<int> counts,
                     std::vector<std::vector<int32_t>> drafts,
                     std::vector<std::vector<float>> draft_probs = {}) {
    StepResult result;
    result.tokens = std::move(tokens);
    result.counts = std::move(counts);
    result.drafts = std::move(drafts);
    result.draft_probs = std::move(draft_probs);
    scheduler_.commit(plan, result, out);
    scheduler_.check_invariants();
  }
  // Commits with token 7 for every sampling row.
  void commit(const StepPlan& plan) {
    commit(plan, std::vector<int32_t>(static_cast<size_t>(plan.num_sampling_rows()), 7));
  }
  const Sequence& seq(RequestId id) const { return *scheduler_.find(id); }
  FinishReason finish_of(RequestId id) const {
    for (const RequestOutput& o : out)
      if (o.id == id && o.finish != FinishReason::kNone) return o.finish;
    return FinishReason::kNone;
  }
  Scheduler& scheduler() { return scheduler_; }
  KvAllocator& kv() { return kv_; }

  std::vector<RequestOutput> out;

 private:
  static SchedulerConfig config(const Options& o) {
    SchedulerConfig c;
    c.max_num_seqs = o.max_num_seqs;
    c.max_num_batched_tokens = o.max_num_batched_tokens;
    c.max_model_len = o.max_model_len;
    c.preemption = o.preemption;
    c.speculative_budget = o.speculative_budget;
    c.zero_overhead = o.zero_overhead;
    return c;
  }
  KvAllocator kv_;
  Scheduler scheduler_;
  RequestId next_id_ = 1;
};

std::vector<int32_t> prompt_of(int n, int salt = 0) {
  return test::distinct_tokens(n, salt);
}

TEST(Scheduler, ChunkedPrefillCutsAtTheBudgetAndKeepsTheHeadInFront) {
  Harness h({.max_num_batched_tokens = 64});
  const RequestId a = h.add(prompt_of(100, 1));
  const RequestId b = h.add(prompt_of(10, 2));
  StepPlan p1;
  ASSERT_EQ(h.schedule(p1), Outcome::kScheduled);
  ASSERT_TRUE(p1.is_prefill);
  ASSERT_EQ(p1.rows.size(), 1u);  // a does not fit whole: its chunk ends the batch
  EXPECT_EQ(p1.rows[0].seq_id, a);
  EXPECT_EQ(p1.rows[0].forward.start_pos, 0);
  EXPECT_EQ(p1.rows[0].forward.num_tokens, 64);
  EXPECT_FALSE(p1.rows[0].samples());
  EXPECT_EQ(p1.rows[0].forward.num_logits, 0);  // no logits, no lm_head for this row
  h.commit(p1, {});

  StepPlan p2;
  ASSERT_EQ(h.schedule(p2), Outcome::kScheduled);
  ASSERT_EQ(p2.rows.size(), 2u);  // a's rest first (it kept the head), then b whole
  EXPECT_EQ(p2.rows[0].seq_id, a);
  EXPECT_EQ(p2.rows[0].forward.start_pos, 64);
  EXPECT_EQ(p2.rows[0].forward.num_tokens, 36);
  EXPECT_TRUE(p2.rows[0].samples());
  EXPECT_EQ(p2.rows[1].seq_id, b);
  EXPECT_EQ(p2.rows[1].forward.num_tokens, 10);
  // The forward's tokens are the prompt's, in place.
  EXPECT_TRUE(std::equal(p2.rows[0].forward.tokens.begin(), p2.rows[0].forward.tokens.end(),
                         h.seq(a).tokens.begin() + 64));
  h.commit(p2, {11, 12});
  EXPECT_EQ(h.seq(a).tokens.back(), 11);
  EXPECT_EQ(h.seq(b).tokens.back(), 12);
}

TEST(Scheduler, BlockTablesCoverExactlyTheRowsPositions) {
  Harness h({.max_num_batched_tokens = 512});
  const RequestId a = h.add(prompt_of(300));
  StepPlan p;
  ASSERT_EQ(h.schedule(p), Outcome::kScheduled);
  EXPECT_EQ(p.rows[0].forward.block_table.size(), static_cast<size_t>(kv::blocks_for_tokens(300)));
  EXPECT_EQ(p.rows[0].forward.slot, h.seq(a).state_slot);
  h.commit(p);
  // Decode at position 300 needs a third block only once position 384 is reached.
  StepPlan d;
  ASSERT_EQ(h.schedule(d), Outcome::kScheduled);
  EXPECT_FALSE(d.is_prefill);
  EXPECT_EQ(d.rows[0].forward.start_pos, 300);
  EXPECT_EQ(d.rows[0].forward.block_table.size(), 3u);
  h.commit(d);
}

TEST(Scheduler, DecodeRowsPlannedWhileAStepRunsCarryItsSample) {
  Harness h({});
  const RequestId a = h.add(prompt_of(20, 1));
  const RequestId b = h.add(prompt_of(30, 2));
  StepPlan prefill;
  ASSERT_EQ(h.schedule(prefill), Outcome::kScheduled);
  ASSERT_EQ(prefill.num_sampling_rows(), 2);
  // Zero-overhead: the decode step is planned before the prefill is committed.
  StepPlan decode;
  ASSERT_EQ(h.schedule(decode), Outcome::kScheduled);
  ASSERT_EQ(decode.rows.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const StepRow& r = decode.rows[i];
    EXPECT_TRUE(r.carried());
    EXPECT_EQ(r.forward.num_tokens, 1);
    // The index of this sequence's sampling row in the step still running.
    EXPECT_EQ(r.forward.token_from_previous, static_cast<int32_t>(i));
    EXPECT_EQ(r.forward.start_pos, i == 0 ? 20 : 30);
  }
  EXPECT_EQ(h.seq(a).inflight.steps, 2);
  h.commit(prefill, {40, 41});
  h.commit(decode, {42, 43});
  EXPECT_EQ(h.seq(a).tokens.size(), 22u);
  EXPECT_EQ(h.seq(b).tokens.back(), 43);
  EXPECT_EQ(h.seq(b).inflight.steps, 0);
}

TEST(Scheduler, CarriedIndicesFollowTheSamplingRowsNotAllRows) {
  Harness h({.max_num_batched_tokens = 40});
  const RequestId a = h.add(prompt_of(30, 1));  // whole in the first step
  h.add(prompt_of(100, 2));                     // chunked behind it
  StepPlan p1;
  ASSERT_EQ(h.schedule(p1), Outcome::kScheduled);
  h.commit(p1, {5});
  // p2 is a decode step for a (alternation), p3 prefill for the other while p2 runs.
  StepPlan p2;
  ASSERT_EQ(h.schedule(p2), Outcome::kScheduled);
  ASSERT_FALSE(p2.is_prefill);
  StepPlan p3;
  ASSERT_EQ(h.schedule(p3), Outcome::kScheduled);
  ASSERT_TRUE(p3.is_prefill);
  EXPECT_FALSE(p3.rows[0].carried());  // prompt tokens are on the host
  h.commit(p2, {6});
  h.commit(p3, {});
  StepPlan p4;
  ASSERT_EQ(h.schedule(p4), Outcome::kScheduled);
  ASSERT_FALSE(p4.is_prefill);
  EXPECT_EQ(p4.rows[0].seq_id, a);
  EXPECT_FALSE(p4.rows[0].carried());  // nothing in flight: the token is committed
  EXPECT_EQ(p4.rows[0].forward.tokens[0], 6);
  h.commit(p4);
}

TEST(Scheduler, StopTokenAndMaxTokensFinishAndReleaseOnlyAfterTheLastInFlightStep) {
  Harness h({});
  const RequestId a = h.add(prompt_of(10, 1), /*max_tokens=*/2);
  const RequestId b = h.add(prompt_of(10, 2), /*max_tokens=*/8);
  StepPlan p1;
  ASSERT_EQ(h.schedule(p1), Outcome::kScheduled);
  StepPlan p2;  // decode planned while p1 runs
  ASSERT_EQ(h.schedule(p2), Outcome::kScheduled);
  h.commit(p1, {7, kEos});  // b stops on EOS while its next row is already in flight
  EXPECT_EQ(h.finish_of(b), FinishReason::kStop);
  EXPECT_TRUE(h.seq(b).holds_resources()) << "released under a running step";
  h.commit(p2, {8, 9});  // a reaches max_tokens; b's row is dropped
  EXPECT_EQ(h.finish_of(a), FinishReason::kLength);
  EXPECT_FALSE(h.seq(b).holds_resources());
  EXPECT_EQ(h.seq(b).tokens.size(), 11u);  // nothing appended after the stop
  StepPlan idle;
  EXPECT_EQ(h.schedule(idle), Outcome::kIdle);
  EXPECT_EQ(h.kv().blocks().num_free(), h.kv().blocks().num_usable());
  EXPECT_EQ(h.scheduler().num_unfinished(), 0);
}

TEST(Scheduler, RejectsPromptsThatCanNeverRun) {
  Harness h({.num_blocks = 4, .max_model_len = 1000});
  const RequestId too_long = h.add(prompt_of(1000));
  const RequestId too_big = h.add(prompt_of(500));  // 4 blocks, 3 usable
  const RequestId fine = h.add(prompt_of(100));
  StepPlan p;
  ASSERT_EQ(h.schedule(p), Outcome::kScheduled);
  EXPECT_EQ(h.finish_of(too_long), FinishReason::kRejected);
  EXPECT_EQ(h.finish_of(too_big), FinishReason::kRejected);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].seq_id, fine);
  h.commit(p);
}

TEST(Scheduler, PreemptionRecomputesTheNewestAndNeedsADrainWhenItIsInFlight) {
  // 3 usable blocks: two 128-token prompts fill two, the third goes to the first to grow.
  Harness h({.num_blocks = 4, .max_num_seqs = 4, .max_num_batched_tokens = 512});
  const RequestId a = h.add(prompt_of(127, 1), 100);
  const RequestId b = h.add(prompt_of(128, 2), 100);
  StepPlan p1;
  ASSERT_EQ(h.schedule(p1), Outcome::kScheduled);
  ASSERT_EQ(p1.rows.size(), 2u);
  h.commit(p1);
  StepPlan p2;  // a decodes at 127 (its block has room), b needs a block at 128: the last one
  ASSERT_EQ(h.schedule(p2), Outcome::kScheduled);
  StepPlan p3;  // planned while p2 runs: a needs a block at 128, none is free; the victim b is
                // in flight, so the scheduler asks for a drain and gives back p3's reservations
  EXPECT_EQ(h.schedule(p3), Outcome::kNeedsDrain);
  EXPECT_TRUE(p3.empty());
  EXPECT_EQ(h.seq(a).inflight.steps, 1);
  h.commit(p2);
  StepPlan p4;
  ASSERT_EQ(h.schedule(p4), Outcome::kScheduled);
  EXPECT_EQ(h.seq(b).state, SeqState::kWaiting);  // recompute: back to the queue's head
  EXPECT_EQ(h.seq(b).epoch, 1u);
  EXPECT_FALSE(h.seq(b).holds_resources());
  ASSERT_EQ(p4.rows.size(), 1u);
  EXPECT_EQ(p4.rows[0].seq_id, a);
  h.commit(p4);
  EXPECT_EQ(h.scheduler().stats().num_preemptions, 1u);
}

TEST(Scheduler, PreemptionModeStopFinishesTheVictim) {
  Harness h({.num_blocks = 4, .max_num_seqs = 4, .preemption = PreemptionMode::kStop});
  h.add(prompt_of(127, 1), 100);
  const RequestId b = h.add(prompt_of(128, 2), 100);
  StepPlan p1;
  ASSERT_EQ(h.schedule(p1), Outcome::kScheduled);
  h.commit(p1);
  StepPlan p2;
  ASSERT_EQ(h.schedule(p2), Outcome::kScheduled);
  h.commit(p2);
  StepPlan p3;
  ASSERT_EQ(h.schedule(p3), Outcome::kScheduled);
  EXPECT_EQ(h.finish_of(b), FinishReason::kPreempted);
  h.commit(p3);
}

TEST(Scheduler, AbortBetweenPrefillChunksFreesEverything) {
  Harness h({.max_num_batched_tokens = 64});
  const RequestId a = h.add(prompt_of(300));
  StepPlan p1;
  ASSERT_EQ(h.schedule(p1), Outcome::kScheduled);
  h.commit(p1, {});
  EXPECT_TRUE(h.seq(a).holds_resources());
  h.scheduler().abort(a, h.out);
  EXPECT_EQ(h.finish_of(a), FinishReason::kAbort);
  StepPlan p2;
  EXPECT_EQ(h.schedule(p2), Outcome::kIdle);
  EXPECT_EQ(h.kv().blocks().num_free(), h.kv().blocks().num_usable());
  EXPECT_EQ(h.kv().live_slots().num_free(), h.kv().live_slots().capacity());
}

TEST(Scheduler, APrefixHitRestoresTheSnapshotAndComputesOnlyTheRest) {
  Harness h({.num_snapshot_slots = 4});
  const std::vector<int32_t> prompt = prompt_of(300);
  const RequestId a = h.add(prompt, 1);
  StepPlan p1;  // cut at the checkpoint 256, snapshot saved after the chunk
  ASSERT_EQ(h.schedule(p1), Outcome::kScheduled);
  ASSERT_EQ(p1.rows.size(), 1u);
  EXPECT_EQ(p1.rows[0].forward.num_tokens, 256);
  ASSERT_EQ(p1.copies_after.size(), 1u);
  EXPECT_EQ(p1.copies_after[0].first, h.seq(a).state_slot);
  EXPECT_EQ(p1.rows[0].snapshot, p1.copies_after[0].second);
  h.commit(p1, {});
  StepPlan p2;
  ASSERT_EQ(h.schedule(p2), Outcome::kScheduled);
  EXPECT_EQ(p2.rows[0].forward.start_pos, 256);
  h.commit(p2);  // max_tokens 1: a finishes and its blocks stay cached

  const RequestId b = h.add(prompt, 1);
  StepPlan p3;
  ASSERT_EQ(h.schedule(p3), Outcome::kScheduled);
  ASSERT_EQ(p3.copies_before.size(), 1u);  // the snapshot goes into b's slot first
  EXPECT_EQ(p3.copies_before[0].second, h.seq(b).state_slot);
  EXPECT_EQ(p3.rows[0].forward.start_pos, 256);
  EXPECT_EQ(p3.rows[0].forward.num_tokens, 44);
  EXPECT_EQ(h.seq(b).prompt_cache_hit_tokens, 256);
  h.commit(p3);
}

// A prompt cut at its prefix checkpoint keeps its place in the queue, and the prompts behind it
// still fill the step: each of three 300-token prompts runs its 256 tokens up to the checkpoint
// in the first step (the old rule ended the batch at the first cut: one prompt per step), and
// their 44-token rests together in the second, in queue order.
TEST(Scheduler, ACheckpointCutDoesNotEndTheBatch) {
  Harness h({.max_num_batched_tokens = 1024, .num_snapshot_slots = 8});
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(h.add(prompt_of(300, 10 + i), 1));
  StepPlan p1;
  ASSERT_EQ(h.schedule(p1), Outcome::kScheduled);
  ASSERT_EQ(p1.rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p1.rows[i].seq_id, ids[i]);
    EXPECT_EQ(p1.rows[i].forward.start_pos, 0);
    EXPECT_EQ(p1.rows[i].forward.num_tokens, 256);
    EXPECT_GE(p1.rows[i].snapshot, 0);
  }
  EXPECT_EQ(p1.copies_after.size(), 3u);
  h.commit(p1, {});
  StepPlan p2;
  ASSERT_EQ(h.schedule(p2), Outcome::kScheduled);
  ASSERT_EQ(p2.rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p2.rows[i].seq_id, ids[i]);
    EXPECT_EQ(p2.rows[i].forward.start_pos, 256);
    EXPECT_EQ(p2.rows[i].forward.num_tokens, 44);
  }
  h.commit(p2);
}

// Prompts held at their checkpoint cut must not wait behind a sequence that cannot be admitted:
// R decodes until it needs a block the held prompts A and B took, preempts itself and goes back
// to the head of the queue, where it cannot be admitted until A or B finish. A and B must still
// run their rests (and finish, freeing R's blocks); stopping the scan at R idled the engine.
TEST(Scheduler, HeldPromptsRunPastAHeadThatCannotBeAdmitted) {
  Harness h({.num_blocks = 8,
             .max_num_seqs = 4,
             .max_num_batched_tokens = 1024,
             .num_snapshot_slots = 4});
  const RequestId r = h.add(prompt_of(127, 1), 200);
  StepPlan p0;
  ASSERT_EQ(h.schedule(p0), Outcome::kScheduled);
  h.commit(p0);
  const RequestId a = h.add(prompt_of(300, 2), 1);
  const RequestId b = h.add(prompt_of(300, 3), 1);
  // A step may come out empty (R's decode step preempts R itself); the work must still finish.
  bool preempted = false;
  for (int i = 0;
       i < 400 && (h.finish_of(a) == FinishReason::kNone || h.finish_of(b) == FinishReason::kNone ||
                   h.finish_of(r) == FinishReason::kNone);
       ++i) {
    StepPlan p;
    if (h.schedule(p) == Outcome::kScheduled) h.commit(p);
    preempted = preempted || h.scheduler().stats().num_preemptions > 0;
  }
  EXPECT_TRUE(preempted) << "the scenario needs R to preempt itself";
  EXPECT_EQ(h.finish_of(a), FinishReason::kLength);
  EXPECT_EQ(h.finish_of(b), FinishReason::kLength);
  EXPECT_EQ(h.finish_of(r), FinishReason::kLength);
}

// A host drafter proposing `drafts` for the sequences in `drafting`, nothing for the others.
class FixedDrafter final : public Drafter {
 public:
  FixedDrafter(std::vector<RequestId> drafting, std::vector<int32_t> drafts)
      : drafting_(std::move(drafting)), drafts_(std::move(drafts)) {}
  void propose(RequestId id, std::span<const int32_t>, int max_drafts,
               std::vector<int32_t>& drafts) override {
    if (std::find(drafting_.begin(), drafting_.end(), id) == drafting_.end()) return;
    drafts.assign(drafts_.begin(), drafts_.begin() + std::min<ptrdiff_t>(max_drafts, 3));
  }

 private:
  std::vector<RequestId> drafting_;
  std::vector<int32_t> drafts_;
};

// Zero-overhead scheduling with a host drafter: a step is planned while the one before it is in
// flight. A sequence whose in-flight row verifies drafts gets no row (its next position depends
// on the accepted count); one with a plain row in flight skips a step to draft only while its
// expected accepted drafts exceed one, and a skip that found no drafts counts as a rejection.
TEST(Scheduler, ZeroOverheadDraftingSkipsAStepAfterAVerifyRow) {
  Harness h({});
  const RequestId a = h.add(prompt_of(10, 1), 8);
  const RequestId b = h.add(prompt_of(10, 2), 8);
  h.scheduler().set_drafter(
      std::make_shared<FixedDrafter>(std::vector<RequestId>{a}, std::vector<int32_t>{7, 7, 7}), 3,
      1000);
  StepPlan p1;
  ASSERT_EQ(h.schedule(p1), Outcome::kScheduled);
  ASSERT_EQ(p1.rows.size(), 2u);
  // With p1 in flight both would rather draft next (prior estimate: 0.6 + 0.36 + 0.216 > 1).
  StepPlan p2;
  EXPECT_EQ(h.schedule(p2), Outcome::kIdle);
  h.commit(p1, {7, 8});
  StepPlan p3;
  ASSERT_EQ(h.schedule(p3), Outcome::kScheduled);
  ASSERT_EQ(p3.rows.size(), 2u);
  EXPECT_EQ(p3.rows[0].num_drafts, 3);  // a verifies from committed tokens
  EXPECT_FALSE(p3.rows[0].carried());
  EXPECT_EQ(p3.rows[1].num_drafts, 0);  // b's drafter found nothing
  // With p3 in flight: a skips (a verify row is in flight); b, whose skip found no drafts, no
  // longer expects drafting to pay and decodes on, its token taken from p3's output, which holds
  // one sample per logits row: a's four, then b's.
  StepPlan p4;
  ASSERT_EQ(h.schedule(p4), Outcome::kScheduled);
  ASSERT_EQ(p4.rows.size(), 1u);
  EXPECT_EQ(p4.rows[0].seq_id, b);
  EXPECT_EQ(p4.rows[0].forward.token_from_previous, 4);
  EXPECT_EQ(p4.rows[0].forward.start_pos, 11);
  h.commit_drafts(p3, {7, 9, 11}, {2, 1}, {});  // a accepted one draft
  EXPECT_EQ(h.seq(a).num_tokens(), 13);
  EXPECT_EQ(h.seq(a).num_computed, 12);
  // With p4 in flight: a has nothing in flight and verifies again where its tokens end; b is
  // carried from p4's only sample.
  StepPlan p5;
  ASSERT_EQ(h.schedule(p5), Outcome::kScheduled);
  ASSERT_EQ(p5.rows.size(), 2u);
  EXPECT_EQ(p5.rows[0].seq_id, a);
  EXPECT_EQ(p5.rows[0].forward.start_pos, 12);
  EXPECT_EQ(p5.rows[0].num_drafts, 3);
  EXPECT_EQ(p5.rows[1].forward.token_from_previous, 0);
  h.commit(p4, {13});
  h.commit_drafts(p5, {7, 7, 7, 5, 17}, {4, 1}, {});
  EXPECT_EQ(h.seq(a).num_tokens(), 17);
  EXPECT_EQ(h.seq(b).num_tokens(), 14);
  EXPECT_EQ(h.scheduler().stats().draft_tokens, 6u);
  EXPECT_EQ(h.scheduler().stats().accepted_draft_tokens, 4u);
}

// speculative_method "mtp": the drafts a step's result carries for a row are the next decode row's
// drafts, only while nothing else was committed for that sequence since.
TEST(Scheduler, ExecutorDraftsFeedTheNextDecodeRowOnly) {
  Harness h({});
  h.scheduler().use_executor_drafts(3);
  const RequestId id = h.add(prompt_of(10), 16);
  StepPlan prefill;
  ASSERT_EQ(h.schedule(prefill), Outcome::kScheduled);
  h.commit_drafts(prefill, {7}, {}, {{11, 12, 13}});
  StepPlan verify;
  ASSERT_EQ(h.schedule(verify), Outcome::kScheduled);
  ASSERT_EQ(verify.rows.size(), 1u);
  EXPECT_EQ(verify.rows[0].num_drafts, 3);
  const std::span<const int32_t> input = verify.rows[0].forward.tokens;
  EXPECT_EQ(std::vector<int32_t>(input.begin(), input.end()),
            (std::vector<int32_t>{7, 11, 12, 13}));
  // One draft accepted, then the final token 9; the result drafts one token past them.
  h.commit_drafts(verify, {11, 9}, {2}, {{21}});
  EXPECT_EQ(h.seq(id).num_tokens(), 13);
  EXPECT_EQ(h.scheduler().stats().draft_tokens, 3u);
  EXPECT_EQ(h.scheduler().stats().accepted_draft_tokens, 1u);
  StepPlan again;
  ASSERT_EQ(h.schedule(again), Outcome::kScheduled);
  EXPECT_EQ(again.rows[0].num_drafts, 1);
  // A result without drafts leaves the sequence's drafts stale: a plain decode row.
  h.commit_drafts(again, {21, 5}, {2}, {});
  StepPlan plain;
  ASSERT_EQ(h.schedule(plain), Outcome::kScheduled);
  EXPECT_EQ(plain.rows[0].num_drafts, 0);
  h.commit(plain);
}

// Drafts that fit in a sequence's last block cost no block, so a full cache does not cut them:
// with every block taken, each of three decoding sequences still verifies its drafts. (Regression:
// the spare-block check compared the draft's zero new blocks with free minus the later rows'
// needs, which is negative when the cache is full, so only the last row kept its drafts.)
TEST(Scheduler, DraftsWithinTheLastBlockNeedNoFreeBlocks) {
  Harness h({.num_blocks = 4});  // 3 usable: one per sequence
  h.scheduler().use_executor_drafts(2);
  for (int i = 0; i < 3; ++i) h.add(prompt_of(10, i), 16);
  StepPlan prefill;
  ASSERT_EQ(h.schedule(prefill), Outcome::kScheduled);
  ASSERT_EQ(prefill.rows.size(), 3u);
  h.commit_drafts(prefill, {7, 7, 7}, {}, {{11, 12}, {11, 12}, {11, 12}});
  ASSERT_EQ(h.kv().blocks().num_free(), 0);
  StepPlan verify;
  ASSERT_EQ(h.schedule(verify), Outcome::kScheduled);
  ASSERT_EQ(verify.rows.size(), 3u);
  for (const StepRow& r : verify.rows) EXPECT_EQ(r.num_drafts, 2);
  h.commit_drafts(verify, {11, 12, 5, 11, 12, 5, 11, 12, 5}, {3, 3, 3}, {});
}

// The MTP drafts' probabilities travel with them: a verify row's drafts are recorded for the
// calibration with the cumulative products of their probabilities, with their outcomes.
TEST(Scheduler, ExecutorDraftProbabilitiesAreTheVerifiedDraftsEstimates) {
  Harness h({});
  h.scheduler().use_executor_drafts(3);
  h.add(prompt_of(10), 16);
  StepPlan prefill;
  ASSERT_EQ(h.schedule(prefill), Outcome::kScheduled);
  h.commit_drafts(prefill, {7}, {}, {{11, 12, 13}}, {{0.5f, 0.5f, 0.25f}});
  StepPlan verify;
  ASSERT_EQ(h.schedule(verify), Outcome::kScheduled);
  ASSERT_EQ(verify.rows[0].num_drafts, 3);
  h.commit_drafts(verify, {11, 9}, {2}, {});  // draft 0 accepted, draft 1 rejected
  const DraftCalibration& c = h.scheduler().stats().calibration;
  // Estimates 0.5 (accepted), 0.25 (rejected), 0.0625 (rejected: never reached).
  EXPECT_EQ(c.drafts[5], 1u);
  EXPECT_EQ(c.accepted[5], 1u);
  EXPECT_EQ(c.drafts[2], 1u);
  EXPECT_EQ(c.drafts[0], 1u);
  EXPECT_EQ(c.accepted[2] + c.accepted[0], 0u);
  EXPECT_DOUBLE_EQ(c.estimate_sum[5] + c.estimate_sum[2] + c.estimate_sum[0], 0.8125);
  EXPECT_EQ(h.scheduler().stats().verify_steps, 1u);
  EXPECT_NEAR(calibration_error(c), (0.5 + 0.25 + 0.0625) / 3, 1e-12);
  StepPlan plain;  // the second result drafted nothing
  ASSERT_EQ(h.schedule(plain), Outcome::kScheduled);
  EXPECT_EQ(plain.rows[0].num_drafts, 0);
  h.commit(plain);
}

// The confidence budget reads MTP drafts' probabilities: with a fitted cost model a request
// verifies its likely first draft and not the unlikely ones after it.
TEST(Scheduler, ConfidenceBudgetVerifiesOnlyLikelyMtpDrafts) {
  Harness h({.speculative_budget = "confidence"});
  h.scheduler().use_executor_drafts(3);
  for (int t = 1; t <= 64; t += 3) h.scheduler().observe_decode_step(t, 0.004 + 0.0004 * t);
  h.add(prompt_of(10), 16);
  StepPlan prefill;
  ASSERT_EQ(h.schedule(prefill), Outcome::kScheduled);
  // a_j = 0.99, 0.0099, 0.00891 (the acceptance history's prior would verify all three)
  h.commit_drafts(prefill, {7}, {}, {{11, 12, 13}}, {{0.99f, 0.01f, 0.9f}});
  StepPlan verify;
  ASSERT_EQ(h.schedule(verify), Outcome::kScheduled);
  EXPECT_EQ(verify.rows[0].num_drafts, 1);
  h.commit_drafts(verify, {11, 9}, {2}, {{21, 22, 23}}, {{0.001f, 0.5f, 0.5f}});
  StepPlan none;
  ASSERT_EQ(h.schedule(none), Outcome::kScheduled);
  EXPECT_EQ(none.rows[0].num_drafts, 0);
  h.commit(none);
}

// Under zero-overhead scheduling with MTP drafts, a row carried on the device verifies the drafts
// the step in flight is making, whose probabilities the plan cannot know yet: the confidence
// budget sizes it from the request's acceptance history (the prior here, a = 0.6, 0.36, 0.216).
// With a step cost proportional to its tokens (1 ms + 1 ms per token) one draft pays
// (1.6 / 3 ms against 1 / 2 ms) and a second does not (1.96 / 4 ms); the fixed budget verifies
// all three.
TEST(Scheduler, ConfidenceBudgetSizesRowsCarriedOnTheDevice) {
  for (const std::string budget : {"confidence", "fixed"}) {
    Harness h({.speculative_budget = budget});
    h.scheduler().use_executor_drafts(3);
    for (int t = 1; t <= 64; t += 3) h.scheduler().observe_decode_step(t, 0.001 + 0.001 * t);
    const RequestId id = h.add(prompt_of(10), 16);
    StepPlan prefill;
    ASSERT_EQ(h.schedule(prefill), Outcome::kScheduled);
    StepPlan carried;  // planned while the prefill is in flight
    ASSERT_EQ(h.schedule(carried), Outcome::kScheduled);
    ASSERT_EQ(carried.rows.size(), 1u);
    const StepRow& r = carried.rows[0];
    EXPECT_TRUE(r.carried());
    const int want = budget == "confidence" ? 1 : 3;
    EXPECT_EQ(r.num_drafts, want) << budget;
    EXPECT_EQ(r.forward.carried_tokens, 1 + want) << budget;
    EXPECT_EQ(h.scheduler().stats().device_carried_verify_rows, 1u);
    // The prefill drafted 11, 12, 13; the carried row accepts its first draft and samples 5.
    h.commit_drafts(prefill, {7}, {}, {{11, 12, 13}}, {{0.9f, 0.9f, 0.9f}});
    h.commit_drafts(carried, {11, 5}, {2}, {});
    EXPECT_EQ(h.seq(id).tokens.back(), 5);
    EXPECT_EQ(h.seq(id).num_tokens(), 13) << budget;
    EXPECT_EQ(h.scheduler().stats().draft_tokens, static_cast<uint64_t>(want));
    EXPECT_EQ(h.scheduler().stats().accepted_draft_tokens, 1u);
  }
}

}  // namespace
}  // namespace deepinfer::sched
