// Sizing the paged KV cache from device memory (issue 11, item 2): the pure arithmetic, and how
// the engine takes a count its executor sized (max_model_len follows the cache when automatic, an
// explicit one that does not fit is an error naming both numbers).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "deepinfer/config.h"
#include "deepinfer/error.h"
#include "engine/engine_impl.h"
#include "error_message.h"
#include "model/model_instance.h"

namespace deepinfer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(KvSizing, BlocksFromMemory) {
  const DeviceMemory m{100 * kGiB, 60 * kGiB};  // 40 GiB in use with the weights loaded
  // 0.9 * 100 - 40 - 10 (reserve) - 4 (state) = 36 GiB of 1 MiB blocks.
  EXPECT_EQ(kv_blocks_from_memory(m, 0.9, 10 * kGiB, 4 * kGiB, int64_t{1} << 20), 36 * 1024);
  EXPECT_EQ(kv_blocks_from_memory(m, 0.5, 10 * kGiB, 4 * kGiB, int64_t{1} << 20), 0);
  EXPECT_EQ(kv_blocks_from_memory(m, 0.9, 10 * kGiB, 4 * kGiB, 0), 0);
  EXPECT_EQ(kv_blocks_from_memory(DeviceMemory{}, 0.9, 0, 0, 1), 0);
}

TEST(KvSizing, ActivationReserveGrowsWithTheBatch) {
  ModelConfig c;  // V4-Flash defaults
  const int64_t small = activation_reserve_bytes(c, 256, 1);
  const int64_t large = activation_reserve_bytes(c, 2048, 1);
  EXPECT_GT(small, kGiB);  // the fixed 1 GiB for workspaces and graphs
  EXPECT_GT(large, small);
  // Per token: 2 * 4 * (2*4*4096 + 5*64*512 + 8*1024 + 6*(2*4096 + 2*2048)) bytes.
  const int64_t per_token = 2 * 4 * (2 * 4 * 4096 + 5 * 64 * 512 + 8 * 1024 + 6 * (12288));
  EXPECT_EQ(large - small, per_token * (2048 - 256));
  EXPECT_EQ(activation_reserve_bytes(c, 256, 3) - small, 2 * 2 * int64_t{c.vocab_size} * 4);
  // Speculative decoding also reserves the verify graphs' logits: min(max_seqs, 64) rows of up
  // to 6 tokens, plus one.
  EXPECT_EQ(activation_reserve_bytes(c, 256, 3, true) - activation_reserve_bytes(c, 256, 3),
            (3 * 6 + 1) * int64_t{c.vocab_size} * 4);
  EXPECT_EQ(activation_reserve_bytes(c, 256, 300, true) - activation_reserve_bytes(c, 256, 300),
            (64 * 6 + 1) * int64_t{c.vocab_size} * 4);
}

// An executor that reports a block count sized from device memory; never launched.
class SizedExecutor final : public engine::StepExecutor {
 public:
  explicit SizedExecutor(int blocks, int64_t bytes_per_block = 128 * 1000)
      : blocks_(blocks), bytes_per_block_(bytes_per_block) {}
  std::unique_ptr<engine::InflightStep> launch(const sched::StepPlan&,
                                               engine::InflightStep*) override {
    throw Error(ErrorCode::kInternal, "not launched in this test");
  }
  sched::StepResult wait(engine::InflightStep&) override {
    throw Error(ErrorCode::kInternal, "not launched in this test");
  }
  int vocab_size() const override { return 100; }
  int max_position() const override { return 1 << 20; }
  int num_kv_blocks() const override { return blocks_; }
  int num_state_slots() const override { return 64; }
  int num_snapshot_slots() const override { return 4; }
  const std::vector<int>& eos_token_ids() const override { return eos_; }
  int64_t kv_bytes_per_block() const override { return bytes_per_block_; }
  bool kv_sized_from_memory() const override { return true; }

 private:
  int blocks_;
  int64_t bytes_per_block_;
  std::vector<int> eos_{1};
};

TEST(KvSizing, EngineTakesTheExecutorsCountAndFitsMaxModelLen) {
  EngineConfig config;
  config.placement.device = "cpu";
  config.scheduler.max_num_seqs = 4;
  // 41 blocks: block 0 reserved, 40 * 128 = 5120 tokens; the automatic max_model_len (8192)
  // shrinks to that.
  engine::EngineImpl e(config, std::make_unique<SizedExecutor>(41));
  EXPECT_EQ(e.config().cache.num_kv_blocks, 41);
  EXPECT_EQ(e.config().scheduler.max_model_len, 5120);
  const KvCapacity k = e.kv_capacity();
  EXPECT_EQ(k.num_blocks, 40);
  EXPECT_EQ(k.max_tokens, 5120);
  EXPECT_EQ(k.bytes_per_block, 128 * 1000);
  EXPECT_EQ(k.bytes_per_token, 1000);
  EXPECT_EQ(k.max_seqs_at_max_model_len, 1);
  EXPECT_TRUE(k.sized_from_memory);
  // An explicit max_model_len the cache cannot hold is an error naming both numbers.
  config.scheduler.max_model_len = 6000;
  const std::string m = testing::error_message(
      [&] { engine::EngineImpl(config, std::make_unique<SizedExecutor>(41)); });
  EXPECT_NE(m.find("'max_model_len' is 6000"), std::string::npos) << m;
  EXPECT_NE(m.find("holds 5120 tokens"), std::string::npos) << m;
  EXPECT_NE(m.find("gpu_memory_utilization"), std::string::npos) << m;
}

TEST(KvSizing, BytesPerTokenRoundsUp) {
  EngineConfig config;
  config.placement.device = "cpu";
  config.scheduler.max_num_seqs = 4;
  // A block of fp8 records need not be a whole number of bytes per token (the tiny checkpoint:
  // 42.375); a capacity estimate from bytes_per_token must not fall short.
  engine::EngineImpl e(config, std::make_unique<SizedExecutor>(41, 128 * 1000 + 1));
  EXPECT_EQ(e.kv_capacity().bytes_per_block, 128 * 1000 + 1);
  EXPECT_EQ(e.kv_capacity().bytes_per_token, 1001);
}

TEST(KvSizing, UtilizationIsValidated) {
  EngineConfig config;
  config.placement.device = "cpu";
  config.cache.gpu_memory_utilization = 1.5;
  const std::string m = testing::error_message(
      [&] { engine::EngineImpl(config, std::make_unique<SizedExecutor>(41)); });
  EXPECT_NE(m.find("'gpu_memory_utilization' must be in (0, 1]"), std::string::npos) << m;
}

}  // namespace
}  // namespace deepinfer
