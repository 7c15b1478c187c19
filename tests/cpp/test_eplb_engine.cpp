// EPLB inside the running engine (engine/expert_balancer.h): data-parallel groups with
// expert-parallel MoE built through Engine::create on the CPU. Each test names the contract it
// protects:
//   ShuffleLoadsTheInitialValues   load_layer_experts gives an expert the bytes the initial load
//                                  gave it (random weights: a function of seed and name; the
//                                  tiny checkpoint: the stored expert), so a rank gaining an
//                                  expert computes what its previous holder computed
//   ShuffleSlicesAStackedCheckpoint  the same from a stacked (gate_up_proj) checkpoint
//   OutputsUnchangedAcrossRebalances  greedy tokens with EPLB on equal EPLB off, bit for bit, with
//                                  2 and 4 ranks and one redundant slot per rank, while rebalances
//                                  happen (stats) and move experts; every block and state slot
//                                  is free afterwards
//   RebalanceLowersSkewedImbalance  on a skewed workload (one prompt repeated), the window's
//                                  max/mean rank load under the new placement is <= the old one's
//   OptionsAreChecked              enable_eplb without expert parallelism names the option
// The tiny checkpoint (python -m deepinfer.tiny) is used when it is in the deepinfer cache or
// DEEPINFER_TINY_CHECKPOINT names it; the dummy-weight runs need nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "deepinfer/engine.h"
#include "deepinfer/engine_config.h"
#include "deepinfer/error.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

// The tiny model's config.json, cut to a small vocabulary for the dummy-weight runs.
const char* kSmallConfig = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
  "layer_types": ["sliding_attention", "compressed_sparse_attention",
                  "heavily_compressed_attention", "compressed_sparse_attention"],
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
  "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
  "partial_rotary_factor": 0.25, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
  "sliding_window": 128, "index_n_heads": 16, "index_head_dim": 32, "index_topk": 16,
  "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
  "n_shared_experts": 1, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
  "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "rms_norm_eps": 1e-06,
  "swiglu_limit": 10.0, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
  "rope_parameters": {
    "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "partial_rotary_factor": 0.25,
                 "factor": 16.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
                 "beta_slow": 1, "attention_factor": 1.0}},
  "max_position_embeddings": 65536, "bos_token_id": 0, "eos_token_id": 1,
  "tie_word_embeddings": false, "hidden_act": "silu", "dtype": "float32"})";

class DummyModelDir {
 public:
  DummyModelDir() {
    std::ofstream out(dir_.file("config.json"));
    out << kSmallConfig;
  }
  std::string path() const { return dir_.path(); }

 private:
  test::TempDir dir_;
};

// The tiny checkpoint, or "" when this machine has none.
std::string tiny_checkpoint() {
  auto usable = [](const fs::path& d) {
    return fs::exists(d / "config.json") && fs::exists(d / "model.safetensors");
  };
  if (const char* env = std::getenv("DEEPINFER_TINY_CHECKPOINT"); env != nullptr && *env != 0) {
    return usable(env) ? std::string(env) : std::string();
  }
  std::vector<fs::path> roots;
  if (const char* c = std::getenv("DEEPINFER_CACHE"); c != nullptr && *c != 0) roots.push_back(c);
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != 0)
    roots.push_back(fs::path(x) / "deepinfer");
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != 0)
    roots.push_back(fs::path(h) / ".cache" / "deepinfer");
  for (const fs::path& root : roots) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("tiny-v4-") && !name.starts_with("tiny-v4-mtp-") && usable(entry.path()))
        return entry.path().string();
    }
  }
  return "";
}

bool same_bytes(Backend& be, const Tensor& a, const Tensor& b) {
  const Tensor ha = be.to_host(a);
  const Tensor hb = be.to_host(b);
  return ha.shape() == hb.shape() && ha.dtype() == hb.dtype() &&
         std::memcmp(ha.data<uint8_t>(), hb.data<uint8_t>(), ha.nbytes()) == 0;
}

void expect_experts_match(Backend& be, const ModelWeights& full, int layer,
                          const std::vector<int32_t>& experts, const ExpertWeights& got) {
  ASSERT_EQ(got.w1.size(), experts.size());
  const ExpertWeights& want = full.layers[static_cast<size_t>(layer)].ffn.experts;
  for (size_t i = 0; i < experts.size(); ++i) {
    const auto e = static_cast<size_t>(experts[i]);
    SCOPED_TRACE("layer " + std::to_string(layer) + " expert " + std::to_string(e));
    EXPECT_TRUE(same_bytes(be, got.w1[i].values, want.w1[e].values));
    EXPECT_TRUE(same_bytes(be, got.w3[i].values, want.w3[e].values));
    EXPECT_TRUE(same_bytes(be, got.w2[i].values, want.w2[e].values));
  }
}

TEST(EplbEngine, ShuffleLoadsTheInitialValues) {
  const std::vector<int32_t> experts = {5, 0, 5, 7};  // a replica twice, out of order
  {
    DummyModelDir dir;
    const ModelConfig config = ModelConfig::from_file(dir.path() + "/config.json");
    std::unique_ptr<Backend> be = make_backend("cpu", 1);
    const ModelWeights full = random_model_weights(config, *be, 42, DType::kF32);
    for (int layer : {0, 2}) {
      const ExpertWeights got =
          load_layer_experts(nullptr, config, *be, layer, experts, {}, 42, DType::kF32);
      expect_experts_match(*be, full, layer, experts, got);
    }
    // Another seed draws other weights: the comparison above can fail.
    const ExpertWeights other =
        load_layer_experts(nullptr, config, *be, 2, experts, {}, 43, DType::kF32);
    EXPECT_FALSE(same_bytes(*be, other.w1[0].values,
                            full.layers[2].ffn.experts.w1[static_cast<size_t>(experts[0])].values));
  }
  const std::string tiny = tiny_checkpoint();
  if (tiny.empty()) GTEST_SKIP() << "no tiny checkpoint (python -m deepinfer.tiny makes one)";
  const ModelConfig config = ModelConfig::from_file(tiny + "/config.json");
  const Checkpoint ckpt = Checkpoint::open(tiny);
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  const ModelWeights full = load_model_weights(ckpt, config, *be);
  for (int layer : {1, 3}) {
    const ExpertWeights got = load_layer_experts(&ckpt, config, *be, layer, experts);
    expect_experts_match(*be, full, layer, experts, got);
  }
}

TEST(EplbEngine, ShuffleSlicesAStackedCheckpoint) {
  // transformers' stacked layout (gate_up_proj [E, 2I, H], down_proj [E, H, I]): a gained
  // expert is its slices, read alone.
  DummyModelDir dir;
  const ModelConfig config = ModelConfig::from_file(dir.path() + "/config.json");
  const int64_t e_count = config.n_routed_experts;
  const int64_t i_size = config.moe_intermediate_size;
  const int64_t h = config.hidden_size;
  std::vector<float> gate_up(static_cast<size_t>(e_count * 2 * i_size * h));
  std::vector<float> down(static_cast<size_t>(e_count * h * i_size));
  for (size_t i = 0; i < gate_up.size(); ++i) gate_up[i] = static_cast<float>(i % 977) * 0.25f;
  for (size_t i = 0; i < down.size(); ++i) down[i] = -static_cast<float>(i % 613) * 0.5f;
  test::TempDir ckpt_dir;
  write_safetensors(
      ckpt_dir.file("model.safetensors"),
      {{"layers.2.ffn.experts.gate_up_proj",
        Tensor::from_vector(gate_up, {e_count, 2 * i_size, h})},
       {"layers.2.ffn.experts.down_proj", Tensor::from_vector(down, {e_count, h, i_size})}});
  const Checkpoint ckpt = Checkpoint::open(ckpt_dir.path());
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  const std::vector<int32_t> experts = {6, 1};
  const ExpertWeights got = load_layer_experts(&ckpt, config, *be, 2, experts);
  ASSERT_EQ(got.w1.size(), 2u);
  for (size_t k = 0; k < experts.size(); ++k) {
    const auto e = static_cast<int64_t>(experts[k]);
    const Tensor w1 = be->to_host(got.w1[k].values);
    const Tensor w3 = be->to_host(got.w3[k].values);
    const Tensor w2 = be->to_host(got.w2[k].values);
    ASSERT_EQ(w1.shape(), (Shape{i_size, h}));
    ASSERT_EQ(w2.shape(), (Shape{h, i_size}));
    const float* gu = gate_up.data() + e * 2 * i_size * h;
    EXPECT_EQ(0, std::memcmp(w1.data<float>(), gu, w1.nbytes()));
    EXPECT_EQ(0, std::memcmp(w3.data<float>(), gu + i_size * h, w3.nbytes()));
    EXPECT_EQ(0, std::memcmp(w2.data<float>(), down.data() + e * h * i_size, w2.nbytes()));
  }
}

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;  // per request, in add order
  EngineStats stats;
  EngineStats before;  // before the first request
};

EngineConfig group_config(const std::string& model, bool dummy, int ranks, bool eplb) {
  EngineConfig c;
  c.model_path = model;
  c.load_format = dummy ? "dummy" : "auto";
  c.placement.device = "cpu";
  c.placement.num_threads = 1;
  c.scheduler.max_num_seqs = 8;
  c.scheduler.max_model_len = 512;
  c.cache.num_kv_blocks = 64;
  c.parallel.data_parallel_size = ranks;
  c.parallel.expert_parallel_size = ranks;
  c.parallel.redundant_experts_per_rank = 1;
  c.parallel.enable_eplb = eplb;
  // Rebalances after group steps 4, 20, 36: several within one short run.
  c.parallel.eplb_window_steps = 8;
  c.parallel.eplb_rebalance_interval = 16;
  c.seed = 7;
  return c;
}

RunResult run_group(const EngineConfig& config, const std::vector<std::vector<int32_t>>& prompts,
                    int max_tokens) {
  std::unique_ptr<Engine> engine = Engine::create(config);
  RunResult r;
  r.before = engine->stats();
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = max_tokens;
  greedy.ignore_eos = true;
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[engine->add_request(prompts[i], greedy)] = i;
  r.tokens.resize(prompts.size());
  for (int guard = 0; engine->num_unfinished() > 0; ++guard) {
    if (guard > 10000) throw Error(ErrorCode::kInternal, "the group did not finish");
    for (const RequestOutput& o : engine->step()) {
      auto& t = r.tokens[index.at(o.id)];
      t.insert(t.end(), o.tokens.begin(), o.tokens.end());
    }
    engine->check_invariants();
  }
  EXPECT_EQ(engine->num_inflight_steps(), 0);
  r.stats = engine->stats();
  return r;
}

std::vector<std::vector<int32_t>> mixed_prompts(int vocab) {
  std::vector<std::vector<int32_t>> prompts;
  uint32_t h = 12345;
  for (int n : {3, 17, 40, 9, 64, 5, 23}) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) {
      h = h * 1664525u + 1013904223u;
      p.push_back(2 + static_cast<int32_t>((h >> 8) % static_cast<uint32_t>(vocab - 2)));
    }
    prompts.push_back(p);
  }
  return prompts;
}

void expect_nothing_leaked(const RunResult& r) {
  EXPECT_EQ(r.stats.num_blocks_free, r.stats.num_blocks_total);
  EXPECT_EQ(r.stats.num_blocks_free, r.before.num_blocks_free);
  EXPECT_EQ(r.stats.num_state_slots_free, r.before.num_state_slots_free);
  EXPECT_EQ(r.stats.num_running, 0);
  EXPECT_EQ(r.stats.num_waiting, 0);
}

void check_outputs_unchanged(const std::string& model, bool dummy, int ranks, int vocab,
                             bool zero_overhead = true) {
  SCOPED_TRACE(std::to_string(ranks) + " ranks, " + (dummy ? "dummy weights" : model) +
               (zero_overhead ? "" : ", zero_overhead off"));
  const auto prompts = mixed_prompts(vocab);
  EngineConfig off_config = group_config(model, dummy, ranks, false);
  EngineConfig on_config = group_config(model, dummy, ranks, true);
  off_config.scheduler.zero_overhead = zero_overhead;
  on_config.scheduler.zero_overhead = zero_overhead;
  const RunResult off = run_group(off_config, prompts, 40);
  const RunResult on = run_group(on_config, prompts, 40);
  std::printf("%d ranks: %llu rebalances, last pause %.4f s, max/mean %.3f -> %.3f\n", ranks,
              static_cast<unsigned long long>(on.stats.eplb_rebalances),
              on.stats.eplb_last_pause_seconds, on.stats.eplb_max_over_mean_before,
              on.stats.eplb_max_over_mean_after);
  EXPECT_EQ(off.stats.eplb_rebalances, 0u);
  EXPECT_GE(on.stats.eplb_rebalances, 2u);
  EXPECT_GT(on.stats.eplb_last_pause_seconds, 0.0);
  // The rebalances moved experts (a placement that never changes would prove nothing).
  EXPECT_LT(on.stats.eplb_max_over_mean_after, on.stats.eplb_max_over_mean_before);
  ASSERT_EQ(on.tokens.size(), off.tokens.size());
  for (size_t i = 0; i < on.tokens.size(); ++i) {
    EXPECT_EQ(on.tokens[i].size(), 40u);
    EXPECT_EQ(on.tokens[i], off.tokens[i]) << "request " << i;
  }
  expect_nothing_leaked(on);
  expect_nothing_leaked(off);
}

TEST(EplbEngine, OutputsUnchangedAcrossRebalancesDummyWeights) {
  DummyModelDir dir;
  check_outputs_unchanged(dir.path(), true, 2, 512);
  check_outputs_unchanged(dir.path(), true, 4, 512);
  check_outputs_unchanged(dir.path(), true, 2, 512, /*zero_overhead=*/false);
}

TEST(EplbEngine, OutputsUnchangedAcrossRebalancesTinyCheckpoint) {
  const std::string tiny = tiny_checkpoint();
  if (tiny.empty()) GTEST_SKIP() << "no tiny checkpoint (python -m deepinfer.tiny makes one)";
  check_outputs_unchanged(tiny, false, 2, 4096);
  check_outputs_unchanged(tiny, false, 4, 4096);
}

TEST(EplbEngine, RebalanceLowersSkewedImbalance) {
  DummyModelDir dir;
  // One prompt, repeated: every rank routes the same tokens (the hash layer the same experts),
  // so a few experts take most of the pairs.
  const std::vector<int32_t> prompt = {7, 7, 7, 300, 7, 7, 9, 7, 7, 7, 7, 300, 7, 7, 7, 7};
  const std::vector<std::vector<int32_t>> prompts(8, prompt);
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const RunResult r = run_group(group_config(dir.path(), true, ranks, true), prompts, 30);
    std::printf("skewed, %d ranks: %llu rebalances, max/mean %.3f -> %.3f\n", ranks,
                static_cast<unsigned long long>(r.stats.eplb_rebalances),
                r.stats.eplb_max_over_mean_before, r.stats.eplb_max_over_mean_after);
    EXPECT_GE(r.stats.eplb_rebalances, 1u);
    EXPECT_GT(r.stats.eplb_max_over_mean_before, 1.0);
    EXPECT_LT(r.stats.eplb_max_over_mean_after, r.stats.eplb_max_over_mean_before);
    expect_nothing_leaked(r);
  }
}

TEST(EplbEngine, OptionsAreChecked) {
  DummyModelDir dir;
  EngineConfig c = group_config(dir.path(), true, 2, true);
  c.parallel.expert_parallel_size = 1;
  c.parallel.redundant_experts_per_rank = 0;
  try {
    Engine::create(c);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'enable_eplb'"), std::string::npos) << e.what();
  }
  c = group_config(dir.path(), true, 2, true);
  c.parallel.eplb_window_steps = 0;
  try {
    Engine::create(c);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'eplb_window_steps'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
