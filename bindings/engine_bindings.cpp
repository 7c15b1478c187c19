// Bindings of the engine API: Engine, SamplingParams, RequestOutput, EngineStats (EngineConfig:
// engine_config_bindings.cpp).
#include "engine_bindings.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>
#include <nanobind/trampoline.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/engine.h"
#include "deepinfer/rank_group.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using deepinfer::Engine;
using deepinfer::EngineConfig;

// Python subclasses of TokenConstraint. The engine calls them on its step thread with the GIL
// released, so each call takes it.
class PyTokenConstraint : public deepinfer::TokenConstraint {
 public:
  NB_TRAMPOLINE(deepinfer::TokenConstraint);

  void fill_allowed(std::span<uint32_t> mask) override {
    nb::gil_scoped_acquire gil;
    // A numpy view of the engine's buffer, valid for this call only. (NB_OVERRIDE_PURE would
    // pass the span itself, which has no Python type.)
    nb::ndarray<nb::numpy, uint32_t, nb::ndim<1>> view(mask.data(), {mask.size()}, nb::handle());
    nb::detail::ticket ticket(nb_trampoline, "fill_allowed", nb::detail::str_hash("fill_allowed"),
                              /*pure=*/true);
    // rv_policy::reference: a view of the buffer, not a copy (the default for an owner-less
    // array), so the Python side's writes reach the engine.
    nb_trampoline.base().attr(ticket.key)(nb::cast(view, nb::rv_policy::reference));
  }
  bool accept(int32_t token) override {
    nb::gil_scoped_acquire gil;
    NB_OVERRIDE_PURE(accept, token);
  }
  bool is_terminated() override {
    nb::gil_scoped_acquire gil;
    NB_OVERRIDE_PURE(is_terminated);
  }
  bool can_rollback() override {
    nb::gil_scoped_acquire gil;
    NB_OVERRIDE(can_rollback);
  }
  void rollback(int num_tokens) override {
    nb::gil_scoped_acquire gil;
    NB_OVERRIDE(rollback, num_tokens);
  }
};

// Python subclasses of Drafter (propose(id, tokens, max_drafts) -> list of token ids), called on
// the engine thread with the GIL released: each call takes it.
class PyDrafter : public deepinfer::Drafter {
 public:
  NB_TRAMPOLINE(deepinfer::Drafter);

  void propose(deepinfer::RequestId id, std::span<const int32_t> tokens, int max_drafts,
               std::vector<int32_t>& drafts) override {
    nb::gil_scoped_acquire gil;
    nb::detail::ticket ticket(nb_trampoline, "propose", nb::detail::str_hash("propose"),
                              /*pure=*/true);
    const std::vector<int32_t> context(tokens.begin(), tokens.end());
    nb::object proposed = nb_trampoline.base().attr(ticket.key)(id, context, max_drafts);
    drafts = nb::cast<std::vector<int32_t>>(proposed);
  }
};

// logit_bias as a dict {token: bias} (OpenAI's shape) or a list of pairs.
std::vector<std::pair<int32_t, float>> logit_bias_from(const nb::handle& value) {
  std::vector<std::pair<int32_t, float>> out;
  if (value.is_none()) return out;
  if (nb::isinstance<nb::dict>(value)) {
    for (auto [k, v] : nb::borrow<nb::dict>(value))
      out.emplace_back(nb::cast<int32_t>(k), nb::cast<float>(v));
    return out;
  }
  return nb::cast<std::vector<std::pair<int32_t, float>>>(value);
}

nb::dict stats_dict(const deepinfer::EngineStats& s) {
  nb::dict d;
  d["num_running"] = s.num_running;
  d["num_waiting"] = s.num_waiting;
  d["num_fetching"] = s.num_fetching;
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
  d["draft_tokens"] = s.draft_tokens;
  d["accepted_draft_tokens"] = s.accepted_draft_tokens;
  d["verify_rows"] = s.verify_rows;
  d["device_carried_rows"] = s.device_carried_rows;
  d["device_carried_verify_rows"] = s.device_carried_verify_rows;
  d["budget_step_times"] = s.budget_step_times;
  d["drafter_errors"] = s.drafter_errors;
  d["drafts_at_position"] =
      std::vector<uint64_t>(s.drafts_at_position.begin(), s.drafts_at_position.end());
  d["accepted_at_position"] =
      std::vector<uint64_t>(s.accepted_at_position.begin(), s.accepted_at_position.end());
  d["verify_steps"] = s.verify_steps;
  std::vector<double> rates;
  for (size_t j = 0; j < s.drafts_at_position.size(); ++j) {
    rates.push_back(s.drafts_at_position[j] > 0 ? static_cast<double>(s.accepted_at_position[j]) /
                                                      static_cast<double>(s.drafts_at_position[j])
                                                : 0.0);
  }
  d["spec_acceptance_rate_at_position"] = rates;
  d["spec_mean_acceptance_length"] = s.spec_mean_acceptance_length;
  d["spec_mean_verified_per_step"] = s.spec_mean_verified_per_step;
  d["spec_mean_accepted_per_step"] = s.spec_mean_accepted_per_step;
  d["spec_mean_estimate"] = s.spec_mean_estimate;
  d["spec_mean_acceptance"] = s.spec_mean_acceptance;
  d["spec_calibration_error"] = s.spec_calibration_error;
  const deepinfer::DraftCalibration& c = s.calibration;
  d["spec_calibration_drafts"] = std::vector<uint64_t>(c.drafts.begin(), c.drafts.end());
  d["spec_calibration_accepted"] = std::vector<uint64_t>(c.accepted.begin(), c.accepted.end());
  d["spec_calibration_estimate_sum"] =
      std::vector<double>(c.estimate_sum.begin(), c.estimate_sum.end());
  d["num_graph_steps"] = s.num_graph_steps;
  d["num_graph_verify_steps"] = s.num_graph_verify_steps;
  d["host_hit_tokens"] = s.host_hit_tokens;
  d["store_hit_tokens"] = s.store_hit_tokens;
  d["store_bytes_read"] = s.store_bytes_read;
  d["store_bytes_written"] = s.store_bytes_written;
  d["kv_blocks_written_through"] = s.kv_blocks_written_through;
  d["kv_tier_fetch_failures"] = s.kv_tier_fetch_failures;
  d["kv_host_pinned_bytes"] = s.kv_host_pinned_bytes;
  d["kv_fetches"] = s.kv_fetches;
  d["kv_fetch_waits"] = s.kv_fetch_waits;
  d["dp_group_steps"] = s.dp_group_steps;
  d["dp_idle_passes"] = s.dp_idle_passes;
  d["eplb_rebalances"] = s.eplb_rebalances;
  d["eplb_last_pause_seconds"] = s.eplb_last_pause_seconds;
  d["eplb_max_over_mean_before"] = s.eplb_max_over_mean_before;
  d["eplb_max_over_mean_after"] = s.eplb_max_over_mean_after;
  d["kv_fetch_seconds_total"] = s.kv_fetch_seconds_total;
  d["kv_fetch_seconds_max"] = s.kv_fetch_seconds_max;
  return d;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<deepinfer::Drafter, PyDrafter>(
      m, "Drafter",
      "Base class of a host-side drafter for speculative decoding (speculative_method\n"
      "'external', Engine.set_drafter). The engine calls propose(request_id, tokens, max_drafts)\n"
      "on its step thread before a decode step; it returns up to max_drafts token ids likely to\n"
      "follow `tokens` (the prompt and committed outputs). The target model verifies them, so\n"
      "outputs do not change (greedy: identical; sampled: the same distribution). An exception\n"
      "or an id outside the vocabulary means no drafts for that step.")
      .def(nb::init<>());

  nb::class_<deepinfer::TokenConstraint, PyTokenConstraint>(
      m, "TokenConstraint",
      "Base class of a constraint on the tokens one request generates (structured outputs).\n"
      "Subclass it in Python and pass an instance as SamplingParams(constraint=...), one per\n"
      "request. The engine calls, on its step thread:\n"
      "  fill_allowed(mask): mask is a zeroed uint32 numpy array of ceil(vocab_size / 32)\n"
      "    words; set bit t % 32 of word t // 32 for every token t allowed next;\n"
      "  accept(token) -> bool: the emitted token; False ends the request ('grammar_error');\n"
      "  is_terminated() -> bool: True once the output is complete (the request stops).\n"
      "For speculative decoding, also can_rollback() -> True and rollback(n) (undo the last n\n"
      "accepts): the engine accepts drafts to mask each verify row, then rolls them back.\n"
      "An exception in any of them ends that request alone with 'grammar_error'.")
      .def(nb::init<>())
      .def("can_rollback", &deepinfer::TokenConstraint::can_rollback)
      .def("rollback", &deepinfer::TokenConstraint::rollback, "num_tokens"_a);

  nb::class_<deepinfer::SamplingParams>(m, "SamplingParams",
                                        "Per-request sampling and stopping parameters.")
      .def(
          "__init__",
          [](deepinfer::SamplingParams* self, float temperature, int top_k, float top_p,
             std::optional<uint64_t> seed, int max_tokens, bool ignore_eos,
             std::vector<int32_t> stop_token_ids, int logprobs, std::vector<int32_t> forced_tokens,
             nb::handle logit_bias, float presence_penalty, float frequency_penalty,
             std::shared_ptr<deepinfer::TokenConstraint> constraint, std::string kv_retention) {
            auto* p = new (self) deepinfer::SamplingParams();
            p->temperature = temperature;
            p->top_k = top_k;
            p->top_p = top_p;
            p->seed = seed;
            p->max_tokens = max_tokens;
            p->ignore_eos = ignore_eos;
            p->stop_token_ids = std::move(stop_token_ids);
            p->logprobs = logprobs;
            p->forced_tokens = std::move(forced_tokens);
            p->logit_bias = logit_bias_from(logit_bias);
            p->presence_penalty = presence_penalty;
            p->frequency_penalty = frequency_penalty;
            p->constraint = std::move(constraint);
            p->kv_retention = std::move(kv_retention);
          },
          "temperature"_a = 1.0f, "top_k"_a = 0, "top_p"_a = 1.0f, "seed"_a = nb::none(),
          "max_tokens"_a = 16, "ignore_eos"_a = false, "stop_token_ids"_a = std::vector<int32_t>{},
          "logprobs"_a = 0, "forced_tokens"_a = std::vector<int32_t>{}, "logit_bias"_a = nb::none(),
          "presence_penalty"_a = 0.0f, "frequency_penalty"_a = 0.0f, "constraint"_a = nb::none(),
          "kv_retention"_a = "")
      .def_rw("temperature", &deepinfer::SamplingParams::temperature)
      .def_rw("top_k", &deepinfer::SamplingParams::top_k)
      .def_rw("top_p", &deepinfer::SamplingParams::top_p)
      .def_rw("seed", &deepinfer::SamplingParams::seed)
      .def_rw("max_tokens", &deepinfer::SamplingParams::max_tokens)
      .def_rw("ignore_eos", &deepinfer::SamplingParams::ignore_eos)
      .def_rw("stop_token_ids", &deepinfer::SamplingParams::stop_token_ids)
      .def_rw("logprobs", &deepinfer::SamplingParams::logprobs)
      .def_rw("forced_tokens", &deepinfer::SamplingParams::forced_tokens)
      .def_prop_rw(
          "logit_bias",
          [](const deepinfer::SamplingParams& p) {
            nb::dict d;
            for (const auto& [token, bias] : p.logit_bias) d[nb::int_(token)] = bias;
            return d;
          },
          [](deepinfer::SamplingParams& p, nb::handle value) {
            p.logit_bias = logit_bias_from(value);
          })
      .def_rw("presence_penalty", &deepinfer::SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &deepinfer::SamplingParams::frequency_penalty)
      .def_rw("constraint", &deepinfer::SamplingParams::constraint, nb::arg("value").none())
      .def_rw("kv_retention", &deepinfer::SamplingParams::kv_retention);

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
      .def_ro("bytes_per_block", &deepinfer::KvCapacity::bytes_per_block)
      .def_ro("bytes_per_token", &deepinfer::KvCapacity::bytes_per_token)
      .def_ro("bytes_per_state_slot", &deepinfer::KvCapacity::bytes_per_state_slot)
      .def_ro("max_tokens", &deepinfer::KvCapacity::max_tokens)
      .def_ro("max_seqs_at_max_model_len", &deepinfer::KvCapacity::max_seqs_at_max_model_len)
      .def_ro("sized_from_memory", &deepinfer::KvCapacity::sized_from_memory)
      .def("__repr__", [](const deepinfer::KvCapacity& k) {
        return "KvCapacity(num_blocks=" + std::to_string(k.num_blocks) +
               ", block_size=" + std::to_string(k.block_size) +
               ", bytes_per_block=" + std::to_string(k.bytes_per_block) +
               ", bytes_per_token=" + std::to_string(k.bytes_per_token) +
               ", max_tokens=" + std::to_string(k.max_tokens) +
               ", max_seqs_at_max_model_len=" + std::to_string(k.max_seqs_at_max_model_len) +
               ", sized_from_memory=" + (k.sized_from_memory ? "True" : "False") + ")";
      });

  nb::class_<deepinfer::RankListener>(
      m, "RankListener",
      "Rank 0's listening socket for a group of processes, bound at once (port 0: a free one).")
      .def(nb::init<const std::string&, int>(), "address"_a, "port"_a)
      .def_prop_ro("port", &deepinfer::RankListener::port);
  m.def(
      "serve_rank",
      [](const EngineConfig& config, int rank, int local_rank, const std::string& address, int port,
         int connect_timeout_s) {
        nb::gil_scoped_release release;
        deepinfer::serve_tcp_rank(config, rank, local_rank, address, port,
                                  std::chrono::seconds(connect_timeout_s));
      },
      "config"_a, "rank"_a, "local_rank"_a, "address"_a, "port"_a, "connect_timeout_s"_a = 120,
      "Rank `rank` (1..N-1) of a group of processes: connects to rank 0 at address:port, loads "
      "(device \"cuda\": cuda:<local_rank>) and serves rank 0's steps until it closes the group.");

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
      .def_static(
          "front",
          [](const EngineConfig& config, deepinfer::RankListener& listener, nb::object progress,
             int connect_timeout_s) {
            deepinfer::LoadProgress report;
            if (!progress.is_none()) {
              report = [callback = nb::handle(progress)](int done, int total) {
                nb::gil_scoped_acquire acquire;
                callback(done, total);
              };
            }
            nb::gil_scoped_release release;
            return deepinfer::create_tcp_front(config, std::move(listener),
                                               std::chrono::seconds(connect_timeout_s), report);
          },
          "config"_a, "listener"_a, "progress"_a = nb::none(), "connect_timeout_s"_a = 120,
          "Rank 0 of a group of processes over TCP (deepinfer/rank_group.h): waits for ranks "
          "1..N-1 on `listener` (which it takes), loads rank 0 and returns the front engine.")
      .def("add_request", &Engine::add_request, "prompt"_a, "params"_a,
           "Queue a request; returns its id.")
      .def("abort", &Engine::abort, "id"_a)
      .def("set_drafter", &Engine::set_drafter, "drafter"_a.none(),
           "The drafter of speculative_method 'external' (None: drafting off). Call between "
           "steps.")
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
                   "Steps launched and not yet committed (0, 1 or 2).")
      .def("flush_kv_tiers", &Engine::flush_kv_tiers, nb::call_guard<nb::gil_scoped_release>(),
           "Wait until every block written through so far is in the host tier and the store.")
      .def("hold_kv_fetches", &Engine::hold_kv_fetches, "hold"_a,
           "Test hook: while held, the KV tiers start no store read, so a request on a store "
           "hit stays fetching; hold_kv_fetches(False) lets the reads go.");
}
