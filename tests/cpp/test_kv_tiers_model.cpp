// The KV tiers over the real model executor on the CPU backend (a small V4 config with dummy
// weights): a prompt served from the store or the host tier gives the cold run's tokens and
// logprobs bit for bit, so the fetched KV and snapshot bytes land where the forward reads them,
// in time (the layer-wise import, docs/kv_store.md#the-engine-and-the-tiers).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/config.h"
#include "deepinfer/engine.h"
#include "model/model_instance.h"
#include "small_v4_model.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int hit = -1;
};

Generated generate(Engine& engine, const std::vector<int32_t>& prompt) {
  SamplingParams s;
  s.temperature = 0.0f;
  s.max_tokens = 8;
  s.ignore_eos = true;
  s.logprobs = 1;
  const RequestId id = engine.add_request(prompt, s);
  Generated run;
  for (const RequestOutput& o : engine.run_until_idle()) {
    if (o.id != id) continue;
    if (o.ready) run.hit = o.prompt_cache_hit_tokens;
    run.tokens.insert(run.tokens.end(), o.tokens.begin(), o.tokens.end());
    for (const TokenLogprobs& l : o.logprobs) run.logprobs.push_back(l.logprob);
  }
  return run;
}

void expect_same_bits(const Generated& a, const Generated& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
  EXPECT_EQ(std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * sizeof(float)),
            0);
}

class KvTiersModel : public ::testing::Test {
 protected:
  void SetUp() override { test::write_small_v4(model.path()); }

  EngineConfig config() const {
    EngineConfig c = test::small_v4_engine(model.path());
    c.scheduler.max_num_seqs = 2;
    c.scheduler.max_num_batched_tokens = 512;
    return c;
  }

  // 300 tokens: two full blocks up to the prefix checkpoint, then a suffix to prefill.
  std::vector<int32_t> prompt(int salt) const {
    std::vector<int32_t> p;
    for (int j = 0; j < 300; ++j) p.push_back(2 + (37 * salt + 13 * j + j * j) % 250);
    return p;
  }

  test::TempDir model;
  test::TempDir store;
};

TEST_F(KvTiersModel, AStoreHitAfterARestartEqualsTheColdRun) {
  EngineConfig c = config();
  c.cache.kv_store_path = store.path();
  Generated cold;
  {
    std::unique_ptr<Engine> writer = Engine::create(c);
    cold = generate(*writer, prompt(1));
    writer->flush_kv_tiers();
  }
  EXPECT_EQ(cold.hit, 0);
  std::unique_ptr<Engine> reader = Engine::create(c);
  const Generated warm = generate(*reader, prompt(1));
  EXPECT_EQ(warm.hit, 256);
  EXPECT_EQ(reader->stats().store_hit_tokens, 256u);
  EXPECT_EQ(reader->stats().kv_tier_fetch_failures, 0u);
  expect_same_bits(warm, cold);
  // A second request on the same prefix in the same engine: the GPU index and the host copy.
  expect_same_bits(generate(*reader, prompt(1)), cold);
}

TEST_F(KvTiersModel, AHostHitAfterGpuEvictionEqualsTheColdRun) {
  EngineConfig c = config();
  c.cache.kv_host_cache_bytes = 64 << 20;
  c.cache.num_kv_blocks = 8;  // 7 usable: two 3-block prompts evict the first one's blocks
  std::unique_ptr<Engine> engine = Engine::create(c);
  const Generated cold = generate(*engine, prompt(1));
  generate(*engine, prompt(2));
  generate(*engine, prompt(3));
  const Generated warm = generate(*engine, prompt(1));
  EXPECT_EQ(warm.hit, 256);
  EXPECT_GE(engine->stats().host_hit_tokens, 256u);
  expect_same_bits(warm, cold);
}

// The forward waits for layer L's imported copies right before layer L, not all at once: when it
// waits for layer L, layer L - 1 has already run (its SWA ring holds the new positions) and layer
// L still holds the imported bytes.
TEST(KvTiersForward, TheForwardWaitsForEachLayersImportRightBeforeThatLayer) {
  const ModelConfig config = ModelConfig::from_json_text(test::kSmallV4Config, "test config");
  CacheShape shape;
  shape.num_blocks = 4;
  shape.num_state_slots = 3;
  std::unique_ptr<ModelInstance> m =
      ModelInstance::random(config, shape, "cpu", 1, /*seed=*/7, DType::kF32);
  Backend& be = *m->backend;
  ModelCaches& caches = *m->caches;
  // Payloads of small f32 values (the caches are f32): block 1 and slot 1.
  auto floats = [](int64_t bytes, float base) {
    std::vector<float> f(static_cast<size_t>(bytes) / sizeof(float));
    for (size_t i = 0; i < f.size(); ++i) f[i] = base + 0.001f * static_cast<float>(i % 97);
    return f;
  };
  const std::vector<float> block = floats(caches.bytes_per_block(), 0.01f);
  const std::vector<float> state = floats(caches.bytes_per_state_slot(), 0.02f);
  auto bytes = [](const std::vector<float>& f) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(f.data()),
                                    f.size() * sizeof(float));
  };
  const std::vector<int32_t> ids = {1};
  const std::vector<std::span<const uint8_t>> payloads = {bytes(block)};
  caches.import_layered(be, ids, payloads, 1, bytes(state));
  auto ring = [&](int li) {
    Tensor h = be.to_host(caches.layer(li).swa_ring.narrow(0, 1, 1));
    const auto* p = static_cast<const uint8_t*>(h.raw_data());
    return std::vector<uint8_t>(p, p + h.nbytes());
  };
  std::vector<std::vector<uint8_t>> imported;
  for (int li = 0; li < config.num_hidden_layers; ++li) imported.push_back(ring(li));
  std::vector<int> waited;
  caches.set_import_wait_observer([&](int li) {
    waited.push_back(li);
    EXPECT_TRUE(ring(li) == imported[static_cast<size_t>(li)]) << "layer " << li << " already ran";
    if (li > 0) {
      EXPECT_FALSE(ring(li - 1) == imported[static_cast<size_t>(li - 1)])
          << "layer " << li - 1 << " has not run yet";
    }
  });
  // A row resuming after the imported block: positions 128..131, block table {1, 2}.
  const std::vector<int32_t> tokens = {5, 6, 7, 8};
  const std::vector<int32_t> table = {1, 2};
  ForwardRow row;
  row.slot = 1;
  row.start_pos = 128;
  row.num_tokens = 4;
  row.tokens = tokens;
  row.block_table = table;
  const std::vector<ForwardRow> rows = {row};
  m->forward(rows, table.size(), LogitsMode::kLast, Tensor());
  be.synchronize();
  EXPECT_EQ(waited, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(caches.num_pending_imports(), 0);
}

}  // namespace
}  // namespace deepinfer
