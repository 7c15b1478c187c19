// config.json texts of DeepSeek-V4.1 configs for the C++ tests: the output of
// tests/python/v41_reference.py's to_hf_config() for V41_FLASH and TINY_CONFIGS A, B and C
// (json.dumps with separators (",", ":"), wrapped after commas).
#pragma once

namespace deepinfer::v41_fixtures {

// clang-format off
inline constexpr const char* kFlash = R"json(
{"model_type":"deepseek_v41","architectures":["DeepseekV41ForCausalLM"],"dtype":"bfloat16",
"text_config":{"vocab_size":129280,"hidden_size":5120,"num_hidden_layers":40,
"num_attention_heads":64,"num_key_value_heads":1,"head_dim":512,"qk_rope_head_dim":64,
"q_lora_rank":1280,"o_groups":8,"o_lora_rank":1024,"n_routed_experts":384,
"num_experts_per_tok":6,"n_shared_experts":1,"moe_intermediate_size":2304,
"scoring_func":"sqrtsoftplus","topk_method":"noaux_tc","routed_scaling_factor":1.5,
"norm_topk_prob":true,"swiglu_limit":10.0,"max_position_embeddings":1048576,
"rope_theta":10000.0,"compress_rope_theta":160000.0,"rope_scaling":{"type":"yarn",
"factor":16.0,"original_max_position_embeddings":65536,"beta_fast":32,"beta_slow":1},
"sliding_window":128,"rms_norm_eps":1e-20,"compress_ratios":[0,0,2,2,2,2,2,2,2,2,2,2,2,2,2,2,
2,2,2,2,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,0,0,0],"index_n_heads":32,
"index_head_dim":128,"index_topk":512,"kv_source_layer_ids":[2,8,14,20],
"index_source_layer_ids":[2,8,14,20,24,28,32,36],"candidate_source_layer_id":20,
"candidate_topk_blocks":2048,"candidate_block_size":8,"hc_mult":4,"hc_sinkhorn_iters":20,
"hc_eps":1e-06,"hc_shifted":true,"engram_layer_ids":[1,14],
"engram_num_embeddings":[384006168,384016682],"engram_max_ngram_size":4,
"engram_vocab_size":16000000,"engram_n_heads":8,"engram_head_dim":256,
"engram_compressed_vocab_size":99092,"engram_pad_token_id":2,"num_nextn_predict_layers":3,
"dspark_block_size":5,"dspark_target_layer_ids":[37,38,39],"dspark_markov_rank":256,
"dspark_noise_token_id":128799,"dspark_n_routed_experts":128,"dspark_num_experts_per_tok":3,
"image_token_id":129264,"hidden_act":"silu","attention_bias":false,"attention_dropout":0.0},
"vision_config":{},"quantization_config":{"quant_method":"fp8","expert_dtype":"fp4",
"activation_scheme":"dynamic","weight_block_size":[32,32],"scale_fmt":"ue8m0"}})json";

inline constexpr const char* kTinyA = R"json(
{"model_type":"deepseek_v41","architectures":["DeepseekV41ForCausalLM"],"dtype":"bfloat16",
"text_config":{"vocab_size":192,"hidden_size":64,"num_hidden_layers":10,
"num_attention_heads":4,"num_key_value_heads":1,"head_dim":32,"qk_rope_head_dim":8,
"q_lora_rank":32,"o_groups":2,"o_lora_rank":16,"n_routed_experts":8,"num_experts_per_tok":2,
"n_shared_experts":1,"moe_intermediate_size":32,"scoring_func":"sqrtsoftplus",
"topk_method":"noaux_tc","routed_scaling_factor":1.5,"norm_topk_prob":true,
"swiglu_limit":10.0,"max_position_embeddings":4096,"rope_theta":10000.0,
"compress_rope_theta":160000.0,"rope_scaling":{"type":"yarn","factor":4.0,
"original_max_position_embeddings":32,"beta_fast":32,"beta_slow":1},"sliding_window":8,
"rms_norm_eps":1e-20,"compress_ratios":[0,0,2,2,2,2,1,1,1,1,0],"index_n_heads":16,
"index_head_dim":16,"index_topk":4,"kv_source_layer_ids":[2,4,6],"index_source_layer_ids":[2,
4,6,8],"candidate_source_layer_id":6,"candidate_topk_blocks":3,"candidate_block_size":2,
"hc_mult":4,"hc_sinkhorn_iters":20,"hc_eps":1e-06,"hc_shifted":true,"engram_layer_ids":[1,4],
"engram_num_embeddings":[304,462],"engram_max_ngram_size":4,"engram_vocab_size":40,
"engram_n_heads":2,"engram_head_dim":8,"engram_compressed_vocab_size":48,
"engram_pad_token_id":2,"num_nextn_predict_layers":1,"dspark_block_size":3,
"dspark_target_layer_ids":[8,9],"dspark_markov_rank":8,"dspark_noise_token_id":191,
"dspark_n_routed_experts":4,"dspark_num_experts_per_tok":2,"image_token_id":190,
"hidden_act":"silu","attention_bias":false,"attention_dropout":0.0},"vision_config":{},
"quantization_config":{"quant_method":"fp8","expert_dtype":"fp4",
"activation_scheme":"dynamic","weight_block_size":[32,32],"scale_fmt":"ue8m0"}})json";

inline constexpr const char* kTinyB = R"json(
{"model_type":"deepseek_v41","architectures":["DeepseekV41ForCausalLM"],"dtype":"bfloat16",
"text_config":{"vocab_size":192,"hidden_size":64,"num_hidden_layers":7,
"num_attention_heads":4,"num_key_value_heads":1,"head_dim":32,"qk_rope_head_dim":8,
"q_lora_rank":32,"o_groups":2,"o_lora_rank":16,"n_routed_experts":8,"num_experts_per_tok":2,
"n_shared_experts":1,"moe_intermediate_size":32,"scoring_func":"sqrtsoftplus",
"topk_method":"noaux_tc","routed_scaling_factor":1.5,"norm_topk_prob":true,
"swiglu_limit":10.0,"max_position_embeddings":4096,"rope_theta":10000.0,
"compress_rope_theta":160000.0,"rope_scaling":{"type":"yarn","factor":4.0,
"original_max_position_embeddings":32,"beta_fast":32,"beta_slow":1},"sliding_window":6,
"rms_norm_eps":1e-20,"compress_ratios":[0,2,2,1,1,1,1,0],"index_n_heads":16,
"index_head_dim":16,"index_topk":3,"kv_source_layer_ids":[1,3],"index_source_layer_ids":[1,2,
3,4,6],"candidate_source_layer_id":3,"candidate_topk_blocks":2,"candidate_block_size":3,
"hc_mult":2,"hc_sinkhorn_iters":20,"hc_eps":1e-06,"hc_shifted":true,"engram_layer_ids":[2],
"engram_num_embeddings":[304],"engram_max_ngram_size":3,"engram_vocab_size":40,
"engram_n_heads":3,"engram_head_dim":8,"engram_compressed_vocab_size":48,
"engram_pad_token_id":2,"num_nextn_predict_layers":1,"dspark_block_size":3,
"dspark_target_layer_ids":[],"dspark_markov_rank":8,"dspark_noise_token_id":191,
"dspark_n_routed_experts":4,"dspark_num_experts_per_tok":2,"image_token_id":190,
"hidden_act":"silu","attention_bias":false,"attention_dropout":0.0},"vision_config":{},
"quantization_config":{"quant_method":"fp8","expert_dtype":"fp4",
"activation_scheme":"dynamic","weight_block_size":[32,32],"scale_fmt":"ue8m0"}})json";

inline constexpr const char* kTinyC = R"json(
{"model_type":"deepseek_v41","architectures":["DeepseekV41ForCausalLM"],"dtype":"bfloat16",
"text_config":{"vocab_size":192,"hidden_size":64,"num_hidden_layers":6,
"num_attention_heads":4,"num_key_value_heads":1,"head_dim":32,"qk_rope_head_dim":8,
"q_lora_rank":32,"o_groups":2,"o_lora_rank":16,"n_routed_experts":8,"num_experts_per_tok":2,
"n_shared_experts":1,"moe_intermediate_size":32,"scoring_func":"sqrtsoftplus",
"topk_method":"noaux_tc","routed_scaling_factor":1.5,"norm_topk_prob":true,
"swiglu_limit":10.0,"max_position_embeddings":4096,"rope_theta":10000.0,
"compress_rope_theta":160000.0,"rope_scaling":{"type":"yarn","factor":4.0,
"original_max_position_embeddings":32,"beta_fast":32,"beta_slow":1},"sliding_window":8,
"rms_norm_eps":1e-20,"compress_ratios":[0,0,2,2,2,2,0],"index_n_heads":16,
"index_head_dim":16,"index_topk":3,"kv_source_layer_ids":[2],"index_source_layer_ids":[2,3,
5],"candidate_source_layer_id":3,"candidate_topk_blocks":3,"candidate_block_size":2,
"hc_mult":4,"hc_sinkhorn_iters":20,"hc_eps":1e-06,"hc_shifted":true,"engram_layer_ids":[0,1],
"engram_num_embeddings":[304,462],"engram_max_ngram_size":4,"engram_vocab_size":40,
"engram_n_heads":2,"engram_head_dim":8,"engram_compressed_vocab_size":48,
"engram_pad_token_id":2,"num_nextn_predict_layers":1,"dspark_block_size":3,
"dspark_target_layer_ids":[],"dspark_markov_rank":8,"dspark_noise_token_id":191,
"dspark_n_routed_experts":4,"dspark_num_experts_per_tok":2,"image_token_id":190,
"hidden_act":"silu","attention_bias":false,"attention_dropout":0.0},"vision_config":{},
"quantization_config":{"quant_method":"fp8","expert_dtype":"fp4",
"activation_scheme":"dynamic","weight_block_size":[32,32],"scale_fmt":"ue8m0"}})json";

// clang-format on

}  // namespace deepinfer::v41_fixtures
