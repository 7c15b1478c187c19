// Bindings of the engine options (deepinfer/engine_config.h): SchedulerConfig, CacheConfig,
// PlacementConfig and EngineConfig, field by field, so every default comes from the C++
// initialisers and none is written here.
//
// Also the flat spelling the Python API uses everywhere: `EngineConfig(max_num_seqs=8)`,
// `Engine(path, **options)`, `scripted_engine(model, **options)`, a run config's `engine:`
// section and `LLM(**options)`. Field names are unique across the parts, so a flat name picks one
// field, and its value is checked against that field's C++ type: a bool is not an integer and a
// string is not a number (`max_num_seqs: "8"` in a YAML file is an error, not a conversion).
#include <nanobind/nanobind.h>
#include <nanobind/operators.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "deepinfer/engine_config.h"
#include "deepinfer/error.h"
#include "engine_bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using deepinfer::CacheConfig;
using deepinfer::EngineConfig;
using deepinfer::ParallelConfig;
using deepinfer::PlacementConfig;
using deepinfer::PreemptionMode;
using deepinfer::SchedulerConfig;

// A flat option: the EngineConfig part holding it and how to set it from a Python value.
struct Option {
  std::string part;  // "scheduler", "cache", "placement"; empty: a field of EngineConfig itself
  std::string name;
  std::function<void(EngineConfig&, nb::handle)> set;
};

std::vector<Option>& options() {
  static std::vector<Option> all;  // filled once, when the module is initialised
  return all;
}

const Option* find_option(const std::string& name) {
  for (const Option& o : options())
    if (o.name == name) return &o;
  return nullptr;
}

bool is_part(const std::string& name) {
  return std::any_of(options().begin(), options().end(),
                     [&](const Option& o) { return !o.part.empty() && o.part == name; });
}

std::string known_options() {
  std::vector<std::string> names;
  for (const Option& o : options()) names.push_back(o.name);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

const char* preemption_name(PreemptionMode mode) {
  return mode == PreemptionMode::kStop ? "stop" : "recompute";
}

PreemptionMode parse_preemption(const std::string& mode) {
  if (mode == "recompute") return PreemptionMode::kRecompute;
  if (mode == "stop") return PreemptionMode::kStop;
  throw deepinfer::Error(
      deepinfer::ErrorCode::kInvalidArgument,
      "engine config: 'preemption' must be \"recompute\" or \"stop\", got \"" + mode + "\"");
}

[[noreturn]] void bad_type(const std::string& name, const char* want, nb::handle value) {
  throw nb::type_error(
      ("engine option '" + name + "' must be " + want + ", got " + nb::repr(value).c_str())
          .c_str());
}

// The value of a field of type T given by Python `v`, checked strictly.
template <typename T>
T from_python(const std::string& name, nb::handle v) {
  PyObject* o = v.ptr();
  if constexpr (std::is_same_v<T, bool>) {
    if (!PyBool_Check(o)) bad_type(name, "true or false", v);
    return o == Py_True;
  } else if constexpr (std::is_integral_v<T>) {
    T out{};
    if (!PyLong_Check(o) || PyBool_Check(o)) bad_type(name, "an integer", v);
    if (!nb::try_cast(v, out, false)) bad_type(name, "an integer in range", v);
    return out;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!(PyLong_Check(o) || PyFloat_Check(o)) || PyBool_Check(o)) bad_type(name, "a number", v);
    return static_cast<T>(PyFloat_AsDouble(o));
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!PyUnicode_Check(o)) bad_type(name, "a string", v);
    return nb::cast<std::string>(v);
  } else {
    static_assert(std::is_same_v<T, PreemptionMode>);
    if (!PyUnicode_Check(o)) bad_type(name, "\"recompute\" or \"stop\"", v);
    return parse_preemption(nb::cast<std::string>(v));
  }
}

// Python's repr of a config: its fields (for EngineConfig, the flat options) as keywords.
std::string repr_fields(nb::handle self, const char* type_name, const std::string& part) {
  std::string out = std::string(type_name) + "(";
  bool first = true;
  for (const Option& o : options()) {
    if (!part.empty() && o.part != part) continue;
    nb::object owner =
        part.empty() && !o.part.empty() ? nb::object(self.attr(o.part.c_str())) : nb::borrow(self);
    out += (first ? "" : ", ") + o.name + "=" + nb::repr(owner.attr(o.name.c_str())).c_str();
    first = false;
  }
  return out + ")";
}

// What every config class has: construction with the C++ defaults, ==, copies, a repr.
template <typename T>
nb::class_<T> config_class(nb::module_& m, const char* name, const char* part, const char* doc) {
  nb::class_<T> cls(m, name, doc);
  if constexpr (!std::is_same_v<T, EngineConfig>) cls.def(nb::init<>());
  cls.def(nb::self == nb::self)
      .def("__copy__", [](const T& t) { return T(t); })
      .def(
          "__deepcopy__", [](const T& t, nb::handle) { return T(t); }, "memo"_a)
      .def("__repr__", [name, part](nb::handle self) { return repr_fields(self, name, part); });
  return cls;
}

// The type of a member: member_of<int SchedulerConfig::*>::type is int.
template <typename M>
struct member_of;
template <typename C, typename T>
struct member_of<T C::*> {
  using type = T;
};

// The part of EngineConfig that the member pointer `Part` names; nullptr: EngineConfig itself.
template <auto Part>
struct part_of {
  using type = typename member_of<decltype(Part)>::type;
};
template <>
struct part_of<nullptr> {
  using type = EngineConfig;
};

// Binds one part of EngineConfig (its class, then field by field) and registers its fields as
// flat options.
template <auto Part>
struct PartBinder {
  using Owner = typename part_of<Part>::type;
  nb::class_<Owner> cls;
  const char* part;

  PartBinder(nb::module_& m, const char* name, const char* part_name, const char* doc)
      : cls(config_class<Owner>(m, name, part_name, doc)), part(part_name) {}

  static Owner& owner(EngineConfig& c) {
    if constexpr (std::is_null_pointer_v<decltype(Part)>) {
      return c;
    } else {
      return c.*Part;
    }
  }

  template <auto Field>
  PartBinder& option(const char* name) {
    using T = typename member_of<decltype(Field)>::type;
    if constexpr (std::is_same_v<T, PreemptionMode>) {  // as the strings "recompute" / "stop"
      cls.def_prop_rw(
          name, [](const Owner& o) { return std::string(preemption_name(o.*Field)); },
          [name](Owner& o, nb::handle v) { o.*Field = from_python<T>(name, v); });
    } else {
      cls.def_rw(name, Field);
    }
    options().push_back({part, name, [name](EngineConfig& c, nb::handle v) {
                           owner(c).*Field = from_python<T>(name, v);
                         }});
    return *this;
  }
};

// Sets the flat options of `values` (a dict) on `config`. A part may also be given as a mapping
// of its own options: scheduler={"max_num_seqs": 8}.
void apply(EngineConfig& config, nb::handle values, const std::string& part = "") {
  for (auto [key, value] : nb::borrow<nb::dict>(values)) {
    if (!PyUnicode_Check(key.ptr())) {
      throw nb::type_error(
          ("engine option names must be strings, got " + std::string(nb::repr(key).c_str()))
              .c_str());
    }
    const std::string name = nb::cast<std::string>(key);
    if (part.empty() && is_part(name)) {
      if (!PyDict_Check(value.ptr())) bad_type(name, "a mapping of its options", value);
      apply(config, value, name);
      continue;
    }
    const Option* o = find_option(name);
    const std::string spelled = part.empty() ? name : part + "." + name;
    if (o == nullptr || (!part.empty() && o->part != part)) {
      throw nb::type_error(
          ("unknown engine option '" + spelled + "' (known: " + known_options() + ")").c_str());
    }
    o->set(config, value);
  }
}

}  // namespace

EngineConfig engine_config_from(const nb::kwargs& values) {
  EngineConfig config;
  apply(config, values);
  return config;
}

void bind_engine_config(nb::module_& m) {
  PartBinder<nullptr> engine(
      m, "EngineConfig", "",
      "Every engine option, in parts (scheduler, cache, placement, parallel), with "
      "the C++ defaults (cpp/include/deepinfer/engine_config.h).");
  engine.cls
      .def(
          "__init__",
          [](EngineConfig* self, const nb::kwargs& values) {
            new (self) EngineConfig(engine_config_from(values));
          },
          "options"_a,
          "The defaults, then `options` by flat name: EngineConfig(max_num_seqs=8, "
          "device=\"cpu\"). Unknown names and ill-typed values raise TypeError.")
      .def(
          "update",
          [](EngineConfig& self, const nb::kwargs& values) {
            EngineConfig updated = self;  // all or nothing
            apply(updated, values);
            self = std::move(updated);
          },
          "options"_a,
          "Sets `options` by flat name (max_num_seqs=8); a part may be given as a mapping "
          "(scheduler={\"max_num_seqs\": 8}). Unknown names and ill-typed values raise "
          "TypeError.")
      .def(
          "options",
          [](nb::handle self) {
            nb::dict out;
            for (const Option& o : options()) {
              nb::object owner = o.part.empty() ? nb::borrow(self) : self.attr(o.part.c_str());
              out[o.name.c_str()] = owner.attr(o.name.c_str());
            }
            return out;
          },
          "Every option by its flat name: EngineConfig(**config.options()) == config (how a rank "
          "process gets its front's config).")
      .def_rw("scheduler", &EngineConfig::scheduler)
      .def_rw("cache", &EngineConfig::cache)
      .def_rw("placement", &EngineConfig::placement)
      .def_rw("parallel", &EngineConfig::parallel);
  engine.option<&EngineConfig::model_path>("model_path")
      .option<&EngineConfig::seed>("seed")
      .option<&EngineConfig::load_format>("load_format");

  PartBinder<&EngineConfig::scheduler>(m, "SchedulerConfig", "scheduler",
                                       "Batching and admission options (engine_config.h).")
      .option<&SchedulerConfig::max_num_seqs>("max_num_seqs")
      .option<&SchedulerConfig::max_num_batched_tokens>("max_num_batched_tokens")
      .option<&SchedulerConfig::max_model_len>("max_model_len")
      .option<&SchedulerConfig::enable_chunked_prefill>("enable_chunked_prefill")
      .option<&SchedulerConfig::zero_overhead>("zero_overhead")
      .option<&SchedulerConfig::preemption>("preemption")
      .option<&SchedulerConfig::kv_admission_watermark>("kv_admission_watermark")
      .option<&SchedulerConfig::prefill_steps_per_decode_step>("prefill_steps_per_decode_step")
      .option<&SchedulerConfig::num_speculative_tokens>("num_speculative_tokens")
      .option<&SchedulerConfig::speculative_zero_overhead>("speculative_zero_overhead")
      .option<&SchedulerConfig::speculative_method>("speculative_method")
      .option<&SchedulerConfig::prompt_lookup_min>("prompt_lookup_min")
      .option<&SchedulerConfig::prompt_lookup_max>("prompt_lookup_max")
      .option<&SchedulerConfig::speculative_budget>("speculative_budget");
  PartBinder<&EngineConfig::cache>(m, "CacheConfig", "cache", "KV cache options (engine_config.h).")
      .option<&CacheConfig::num_kv_blocks>("num_kv_blocks")
      .option<&CacheConfig::num_prefix_snapshots>("num_prefix_snapshots")
      .option<&CacheConfig::enable_prefix_cache>("enable_prefix_cache")
      .option<&CacheConfig::gpu_memory_utilization>("gpu_memory_utilization")

      .option<&CacheConfig::kv_cache_dtype>("kv_cache_dtype")
      .option<&CacheConfig::kv_host_cache_bytes>("kv_host_cache_bytes")
      .option<&CacheConfig::kv_store_path>("kv_store_path")
      .option<&CacheConfig::kv_store_capacity_bytes>("kv_store_capacity_bytes")
      .option<&CacheConfig::kv_store_ttl_class>("kv_store_ttl_class")
      .option<&CacheConfig::fetch_threads>("fetch_threads")
      .option<&CacheConfig::kv_window_state>("kv_window_state");
  PartBinder<&EngineConfig::placement>(m, "PlacementConfig", "placement",
                                       "Where the model runs (engine_config.h).")
      .option<&PlacementConfig::device>("device")
      .option<&PlacementConfig::num_threads>("num_threads")
      .option<&PlacementConfig::decode_graph_max_batch>("decode_graph_max_batch")
      .option<&PlacementConfig::activation_quant>("activation_quant")
      .option<&PlacementConfig::yoco_prefill_truncation>("yoco_prefill_truncation")
      .option<&PlacementConfig::yoco_keep_tokens>("yoco_keep_tokens")
      .option<&PlacementConfig::engram_table_memory>("engram_table_memory");
  PartBinder<&EngineConfig::parallel>(m, "ParallelConfig", "parallel",
                                      "Data/expert parallel ranks and DP voting (engine_config.h).")
      .option<&ParallelConfig::data_parallel_size>("data_parallel_size")
      .option<&ParallelConfig::expert_parallel_size>("expert_parallel_size")
      .option<&ParallelConfig::tensor_parallel_size>("tensor_parallel_size")
      .option<&ParallelConfig::data_parallel_backend>("data_parallel_backend")
      .option<&ParallelConfig::redundant_experts_per_rank>("redundant_experts_per_rank")
      .option<&ParallelConfig::dp_prefill_all_interval>("dp_prefill_all_interval")
      .option<&ParallelConfig::dp_prefill_any_interval>("dp_prefill_any_interval")
      .option<&ParallelConfig::dp_prefill_when_idle>("dp_prefill_when_idle")
      .option<&ParallelConfig::enable_eplb>("enable_eplb")
      .option<&ParallelConfig::eplb_window_steps>("eplb_window_steps")
      .option<&ParallelConfig::eplb_rebalance_interval>("eplb_rebalance_interval");
}
