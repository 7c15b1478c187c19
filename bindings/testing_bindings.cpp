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
  const ScriptedModel kDefaults;
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
          "vocab_size"_a = kDefaults.vocab_size, "eos_probability"_a = kDefaults.eos_probability,
          "eos_token_ids"_a = kDefaults.eos_token_ids,
          "step_latency_us"_a = kDefaults.step_latency.count())
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
      [](const ScriptedModel& model, const deepinfer::EngineConfig& config) {
        return deepinfer::testing::make_scripted_engine(config, model);
      },
      "model"_a, "config"_a,
      "An engine over the scripted (model-free) executor, for tests (config.model_path and "
      "config.placement are ignored).");
  m.def(
      "scripted_engine",
      [](const ScriptedModel& model, const nb::kwargs& options) {
        return deepinfer::testing::make_scripted_engine(engine_config_from(options), model);
      },
      "model"_a, "options"_a,
      "The same with EngineConfig options given by flat name: scripted_engine(model, "
      "max_num_seqs=8).");
}
