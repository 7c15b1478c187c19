// EngineConfig resolution: derived sizes, the device "auto", and one error per bad field that
// names it by its flat name (the name the Python API and run configs use).
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "deepinfer/backend.h"
#include "deepinfer/build_info.h"
#include "deepinfer/engine_config.h"
#include "deepinfer/error.h"
#include "deepinfer/v41_config.h"
#include "engine/engine_config.h"
#include "model/cache_tensors.h"

namespace deepinfer {
namespace {

using engine::resolve_engine_config;

bool cuda_built() {
  for (const std::string& b : build_info().backends)
    if (b == "cuda") return true;
  return false;
}

TEST(EngineConfig, DerivesSizesFromTheModel) {
  EngineConfig c;
  c.scheduler.max_num_seqs = 4;
  const EngineConfig r = resolve_engine_config(c, 1000);
  EXPECT_EQ(r.scheduler.max_model_len, 1000);   // min(max_position, 8192)
  EXPECT_EQ(r.cache.num_kv_blocks, 1 + 4 * 8);  // ceil(1000 / 128) blocks per sequence
  EXPECT_EQ(r.cache.num_prefix_snapshots, 4);
  EXPECT_EQ(resolve_engine_config(EngineConfig{}, 1 << 20).scheduler.max_model_len, 8192);
  // Resolving is idempotent, and what is set stays set.
  EXPECT_EQ(resolve_engine_config(r, 1000), r);
}

// kv_cache_dtype "auto": f32 on the CPU; on a device fp8 for an FP8 V4 checkpoint and for every
// V4.1 one (V4.1's FP8 / FP4 formats, which the CUDA backend runs), else bf16.
TEST(EngineConfig, AutoKvDtypeFollowsTheModel) {
  ModelConfig v4;
  EXPECT_FALSE(auto_kv_is_fp8(v4));
  ModelConfig v4_fp8;
  v4_fp8.quantization.fp8 = true;
  EXPECT_TRUE(auto_kv_is_fp8(v4_fp8));
  ModelConfig v41;
  v41.v41 = std::make_shared<const V41TextConfig>();
  EXPECT_TRUE(auto_kv_is_fp8(v41));  // whatever its weights' dtype
  auto resolved_kv = [](const std::string& device, const ModelConfig& m) {
    EngineConfig c;
    c.placement.device = device;
    return resolve_engine_config(c, 4096, false, auto_kv_is_fp8(m)).cache.kv_cache_dtype;
  };
  EXPECT_EQ(resolved_kv("cuda", v41), "fp8");
  EXPECT_EQ(resolved_kv("cuda", v4_fp8), "fp8");
  EXPECT_EQ(resolved_kv("cuda", v4), "bf16");
  EXPECT_EQ(resolved_kv("cpu", v41), "f32");
}

TEST(EngineConfig, AutoDeviceResolvesToOneInUse) {
  EXPECT_EQ(EngineConfig{}.placement.device, "auto");
  const std::string device = resolve_engine_config(EngineConfig{}, 4096).placement.device;
  EXPECT_EQ(device, resolve_device("auto"));
  EXPECT_TRUE(device == "cpu" || device == "cuda") << device;
  EXPECT_TRUE(backend_available("auto"));
  EXPECT_EQ(resolve_device("cuda:1"), "cuda:1");  // only "auto" is resolved
  if (!cuda_built()) {                            // a CPU-only build always picks the CPU
    EXPECT_EQ(device, "cpu");
    EXPECT_EQ(make_backend("auto")->device_kind(), DeviceKind::kCpu);
  }
}

// Every bad field: the error is kInvalidArgument and names the field by its flat name.
TEST(EngineConfig, ErrorsNameTheField) {
  struct Case {
    const char* field;
    std::function<void(EngineConfig&)> set;
  };
  const Case cases[] = {
      {"'max_num_seqs' must be >= 1, got 0", [](EngineConfig& c) { c.scheduler.max_num_seqs = 0; }},
      {"'max_num_batched_tokens' must be >= 1, got -3",
       [](EngineConfig& c) { c.scheduler.max_num_batched_tokens = -3; }},
      {"'max_model_len' must be in [2, 4096]",
       [](EngineConfig& c) { c.scheduler.max_model_len = 5000; }},
      {"'max_model_len' must be in [2, 4096]",
       [](EngineConfig& c) { c.scheduler.max_model_len = 1; }},
      {"'kv_admission_watermark' must be in (0, 1]",
       [](EngineConfig& c) { c.scheduler.kv_admission_watermark = 1.5; }},
      {"'prefill_steps_per_decode_step' must be >= 1, got 0",
       [](EngineConfig& c) { c.scheduler.prefill_steps_per_decode_step = 0; }},
      {"'num_kv_blocks' must be >= 2, got 1", [](EngineConfig& c) { c.cache.num_kv_blocks = 1; }},
      {"'num_prefix_snapshots' must be >= 0, got -1",
       [](EngineConfig& c) { c.cache.num_prefix_snapshots = -1; }},
      {"'num_threads' must be >= 0, got -2", [](EngineConfig& c) { c.placement.num_threads = -2; }},
      {"'fetch_threads' must be in [1, 64], got 0",
       [](EngineConfig& c) { c.cache.fetch_threads = 0; }},
      {"'fetch_threads' must be in [1, 64], got 65",
       [](EngineConfig& c) { c.cache.fetch_threads = 65; }},
  };
  for (const Case& k : cases) {
    EngineConfig c;
    k.set(c);
    try {
      resolve_engine_config(c, 4096);
      ADD_FAILURE() << "no error for " << k.field;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("engine config: ") + k.field),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(EngineConfig, MtpDraftingTakesSlidingMtpLayersOnly) {
  EngineConfig c;
  c.scheduler.num_speculative_tokens = 2;
  c.scheduler.speculative_method = "mtp";
  engine::check_mtp_layer_kinds(c, {AttentionKind::kSliding});  // V4's kind: fine
  try {
    engine::check_mtp_layer_kinds(c, {AttentionKind::kSliding, AttentionKind::kCompressedSparse});
    ADD_FAILURE() << "a compressed MTP layer was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'speculative_method'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MTP block 1"), std::string::npos) << e.what();
  }
  c.scheduler.speculative_method = "ngram";  // not drafting with the MTP block: no constraint
  engine::check_mtp_layer_kinds(c, {AttentionKind::kHeavilyCompressed});
}

}  // namespace
}  // namespace deepinfer
