// The CUDA backend's A/B switches (cuda/backend/backend_switches.h), read from the environment
// when a backend is created: unset or empty is each switch's default, the names choose, and a
// bad value is an error naming the variable and the value. Host code only: runs without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "cuda/backend/backend_switches.h"
#include "cuda/moe/moe_heuristics.h"
#include "deepinfer/error.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops {
namespace {

constexpr const char* kSwitches[] = {
    "DEEPINFER_MOE_QUANT_DECODE",   "DEEPINFER_MOE_QUANT_PREFILL",
    "DEEPINFER_FP8_LINEAR",         "DEEPINFER_HC_PRE",
    "DEEPINFER_INDEXER_FP8_SCORES", "DEEPINFER_ATTENTION_KERNEL",
    "DEEPINFER_ATTENTION_COMBINE",  "DEEPINFER_ATTENTION_ROWS",
    "DEEPINFER_ATTENTION_SPLITS",   "DEEPINFER_FP8_WGMMA_MATH",
    "DEEPINFER_HC_CLUSTER",
};

TEST(BackendSwitches, UnsetOrEmptyAreTheDefaults) {
  for (const char* empty : {static_cast<const char*>(nullptr), ""}) {
    ScopedEnv e0(kSwitches[0], empty), e1(kSwitches[1], empty), e2(kSwitches[2], empty),
        e3(kSwitches[3], empty), e4(kSwitches[4], empty), e5(kSwitches[5], empty),
        e6(kSwitches[6], empty), e7(kSwitches[7], empty), e8(kSwitches[8], empty),
        e9(kSwitches[9], empty), e10(kSwitches[10], empty);
    const cuda::BackendSwitches s = cuda::read_backend_switches();
    const cuda::BackendSwitches defaults;
    EXPECT_EQ(s.moe_quant_decode, defaults.moe_quant_decode);
    EXPECT_EQ(s.moe_quant_prefill, defaults.moe_quant_prefill);
    EXPECT_EQ(s.fp8_linear, defaults.fp8_linear);
    EXPECT_EQ(s.fp8_wgmma_math, defaults.fp8_wgmma_math);
    EXPECT_EQ(s.hc_cluster, defaults.hc_cluster);
    EXPECT_EQ(s.hc_pre, defaults.hc_pre);
    EXPECT_EQ(s.indexer_fp8_scores, defaults.indexer_fp8_scores);
    EXPECT_EQ(s.attention_kernel, defaults.attention_kernel);
  }
}

TEST(BackendSwitches, NamesChoose) {
  ScopedEnv prefill("DEEPINFER_MOE_QUANT_PREFILL", "mma_sync"), hc("DEEPINFER_HC_PRE", "fused"),
      kernel("DEEPINFER_ATTENTION_KERNEL", "wgmma"), fp8("DEEPINFER_FP8_LINEAR", "stream"),
      scores("DEEPINFER_INDEXER_FP8_SCORES", "mma_sync"), math("DEEPINFER_FP8_WGMMA_MATH", "f16"),
      cluster("DEEPINFER_HC_CLUSTER", "portable");
  const cuda::BackendSwitches s = cuda::read_backend_switches();
  EXPECT_EQ(s.moe_quant_prefill, cuda::QuantPrefillChoice::kMmaSync);
  EXPECT_EQ(s.hc_pre, cuda::HcPreChoice::kFused);
  EXPECT_EQ(s.attention_kernel, cuda::AttentionKernelChoice::kWgmma);
  EXPECT_EQ(s.fp8_linear, cuda::Fp8LinearChoice::kStream);
  EXPECT_EQ(s.indexer_fp8_scores, cuda::IndexerFp8Scores::kMmaSync);
  EXPECT_EQ(s.fp8_wgmma_math, cuda::Fp8WgmmaMath::kF16);
  EXPECT_EQ(s.hc_cluster, cuda::HcClusterChoice::kPortable);
  ScopedEnv widest("DEEPINFER_HC_CLUSTER", "widest");
  EXPECT_EQ(cuda::read_backend_switches().hc_cluster, cuda::HcClusterChoice::kWidest);
  for (const auto& [name, choice] : {std::pair{"split", cuda::HcPreChoice::kSplit},
                                     std::pair{"legacy", cuda::HcPreChoice::kLegacy}}) {
    ScopedEnv hc_choice("DEEPINFER_HC_PRE", name);
    EXPECT_EQ(cuda::read_backend_switches().hc_pre, choice) << name;
  }
}

// An on/off switch: unset, empty and "on" are on, "off" is off, anything else an error naming the
// variable and the value.
void expect_on_off(const char* name, bool cuda::BackendSwitches::*member) {
  const std::pair<const char*, bool> names[] = {
      {nullptr, true}, {"", true}, {"on", true}, {"off", false}};
  for (const auto& [value, on] : names) {
    ScopedEnv env(name, value);
    EXPECT_EQ(cuda::read_backend_switches().*member, on) << name << "=" << (value ? value : "");
  }
  ScopedEnv bad(name, "yes");
  try {
    cuda::read_backend_switches();
    ADD_FAILURE() << name << "=yes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::string(name) + ": expected on or off, got 'yes'"),
              std::string::npos)
        << e.what();
  }
}

// Programmatic dependent launches are on unless DEEPINFER_PDL=off.
TEST(BackendSwitches, PdlIsOnUnlessTurnedOff) {
  expect_on_off("DEEPINFER_PDL", &cuda::BackendSwitches::pdl);
}

// cuBLASLt's FP8 GEMMs at decode widths take the timed algorithm unless
// DEEPINFER_FP8_CUBLASLT_TUNE=off.
TEST(BackendSwitches, CublasLtTuningIsOnUnlessTurnedOff) {
  expect_on_off("DEEPINFER_FP8_CUBLASLT_TUNE", &cuda::BackendSwitches::cublaslt_tune);
}

// Side branches (a second stream at decode sizes) are on unless DEEPINFER_BRANCHES=off.
TEST(BackendSwitches, BranchesAreOnUnlessTurnedOff) {
  expect_on_off("DEEPINFER_BRANCHES", &cuda::BackendSwitches::branches);
}

TEST(BackendSwitches, MoeQuantDecodeTakesEveryDecodeKernel) {
  const std::pair<const char*, cuda::QuantDecodeChoice> names[] = {
      {"", cuda::QuantDecodeChoice::kAuto},
      {"auto", cuda::QuantDecodeChoice::kAuto},
      {"streaming", cuda::QuantDecodeChoice::kStreaming},
      {"streaming_lean", cuda::QuantDecodeChoice::kStreamingLean},
      {"registers", cuda::QuantDecodeChoice::kRegisters},
      {"prefill", cuda::QuantDecodeChoice::kPrefill},
  };
  for (const auto& [name, choice] : names) {
    ScopedEnv decode("DEEPINFER_MOE_QUANT_DECODE", name);
    EXPECT_EQ(cuda::read_backend_switches().moe_quant_decode, choice) << name;
  }
}

// The default decode choice takes the lean streaming kernel for MXFP4 and the streaming one for
// FP8 (V4-Flash at 4 pairs per expert); an explicit choice takes its kernel for both formats.
TEST(BackendSwitches, MoeQuantDecodeAutoTakesTheLeanKernelForMxfp4Only) {
  constexpr size_t kH200Smem = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90
  cuda::ExpertsPassProblem p{4 * 256, 256, 4096, 2048, false, true};
  p.quantized = true;
  EXPECT_EQ(p.quant_decode, cuda::QuantDecodeChoice::kAuto);
  p.mxfp4 = true;
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel, cuda::ExpertsKernel::kQuantStreamLean);
  p.mxfp4 = false;
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel, cuda::ExpertsKernel::kQuantStream);
  for (const bool mxfp4 : {false, true}) {
    p.mxfp4 = mxfp4;
    p.quant_decode = cuda::QuantDecodeChoice::kStreaming;
    EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel, cuda::ExpertsKernel::kQuantStream);
    p.quant_decode = cuda::QuantDecodeChoice::kStreamingLean;
    EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel,
              cuda::ExpertsKernel::kQuantStreamLean);
    p.quant_decode = cuda::QuantDecodeChoice::kAuto;
  }
}

// Lean MXFP4 decode passes of at most 8 tokens on one activation plane take 8-row tiles (the
// narrow streaming shape, expert_stream_narrow_tiles); 9 tokens, three planes and FP8 (lean or
// not) keep 16-row tiles.
TEST(BackendSwitches, FewTokenLeanMxfp4PassesTakeEightRowTiles) {
  constexpr size_t kH200Smem = 232448;
  cuda::ExpertsPassProblem p{8 * 6, 256, 4096, 2048, false, true};
  p.quantized = true;
  p.mxfp4 = true;
  p.tokens = 8;
  p.one_plane = true;
  cuda::ExpertsPassConfig c = cuda::choose_experts_pass(p, kH200Smem);
  EXPECT_EQ(c.kernel, cuda::ExpertsKernel::kQuantStreamLean);
  EXPECT_EQ(c.tile_rows, cuda::ExpertQuantStreamMxNarrow::kTok);
  EXPECT_EQ(c.max_tiles, 48 / 8 + 48);
  p.tokens = 9;
  p.pairs = 9 * 6;
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).tile_rows, cuda::ExpertQuantDecode::kTok);
  p.tokens = 8;
  p.pairs = 8 * 6;
  p.one_plane = false;
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).tile_rows, cuda::ExpertQuantDecode::kTok);
  p.one_plane = true;
  p.mxfp4 = false;
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).tile_rows, cuda::ExpertQuantDecode::kTok);
  p.quant_decode = cuda::QuantDecodeChoice::kStreamingLean;
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel, cuda::ExpertsKernel::kQuantStreamLean);
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).tile_rows, cuda::ExpertQuantDecode::kTok);
}

TEST(BackendSwitches, IndexerFp8ScoresTakesThePipelinedWgmmaKernel) {
  ScopedEnv scores("DEEPINFER_INDEXER_FP8_SCORES", "wgmma_pipelined");
  EXPECT_EQ(cuda::read_backend_switches().indexer_fp8_scores,
            cuda::IndexerFp8Scores::kWgmmaPipelined);
}

TEST(BackendSwitches, IndexerFp8ScoresTakesThePersistentWgmmaKernel) {
  {
    ScopedEnv scores("DEEPINFER_INDEXER_FP8_SCORES", "wgmma_persistent");
    EXPECT_EQ(cuda::read_backend_switches().indexer_fp8_scores,
              cuda::IndexerFp8Scores::kWgmmaPersistent);
  }
  {
    ScopedEnv scores("DEEPINFER_INDEXER_FP8_SCORES", "wgmma_persistent_fp8");
    EXPECT_EQ(cuda::read_backend_switches().indexer_fp8_scores,
              cuda::IndexerFp8Scores::kWgmmaPersistentFp8);
  }
  ScopedEnv scores("DEEPINFER_INDEXER_FP8_SCORES", "wgmma_persistent_cvt");
  EXPECT_EQ(cuda::read_backend_switches().indexer_fp8_scores,
            cuda::IndexerFp8Scores::kWgmmaPersistentCvt);
}

// Each DEEPINFER_ATTENTION_KERNEL value the switches read, and the choice it names.
TEST(BackendSwitches, AttentionKernelTakesEachValue) {
  const std::pair<const char*, cuda::AttentionKernelChoice> values[] = {
      {"wgmma_prefetch", cuda::AttentionKernelChoice::kWgmmaPrefetch},
      {"wgmma_prefetch_pdl", cuda::AttentionKernelChoice::kWgmmaPrefetchPdl},
      {"wgmma_prefetch_sw128_pdl", cuda::AttentionKernelChoice::kWgmmaPrefetchSw128Pdl},
      {"wgmma_overlap", cuda::AttentionKernelChoice::kWgmmaOverlap},
      {"wgmma_overlap_pdl", cuda::AttentionKernelChoice::kWgmmaOverlapPdl},
      {"wgmma_overlap_fused", cuda::AttentionKernelChoice::kWgmmaOverlapFused},
      {"wgmma_overlap_pair", cuda::AttentionKernelChoice::kWgmmaOverlapPair},
      {"wgmma_overlap_pair_blocks", cuda::AttentionKernelChoice::kWgmmaOverlapPairBlocks},
      {"auto", cuda::AttentionKernelChoice::kWgmmaOverlapAuto},
      {"wgmma_overlap_ilp", cuda::AttentionKernelChoice::kWgmmaOverlapIlp},
      {"wgmma_keysplit", cuda::AttentionKernelChoice::kWgmmaKeySplit},
  };
  for (const auto& [value, choice] : values) {
    ScopedEnv kernel("DEEPINFER_ATTENTION_KERNEL", value);
    EXPECT_EQ(cuda::read_backend_switches().attention_kernel, choice) << value;
  }
}

TEST(BackendSwitches, ABadValueNamesTheVariableAndTheValue) {
  for (const char* name : kSwitches) {
    ScopedEnv bad(name, "no-such-choice");
    try {
      (void)cuda::read_backend_switches();
      ADD_FAILURE() << name << "=no-such-choice was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(name), std::string::npos) << m;
      EXPECT_NE(m.find("no-such-choice"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
