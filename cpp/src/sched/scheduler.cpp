#include "sched/scheduler.h"

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "deepinfer/error.h"

namespace deepinfer::sched {

namespace {

// Host input of a carried row: the forward takes the real token from the device.
// A carried row's host tokens (the device supplies them): the input token and up to 5 drafts.
constexpr int32_t kCarriedPlaceholder[6] = {};

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, std::vector<int> eos_token_ids, KvAllocator& kv)
    : config_(config),
      eos_token_ids_(std::move(eos_token_ids)),
      kv_(kv),
      interleave_(config.prefill_steps_per_decode_step) {}

RequestOutput Scheduler::make_output(const Sequence& s) {
  RequestOutput out;
  out.id = s.id;
  return out;
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  DEEPINFER_CHECK(seq && seq->state == SeqState::kWaiting && !seq->holds_resources(),
                  "bad new sequence");
  Sequence* s = seq.get();
  DEEPINFER_CHECK(seqs_.emplace(s->id, std::move(seq)).second, "duplicate request id");
  waiting_.push_back(s);
  ++num_unfinished_;
}

const Sequence* Scheduler::find(RequestId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

int Scheduler::num_running() const {
  int n = 0;
  for (const Sequence* s : running_) n += s->state == SeqState::kRunning ? 1 : 0;
  return n;
}

int Scheduler::num_waiting() const {
  int n = 0;
  for (const Sequence* s : waiting_) n += s->state == SeqState::kWaiting ? 1 : 0;
  return n;
}

void Scheduler::abort(RequestId id, std::vector<RequestOutput>& out) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second->finished()) return;
  finish(*it->second, FinishReason::kAbort, "", out);
}

void Scheduler::finish(Sequence& s, FinishReason reason, std::string detail,
                       std::vector<RequestOutput>& out) {
  DEEPINFER_CHECK(!s.finished(), "sequence finished twice");
  s.state = SeqState::kFinished;
  s.finish = reason;
  s.finish_detail = std::move(detail);
  --num_unfinished_;
  RequestOutput o = make_output(s);
  o.finish = reason;
  o.finish_detail = s.finish_detail;
  out.push_back(std::move(o));
  retiring_.push_back(s.id);
  release_if_done(s);
}

// Every terminal path ends here: resources go back only once nothing of the sequence is in
// flight (the step that still uses them has been waited for and committed).
void Scheduler::release_if_done(Sequence& s) {
  if (!s.finished() || s.inflight.steps != 0 || !s.holds_resources()) return;
  kv_.release(s);
  --num_holding_;
}

void Scheduler::retire_finished() {
  if (retiring_.empty()) return;
  std::vector<RequestId> keep;
  for (RequestId id : retiring_) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    Sequence* s = it->second.get();
    if (s->inflight.steps > 0) {
      keep.push_back(id);
      continue;
    }
    release_if_done(*s);
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
    running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
    fetching_.erase(std::remove(fetching_.begin(), fetching_.end(), s), fetching_.end());
    seqs_.erase(it);
  }
  retiring_ = std::move(keep);
}

void Scheduler::insert_running(Sequence* s) {
  auto pos = std::upper_bound(
      running_.begin(), running_.end(), s,
      [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  running_.insert(pos, s);
}

bool Scheduler::has_decode_work() const {
  for (const Sequence* s : running_) {
    if (s->state == SeqState::kRunning && s->remaining_budget(config_.max_model_len) > 0)
      return true;
  }
  return false;
}

LocalWish Scheduler::dp_wish() {
  sweep_dead_waiting(waiting_);
  LocalWish wish;
  wish.has_decode = has_decode_work();
  // As schedule_prefill: the first sequence to admit decides whether admission goes on, and a
  // sequence that holds its blocks (cut at a checkpoint) runs wherever it stands.
  bool first = true;
  for (const Sequence* s : waiting_) {
    if (s->state != SeqState::kWaiting) continue;
    if (s->holds_resources()) {
      wish.wants_prefill = true;
      break;
    }
    if (!first) continue;
    first = false;
    if (num_holding_ < config_.max_num_seqs &&
        kv_.blocks().usage() <= config_.kv_admission_watermark) {
      wish.wants_prefill = true;
      break;
    }
  }
  return wish;
}

Scheduler::Outcome Scheduler::schedule(StepPlan& plan, std::vector<RequestOutput>& out,
                                       std::optional<StepKind> voted) {
  retire_finished();
  plan.clear();
  num_sampled_tokens_ = 0;
  num_sampling_rows_ = 0;

  const bool decode_work = has_decode_work();
  bool prefill_work = false;
  for (const Sequence* s : waiting_) {
    if (s->state == SeqState::kWaiting) {
      prefill_work = true;
      break;
    }
  }
  if (!decode_work && !prefill_work) return Outcome::kIdle;

  StepKind kind = voted ? *voted : interleave_.choose(prefill_work, decode_work);
  if (kind == StepKind::kPrefill && !schedule_prefill(plan, out)) {
    plan.clear();
    num_sampled_tokens_ = 0;
    num_sampling_rows_ = 0;
    num_sampling_rows_ = 0;
    // The group voted for prefill: this rank runs an empty one, never a decode.
    if (voted) return Outcome::kIdle;
    // Nothing admissible (blocks, slots or max_num_seqs exhausted): decode instead of idling.
    kind = StepKind::kDecode;
  }
  if (kind == StepKind::kDecode) {
    Outcome o = schedule_decode(plan, out);
    if (o == Outcome::kNeedsDrain) {
      unreserve(plan);
      plan.clear();
      return o;
    }
    // Every decoding sequence skipped this step (Scheduler::sits_out): waiting prompts may use it.
    if (plan.empty() && drafting() && prefill_work && !voted && schedule_prefill(plan, out))
      kind = StepKind::kPrefill;
  }
  if (plan.empty()) return Outcome::kIdle;

  interleave_.record(kind);
  // The stride of the carried outputs a row of the next step may read (InflightLedger).
  for (const StepRow& r : plan.rows) {
    if (r.samples()) seqs_.at(r.seq_id)->inflight.last_step_logit_rows = num_sampled_tokens_;
  }
  plan.step_id = next_step_id_++;
  plan.is_prefill = kind == StepKind::kPrefill;
  ++stats_.num_steps;
  if (plan.is_prefill) ++stats_.num_prefill_steps;
#ifdef DEEPINFER_DEBUG_INVARIANTS
  check_invariants();
#endif
  return Outcome::kScheduled;
}

// Appends a row and reserves its in-flight accounting (released in commit, or by unreserve when
// the plan is dropped).
void Scheduler::add_row(StepPlan& plan, Sequence& s, int q, std::span<const int32_t> drafts,
                        int device_drafts) {
  StepRow& row = plan.rows.emplace_back();
  const int start = s.next_position();
  ForwardRow& f = row.forward;
  f.slot = s.state_slot;
  f.start_pos = start;
  f.num_tokens = q;
  if (device_drafts >= 0) {
    // Planned as if the in-flight row's drafts were all accepted: its tokens (the sample after
    // them, then the drafts the device made past it) and its place are moved back on the device
    // by the drafts it rejects (ForwardRow::carried_tokens, shift_from).
    const InflightLedger& in = s.inflight;
    DEEPINFER_CHECK(q == 1 + device_drafts &&
                        q <= static_cast<int>(std::size(kCarriedPlaceholder)) && in.steps == 1 &&
                        in.last_sampling_row >= 0 && in.last_step_logit_rows > 0 &&
                        start >= s.num_tokens(),
                    "a row carried on the device must follow the sampling row in flight");
    f.tokens = std::span<const int32_t>(kCarriedPlaceholder, static_cast<size_t>(q));
    f.token_from_previous = in.last_sampling_row + in.last_num_drafts;
    f.carried_tokens = q;
    f.carried_stride = in.last_step_logit_rows;
    if (in.last_num_drafts > 0) {
      f.shift_from = in.last_sampling_index;
      f.max_shift = in.last_num_drafts;
    }
    row.num_drafts = device_drafts;
    ++stats_.device_carried_rows;
    if (device_drafts > 0) ++stats_.device_carried_verify_rows;
  } else if (!drafts.empty()) {
    // A verify row: the last committed token, then the drafts at the positions after it.
    DEEPINFER_CHECK(start == s.num_tokens() - 1 && q == 1 + static_cast<int>(drafts.size()) &&
                        s.inflight.steps == 0,
                    "a verify row must be the decode of a sequence with nothing in flight");
    s.verify_input.assign(1, s.tokens.back());
    s.verify_input.insert(s.verify_input.end(), drafts.begin(), drafts.end());
    f.tokens = std::span<const int32_t>(s.verify_input);
    row.num_drafts = static_cast<int>(drafts.size());
  } else if (start >= s.num_tokens()) {
    // The input token is the one the in-flight step is sampling: it is still on the device.
    DEEPINFER_CHECK(q == 1 && start == s.num_tokens() && s.inflight.steps > 0 &&
                        s.inflight.last_sampling_row >= 0,
                    "a carried row must be the one-token decode of the in-flight step's sample");
    f.tokens = std::span<const int32_t>(kCarriedPlaceholder, 1);
    f.token_from_previous = s.inflight.last_sampling_row;
  } else {
    f.tokens = std::span<const int32_t>(s.tokens.data() + start, static_cast<size_t>(q));
    // Every chunk of a prefill names its end: V4.1's YOCO truncation keeps the positions before it.
    f.prompt_end = s.num_tokens();
  }
  f.swa_valid_start = s.swa_valid_start;
  f.replay_end = s.replay_end;
  // Every token before `start` is committed (a carried row starts at num_tokens(); one carried on
  // the device may start further, as planned: V4.1, which reads the history, never plans those).
  f.history = std::span<const int32_t>(s.tokens.data(),
                                       static_cast<size_t>(std::min(start, s.num_tokens())));
  const size_t blocks = static_cast<size_t>(kv_.blocks_for(start + q));
  DEEPINFER_CHECK(s.block_table.size() >= blocks, "a planned row's blocks are not allocated");
  f.block_table = std::span<const int32_t>(s.block_table).first(blocks);
  row.seq_id = s.id;
  row.epoch = s.epoch;
  row.num_sampled = start + q >= s.num_tokens() ? 1 : 0;
  f.num_logits = row.num_sampled > 0 ? 1 + row.num_drafts : 0;
  row.reserved = kStepReservation + row.num_drafts;
  row.params = &s.params;
  row.seed = s.seed;
  row.sequence = &s;
  if (row.samples()) {
    // Output index of the token this row generates (at position start + q).
    const size_t output_index = static_cast<size_t>(start + q - s.num_prompt_tokens);
    if (output_index < s.params.forced_tokens.size())
      row.forced_token = s.params.forced_tokens[output_index];
    s.inflight.last_sampling_row = num_sampled_tokens_;
    s.inflight.last_sampling_index = num_sampling_rows_++;
    s.inflight.last_num_drafts = row.num_drafts;
    num_sampled_tokens_ += f.num_logits;
  }

  s.inflight.steps += 1;
  s.inflight.reserved += row.reserved;
  s.inflight.kv += q;
  DEEPINFER_CHECK(s.inflight.steps <= 2, "more than two steps in flight for one sequence");
}

// Gives back the reservations of a plan that will not be launched.
void Scheduler::unreserve(const StepPlan& plan) {
  for (const StepRow& r : plan.rows) {
    Sequence& s = *seqs_.at(r.seq_id);
    s.inflight.steps -= 1;
    s.inflight.reserved -= r.reserved;
    s.inflight.kv -= r.forward.num_tokens;
  }
}

bool Scheduler::schedule_prefill(StepPlan& plan, std::vector<RequestOutput>& out) {
  int budget = config_.max_num_batched_tokens;
  // In queue order. A prompt cut at its prefix checkpoint keeps its place (its next piece goes
  // after this step's snapshot) and the ones behind it may still fill the step, so `next` only
  // moves past such a sequence; every other one leaves the queue or ends the batch.
  size_t next = 0;
  auto leave_queue = [&] { waiting_.erase(waiting_.begin() + static_cast<ptrdiff_t>(next)); };
  // Admission is first come, first served: once one sequence cannot be admitted, none behind it
  // is. The ones behind it that already hold their blocks (cut at a checkpoint) still run: they
  // may be what frees the blocks it waits for (a preempted sequence goes back to the head).
  bool admitting = true;
  auto stop_admitting = [&] {
    admitting = false;
    ++next;
  };
  while (next < waiting_.size() && budget > 0) {
    Sequence& s = *waiting_[next];
    if (s.state != SeqState::kWaiting) {
      leave_queue();  // finished while queued; retire_finished frees it
      continue;
    }
    if (!s.holds_resources()) {
      if (!admitting) {
        ++next;
        continue;
      }
      if (num_holding_ >= config_.max_num_seqs) {
        stop_admitting();
        continue;
      }
      if (s.num_tokens() >= config_.max_model_len) {
        leave_queue();
        finish(s, FinishReason::kRejected,
               "the prompt has " + std::to_string(s.num_tokens()) + " tokens; max_model_len is " +
                   std::to_string(config_.max_model_len) + " (prompt plus at least one new token)",
               out);
        continue;
      }
      if (!config_.enable_chunked_prefill && s.num_output_tokens() == 0 &&
          s.num_tokens() > config_.max_num_batched_tokens) {
        leave_queue();
        finish(s, FinishReason::kRejected,
               "the prompt has " + std::to_string(s.num_tokens()) +
                   " tokens, more than max_num_batched_tokens " +
                   std::to_string(config_.max_num_batched_tokens) + " with chunked prefill off",
               out);
        continue;
      }
      if (kv_.blocks().usage() > config_.kv_admission_watermark) {
        stop_admitting();
        continue;
      }
      Admission a = kv_.admit(s);
      if (a.status == AdmitStatus::kNever) {
        leave_queue();
        finish(s, FinishReason::kRejected,
               "the sequence needs " + std::to_string(kv_.blocks_for(s.num_tokens())) +
                   " KV blocks; the cache has " + std::to_string(kv_.blocks().num_usable()),
               out);
        continue;
      }
      if (a.status == AdmitStatus::kLater) {
        stop_admitting();
        continue;
      }
      if (a.status == AdmitStatus::kWaitFetch) {
        // Another request's fetch reads its blocks: it waits for that one, holding nothing, and
        // is admitted again (from the GPU index then) once poll_fetches sees it over.
        leave_queue();
        s.state = SeqState::kFetching;
        fetching_.push_back(&s);
        ++stats_.kv_fetch_waits;
        continue;
      }
      ++num_holding_;
      if (a.status == AdmitStatus::kFetching) {
        // Its blocks come up in the background; the requests behind it go on meanwhile.
        leave_queue();
        s.state = SeqState::kFetching;
        fetching_.push_back(&s);
        continue;
      }
      if (a.restore_snapshot >= 0)
        plan.copies_before.emplace_back(a.restore_snapshot, s.state_slot);
      on_admitted(s, a, out);
    }
    const int pos = s.next_position();
    const int remaining = s.num_tokens() - pos;
    DEEPINFER_CHECK(remaining > 0, "a waiting sequence has nothing left to prefill");
    int q = std::min(remaining, budget);
    const bool checkpoint_cut = s.prefix_checkpoint > pos && s.prefix_checkpoint < pos + q;
    if (checkpoint_cut) q = s.prefix_checkpoint - pos;
    // With chunking off a prompt runs whole (or in its two checkpoint pieces); one that does not
    // fit the remaining budget goes first in the next step. Recomputed sequences may chunk.
    if (q < remaining && !checkpoint_cut && !config_.enable_chunked_prefill &&
        s.num_output_tokens() == 0)
      break;
    add_row(plan, s, q);
    budget -= q;
    stats_.prompt_tokens_computed += static_cast<uint64_t>(q);
    if (s.prefix_checkpoint == pos + q) {
      s.prefix_checkpoint = 0;
      const int32_t snap = kv_.prefix_cache().take_snapshot_slot();
      if (snap >= 0) {
        plan.copies_after.emplace_back(s.state_slot, snap);
        plan.rows.back().snapshot = snap;
        plan.rows.back().snapshot_pos = pos + q;
      }
    }
    if (q < remaining) {
      // A chunk the budget cut ends the batch and keeps its place; a checkpoint cut keeps its
      // place while the sequences behind it go on (an agent's suffixes: each stops at its last
      // block boundary, so without this a step would hold one of them).
      if (!checkpoint_cut) break;
      ++next;
      continue;
    }
    leave_queue();
    s.state = SeqState::kRunning;
    insert_running(&s);
  }
  return !plan.empty();
}

void Scheduler::on_admitted(Sequence& s, const Admission& a, std::vector<RequestOutput>& out) {
  stats_.prompt_tokens_cached += static_cast<uint64_t>(a.hit_tokens);
  // A replayed window is approximate: no snapshot of it goes into the prefix cache, whose hits
  // are exact (nor through it to the tiers).
  s.prefix_checkpoint = s.replay_end > 0 ? 0 : kv_.prefix_cache().checkpoint(s);
  if (!s.ready_emitted) {
    s.ready_emitted = true;
    s.prompt_cache_hit_tokens = a.hit_tokens;
    RequestOutput o = make_output(s);
    o.ready = true;
    o.num_prompt_tokens = s.num_prompt_tokens;
    o.prompt_cache_hit_tokens = a.hit_tokens;
    out.push_back(std::move(o));
  }
}

Scheduler::Outcome Scheduler::schedule_decode(StepPlan& plan, std::vector<RequestOutput>& out) {
  // Recompute-preempted sequences went back to `waiting`; drop them from `running` on every exit.
  auto drop_preempted = [this] {
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const Sequence* s) { return s->state == SeqState::kWaiting; }),
                   running_.end());
  };
  plan_draft_budget();
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    if (s.state != SeqState::kRunning || s.remaining_budget(config_.max_model_len) <= 0) continue;
    const bool on_device = s.inflight.steps > 0 && device_carries();
    if (s.inflight.steps > 0 && !on_device && sits_out(s)) continue;
    const int pos = s.next_position();
    bool scheduled_self = true;
    while (!kv_.grow(s, pos + 1)) {
      int v = choose_preemption_victim(running_, static_cast<int>(i) + 1);
      Sequence& victim = v >= 0 ? *running_[static_cast<size_t>(v)] : s;
      if (victim.inflight.steps > 0) {
        drop_preempted();
        return Outcome::kNeedsDrain;
      }
      preempt(victim, out);
      if (&victim == &s) {
        scheduled_self = false;
        break;
      }
    }
    if (!scheduled_self) continue;
    const int later = static_cast<int>(running_.size() - i - 1);
    if (on_device) {
      int m = device_carried_drafts(s, pos);
      // Drafts grow only into spare blocks, as below.
      const int more = kv_.blocks_for(pos + 1 + m) - static_cast<int>(s.block_table.size());
      if (m > 0 &&
          !((more <= 0 || more <= kv_.blocks().num_free() - later) && kv_.grow(s, pos + 1 + m))) {
        m = 0;
      }
      add_row(plan, s, 1 + m, {}, m);
      continue;
    }
    propose_drafts(s);
    // Drafts grow only into spare blocks: each running sequence after this one may still need
    // a block for its own token, and a draft must never cost another request a preemption.
    const int draft_blocks = kv_.blocks_for(pos + 1 + static_cast<int>(drafts_.size())) -
                             static_cast<int>(s.block_table.size());
    if (!drafts_.empty() &&
        (draft_blocks == 0 || draft_blocks <= kv_.blocks().num_free() - later) &&
        kv_.grow(s, pos + 1 + static_cast<int>(drafts_.size()))) {
      add_row(plan, s, 1 + static_cast<int>(drafts_.size()), drafts_);
    } else {
      add_row(plan, s, 1);  // no drafts, or no blocks for them: a plain decode row
    }
  }
  drop_preempted();
  return Outcome::kScheduled;
}

void Scheduler::preempt(Sequence& s, std::vector<RequestOutput>& out) {
  DEEPINFER_CHECK(s.inflight.steps == 0, "preempting a sequence with a step in flight");
  ++stats_.num_preemptions;
  if (config_.preemption == PreemptionMode::kStop) {
    finish(s, FinishReason::kPreempted,
           "evicted to free KV blocks for older requests (preemption mode stop)", out);
    return;
  }
  kv_.release(s);
  --num_holding_;
  ++s.epoch;
  s.model_drafts_at = -1;  // made over caches that are gone
  s.skip_tiers = false;    // a failed fetch was one store hiccup: the next admission may hit
  s.num_computed = 0;
  s.prefix_checkpoint = 0;
  s.swa_valid_start = 0;  // recomputed from its admission (a replay starts afresh)
  s.replay_end = 0;
  s.state = SeqState::kWaiting;
  waiting_.push_front(&s);
}

void Scheduler::check_invariants() const {
  std::vector<const Sequence*> holders;
  int unfinished = 0;
  for (const auto& [id, s] : seqs_) {
    s->check_invariants();
    if (s->holds_resources()) holders.push_back(s.get());
    if (!s->finished()) ++unfinished;
    if (s->state == SeqState::kRunning &&
        std::find(running_.begin(), running_.end(), s.get()) == running_.end()) {
      throw Error(ErrorCode::kInternal,
                  "running sequence " + std::to_string(id) + " is not in the running queue");
    }
    if (s->state == SeqState::kFetching &&
        std::find(fetching_.begin(), fetching_.end(), s.get()) == fetching_.end()) {
      throw Error(ErrorCode::kInternal,
                  "fetching sequence " + std::to_string(id) + " is not in the fetching list");
    }
  }
  if (unfinished != num_unfinished_) {
    throw Error(ErrorCode::kInternal, "unfinished count " + std::to_string(num_unfinished_) +
                                          " but " + std::to_string(unfinished) +
                                          " sequences are unfinished");
  }
  if (static_cast<int>(holders.size()) != num_holding_) {
    throw Error(ErrorCode::kInternal, std::to_string(holders.size()) +
                                          " sequences hold resources but the count is " +
                                          std::to_string(num_holding_));
  }
  kv_.check_invariants(holders);
}

}  // namespace deepinfer::sched
