// Speculative decoding through the engine loop over the scripted executor, with and without
// zero-overhead scheduling: outputs equal the model emulation's whatever the drafts, and every
// pool is full again after aborts and preemptions while verify rows are in flight. The executor
// checks that every row starts where its state slot ends, so a row planned at a verify row's
// optimistic length (drafts the device rejected) fails loudly.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "deepinfer/engine.h"
#include "deepinfer/testing/scripted_engine.h"
#include "sample/sampler.h"

namespace deepinfer {
namespace {

using testing::ScriptedModel;

// Proposes the emulation's own continuation; each draft is right with probability `p_right`
// (`p_right_odd` for prompts whose first token is odd), decided by a hash of (context length,
// draft index), so every engine sees the same drafts for the same context. Mixed probabilities
// put verify rows and plain rows of sequences that stopped drafting in one step.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(const ScriptedModel& model, double p_right, double p_right_odd)
      : model_(model), p_right_(p_right), p_right_odd_(p_right_odd) {}
  void propose(RequestId, std::span<const int32_t> tokens, int max_drafts,
               std::vector<int32_t>& drafts) override {
    const double p_right = tokens[0] % 2 == 1 ? p_right_odd_ : p_right_;
    std::vector<int32_t> context(tokens.begin(), tokens.end());
    for (int j = 0; j < max_drafts; ++j) {
      const int32_t next = model_.next_token(context);
      const uint64_t h = sample::splitmix64(context.size() * 131 + static_cast<uint64_t>(j));
      const bool right = static_cast<double>(h >> 11) * 0x1.0p-53 < p_right;
      drafts.push_back(right ? next : 2 + (next + 1) % (model_.vocab_size - 2));
      context.push_back(drafts.back());
    }
    ++calls;
  }
  int calls = 0;

 private:
  ScriptedModel model_;
  double p_right_;
  double p_right_odd_;
};

EngineConfig spec_config(bool zero_overhead, int drafts, int num_kv_blocks = 64) {
  EngineConfig c;
  c.scheduler.max_num_seqs = 6;
  c.scheduler.max_num_batched_tokens = 192;
  c.scheduler.max_model_len = 2048;
  c.cache.num_kv_blocks = num_kv_blocks;
  c.cache.num_prefix_snapshots = 4;
  c.scheduler.zero_overhead = zero_overhead;
  c.scheduler.speculative_zero_overhead = zero_overhead;
  c.scheduler.num_speculative_tokens = drafts;
  c.scheduler.speculative_method = "external";
  return c;
}

std::vector<int32_t> reference(const ScriptedModel& model, std::vector<int32_t> context, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(model.next_token(context));
    context.push_back(out.back());
  }
  return out;
}

std::vector<std::vector<int32_t>> prompts_with_shared_prefix(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> shared(256);
  for (int32_t& t : shared) t = static_cast<int32_t>(2 + rng() % 900);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> p;
    if (i % 2 == 0) p = shared;  // prefix-cache hits for every other prompt
    const int extra = 1 + static_cast<int>(rng() % 200);
    for (int k = 0; k < extra; ++k) p.push_back(static_cast<int32_t>(2 + rng() % 900));
    prompts.push_back(std::move(p));
  }
  return prompts;
}

struct Outputs {
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, FinishReason> finish;
  int calls_left_running = 0;  // step() calls that returned with a step still in flight
};

void drain(Engine& engine, Outputs& run) {
  while (engine.has_unfinished()) {
    for (RequestOutput& o : engine.step()) {
      auto& t = run.tokens[o.id];
      t.insert(t.end(), o.tokens.begin(), o.tokens.end());
      if (o.finish != FinishReason::kNone) run.finish[o.id] = o.finish;
    }
    engine.check_invariants();
    ASSERT_LE(engine.num_inflight_steps(), 1);
    run.calls_left_running += engine.num_inflight_steps();
  }
  EXPECT_EQ(engine.num_inflight_steps(), 0);
}

void expect_pools_full(const Engine& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.num_blocks_free, s.num_blocks_total);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_waiting, 0);
}

TEST(EngineSpecPipeline, OutputsEqualTheEmulationWithDraftsAndZeroOverheadOnAndOff) {
  const ScriptedModel model;
  const auto prompts = prompts_with_shared_prefix(10, 3);
  constexpr int kTokens = 40;
  for (double p_right : {1.0, 0.7, 0.0, -1.0}) {
    for (bool zos : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "p_right " << p_right << " zero_overhead " << zos);
      auto engine = testing::make_scripted_engine(spec_config(zos, 3), model);
      // -1: always right for prompts with an odd first token, always wrong for the others.
      auto drafter = p_right < 0 ? std::make_shared<OracleDrafter>(model, 0.0, 1.0)
                                 : std::make_shared<OracleDrafter>(model, p_right, p_right);
      engine->set_drafter(drafter);
      SamplingParams p;
      p.max_tokens = kTokens;
      std::vector<RequestId> ids;
      for (const auto& prompt : prompts) ids.push_back(engine->add_request(prompt, p));
      Outputs run;
      drain(*engine, run);
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(run.finish[ids[i]], FinishReason::kLength);
        EXPECT_EQ(run.tokens[ids[i]], reference(model, prompts[i], kTokens)) << "request " << i;
      }
      expect_pools_full(*engine);
      const EngineStats s = engine->stats();
      EXPECT_GT(s.prompt_tokens_cached, 0u) << "no prefix hit was exercised";
      EXPECT_GT(s.verify_rows, 0u);
      if (p_right == 1.0) {
        EXPECT_GT(s.accepted_draft_tokens, s.verify_rows);
      }
      if (p_right == 0.0) {
        EXPECT_EQ(s.accepted_draft_tokens, 0u);
      }
      if (p_right != 0.0 && p_right < 1.0) {
        EXPECT_GT(s.accepted_draft_tokens, 0u);
        EXPECT_LT(s.accepted_draft_tokens, s.draft_tokens);
      }
      // With zero-overhead scheduling the pipeline keeps a step running between calls.
      if (zos) {
        EXPECT_GT(run.calls_left_running, 0);
      }
    }
  }
}

// Aborts at random moments (verify rows in flight included), preemptions from a small cache and
// EOS stops: every request ends once, the survivors' outputs are the emulation's, and every pool
// is full after the drain.
TEST(EngineSpecPipeline, AbortsPreemptionsAndStopsWhileDraftsAreInFlightLeakNothing) {
  ScriptedModel model;
  model.eos_probability = 0.004;
  for (bool zos : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "zero_overhead " << zos);
    auto engine = testing::make_scripted_engine(spec_config(zos, 4, /*num_kv_blocks=*/14), model);
    engine->set_drafter(std::make_shared<OracleDrafter>(model, 0.1, 0.9));
    std::mt19937 rng(zos ? 5 : 6);
    const auto prompts = prompts_with_shared_prefix(24, 9);
    std::map<RequestId, size_t> prompt_of;
    std::vector<RequestId> live;
    std::map<RequestId, bool> aborted;
    Outputs run;
    size_t next = 0;
    int preemptions_seen = 0;
    while (next < prompts.size() || engine->has_unfinished()) {
      // A burst of arrivals first (the cache fills and decode must preempt), then a trickle.
      if (next < prompts.size() && (next < 12 || rng() % 3 == 0)) {
        SamplingParams p;
        // Long generations grow past block boundaries, which forces preemptions.
        p.max_tokens = 100 + static_cast<int>(rng() % 400);
        const RequestId id = engine->add_request(prompts[next], p);
        prompt_of[id] = next++;
        live.push_back(id);
      }
      if (!live.empty() && rng() % 15 == 0) {
        const RequestId id = live[rng() % live.size()];
        engine->abort(id);
        aborted[id] = true;
      }
      for (RequestOutput& o : engine->step()) {
        auto& t = run.tokens[o.id];
        t.insert(t.end(), o.tokens.begin(), o.tokens.end());
        if (o.finish != FinishReason::kNone) {
          ASSERT_EQ(run.finish.count(o.id), 0u) << "request " << o.id << " finished twice";
          run.finish[o.id] = o.finish;
          std::erase(live, o.id);
        }
      }
      engine->check_invariants();
      ASSERT_LE(engine->num_inflight_steps(), 1);
      preemptions_seen = static_cast<int>(engine->stats().num_preemptions);
    }
    EXPECT_EQ(engine->num_inflight_steps(), 0);
    EXPECT_EQ(run.finish.size(), prompts.size());
    for (const auto& [id, finish] : run.finish) {
      if (finish == FinishReason::kAbort) {
        EXPECT_TRUE(aborted[id]);
        continue;
      }
      const std::vector<int32_t>& out = run.tokens[id];
      EXPECT_EQ(out, reference(model, prompts[prompt_of[id]], static_cast<int>(out.size())))
          << "request " << id;
    }
    EXPECT_GT(preemptions_seen, 0) << "no preemption was exercised";
    EXPECT_GT(engine->stats().verify_rows, 0u);
    expect_pools_full(*engine);
  }
}

}  // namespace
}  // namespace deepinfer
