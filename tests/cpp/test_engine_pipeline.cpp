// The engine loop and its zero-overhead pipeline over the scripted executor (the test double of
// libdeepinfer_testing): outputs equal the model emulation's, with and without zero-overhead
// scheduling, and every pool is full again after a drain, whatever was aborted or preempted.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "deepinfer/engine.h"
#include "deepinfer/testing/scripted_engine.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

using testing::ScriptedModel;

struct Outputs {
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, FinishReason> finish;
  std::map<RequestId, int> hits;
};

EngineConfig small_config(bool zero_overhead, int num_kv_blocks = 64) {
  EngineConfig c;
  c.scheduler.max_num_seqs = 6;
  c.scheduler.max_num_batched_tokens = 192;
  c.scheduler.max_model_len = 2048;
  c.cache.num_kv_blocks = num_kv_blocks;
  c.cache.num_prefix_snapshots = 4;
  c.scheduler.zero_overhead = zero_overhead;
  return c;
}

// Steps `engine` until idle, checking its invariants after every step.
void drain(Engine& engine, Outputs& run) {
  while (engine.has_unfinished()) {
    for (RequestOutput& o : engine.step()) {
      auto& t = run.tokens[o.id];
      t.insert(t.end(), o.tokens.begin(), o.tokens.end());
      if (o.ready) run.hits[o.id] = o.prompt_cache_hit_tokens;
      if (o.finish != FinishReason::kNone) run.finish[o.id] = o.finish;
    }
    engine.check_invariants();
    ASSERT_LE(engine.num_inflight_steps(), 1);
  }
  EXPECT_EQ(engine.num_inflight_steps(), 0);
}

void expect_pools_full(const Engine& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.num_blocks_free, s.num_blocks_total);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_waiting, 0);
}

std::vector<int32_t> reference(const ScriptedModel& model, std::vector<int32_t> context, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(model.next_token(context));
    context.push_back(out.back());
  }
  return out;
}

std::vector<std::vector<int32_t>> random_prompts(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> shared(300);
  for (int32_t& t : shared) t = static_cast<int32_t>(2 + rng() % 900);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    // Every other prompt shares a 256-token prefix, so the prefix cache is exercised too.
    std::vector<int32_t> p;
    if (i % 2 == 0) p.assign(shared.begin(), shared.begin() + 256);
    const int extra = 1 + static_cast<int>(rng() % 250);
    for (int k = 0; k < extra; ++k) p.push_back(static_cast<int32_t>(2 + rng() % 900));
    prompts.push_back(std::move(p));
  }
  return prompts;
}

TEST(EnginePipeline, OutputsEqualTheModelEmulationWithAndWithoutZeroOverhead) {
  const ScriptedModel model;
  const auto prompts = random_prompts(12, 7);
  std::vector<std::vector<int32_t>> outputs[2];
  for (bool zos : {false, true}) {
    auto engine = testing::make_scripted_engine(small_config(zos), model);
    SamplingParams p;
    p.max_tokens = 24;
    std::vector<RequestId> ids;
    for (const auto& prompt : prompts) ids.push_back(engine->add_request(prompt, p));
    Outputs run;
    drain(*engine, run);
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(run.finish[ids[i]], FinishReason::kLength);
      EXPECT_EQ(run.tokens[ids[i]], reference(model, prompts[i], 24)) << "request " << i;
      outputs[zos ? 1 : 0].push_back(run.tokens[ids[i]]);
    }
    expect_pools_full(*engine);
    EXPECT_GT(engine->stats().prompt_tokens_cached, 0u) << "no prefix hit was exercised";
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

TEST(EnginePipeline, ZeroOverheadLeavesOneStepRunningBetweenCalls) {
  const ScriptedModel model;
  for (bool zos : {false, true}) {
    auto engine = testing::make_scripted_engine(small_config(zos), model);
    SamplingParams p;
    p.max_tokens = 5;
    engine->add_request({5, 6, 7}, p);
    engine->step();
    EXPECT_EQ(engine->num_inflight_steps(), zos ? 1 : 0);
    Outputs run;
    drain(*engine, run);
    expect_pools_full(*engine);
  }
}

TEST(EnginePipeline, AbortsAtEveryStageAndPreemptionsLeaveEveryPoolFull) {
  ScriptedModel model;
  model.eos_probability = 0.002;
  // 13 usable blocks for 6 sequences of up to ~1000 tokens: decode runs out and preempts.
  auto engine = testing::make_scripted_engine(small_config(true, 14), model);
  std::mt19937 rng(11);
  const auto prompts = random_prompts(30, 3);
  std::vector<RequestId> live;
  Outputs run;
  size_t next = 0;
  for (int step = 0; step < 400 && (next < prompts.size() || engine->has_unfinished()); ++step) {
    // A burst of arrivals first (the cache fills and decode must preempt), then a trickle.
    while (next < prompts.size() && (next < 12 || rng() % 3 == 0)) {
      SamplingParams p;
      p.max_tokens = 100 + static_cast<int>(rng() % 400);
      live.push_back(engine->add_request(prompts[next++], p));
      if (next >= 12) break;
    }
    if (!live.empty() && rng() % 15 == 0) engine->abort(live[rng() % live.size()]);
    for (RequestOutput& o : engine->step()) {
      if (o.finish != FinishReason::kNone) run.finish[o.id] = o.finish;
    }
    engine->check_invariants();
  }
  drain(*engine, run);
  expect_pools_full(*engine);
  EXPECT_EQ(run.finish.size(), next);
  EXPECT_GT(engine->stats().num_preemptions, 0u);
  int aborted = 0;
  for (const auto& [id, f] : run.finish) aborted += f == FinishReason::kAbort ? 1 : 0;
  EXPECT_GT(aborted, 0);
}

TEST(EnginePipeline, ForcedTokensAreEmittedAndFedBack) {
  const ScriptedModel model;
  auto engine = testing::make_scripted_engine(small_config(true), model);
  SamplingParams p;
  p.max_tokens = 6;
  p.forced_tokens = {100, 200, 300};
  const std::vector<int32_t> prompt = {9, 8, 7};
  const RequestId id = engine->add_request(prompt, p);
  Outputs run;
  drain(*engine, run);
  std::vector<int32_t> want = {100, 200, 300};
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), want.begin(), want.end());
  const std::vector<int32_t> rest = reference(model, context, 3);
  want.insert(want.end(), rest.begin(), rest.end());
  EXPECT_EQ(run.tokens[id], want);
}

TEST(EnginePipeline, APrefixHitGivesTheColdRunsTokens) {
  const ScriptedModel model;
  auto engine = testing::make_scripted_engine(small_config(true), model);
  std::vector<int32_t> prompt(400);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + i % 500);
  SamplingParams p;
  p.max_tokens = 10;
  const RequestId cold = engine->add_request(prompt, p);
  Outputs run;
  drain(*engine, run);
  const RequestId warm = engine->add_request(prompt, p);
  drain(*engine, run);
  EXPECT_EQ(run.hits[cold], 0);
  EXPECT_EQ(run.hits[warm], 384);
  EXPECT_EQ(run.tokens[warm], run.tokens[cold]);
  expect_pools_full(*engine);
}

// A store hit whose import into the device throws falls back to recompute inside the step: the
// request gets the cold run's tokens, every pool is full again, and the next hit is served.
TEST(EnginePipeline, AStoreHitWhoseImportFailsRecomputesAndTheEngineGoesOn) {
  deepinfer::test::TempDir dir;
  EngineConfig c = small_config(true);
  c.cache.kv_store_path = dir.path();
  std::vector<int32_t> prompt(400);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(7 + i % 300);
  SamplingParams p;
  p.max_tokens = 10;
  Outputs run;
  ScriptedModel model;
  RequestId cold = 0;
  {
    auto writer = testing::make_scripted_engine(c, model);
    cold = writer->add_request(prompt, p);
    drain(*writer, run);
    writer->flush_kv_tiers();
  }
  model.failing_imports = 1;
  auto engine = testing::make_scripted_engine(c, model);
  const RequestId failed = engine->add_request(prompt, p);
  drain(*engine, run);
  EXPECT_EQ(engine->stats().kv_tier_fetch_failures, 1u);
  EXPECT_EQ(run.hits[failed], 0);
  EXPECT_EQ(run.tokens[failed], run.tokens[cold]);
  EXPECT_EQ(run.finish[failed], FinishReason::kLength);
  expect_pools_full(*engine);
  // Its own run wrote the prompt through again, so the GPU index serves the next one; a fresh
  // engine shows the store still serves it.
  auto reader = testing::make_scripted_engine(c, ScriptedModel{});
  const RequestId hit = reader->add_request(prompt, p);
  drain(*reader, run);
  EXPECT_EQ(run.hits[hit], 384);
  EXPECT_EQ(run.tokens[hit], run.tokens[cold]);
  EXPECT_EQ(reader->stats().kv_tier_fetch_failures, 0u);
  expect_pools_full(*reader);
}

}  // namespace
}  // namespace deepinfer
