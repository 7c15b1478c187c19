#include "model/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <system_error>
#include <utility>

#include "common/json.h"
#include "common/mapped_file.h"
#include "common/text.h"
#include "common/xxh64.h"
#include "deepinfer/error.h"

namespace deepinfer {

namespace {

// ---- canonical names -------------------------------------------------------------------------

using Parts = std::vector<std::string>;
using Renames = std::initializer_list<std::pair<std::string_view, std::string_view>>;

Parts split(std::string_view name) {
  Parts parts;
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    parts.emplace_back(name.substr(start, dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

std::string join(const Parts& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i != 0) out += '.';
    out += parts[i];
  }
  return out;
}

bool rename(std::string& part, Renames renames) {
  for (const auto& [from, to] : renames) {
    if (part == from) {
      part = to;
      return true;
    }
  }
  return false;
}

bool at(const Parts& p, size_t i, std::string_view s) {
  return i < p.size() && p[i] == s;
}

// A compressor's own tensors; both spellings are accepted so mixed names still canonicalise.
bool is_compressor_part(std::string_view s) {
  for (std::string_view c :
       {"kv_proj", "gate_proj", "kv_norm", "position_bias", "wkv", "wgate", "norm", "ape"}) {
    if (s == c) return true;
  }
  return false;
}

// Inside a compressor gate_proj is the gate (wgate) and kv_norm is plain "norm"; elsewhere the
// same transformers names mean other things (shared expert w1, the main kv_norm).
void rename_compressor_part(std::string& part) {
  rename(
      part,
      {{"kv_proj", "wkv"}, {"gate_proj", "wgate"}, {"kv_norm", "norm"}, {"position_bias", "ape"}});
}

// p = layers.L.attn.<rest>
void canonical_attention(Parts& p) {
  constexpr size_t i = 3;
  if (p.size() <= i) return;
  std::string& c = p[i];
  if (c == "sinks" && p.size() == i + 1) {
    c = "attn_sink";
    return;
  }
  if (c == "norm" && p.size() == i + 2 && p[i + 1] == "weight") {
    // transformers' save_pretrained writes the main kv_norm as attn.norm
    // (docs/model.md#names-written-by-save_pretrained).
    c = "kv_norm";
    return;
  }
  if (rename(c, {{"q_a_proj", "wq_a"},
                 {"q_b_proj", "wq_b"},
                 {"kv_proj", "wkv"},
                 {"o_a_proj", "wo_a"},
                 {"o_b_proj", "wo_b"},
                 {"q_a_norm", "q_norm"}})) {
    return;
  }
  if (c == "compressor" && at(p, i + 1, "indexer") && p.size() > i + 2) {
    // transformers nests the indexer inside the compressor; the original names do the reverse.
    std::string& x = p[i + 2];
    if (is_compressor_part(x)) {
      p[i] = "indexer";
      p[i + 1] = "compressor";
      rename_compressor_part(x);
    } else if (x == "q_b_proj" || x == "wq_b") {
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(i));
      p[i + 1] = "wq_b";
    } else if (x == "weights_proj") {
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (x == "scorer" && at(p, i + 3, "weights_proj")) {
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(i + 2));  // scorer
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(i));      // compressor
    }
  } else if (c == "compressor" && p.size() > i + 1) {
    rename_compressor_part(p[i + 1]);
  } else if (c == "indexer" && at(p, i + 1, "compressor") && p.size() > i + 2) {
    rename_compressor_part(p[i + 2]);
  }
}

// p = layers.L.ffn.<rest>
void canonical_ffn(Parts& p) {
  constexpr size_t i = 3;
  if (at(p, i, "gate") && at(p, i + 1, "e_score_correction_bias")) {
    p[i + 1] = "bias";
  } else if (at(p, i, "shared_experts") && p.size() > i + 1) {
    rename(p[i + 1], {{"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}});
  }
}

// p = layers.L.<rest>
void canonical_layer(Parts& p) {
  std::string& c = p[2];
  if (c == "input_layernorm") {
    c = "attn_norm";
  } else if (c == "post_attention_layernorm") {
    c = "ffn_norm";
  } else if ((c == "attn_hc" || c == "ffn_hc") && p.size() == 4 &&
             (p[3] == "fn" || p[3] == "base" || p[3] == "scale")) {
    c = (c == "attn_hc" ? "hc_attn_" : "hc_ffn_") + p[3];
    p.pop_back();
  } else if (c == "self_attn") {
    c = "attn";
  } else if (c == "mlp") {
    c = "ffn";
  }
  if (p[2] == "attn") canonical_attention(p);
  if (p[2] == "ffn") canonical_ffn(p);
}

void canonical_top_level(Parts& p) {
  if (rename(p[0], {{"embed_tokens", "embed"}, {"lm_head", "head"}})) return;
  if (p[0] == "hc_head" && p.size() == 2 &&
      (p[1] == "hc_fn" || p[1] == "hc_base" || p[1] == "hc_scale")) {
    p[0] = "hc_head_" + p[1].substr(3);
    p.pop_back();
  }
}

}  // namespace

std::string canonical_tensor_name(std::string_view name) {
  if (name.starts_with("model.")) name.remove_prefix(6);
  Parts p = split(name);
  if (p[0] == "mtp") {
    // transformers has no MTP names: DeepSeek's spelling is the only one (the scale rule aside).
  } else if (p[0] == "layers" && p.size() >= 3) {
    canonical_layer(p);
  } else {
    canonical_top_level(p);
  }
  // transformers calls the multiplicative FP8 block scale weight_scale_inv
  // (docs/model.md#quantized-checkpoints).
  if (p.size() >= 2 && p.back() == "weight_scale_inv") p.back() = "scale";
  return join(p);
}

// ---- Checkpoint ------------------------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

// The index's weight_map as (tensor, shard) pairs in document order.
std::vector<std::pair<std::string, std::string>> read_weight_map(const std::string& index_path) {
  auto file = MappedFile::open(index_path);
  std::string_view text(reinterpret_cast<const char*>(file->data()), file->size());
  json::Value index = json::parse(text, index_path);
  const json::Value* weight_map = index.find("weight_map");
  if (weight_map == nullptr || !weight_map->is_object()) {
    throw Error(ErrorCode::kCorruptFile,
                index_path + ": expected a JSON object with a \"weight_map\" object, found " +
                    (weight_map == nullptr
                         ? std::string(index.is_object() ? "no weight_map" : index.type_name())
                         : std::string("weight_map of type ") + weight_map->type_name()));
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [tensor, shard] : weight_map->as_object()) {
    if (!shard.is_string() || shard.as_string().empty()) {
      throw Error(ErrorCode::kCorruptFile, index_path + ": weight_map maps tensor " +
                                               in_quotes(tensor) + " to " + shard.dump() +
                                               ", expected a shard file name");
    }
    if (fs::path(shard.as_string()).is_absolute()) {
      throw Error(ErrorCode::kCorruptFile, index_path + ": weight_map maps tensor " +
                                               in_quotes(tensor) + " to absolute path " +
                                               in_quotes(shard.as_string()) +
                                               ", expected a file name relative to the directory");
    }
    out.emplace_back(tensor, shard.as_string());
  }
  if (out.empty()) throw Error(ErrorCode::kCorruptFile, index_path + ": weight_map is empty");
  return out;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  fs::file_status status = fs::status(dir, ec);
  if (!fs::exists(status)) {
    if (ec && ec != std::errc::no_such_file_or_directory) {
      throw Error(ErrorCode::kIo, dir + ": cannot read checkpoint directory: " + ec.message());
    }
    throw Error(ErrorCode::kNotFound, dir + ": checkpoint directory does not exist");
  }
  if (!fs::is_directory(status)) {
    throw Error(ErrorCode::kInvalidArgument, dir + ": checkpoint path is not a directory");
  }

  Checkpoint ckpt;
  ckpt.dir_ = dir;
  auto add_file = [&ckpt](std::shared_ptr<const SafetensorsFile> file) {
    size_t file_index = ckpt.files_.size();
    ckpt.files_.push_back(std::move(file));
    const SafetensorsFile& f = *ckpt.files_.back();
    for (size_t i = 0; i < f.entries().size(); ++i) {
      const std::string& raw = f.entries()[i].name;
      auto [it, inserted] =
          ckpt.by_name_.try_emplace(canonical_tensor_name(raw), Location{file_index, i});
      if (!inserted) {
        const SafetensorsFile& other = *ckpt.files_[it->second.file];
        throw Error(ErrorCode::kCorruptFile,
                    ckpt.dir_ + ": tensor " + in_quotes(it->first) + " is provided twice: as " +
                        in_quotes(other.entries()[it->second.entry].name) + " in " + other.path() +
                        " and as " + in_quotes(raw) + " in " + f.path());
      }
    }
  };

  const fs::path root(dir);
  const std::string index_path = (root / "model.safetensors.index.json").string();
  const std::string single_path = (root / "model.safetensors").string();
  if (fs::exists(index_path, ec)) {
    auto weight_map = read_weight_map(index_path);
    std::vector<std::string> shards;  // first-appearance order
    std::vector<size_t> shard_of;     // per weight_map entry
    for (const auto& [tensor, shard] : weight_map) {
      auto it = std::find(shards.begin(), shards.end(), shard);
      shard_of.push_back(static_cast<size_t>(it - shards.begin()));
      if (it == shards.end()) shards.push_back(shard);
    }
    std::vector<std::shared_ptr<const SafetensorsFile>> files;
    for (const std::string& shard : shards) {
      std::string shard_path = (root / shard).string();
      try {
        files.push_back(SafetensorsFile::open(shard_path));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kNotFound) throw;
        throw Error(ErrorCode::kNotFound, index_path + ": shard " + in_quotes(shard) +
                                              " named in weight_map is missing (" + e.what() + ")");
      }
    }
    for (size_t i = 0; i < weight_map.size(); ++i) {
      const SafetensorsFile& f = *files[shard_of[i]];
      if (f.find(weight_map[i].first) == nullptr) {
        throw Error(ErrorCode::kCorruptFile, index_path + ": weight_map puts tensor " +
                                                 in_quotes(weight_map[i].first) + " in shard " +
                                                 in_quotes(weight_map[i].second) + ", but " +
                                                 f.path() + " does not contain it");
      }
    }
    for (auto& f : files) add_file(std::move(f));
  } else if (fs::exists(single_path, ec)) {
    add_file(SafetensorsFile::open(single_path));
  } else {
    std::vector<std::string> paths;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".safetensors" && it->is_regular_file(ec)) {
        paths.push_back(it->path().string());
      }
    }
    if (ec) throw Error(ErrorCode::kIo, dir + ": cannot list directory: " + ec.message());
    if (paths.empty()) {
      throw Error(ErrorCode::kNotFound,
                  dir +
                      ": no model.safetensors.index.json, model.safetensors or *.safetensors "
                      "file in the checkpoint directory");
    }
    std::sort(paths.begin(), paths.end());  // deterministic order for messages
    for (const std::string& p : paths) add_file(SafetensorsFile::open(p));
  }
  return ckpt;
}

bool Checkpoint::contains(std::string_view canonical_name) const {
  return by_name_.find(canonical_name) != by_name_.end();
}

const SafetensorsEntry& Checkpoint::entry(std::string_view canonical_name) const {
  auto it = by_name_.find(canonical_name);
  if (it == by_name_.end()) {
    std::string hint;
    std::string canonical = canonical_tensor_name(canonical_name);
    if (canonical != canonical_name && contains(canonical)) {
      hint = " (it has the canonical name " + in_quotes(canonical) + ")";
    }
    throw Error(ErrorCode::kNotFound,
                dir_ + ": checkpoint has no tensor " + in_quotes(canonical_name) + hint);
  }
  return files_[it->second.file]->entries()[it->second.entry];
}

const SafetensorsFile& Checkpoint::file_of(std::string_view canonical_name) const {
  entry(canonical_name);  // throws the not-found error
  return *files_[by_name_.find(canonical_name)->second.file];
}

Tensor Checkpoint::tensor(std::string_view canonical_name) const {
  const SafetensorsEntry& e = entry(canonical_name);
  return file_of(canonical_name).tensor(e);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, location] : by_name_) out.push_back(name);
  return out;
}

std::string checkpoint_identity(const std::string& dir) {
  namespace fs = std::filesystem;
  const auto config = MappedFile::open((fs::path(dir) / "config.json").string());
  const uint64_t config_digest = xxh64(config->data(), config->size());
  std::vector<fs::path> files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  if (ec)
    throw Error(ErrorCode::kIo, "cannot list checkpoint directory " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  constexpr size_t kEdge = size_t{1} << 20;
  uint64_t weights = 0;
  for (const fs::path& f : files) {
    const auto m = MappedFile::open(f.string());
    const std::string name = f.filename().string();
    weights = xxh64(name, weights);
    const uint64_t size = m->size();
    weights = xxh64(&size, sizeof(size), weights);
    const size_t head = std::min(m->size(), kEdge);
    weights = xxh64(m->data(), head, weights);
    if (m->size() > head) {
      const size_t tail = std::min(m->size() - head, kEdge);
      weights = xxh64(m->data() + m->size() - tail, tail, weights);
    }
  }
  return "config=" + std::to_string(config_digest) + ";weights=" + std::to_string(weights);
}

}  // namespace deepinfer
