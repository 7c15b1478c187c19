// Bindings of the engine's test doubles: deepinfer_core.testing (libdeepinfer_testing).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "deepinfer/testing/scripted_engine.h"
#include "engine_bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

void bind_testing(nb::module_& m) {
  using deepinfer::testing::ScriptedModel;
  nb::class_<ScriptedModel>(m, "ScriptedModel",
                            "The model emulation of the scripted engine: the token sampled after "
                            "a context is a hash of that context.")
      .def(
          "__init__",
          [](ScriptedModel* self, int vocab_size, double eos_probability,
             std::vector<int> eos_token_ids, int64_t step_latency_us) {
            new (self) ScriptedModel();
            self->vocab_size = vocab_size;
            self->eos_probability = eos_probability;
            self->eos_token_ids = std::move(eos_token_ids);
            self->step_latency = std::chrono::microseconds(step_latency_us);
          },
          "vocab_size"_a = 1000, "eos_probability"_a = 0.0, "eos_token_ids"_a = std::vector<int>{1},
          "step_latency_us"_a = 0)
      .def_ro("vocab_size", &ScriptedModel::vocab_size)
      .def_ro("eos_probability", &ScriptedModel::eos_probability)
      .def(
          "next_token",
          [](const ScriptedModel& model, const std::vector<int32_t>& context) {
            return model.next_token(context);
          },
          "context"_a, "The token the emulation samples after `context`.");

  m.def(
      "scripted_engine",
      [](const ScriptedModel& model, int num_kv_blocks, int num_snapshot_slots, int max_num_seqs,
         int max_num_batched_tokens, int max_model_len, bool enable_prefix_cache,
         bool enable_chunked_prefill, bool zero_overhead, const std::string& preemption,
         double kv_admission_watermark, int prefill_steps_per_decode_step,
         uint64_t seed) -> std::unique_ptr<deepinfer::Engine> {
        const deepinfer::EngineConfig c = make_engine_config(
            "", max_num_seqs, max_num_batched_tokens, max_model_len, num_kv_blocks,
            num_snapshot_slots, enable_prefix_cache, enable_chunked_prefill, zero_overhead,
            preemption, kv_admission_watermark, prefill_steps_per_decode_step, 0, seed);
        return deepinfer::testing::make_scripted_engine(c, model);
      },
      "model"_a, "num_kv_blocks"_a = 256, "num_snapshot_slots"_a = 16, "max_num_seqs"_a = 16,
      "max_num_batched_tokens"_a = 512, "max_model_len"_a = 4096, "enable_prefix_cache"_a = true,
      "enable_chunked_prefill"_a = true, "zero_overhead"_a = true, "preemption"_a = "recompute",
      "kv_admission_watermark"_a = 0.9, "prefill_steps_per_decode_step"_a = 1, "seed"_a = 0,
      "An engine over the scripted (model-free) executor, for tests.");
}
