#include "model/v41_weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/json.h"
#include "deepinfer/error.h"
#include "model/weight_loader.h"

namespace deepinfer {

namespace {

// The C.9 tensor families the text model does not read, with the note each gets.
struct SkippedFamily {
  const char* prefix;
  const char* why;
};
constexpr SkippedFamily kSkippedFamilies[] = {
    {"vision.", "the vision tower (text only)"},
    {"aligner.", "the vision projector (text only)"},
    {"image_", "the image start/end/newline embeddings (text only)"},
};

[[noreturn]] void bad_tables(const std::string& file, const std::string& field,
                             const std::string& what) {
  throw Error(ErrorCode::kInvalidConfig, file + ": field '" + field + "' " + what);
}

// Whether an Engram table of `bytes` goes to host memory the kernels read in place
// (EngramTableMemory). "auto" picks it for a table over 1/8 of the device's memory; a backend
// that reports none (the CPU: its memory is the host's) keeps it where upload_weight puts it.
bool engram_table_on_host(Backend& backend, EngramTableMemory memory, int64_t bytes,
                          const std::string& name) {
  if (memory == EngramTableMemory::kDevice) return false;
  if (memory == EngramTableMemory::kAuto) {
    if (!backend.supports_mapped_host_weights()) return false;
    const DeviceMemory m = backend.memory_info();
    return m.total_bytes > 0 && bytes > m.total_bytes / 8;
  }
  if (!backend.supports_mapped_host_weights()) {
    throw Error(ErrorCode::kUnsupported,
                "'engram_table_memory' \"host\": the " + backend.name() +
                    " backend cannot read host memory in place, so tensor '" + name +
                    "' cannot stay there (use \"device\" or \"auto\")");
  }
  return true;
}

// `host` (a checkpoint tensor) on the backend, in host memory read in place or in device memory.
Tensor place_engram_table(Backend& backend, const Tensor& host, DType dtype, bool on_host) {
  if (!on_host) return backend.upload_weight(host, dtype);
  return backend.upload_weight_mapped(host.dtype() == dtype ? host : host.to(dtype));
}

// An Engram table as V4.1 ships it (C.7.4, C.9): e4m3 codes [rows, cols] with `<base>.scale`
// [rows, ceil(cols / 32)] F8_E8M0, one UE8M0 scale per row and 32 columns. It stays in that
// format (V4.1-Flash's tables are ~98 GB each): embedding_fp8 decodes only the looked-up rows.
// On the CPU backend both placements keep the checkpoint's mapping, so nothing is copied.
void load_fp8_engram_table(const Checkpoint& ckpt, Backend& backend, const std::string& name,
                           const Shape& shape, EngramTableMemory memory, EngramWeights& eg) {
  const SafetensorsEntry& e = ckpt.entry(name);
  const std::string& file = ckpt.file_of(name).path();
  if (e.shape != shape) {
    throw Error(ErrorCode::kInvalidConfig,
                file + ": tensor '" + name + "' (F8_E4M3) has shape " + shape_str(e.shape) +
                    " but config.json implies " + shape_str(shape) +
                    " (engram_num_embeddings of the layer, engram_head_dim)");
  }
  const std::string scale_name =
      name.substr(0, name.size() - std::string_view(".weight").size()) + ".scale";
  const Shape grid{shape[0], (shape[1] + 31) / 32};
  if (!ckpt.contains(scale_name)) {
    throw Error(ErrorCode::kNotFound, file + ": tensor '" + name +
                                          "' is F8_E4M3 but has no scale tensor '" + scale_name +
                                          "' (expected F8_E8M0" + shape_str(grid) + ")");
  }
  const SafetensorsEntry& se = ckpt.entry(scale_name);
  const std::string& scale_file = ckpt.file_of(scale_name).path();
  if (se.dtype_name != "F8_E8M0") {
    throw Error(ErrorCode::kUnsupported,
                scale_file + ": scale tensor '" + scale_name + "' has dtype " + se.dtype_name +
                    ", expected F8_E8M0 (the FP8 Engram table's UE8M0 scales, kept as shipped)");
  }
  if (se.shape != grid) {
    throw Error(ErrorCode::kInvalidConfig,
                scale_file + ": scale tensor '" + scale_name + "' has shape " +
                    shape_str(se.shape) + " but '" + name + "' " + shape_str(shape) + " needs " +
                    shape_str(grid) + " (one UE8M0 scale per row and 32 columns)");
  }
  const Tensor scales = ckpt.tensor(scale_name);
  const auto* bits = static_cast<const uint8_t*>(scales.raw_data());
  const void* nan = std::memchr(bits, 0xff, scales.nbytes());
  if (nan != nullptr) {
    const int64_t i = static_cast<const uint8_t*>(nan) - bits;
    throw Error(ErrorCode::kCorruptFile,
                scale_file + ": scale tensor '" + scale_name + "' holds 0xff (e8m0 NaN) at [" +
                    std::to_string(i / grid[1]) + ", " + std::to_string(i % grid[1]) + "]");
  }
  const Tensor values = ckpt.tensor(name);
  eg.embed_on_host = engram_table_on_host(
      backend, memory, static_cast<int64_t>(values.nbytes() + scales.nbytes()), name);
  eg.embed = place_engram_table(backend, values, DType::kF8E4M3, eg.embed_on_host);
  eg.embed_scales = place_engram_table(backend, scales, DType::kE8M0, eg.embed_on_host);
}

// The compressor of kv source `layer` (ratio 2: wkv and wgate stacked, zero ape; ratio 1: wkv).
CompressorWeights v41_compressor(WeightLoader& w, Backend& backend, const V41TextConfig& c,
                                 const std::string& p, int ratio) {
  const int64_t d = c.head_dim;
  const int64_t h = c.hidden_size;
  CompressorWeights out;
  out.norm = w.load(p + "norm.weight", {d});
  if (ratio == 1) {
    out.wkv_gate = w.load_matrix(p + "wkv.weight", {d, h});
    return out;
  }
  out.ape = backend.zeros({2, d}, DType::kF32);  // C2 pools without a position bias
  if (w.is_random()) {
    out.wkv_gate = w.load_matrix(p + "wkv_gate.weight", {2 * d, h});
    return out;
  }
  const Tensor kv_stored = w.host(p + "wkv.weight", {d, h}, /*integer=*/false);
  const DType stored = kv_stored.dtype();
  const Tensor kv = kv_stored.to(stored);
  const Tensor gate = w.host(p + "wgate.weight", {d, h}, /*integer=*/false).to(stored);
  Tensor stacked = Tensor::zeros({2 * d, h}, stored);
  std::memcpy(stacked.raw_data(), kv.raw_data(), kv.nbytes());
  std::memcpy(static_cast<char*>(stacked.raw_data()) + kv.nbytes(), gate.raw_data(), gate.nbytes());
  out.wkv_gate = backend.upload_weight(stacked, backend.weight_dtype(stored));
  return out;
}

// Layer `layer`'s tensors under prefix `p` ("layers.L." or, for a DSpark block, "mtp.K."),
// its MoE of `n_experts` routed experts (the loader's config has as many).
V41LayerWeights v41_layer(WeightLoader& w, const Checkpoint* checkpoint, Backend& backend,
                          const V41TextConfig& c, const EngramTables& tables, int layer,
                          const std::string& p, int64_t n_experts) {
  const int64_t h = c.hidden_size;
  const int64_t n = c.hc_mult;
  const int64_t d = c.head_dim;
  const int64_t q = c.q_lora_rank;
  const int64_t i_size = c.moe_intermediate_size;
  V41LayerWeights L;
  L.attn_norm = w.load(p + "attn_norm.weight", {h});
  L.ffn_norm = w.load(p + "ffn_norm.weight", {h});
  L.hc_attn = w.hc(p + "hc_attn_", (2 + n) * n);
  L.hc_ffn = w.hc(p + "hc_ffn_", (2 + n) * n);
  L.inv_freq = w.inv_freq(c.layer_rope(layer));

  V41AttentionWeights& a = L.attn;
  load_attention_projections(w, c, p, a);
  if (c.is_kv_source(layer)) {
    a.has_compressor = true;
    a.compressor = v41_compressor(w, backend, c, p + "attn.compressor.", c.ratio(layer));
  }
  if (c.is_index_source(layer)) {
    const int64_t hi = c.index_n_heads;
    const int64_t di = c.index_head_dim;
    a.has_indexer = true;
    a.indexer.wq_b = w.load_linear(p + "attn.indexer.wq_b.weight", {hi * di, q}, false);
    a.indexer.weights_proj = w.load_matrix(p + "attn.indexer.weights_proj.weight", {hi, h});
  }
  if (c.is_index_k_source(layer)) {
    const int64_t di = c.index_head_dim;
    a.indexer.owns_k = true;
    a.indexer.wk = w.load_matrix(p + "attn.indexer.wk.weight", {di, d});
    a.indexer.k_norm = w.load(p + "attn.indexer.k_norm.weight", {di});
  }

  MoeWeights& f = L.ffn;
  f.gate = w.load_matrix(p + "ffn.gate.weight", {n_experts, h});
  f.bias = w.load(p + "ffn.gate.bias", {n_experts});
  f.experts = w.experts(p + "ffn.experts.");
  f.shared_w1 = w.load_linear(p + "ffn.shared_experts.w1.weight", {i_size, h}, false);
  f.shared_w3 = w.load_linear(p + "ffn.shared_experts.w3.weight", {i_size, h}, false);
  f.shared_w2 = w.load_linear(p + "ffn.shared_experts.w2.weight", {h, i_size}, false);

  for (size_t e = 0; e < c.engram_layer_ids.size(); ++e) {
    if (c.engram_layer_ids[e] != layer) continue;
    const int64_t orders = c.engram_max_ngram_size - 1;
    const int64_t e_dim = orders * c.engram_n_heads * c.engram_head_dim;
    L.has_engram = true;
    EngramWeights& eg = L.engram;
    eg.hash.multipliers = tables.multipliers[e];
    eg.hash.primes = c.engram_primes[e];
    eg.hash.heads = c.engram_n_heads;
    eg.hash.pad_id = tables.token_map[static_cast<size_t>(c.engram_pad_token_id)];
    const std::string table = p + "engram.embed.weight";
    const Shape table_shape{c.engram_num_embeddings[e], c.engram_head_dim};
    if (checkpoint != nullptr && checkpoint->contains(table) &&
        checkpoint->entry(table).dtype_name == "F8_E4M3") {
      load_fp8_engram_table(*checkpoint, backend, table, table_shape, c.engram_table_memory, eg);
    } else if (checkpoint != nullptr) {
      // A dense table: the dtype load_matrix would give it, wherever it lives.
      const Tensor host = w.host(table, table_shape, /*integer=*/false);
      const DType dtype = backend.weight_dtype(host.dtype());
      eg.embed_on_host = engram_table_on_host(
          backend, c.engram_table_memory,
          table_shape[0] * table_shape[1] * static_cast<int64_t>(dtype_size(dtype)), table);
      eg.embed = place_engram_table(backend, host, dtype, eg.embed_on_host);
    } else {
      // Random weights (load_format dummy) keep a dense table in the backend's memory.
      if (c.engram_table_memory == EngramTableMemory::kHost) {
        throw Error(ErrorCode::kInvalidConfig,
                    table +
                        ": 'engram_table_memory' \"host\" needs the checkpoint's table; "
                        "random weights (load_format dummy) keep a dense table in the "
                        "backend's memory (use \"auto\" or \"device\")");
      }
      eg.embed = w.load_matrix(table, table_shape);
    }
    eg.wkv = w.load_linear(p + "engram.wkv.weight", {(n + 1) * h, e_dim}, false);
    eg.q_weight = w.load(p + "engram.q_weight", {n, h});
    eg.k_weight = w.load(p + "engram.k_weight", {n, h});
  }
  return L;
}

}  // namespace

EngramTables read_engram_tables(const std::string& dir, const V41TextConfig& c) {
  EngramTables t;
  if (c.engram_layer_ids.empty()) return t;
  const std::string file = (std::filesystem::path(dir) / kEngramTablesFile).string();
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw Error(ErrorCode::kNotFound,
                file +
                    ": cannot open the Engram tables (the compressed-token map and the "
                    "multipliers of engram_layer_ids, precomputed offline)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  const json::Value root = json::parse(text.str(), file);
  if (!root.is_object()) bad_tables(file, "(root)", "must be an object");
  const json::Value* map = root.find("token_map");
  if (map == nullptr || !map->is_array() ||
      map->as_array().size() != static_cast<size_t>(c.vocab_size)) {
    bad_tables(file, "token_map",
               "must be an array of vocab_size = " + std::to_string(c.vocab_size) + " ids");
  }
  for (size_t i = 0; i < map->as_array().size(); ++i) {
    const json::Value& v = map->as_array()[i];
    if (!v.is_integer() || v.as_int() < 0 || v.as_int() >= c.engram_compressed_vocab_size) {
      bad_tables(file, "token_map[" + std::to_string(i) + "]",
                 "= " + v.dump() + " is not in [0, engram_compressed_vocab_size = " +
                     std::to_string(c.engram_compressed_vocab_size) + ")");
    }
    t.token_map.push_back(static_cast<int32_t>(v.as_int()));
  }
  const json::Value* mult = root.find("multipliers");
  if (mult == nullptr || !mult->is_object()) bad_tables(file, "multipliers", "must be an object");
  for (int layer : c.engram_layer_ids) {
    const std::string key = std::to_string(layer);
    const std::string field = "multipliers." + key;
    const json::Value* m = mult->find(key);
    if (m == nullptr || !m->is_array() ||
        m->as_array().size() != static_cast<size_t>(c.engram_max_ngram_size)) {
      bad_tables(file, field,
                 "must list engram_max_ngram_size = " + std::to_string(c.engram_max_ngram_size) +
                     " multipliers of Engram layer " + key);
    }
    std::vector<int64_t> values;
    for (const json::Value& v : m->as_array()) {
      if (!v.is_integer() || v.as_int() <= 0 || v.as_int() % 2 == 0) {
        bad_tables(file, field, "holds " + v.dump() + ", expected odd positive integers");
      }
      values.push_back(v.as_int());
    }
    t.multipliers.push_back(std::move(values));
  }
  return t;
}

namespace {

// Both entry points: `checkpoint` null makes random weights with `tables` given.
V41Weights build_v41_weights(const Checkpoint* checkpoint, const EngramTables& tables,
                             WeightLoader& w, const V41TextConfig& config, Backend& backend) {
  const int64_t h = config.hidden_size;
  const int64_t v = config.vocab_size;
  V41Weights m;
  m.embed = w.load_matrix("embed.weight", {v, h});
  m.head = w.load_matrix("head.weight", {v, h});
  m.norm = w.load("norm.weight", {h});
  w.report_progress(1);
  if (!tables.token_map.empty()) {
    m.engram_token_map = backend.upload(
        Tensor::from_vector(tables.token_map, {static_cast<int64_t>(tables.token_map.size())}),
        DType::kI32);
  }
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    m.layers.push_back(v41_layer(w, checkpoint, backend, config, tables, layer,
                                 "layers." + std::to_string(layer) + ".", config.n_routed_experts));
    w.report_progress(layer + 2);
  }
  return m;
}

// The DSpark drafter of `checkpoint` (C.9). Its blocks' MoE has dspark_n_routed_experts experts,
// so they load through a loader whose config says so.
// `checkpoint` null: random weights of the same shapes and formats (seed, stored as the
// loader's).
DSparkWeights load_dspark(const Checkpoint* checkpoint, const V41TextConfig& c,
                          const ModelConfig& shared, Backend& backend,
                          const WeightLoadOptions& options, const EngramTables& tables,
                          uint64_t seed = 0, DType stored = DType::kBF16) {
  const int n = c.num_hidden_layers;
  for (int k = 0; k < c.num_nextn_predict_layers; ++k) {
    if (c.ratio(n + k) != 0) {
      throw Error(ErrorCode::kUnsupported,
                  c.source + ": compress_ratios[" + std::to_string(n + k) + "] = " +
                      std::to_string(c.ratio(n + k)) + " makes DSpark block " + std::to_string(k) +
                      " compressed; the drafter's attention is sliding-window only (model.md C.2)");
    }
  }
  if (c.dspark_target_layer_ids.empty()) {
    throw Error(ErrorCode::kInvalidConfig,
                c.source +
                    ": field 'dspark_target_layer_ids' is empty; the DSpark drafter's main "
                    "keys need at least one target layer");
  }
  if (c.dspark_noise_token_id >= c.vocab_size) {
    throw Error(ErrorCode::kInvalidConfig,
                c.source +
                    ": field 'dspark_noise_token_id' = " + std::to_string(c.dspark_noise_token_id) +
                    " is not below vocab_size = " + std::to_string(c.vocab_size));
  }
  if (c.dspark_num_experts_per_tok > c.dspark_n_routed_experts) {
    throw Error(ErrorCode::kInvalidConfig, c.source + ": field 'dspark_num_experts_per_tok' = " +
                                               std::to_string(c.dspark_num_experts_per_tok) +
                                               " exceeds dspark_n_routed_experts = " +
                                               std::to_string(c.dspark_n_routed_experts));
  }
  ModelConfig moe = shared;
  moe.n_routed_experts = c.dspark_n_routed_experts;
  moe.num_experts_per_tok = c.dspark_num_experts_per_tok;
  WeightLoader w(checkpoint, moe, backend, options, seed, stored);
  const int64_t h = c.hidden_size;
  const int64_t v = c.vocab_size;
  const int64_t r = c.dspark_markov_rank;
  const auto targets = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  DSparkWeights d;
  for (int k = 0; k < c.num_nextn_predict_layers; ++k) {
    d.blocks.push_back(v41_layer(w, checkpoint, backend, c, tables, n + k,
                                 "mtp." + std::to_string(k) + ".", c.dspark_n_routed_experts));
  }
  d.main_proj = w.load_linear("mtp.0.main_proj.weight", {h, targets * h}, false);
  d.main_norm = w.load("mtp.0.main_norm.weight", {h});
  const std::string last = "mtp." + std::to_string(c.num_nextn_predict_layers - 1) + ".";
  d.norm = w.load(last + "norm.weight", {h});
  d.markov_embed = w.load_matrix(last + "markov_head.embed.weight", {v, r});
  d.markov_head = w.load_linear(last + "markov_head.head.weight", {v, r}, false);
  const std::string proj_name = last + "confidence_head.proj.weight";
  if (w.is_random()) {
    d.confidence_hidden = MatrixWeight(w.load_matrix(proj_name, {1, h}));
    d.confidence_markov = MatrixWeight(w.load_matrix(proj_name + ".markov", {1, r}));
    return d;
  }
  // One row [h_i | Markov embedding]: the two column ranges are contiguous prefixes of it.
  const Tensor proj = w.host(proj_name, {1, h + r}, false);
  const DType dt = backend.weight_dtype(proj.dtype());
  d.confidence_hidden = MatrixWeight(backend.upload_weight(proj.narrow(1, 0, h).contiguous(), dt));
  d.confidence_markov = MatrixWeight(backend.upload_weight(proj.narrow(1, h, r).contiguous(), dt));
  return d;
}

}  // namespace

V41Weights load_v41_weights(const Checkpoint& checkpoint, const V41TextConfig& config,
                            const ModelConfig& shared, Backend& backend,
                            const WeightLoadOptions& options) {
  WeightLoadOptions o = options;
  o.expert_slots.clear();
  WeightLoader w(&checkpoint, shared, backend, o);
  const EngramTables tables = read_engram_tables(checkpoint.dir(), config);
  V41Weights m = build_v41_weights(&checkpoint, tables, w, config, backend);
  int64_t mtp_tensors = 0;
  for (const std::string& name : checkpoint.names())
    mtp_tensors += name.starts_with("mtp.") ? 1 : 0;
  if (mtp_tensors > 0 && options.load_mtp && config.num_nextn_predict_layers > 0) {
    m.dspark = load_dspark(&checkpoint, config, shared, backend, o, tables);
  } else if (mtp_tensors > 0) {
    m.notes.push_back("skipped " + std::to_string(mtp_tensors) + " mtp.* tensors (" +
                      (options.load_mtp ? std::string("config.json's num_nextn_predict_layers is 0")
                                        : std::string("the DSpark drafter was not requested")) +
                      ")");
  }

  std::vector<int64_t> skipped(std::size(kSkippedFamilies), 0);
  for (const std::string& name : checkpoint.names()) {
    for (size_t f = 0; f < skipped.size(); ++f) {
      if (name.starts_with(kSkippedFamilies[f].prefix)) ++skipped[f];
    }
  }
  for (size_t l = 0; l < m.layers.size(); ++l) {
    if (!m.layers[l].engram.embed_on_host || backend.device_kind() == DeviceKind::kCpu) continue;
    m.notes.push_back("layers." + std::to_string(l) + ".engram.embed.weight (" +
                      m.layers[l].engram.embed.describe() +
                      ") stays in pinned host memory the device reads in place "
                      "(engram_table_memory)");
  }
  for (size_t f = 0; f < skipped.size(); ++f) {
    if (skipped[f] == 0) continue;
    m.notes.push_back("skipped " + std::to_string(skipped[f]) + " " + kSkippedFamilies[f].prefix +
                      "* tensors (" + kSkippedFamilies[f].why + ")");
  }
  return m;
}

V41Weights random_v41_weights(const V41TextConfig& config, const ModelConfig& shared,
                              Backend& backend, uint64_t seed, DType stored,
                              const WeightLoadOptions& options) {
  WeightLoadOptions o = options;
  o.expert_slots.clear();
  WeightLoader w(nullptr, shared, backend, o, seed, stored);
  const EngramTables tables = random_engram_tables(config, seed);
  V41Weights m = build_v41_weights(nullptr, tables, w, config, backend);
  if (options.load_mtp && config.num_nextn_predict_layers > 0) {
    m.dspark = load_dspark(nullptr, config, shared, backend, o, tables, seed + 1, stored);
  }
  return m;
}

EngramTables random_engram_tables(const V41TextConfig& config, uint64_t seed) {
  EngramTables t;
  if (config.engram_layer_ids.empty()) return t;
  const int64_t compressed = config.engram_compressed_vocab_size;
  t.token_map.reserve(static_cast<size_t>(config.vocab_size));
  for (int64_t v = 0; v < config.vocab_size; ++v) {
    t.token_map.push_back(static_cast<int32_t>(v % compressed));
  }
  // model.md C.7.3: multipliers are odd and below 2 * bound + 1 with
  // bound = (INT64_MAX / compressed vocab) / 2, so every product with a compressed id fits.
  const uint64_t bound =
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / compressed) / 2;
  uint64_t state = seed ^ 0x9e3779b97f4a7c15ULL;
  auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  for (size_t e = 0; e < config.engram_layer_ids.size(); ++e) {
    std::vector<int64_t> values;
    for (int n = 0; n < config.engram_max_ngram_size; ++n) {
      values.push_back(static_cast<int64_t>((next() % bound) * 2 + 1));
    }
    t.multipliers.push_back(std::move(values));
  }
  return t;
}

}  // namespace deepinfer
