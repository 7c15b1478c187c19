// deepinfer_core: Python bindings over the public C++ API. Type conversion only.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include "deepinfer/backend.h"
#include "deepinfer/build_info.h"
#include "deepinfer/config.h"
#include "deepinfer/error.h"
#include "deepinfer/model_runner.h"
#include "deepinfer/v41_config.h"
#include "engine_bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using deepinfer::Error;
using deepinfer::ErrorCode;

nb::dict build_info_dict() {
  deepinfer::BuildInfo info = deepinfer::build_info();
  nb::dict d;
  d["version"] = info.version;
  nb::list backends;
  for (const std::string& b : info.backends) backends.append(b);
  d["backends"] = backends;
  d["compiler"] = info.compiler;
  d["build_type"] = info.build_type;
  d["debug_invariants"] = info.debug_invariants;
  return d;
}

// The layer roles the V4.1 parser derives from a config.json's text: per layer the kv, index and
// index-K source (-1: none) and whether it scores inside candidate blocks, and the YOCO boundary,
// candidate source (-1: none) and Engram layers with their table sizes.
nb::dict v41_layer_roles(const std::string& json_text, int yoco_keep_tokens) {
  const deepinfer::V41TextConfig c =
      deepinfer::V41TextConfig::from_json_text(json_text, "config.json", yoco_keep_tokens);
  nb::list uses_candidates;
  for (int layer = 0; layer < c.num_hidden_layers; ++layer)
    uses_candidates.append(c.uses_candidates(layer));
  nb::dict d;
  d["kv_source"] = nb::cast(c.kv_source);
  d["index_source"] = nb::cast(c.index_source);
  d["index_k_source"] = nb::cast(c.index_k_source);
  d["uses_candidates"] = uses_candidates;
  d["yoco_boundary"] = c.yoco_boundary;
  d["candidate_source"] = c.candidate_source_layer_id;
  d["engram_layer_ids"] = nb::cast(c.engram_layer_ids);
  d["engram_num_embeddings"] = nb::cast(c.engram_num_embeddings);
  return d;
}

nb::list layer_type_names(const deepinfer::ModelConfig& c) {
  nb::list out;
  for (auto k : c.layer_types) out.append(deepinfer::attention_kind_name(k));
  return out;
}

nb::list mlp_type_names(const deepinfer::ModelConfig& c) {
  nb::list out;
  for (auto k : c.mlp_layer_types) out.append(deepinfer::mlp_kind_name(k));
  return out;
}

// A host f32 tensor as a NumPy array that owns a copy of the data.
// A numpy copy of a host tensor whose elements are T (f32 logits, i32 token ids).
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(const deepinfer::Tensor& t) {
  if (t.dtype() != deepinfer::DTypeOf<T>::value) {
    throw Error(ErrorCode::kInternal, "to_numpy: unexpected dtype of " + t.describe());
  }
  deepinfer::Tensor host = t.contiguous();
  auto* data = new T[static_cast<size_t>(host.numel())];
  std::memcpy(data, host.raw_data(), host.nbytes());
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  std::vector<size_t> shape(host.shape().begin(), host.shape().end());
  return nb::ndarray<nb::numpy, T>(data, shape.size(), shape.data(), owner);
}

// A host f32 copy of a C-contiguous NumPy array of rank 3 (the MTP trunk).
deepinfer::Tensor from_numpy3(
    const nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>& x) {
  deepinfer::Tensor host =
      deepinfer::Tensor::zeros({static_cast<int64_t>(x.shape(0)), static_cast<int64_t>(x.shape(1)),
                                static_cast<int64_t>(x.shape(2))},
                               deepinfer::DType::kF32);
  std::memcpy(host.raw_data(), x.data(), host.nbytes());
  return host;
}

using Trunk = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

deepinfer::LogitsMode parse_logits_mode(const std::string& mode) {
  if (mode == "all") return deepinfer::LogitsMode::kAll;
  if (mode == "last") return deepinfer::LogitsMode::kLast;
  throw Error(ErrorCode::kInvalidArgument,
              "logits must be \"all\" or \"last\", got \"" + mode + "\"");
}

// Backend::quantize_activations of x [M, K] on a fresh backend of `device`, as a host copy: lets
// the tests compare the op with an independent implementation of DeepSeek's dynamic FP8
// activation quantization.
nb::ndarray<nb::numpy, float> quantize_activations(
    const nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>& x, int group,
    const std::string& device) {
  const auto rows = static_cast<int64_t>(x.shape(0));
  const auto cols = static_cast<int64_t>(x.shape(1));
  deepinfer::Tensor host = deepinfer::Tensor::zeros({rows, cols}, deepinfer::DType::kF32);
  std::memcpy(host.raw_data(), x.data(), host.nbytes());
  deepinfer::Tensor out;
  {
    nb::gil_scoped_release release;
    std::unique_ptr<deepinfer::Backend> backend = deepinfer::make_backend(device);
    out = backend->to_host(
        backend->quantize_activations(backend->upload(host, deepinfer::DType::kF32), group));
  }
  return to_numpy<float>(out);
}

}  // namespace

NB_MODULE(deepinfer_core, m) {
  m.doc() = "deepinfer C++ core: DeepSeek-V4 model runner and build information";

  // deepinfer::Error -> the matching Python exception, keeping the message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      switch (e.code()) {
        case ErrorCode::kInvalidArgument:
        case ErrorCode::kInvalidConfig:
        case ErrorCode::kCorruptFile:
          PyErr_SetString(PyExc_ValueError, e.what());
          break;
        case ErrorCode::kNotFound:
          PyErr_SetString(PyExc_FileNotFoundError, e.what());
          break;
        case ErrorCode::kIo:
          PyErr_SetString(PyExc_OSError, e.what());
          break;
        case ErrorCode::kUnsupported:
        case ErrorCode::kInternal:
          PyErr_SetString(PyExc_RuntimeError, e.what());
          break;
      }
    }
  });

  bind_engine_config(m);
  bind_engine(m);
  nb::module_ testing = m.def_submodule(
      "testing", "Test doubles of the engine (libdeepinfer_testing): the scripted engine.");
  bind_testing(testing);
  testing.def("quantize_activations", &quantize_activations, "x"_a, "group"_a, "device"_a = "cpu",
              "DeepSeek's dynamic FP8 activation quantization (the backend op the FP8/MXFP4 GEMMs "
              "apply to their input under activation_quant=\"fp8\") of x [M, K] float32 in "
              "groups of `group` columns, returned dequantized as float32.");

  m.def("backend_available", &deepinfer::backend_available, "device"_a,
        "Whether this build has the backend named `device` (\"auto\", \"cpu\", \"cuda\", "
        "\"cuda:N\"; \"auto\" always is).");
  m.def("resolve_device", &deepinfer::resolve_device, "device"_a,
        "The device \"auto\" stands for here: \"cuda\" when this build has the CUDA backend and a "
        "GPU is present, else \"cpu\"; any other name is returned as it is.");
  m.def("build_info", &build_info_dict,
        "Version, compiled backends, compiler and build type of this deepinfer_core build.");

  m.def("v41_layer_roles", &v41_layer_roles, "json_text"_a, "yoco_keep_tokens"_a = 140,
        "The layer roles of a DeepSeek-V4.1 config.json (V41TextConfig): kv_source, "
        "index_source, index_k_source (-1: none) and uses_candidates per layer, yoco_boundary, "
        "candidate_source, engram_layer_ids, engram_num_embeddings. Config only: the engine "
        "does not run V4.1 yet.");

  nb::class_<deepinfer::ModelConfig>(m, "ModelConfig")
      .def_static("from_file", &deepinfer::ModelConfig::from_file, "path"_a,
                  "Read and validate a DeepSeek-V4 config.json.")
      .def_ro("vocab_size", &deepinfer::ModelConfig::vocab_size)
      .def_ro("hidden_size", &deepinfer::ModelConfig::hidden_size)
      .def_ro("num_hidden_layers", &deepinfer::ModelConfig::num_hidden_layers)
      .def_ro("num_attention_heads", &deepinfer::ModelConfig::num_attention_heads)
      .def_ro("head_dim", &deepinfer::ModelConfig::head_dim)
      .def_ro("rope_head_dim", &deepinfer::ModelConfig::rope_head_dim)
      .def_ro("sliding_window", &deepinfer::ModelConfig::sliding_window)
      .def_ro("index_topk", &deepinfer::ModelConfig::index_topk)
      .def_ro("csa_compress_rate", &deepinfer::ModelConfig::csa_compress_rate)
      .def_ro("hca_compress_rate", &deepinfer::ModelConfig::hca_compress_rate)
      .def_ro("n_routed_experts", &deepinfer::ModelConfig::n_routed_experts)
      .def_ro("num_experts_per_tok", &deepinfer::ModelConfig::num_experts_per_tok)
      .def_ro("max_position_embeddings", &deepinfer::ModelConfig::max_position_embeddings)
      .def_ro("bos_token_id", &deepinfer::ModelConfig::bos_token_id)
      .def_ro("eos_token_ids", &deepinfer::ModelConfig::eos_token_ids)
      .def_prop_ro("layer_types", &layer_type_names)
      .def_prop_ro("mlp_layer_types", &mlp_type_names)
      .def_prop_ro(
          "model_type",
          [](const deepinfer::ModelConfig& c) {
            return std::string(c.v41 != nullptr ? "deepseek_v41" : "deepseek_v4");
          },
          "The config.json's model_type: \"deepseek_v4\" or \"deepseek_v41\" (DeepSeek-V4.1, "
          "whose chat prompts the V4.1 encoding renders).");

  nb::class_<deepinfer::SequenceChunk>(m, "SequenceChunk")
      .def(
          "__init__",
          [](deepinfer::SequenceChunk* self, int32_t slot, int64_t start_pos,
             std::vector<int32_t> tokens, std::vector<int32_t> block_table, int64_t prompt_end,
             int64_t swa_valid_start, int64_t replay_end) {
            new (self) deepinfer::SequenceChunk{
                slot,       start_pos,       std::move(tokens), std::move(block_table),
                prompt_end, swa_valid_start, replay_end};
          },
          "slot"_a, "start_pos"_a, "tokens"_a, "block_table"_a = std::vector<int32_t>{},
          "prompt_end"_a = 0, "swa_valid_start"_a = 0, "replay_end"_a = 0,
          "Tokens of one sequence at positions start_pos.., cached in state slot `slot` and the "
          "paged blocks `block_table`. `prompt_end`: the end of the prefill the chunk belongs to "
          "(0: the chunk's end), for DeepSeek-V4.1's YOCO prefill truncation. `swa_valid_start`, "
          "`replay_end`: a bounded-replay KV hit (sliding windows see keys >= swa_valid_start; "
          "compressed entries of windows closing by replay_end are kept).")
      .def_rw("slot", &deepinfer::SequenceChunk::slot)
      .def_rw("start_pos", &deepinfer::SequenceChunk::start_pos)
      .def_rw("tokens", &deepinfer::SequenceChunk::tokens)
      .def_rw("block_table", &deepinfer::SequenceChunk::block_table)
      .def_rw("prompt_end", &deepinfer::SequenceChunk::prompt_end)
      .def_rw("swa_valid_start", &deepinfer::SequenceChunk::swa_valid_start)
      .def_rw("replay_end", &deepinfer::SequenceChunk::replay_end);

  const deepinfer::RunnerOptions kRunner;  // the keyword defaults below
  nb::class_<deepinfer::ModelRunner>(
      m, "ModelRunner", "A DeepSeek-V4 checkpoint loaded on a backend, with its caches.")
      .def(
          nb::new_([](const std::string& path, int num_blocks, int num_state_slots,
                      int max_backtrack, int num_threads, const std::string& device,
                      int decode_graph_max_batch, const std::string& activation_quant,
                      const std::string& kv_cache_dtype, const std::string& yoco_prefill_truncation,
                      int yoco_keep_tokens, const std::string& engram_table_memory) {
            deepinfer::RunnerOptions options;
            options.yoco_prefill_truncation = yoco_prefill_truncation;
            options.yoco_keep_tokens = yoco_keep_tokens;
            options.engram_table_memory = engram_table_memory;
            options.activation_quant = activation_quant;
            options.kv_cache_dtype = kv_cache_dtype;
            options.decode_graph_max_batch = decode_graph_max_batch;
            options.num_blocks = num_blocks;
            options.num_state_slots = num_state_slots;
            options.max_backtrack = max_backtrack;
            options.num_threads = num_threads;
            options.device = device;
            nb::gil_scoped_release release;
            return deepinfer::ModelRunner::load(path, options);
          }),
          "path"_a, "num_blocks"_a = kRunner.num_blocks,
          "num_state_slots"_a = kRunner.num_state_slots, "max_backtrack"_a = kRunner.max_backtrack,
          "num_threads"_a = kRunner.num_threads, "device"_a = kRunner.device,
          "decode_graph_max_batch"_a = kRunner.decode_graph_max_batch,
          "activation_quant"_a = kRunner.activation_quant,
          "kv_cache_dtype"_a = kRunner.kv_cache_dtype,
          "yoco_prefill_truncation"_a = kRunner.yoco_prefill_truncation,
          "yoco_keep_tokens"_a = kRunner.yoco_keep_tokens,
          "engram_table_memory"_a = kRunner.engram_table_memory,
          "Load the Hugging Face checkpoint directory `path` (config.json + safetensors) with "
          "`num_blocks` paged 128-token KV blocks and `num_state_slots` sequence state slots. "
          "Decode calls (one token per sequence) of up to `decode_graph_max_batch` sequences "
          "replay recorded graphs (-1: 256 on CUDA, off on the CPU; 0: off). "
          "`activation_quant` sets the activations in front of FP8/MXFP4 weights: \"auto\" "
          "(exact on the CPU, dynamic FP8 on CUDA), \"fp8\" (always; the CPU emulates the "
          "GPU's W8A8 exactly) or \"none\". `kv_cache_dtype` stores the KV caches as \"f32\", "
          "\"bf16\" or \"fp8\" (\"auto\": f32 on the CPU; on a GPU fp8 for an FP8 V4 "
          "checkpoint and every DeepSeek-V4.1 one, bf16 otherwise). `yoco_prefill_truncation` "
          "(DeepSeek-V4.1): \"off\" "
          "(exact), \"mask\" or \"compact\": the YOCO consumer layers keep the last "
          "`yoco_keep_tokens` positions of a prefill (>= sliding_window + max_backtrack). "
          "`engram_table_memory` (DeepSeek-V4.1): where the Engram tables live, \"device\", "
          "\"host\" (pinned host memory the GPU reads in place) or \"auto\" (host for a table "
          "over 1/8 of the device's memory).")
      .def_static(
          "random",
          [](const std::string& config_json, int num_blocks, int num_state_slots, int num_threads,
             const std::string& device, uint64_t seed, bool bf16, int decode_graph_max_batch,
             const std::string& activation_quant, const std::string& kv_cache_dtype) {
            deepinfer::RunnerOptions options;
            options.activation_quant = activation_quant;
            options.kv_cache_dtype = kv_cache_dtype;
            options.decode_graph_max_batch = decode_graph_max_batch;
            options.num_blocks = num_blocks;
            options.num_state_slots = num_state_slots;
            options.num_threads = num_threads;
            options.device = device;
            nb::gil_scoped_release release;
            return deepinfer::ModelRunner::random(config_json, options, seed, bf16);
          },
          "config_json"_a, "num_blocks"_a = kRunner.num_blocks,
          "num_state_slots"_a = kRunner.num_state_slots, "num_threads"_a = kRunner.num_threads,
          "device"_a = kRunner.device, "seed"_a = 0, "bf16"_a = true,
          "decode_graph_max_batch"_a = kRunner.decode_graph_max_batch,
          "activation_quant"_a = kRunner.activation_quant,
          "kv_cache_dtype"_a = kRunner.kv_cache_dtype,
          "The model described by a config.json with random weights (bf16 matrices by default; "
          "FP8 / MXFP4 in DeepSeek's formats when the config has a quantization_config), for "
          "benchmarks at real widths without a checkpoint.")
      .def_prop_ro("config", &deepinfer::ModelRunner::config, nb::rv_policy::reference_internal)
      .def_prop_ro("load_notes", &deepinfer::ModelRunner::load_notes,
                   "What loading left out on purpose (skipped tensor families), for the user.")
      .def(
          "decode_graph_stats",
          [](const deepinfer::ModelRunner& runner) {
            const deepinfer::DecodeGraphStats s = runner.decode_graph_stats();
            nb::dict d;
            d["num_recorded"] = s.num_recorded;
            d["num_calls"] = s.num_calls;
            d["num_verify_calls"] = s.num_verify_calls;
            return d;
          },
          "Decode graphs used so far: shapes recorded, forward calls they served, and those "
          "with a speculative verify row.")
      .def(
          "forward",
          [](deepinfer::ModelRunner& runner, const std::vector<deepinfer::SequenceChunk>& batch,
             const std::string& logits) {
            deepinfer::LogitsMode mode = parse_logits_mode(logits);
            deepinfer::Tensor out;
            {
              nb::gil_scoped_release release;
              out = runner.forward(batch, mode);
            }
            return to_numpy<float>(out);
          },
          "batch"_a, "logits"_a = "all",
          "Run one forward call over `batch` (a list of SequenceChunk). Returns float32 logits: "
          "one row per token (logits=\"all\") or per sequence (logits=\"last\").")
      .def(
          "greedy",
          [](deepinfer::ModelRunner& runner, const std::vector<deepinfer::SequenceChunk>& batch,
             const std::string& logits) {
            deepinfer::LogitsMode mode = parse_logits_mode(logits);
            deepinfer::Tensor out;
            {
              nb::gil_scoped_release release;
              out = runner.greedy(batch, mode);
            }
            return to_numpy<int32_t>(out);
          },
          "batch"_a, "logits"_a = "last",
          "Run one forward call over `batch` and return each sequence's greedy next token (int32, "
          "the argmax of its last logits row, taken on the device: only the ids are copied); "
          "logits=\"all\": the argmax of every token row, as a speculative verify step scores "
          "them.")
      .def(
          "set_history",
          [](deepinfer::ModelRunner& runner, int slot, const std::vector<int32_t>& tokens) {
            nb::gil_scoped_release release;
            runner.set_history(slot, tokens);
          },
          "slot"_a, "tokens"_a,
          "DeepSeek-V4.1: make `tokens` the history of state slot `slot` (the tokens at "
          "positions 0.. that its Engram n-grams read) without running them, so a chunk may "
          "start anywhere up to len(tokens). The caches are not touched: they keep what earlier "
          "calls wrote (the benchmarks decode over caches not filled by a prefill).")
      .def_prop_ro("num_mtp_blocks", &deepinfer::ModelRunner::num_mtp_blocks,
                   "MTP blocks (mtp.K.*) loaded from the checkpoint; 0 when it ships none.")
      .def(
          "forward_hidden",
          [](deepinfer::ModelRunner& runner, const std::vector<deepinfer::SequenceChunk>& batch,
             const std::string& logits) {
            deepinfer::LogitsMode mode = parse_logits_mode(logits);
            deepinfer::HiddenForward out;
            {
              nb::gil_scoped_release release;
              out = runner.forward_hidden(batch, mode);
            }
            return std::make_pair(to_numpy<float>(out.logits), to_numpy<float>(out.hidden));
          },
          "batch"_a, "logits"_a = "all",
          "forward(), also returning the hidden state the MTP block reads: (logits, hidden) with "
          "hidden float32 [tokens, hc_mult, hidden_size], the HC trunk before the head.")
      .def(
          "mtp_forward",
          [](deepinfer::ModelRunner& runner, const std::vector<deepinfer::SequenceChunk>& batch,
             const Trunk& hidden, const std::string& logits, int step) {
            deepinfer::LogitsMode mode = parse_logits_mode(logits);
            deepinfer::Tensor host = from_numpy3(hidden);
            deepinfer::MtpForward out;
            {
              nb::gil_scoped_release release;
              out = runner.mtp_forward(batch, host, mode, step);
            }
            return std::make_pair(to_numpy<float>(out.logits), to_numpy<float>(out.hidden));
          },
          "batch"_a, "hidden"_a, "logits"_a = "all", "step"_a = 0,
          "One pass of the MTP block over `batch`, whose chunks hold each position's NEXT token, "
          "on `hidden` (float32 [tokens, hc_mult, hidden_size]: forward_hidden's trunk, or a "
          "previous pass's). Returns (logits, hidden): the logits predict the token two "
          "positions ahead; hidden is the block's trunk at the same rows.")
      .def(
          "mtp_draft",
          [](deepinfer::ModelRunner& runner, const std::vector<deepinfer::SequenceChunk>& batch,
             const Trunk& hidden, int num_drafts) {
            deepinfer::Tensor host = from_numpy3(hidden);
            deepinfer::MtpDraft out;
            {
              nb::gil_scoped_release release;
              out = runner.mtp_draft(batch, host, num_drafts);
            }
            return std::make_pair(to_numpy<int32_t>(out.tokens), to_numpy<float>(out.logits));
          },
          "batch"_a, "hidden"_a, "num_drafts"_a,
          "Greedy MTP drafts: mtp_forward over `batch`, then num_drafts - 1 one-token steps fed "
          "the previous draft and trunk. Returns (tokens int32 [seqs, num_drafts], logits float32 "
          "[seqs, num_drafts, vocab]).")
      .def_prop_ro(
          "num_dspark_blocks", &deepinfer::ModelRunner::num_dspark_blocks,
          "DeepSeek-V4.1 DSpark blocks (mtp.K.*) loaded; 0 when the checkpoint ships none.")
      .def(
          "dspark_draft",
          [](deepinfer::ModelRunner& runner, const std::vector<deepinfer::SequenceChunk>& batch) {
            deepinfer::DSparkDraft out;
            {
              nb::gil_scoped_release release;
              out = runner.dspark_draft(batch);
            }
            return std::make_tuple(to_numpy<int32_t>(out.tokens), to_numpy<float>(out.confidences),
                                   to_numpy<float>(out.logits));
          },
          "batch"_a,
          "One DSpark draft step: each chunk holds only the golden token (the target's sample) at "
          "start_pos = the slot's fed length. Returns (tokens int32 [seqs, block], confidences "
          "float32 [seqs, block], logits float32 [seqs, block, vocab]).");
}
