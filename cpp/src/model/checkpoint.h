// A Hugging Face style checkpoint directory: config.json plus model.safetensors, or sharded
// *.safetensors files with model.safetensors.index.json. Tensor names are normalised to one
// canonical spelling (the original DeepSeek names, see canonical_tensor_name) so the model loader
// accepts both the released checkpoints and the hybrid names transformers' save_pretrained writes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/safetensors.h"

namespace deepinfer {

// Canonical spelling of a tensor name. Rules (docs/model.md#canonical-names):
//  - an optional leading "model." is dropped;
//  - transformers names map to the original ones: embed_tokens -> embed, lm_head -> head,
//    hc_head.hc_{fn,base,scale} -> hc_head_{fn,base,scale}, self_attn -> attn, mlp -> ffn,
//    input_layernorm -> attn_norm, post_attention_layernorm -> ffn_norm,
//    {attn,ffn}_hc.{fn,base,scale} -> hc_{attn,ffn}_{fn,base,scale}, sinks -> attn_sink,
//    q_a_proj -> wq_a, q_b_proj -> wq_b, kv_proj -> wkv, o_a_proj -> wo_a, o_b_proj -> wo_b,
//    q_a_norm -> q_norm, compressor gate_proj -> wgate, compressor kv_norm -> norm,
//    position_bias -> ape, compressor.indexer.{kv_proj,gate_proj,kv_norm,position_bias} ->
//    indexer.compressor.{wkv,wgate,norm,ape}, compressor.indexer.q_b_proj -> indexer.wq_b,
//    compressor.indexer.scorer.weights_proj -> indexer.weights_proj,
//    gate.e_score_correction_bias -> gate.bias, shared_experts {gate,up,down}_proj -> w1/w3/w2,
//    weight_scale_inv -> scale;
//  - the main attention's kv norm is "layers.L.attn.kv_norm.weight"; the hybrid name
//    "layers.L.attn.norm.weight" maps to it.
// Names that match no rule (unknown tensors) are returned with only the prefix dropped; mtp.*
// names (which transformers does not have) only lose the prefix and get the scale rename.
std::string canonical_tensor_name(std::string_view name);

// A digest naming a checkpoint's contents, for the KV store's fingerprint (two engines share
// stored KV only when it is equal): XXH64 of config.json, and of every *.safetensors file's name,
// size, first and last MiB (the header with its offsets, and weights at both ends, which any
// fine-tune changes). Cheap for any checkpoint size. "config=<hex>;weights=<hex>". Throws
// Error(kNotFound / kIo) naming a file that cannot be read.
std::string checkpoint_identity(const std::string& dir);

class Checkpoint {
 public:
  // Opens `dir`: model.safetensors.index.json if present (its weight_map names the shards),
  // else model.safetensors, else every *.safetensors in the directory. Errors name the directory
  // or file: no directory, no safetensors file, an index naming a missing shard or a tensor
  // its shard lacks, two files holding the same canonical tensor.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool contains(std::string_view canonical_name) const;
  // The entry and the file holding it; throws Error(kNotFound) naming the tensor and directory.
  const SafetensorsEntry& entry(std::string_view canonical_name) const;
  const SafetensorsFile& file_of(std::string_view canonical_name) const;
  // Zero-copy host tensor (see SafetensorsFile::tensor).
  Tensor tensor(std::string_view canonical_name) const;
  std::vector<std::string> names() const;  // canonical names, sorted

 private:
  struct Location {
    size_t file;
    size_t entry;
  };
  std::string dir_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, Location, std::less<>> by_name_;
};

}  // namespace deepinfer
