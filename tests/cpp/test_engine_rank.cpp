// Engine::create_rank: the ranks of a data-parallel, expert-parallel group made one by one over a
// communicator the caller owns (an embedding server's one process per GPU, here threads over the
// in-process communicator), stepped in lock-step by the caller. Each test names what it protects:
//   RanksOverCallerCommunicatorEqualOneEngine  greedy tokens equal one engine's; each rank runs its
//                                             own requests; ids name the rank; nothing leaks
//   SizeMismatchNamesTheOption                 data_parallel_size != the group's size
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/communicator.h"
#include "deepinfer/engine.h"
#include "deepinfer/error.h"
#include "dist/inprocess_communicator.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

// A small V4 config (transformers' spelling); load_format "dummy" draws every weight from the
// engine seed and the tensor's name, so every rank holds the same values for an expert as the
// single engine does.
const char* kConfig = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
  "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25, "qk_rope_head_dim": 8,
  "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
  "index_n_heads": 4, "index_head_dim": 32, "index_topk": 3,
  "n_routed_experts": 8, "num_experts_per_tok": 4, "moe_intermediate_size": 32,
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
  "layer_types": ["sliding_attention", "compressed_sparse_attention",
                  "heavily_compressed_attention", "compressed_sparse_attention"],
  "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
  "rope_parameters": {
    "compress": {"attention_factor": 1.0, "beta_fast": 32, "beta_slow": 1, "factor": 4.0,
                 "original_max_position_embeddings": 32, "partial_rotary_factor": 0.25,
                 "rope_theta": 160000.0, "rope_type": "yarn"},
    "main": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"}},
  "rope_theta": 10000.0, "compress_rope_theta": 160000.0, "dtype": "float32",
  "max_position_embeddings": 1024,
  "eos_token_id": 1, "bos_token_id": 0, "rms_norm_eps": 1e-06, "hc_eps": 1e-06
})";

EngineConfig config_for(const std::string& dir, int ranks) {
  EngineConfig c;
  c.model_path = dir;
  c.load_format = "dummy";
  c.seed = 7;
  c.placement.device = "cpu";
  c.placement.num_threads = 1;
  c.scheduler.max_num_seqs = 4;
  c.scheduler.max_model_len = 512;
  c.parallel.data_parallel_size = ranks;
  c.parallel.expert_parallel_size = ranks;
  return c;
}

std::vector<std::vector<int32_t>> prompts() {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> tokens;
    for (int j = 0; j < 5 + 11 * i; ++j) tokens.push_back(2 + (37 * i + 13 * j) % 250);
    p.push_back(tokens);
  }
  return p;
}

SamplingParams greedy() {
  SamplingParams s;
  s.temperature = 0.0f;
  s.max_tokens = 12;
  s.ignore_eos = true;
  return s;
}

TEST(EngineRank, RanksOverCallerCommunicatorEqualOneEngine) {
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << kConfig;

  std::unique_ptr<Engine> single = Engine::create(config_for(dir.path(), 1));
  std::map<RequestId, size_t> single_ids;
  for (const auto& p : prompts()) single_ids[single->add_request(p, greedy())] = single_ids.size();
  std::vector<std::vector<int32_t>> want(prompts().size());
  for (const RequestOutput& o : single->run_until_idle()) {
    auto& t = want[single_ids.at(o.id)];
    t.insert(t.end(), o.tokens.begin(), o.tokens.end());
  }

  const int n = 2;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Backend*> raw;
  for (int r = 0; r < n; ++r) {
    backends.push_back(make_cpu_backend(1));
    raw.push_back(backends.back().get());
  }
  std::vector<std::unique_ptr<dist::Communicator>> comms = dist::make_inprocess_group(raw);
  std::vector<std::unique_ptr<Engine>> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back(Engine::create_rank(config_for(dir.path(), n),
                                        std::move(backends[static_cast<size_t>(r)]),
                                        *comms[static_cast<size_t>(r)]));
  }
  // The caller routes: request i to rank i % 2. An id names its rank.
  std::map<RequestId, size_t> ids;
  for (size_t i = 0; i < prompts().size(); ++i) {
    const RequestId id = ranks[i % n]->add_request(prompts()[i], greedy());
    EXPECT_EQ(static_cast<size_t>((id - 1) % n), i % n);
    ids[id] = i;
  }
  std::vector<std::vector<int32_t>> got(prompts().size());
  int steps = 0;
  while (ranks[0]->has_unfinished() || ranks[1]->has_unfinished()) {
    ASSERT_LT(++steps, 1000) << "the ranks did not finish";
    std::vector<std::vector<RequestOutput>> out(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back(
          [&, r] { out[static_cast<size_t>(r)] = ranks[static_cast<size_t>(r)]->step(); });
    }
    for (auto& t : threads) t.join();
    for (const auto& rank_out : out) {
      for (const RequestOutput& o : rank_out) {
        auto& t = got[ids.at(o.id)];
        t.insert(t.end(), o.tokens.begin(), o.tokens.end());
      }
    }
  }
  EXPECT_EQ(got, want);
  for (const auto& rank : ranks) {
    const EngineStats s = rank->stats();
    EXPECT_GT(s.dp_group_steps, 0u);
    EXPECT_EQ(s.num_running + s.num_waiting, 0);
    rank->check_invariants();
  }
  ranks.clear();  // before the communicators they use
}

TEST(EngineRank, SizeMismatchNamesTheOption) {
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << kConfig;
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_cpu_backend(1));
  std::vector<std::unique_ptr<dist::Communicator>> comms =
      dist::make_inprocess_group(std::vector<Backend*>{backends[0].get()});
  try {
    Engine::create_rank(config_for(dir.path(), 2), std::move(backends[0]), *comms[0]);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'data_parallel_size' is 2 but the communicator's group "
                                         "has 1 ranks"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
