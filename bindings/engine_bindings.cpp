// Bindings of the engine API: Engine, SamplingParams, RequestOutput, EngineStats (EngineConfig:
// engine_config_bindings.cpp).
#include "engine_bindings.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>

#include "deepinfer/engine.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using deepinfer::Engine;
using deepinfer::EngineConfig;

nb::dict stats_dict(const deepinfer::EngineStats& s) {
  nb::dict d;
  d["num_running"] = s.num_running;
  d["num_waiting"] = s.num_waiting;
  d["num_blocks_total"] = s.num_blocks_total;
  d["num_blocks_free"] = s.num_blocks_free;
  d["num_blocks_cached"] = s.num_blocks_cached;
  d["num_state_slots_free"] = s.num_state_slots_free;
  d["num_steps"] = s.num_steps;
  d["num_prefill_steps"] = s.num_prefill_steps;
  d["num_preemptions"] = s.num_preemptions;
  d["prompt_tokens_computed"] = s.prompt_tokens_computed;
  d["prompt_tokens_cached"] = s.prompt_tokens_cached;
  d["generated_tokens"] = s.generated_tokens;
  d["num_graph_steps"] = s.num_graph_steps;
  return d;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<deepinfer::SamplingParams>(m, "SamplingParams",
                                        "Per-request sampling and stopping parameters.")
      .def(
          "__init__",
          [](deepinfer::SamplingParams* self, float temperature, int top_k, float top_p,
             std::optional<uint64_t> seed, int max_tokens, bool ignore_eos,
             std::vector<int32_t> stop_token_ids, int logprobs,
             std::vector<int32_t> forced_tokens) {
            new (self) deepinfer::SamplingParams{temperature,
                                                 top_k,
                                                 top_p,
                                                 seed,
                                                 max_tokens,
                                                 ignore_eos,
                                                 std::move(stop_token_ids),
                                                 logprobs,
                                                 std::move(forced_tokens)};
          },
          "temperature"_a = 1.0f, "top_k"_a = 0, "top_p"_a = 1.0f, "seed"_a = nb::none(),
          "max_tokens"_a = 16, "ignore_eos"_a = false, "stop_token_ids"_a = std::vector<int32_t>{},
          "logprobs"_a = 0, "forced_tokens"_a = std::vector<int32_t>{})
      .def_rw("temperature", &deepinfer::SamplingParams::temperature)
      .def_rw("top_k", &deepinfer::SamplingParams::top_k)
      .def_rw("top_p", &deepinfer::SamplingParams::top_p)
      .def_rw("seed", &deepinfer::SamplingParams::seed)
      .def_rw("max_tokens", &deepinfer::SamplingParams::max_tokens)
      .def_rw("ignore_eos", &deepinfer::SamplingParams::ignore_eos)
      .def_rw("stop_token_ids", &deepinfer::SamplingParams::stop_token_ids)
      .def_rw("logprobs", &deepinfer::SamplingParams::logprobs)
      .def_rw("forced_tokens", &deepinfer::SamplingParams::forced_tokens);

  nb::class_<deepinfer::RequestOutput>(m, "RequestOutput",
                                       "What one engine step produced for one request.")
      .def_ro("id", &deepinfer::RequestOutput::id)
      .def_ro("ready", &deepinfer::RequestOutput::ready)
      .def_ro("num_prompt_tokens", &deepinfer::RequestOutput::num_prompt_tokens)
      .def_ro("prompt_cache_hit_tokens", &deepinfer::RequestOutput::prompt_cache_hit_tokens)
      .def_ro("tokens", &deepinfer::RequestOutput::tokens)
      .def_prop_ro("logprobs",
                   [](const deepinfer::RequestOutput& o) {
                     nb::list out;
                     for (const auto& lp : o.logprobs)
                       out.append(nb::make_tuple(lp.logprob, lp.top));
                     return out;
                   })
      .def_prop_ro("finish",
                   [](const deepinfer::RequestOutput& o) -> std::optional<std::string> {
                     if (o.finish == deepinfer::FinishReason::kNone) return std::nullopt;
                     return std::string(deepinfer::finish_reason_name(o.finish));
                   })
      .def_ro("finish_detail", &deepinfer::RequestOutput::finish_detail)
      .def("__repr__", [](const deepinfer::RequestOutput& o) {
        std::string r = "RequestOutput(id=" + std::to_string(o.id);
        if (o.ready)
          r += ", ready, prompt_cache_hit_tokens=" + std::to_string(o.prompt_cache_hit_tokens);
        if (!o.tokens.empty()) r += ", tokens=" + std::to_string(o.tokens.size());
        if (o.finish != deepinfer::FinishReason::kNone)
          r += ", finish=" + std::string(deepinfer::finish_reason_name(o.finish));
        return r + ")";
      });

  nb::class_<deepinfer::KvCapacity>(m, "KvCapacity", "The KV cache an engine runs with (engine.h).")
      .def_ro("num_blocks", &deepinfer::KvCapacity::num_blocks)
      .def_ro("block_size", &deepinfer::KvCapacity::block_size)
      .def_ro("bytes_per_token", &deepinfer::KvCapacity::bytes_per_token)
      .def_ro("bytes_per_state_slot", &deepinfer::KvCapacity::bytes_per_state_slot)
      .def_ro("max_tokens", &deepinfer::KvCapacity::max_tokens)
      .def_ro("max_seqs_at_max_model_len", &deepinfer::KvCapacity::max_seqs_at_max_model_len)
      .def_ro("sized_from_memory", &deepinfer::KvCapacity::sized_from_memory)
      .def("__repr__", [](const deepinfer::KvCapacity& k) {
        return "KvCapacity(num_blocks=" + std::to_string(k.num_blocks) +
               ", block_size=" + std::to_string(k.block_size) +
               ", bytes_per_token=" + std::to_string(k.bytes_per_token) +
               ", max_tokens=" + std::to_string(k.max_tokens) +
               ", max_seqs_at_max_model_len=" + std::to_string(k.max_seqs_at_max_model_len) +
               ", sized_from_memory=" + (k.sized_from_memory ? "True" : "False") + ")";
      });

  nb::class_<Engine>(
      m, "Engine",
      "Continuous-batching engine. add_request/abort are thread-safe; step() belongs "
      "to one thread.")
      .def(nb::new_([](const EngineConfig& config, nb::object progress) {
             deepinfer::LoadProgress report;
             if (!progress.is_none()) {
               // Loading runs without the GIL; the callback takes it back for each report. It
               // holds a borrowed handle: `progress` outlives Engine::create, the only caller.
               report = [callback = nb::handle(progress)](int done, int total) {
                 nb::gil_scoped_acquire acquire;
                 callback(done, total);
               };
             }
             nb::gil_scoped_release release;
             return Engine::create(config, report);
           }),
           "config"_a, "progress"_a = nb::none(),
           "Load config.model_path on config.placement.device. `progress(done, total)`, when "
           "given, is called as the weights load (the embedding and head, then each layer).")
      .def(nb::new_([](const std::string& model_path, const nb::kwargs& options) {
             EngineConfig config = engine_config_from(options);
             config.model_path = model_path;
             nb::gil_scoped_release release;
             return Engine::create(config);
           }),
           "model_path"_a, "options"_a,
           "Load `model_path` with EngineConfig options given by flat name: "
           "Engine(path, max_num_seqs=8, device=\"cpu\").")
      .def("add_request", &Engine::add_request, "prompt"_a, "params"_a,
           "Queue a request; returns its id.")
      .def("abort", &Engine::abort, "id"_a)
      .def("step", &Engine::step, nb::call_guard<nb::gil_scoped_release>(),
           "Run one step; returns the RequestOutputs it produced.")
      .def_prop_ro("num_unfinished", &Engine::num_unfinished)
      .def("has_unfinished", &Engine::has_unfinished)
      .def("stats", [](const Engine& e) { return stats_dict(e.stats()); })
      .def_prop_ro("vocab_size", &Engine::vocab_size)
      .def_prop_ro("eos_token_ids", &Engine::eos_token_ids)
      .def_prop_ro(
          "config", [](const Engine& e) { return e.config(); },
          "A copy of the resolved EngineConfig: derived sizes filled in, placement.device the "
          "device in use (\"auto\" resolved).")
      .def_prop_ro(
          "device", [](const Engine& e) { return e.config().placement.device; },
          "The device the engine runs on (\"auto\" resolved).")
      .def_prop_ro("model_config", &Engine::model_config, nb::rv_policy::reference_internal,
                   "The checkpoint's config.json as the engine read it; None for the scripted "
                   "engine.")
      .def_prop_ro("kv_capacity", &Engine::kv_capacity,
                   "The KV cache it runs with: blocks, bytes per token, the most context and "
                   "sequences of max_model_len it holds, whether it was sized from device memory.")
      .def_prop_ro("load_notes", &Engine::load_notes,
                   "What loading the checkpoint left out on purpose, one line each (e.g. the "
                   "mtp.* tensors).")
      .def("check_invariants", &Engine::check_invariants,
           "Raise if an engine invariant is broken (pools, ledgers, queues).")
      .def_prop_ro("num_inflight_steps", &Engine::num_inflight_steps,
                   "Steps launched and not yet committed (0, 1 or 2).");
}
