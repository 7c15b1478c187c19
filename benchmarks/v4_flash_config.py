"""The DeepSeek-V4-Flash-width config the GPU benchmarks share (no torch import here)."""

from __future__ import annotations

LAYER_TYPES = {
    "sliding": "sliding_attention",
    "csa": "compressed_sparse_attention",
    "hca": "heavily_compressed_attention",
}


def flash_config(layers: list[str]) -> dict:
    n = len(layers)
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": 129280,
        "hidden_size": 4096,
        "num_hidden_layers": n,
        "layer_types": [LAYER_TYPES[x] for x in layers],
        "mlp_layer_types": ["hash_moe" if i == 0 else "moe" for i in range(n)],
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "partial_rotary_factor": 0.125,
        "q_lora_rank": 1024,
        "o_groups": 8,
        "o_lora_rank": 1024,
        "sliding_window": 128,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 512,
        "n_routed_experts": 256,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "routed_scaling_factor": 1.5,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        "max_position_embeddings": 1048576,
        "rms_norm_eps": 1e-6,
        "eos_token_id": 1,
        "bos_token_id": 0,
    }


def decode_token(seq: int) -> int:
    """The input token of sequence `seq` in the decode benchmarks: distinct per sequence, so a
    batch routes to different experts as real decoding does (identical rows would share six)."""
    return (5 + 7919 * seq) % 129000 + 2


# DeepSeek's shipped formats: FP8 e4m3 128x128 block-scaled linears with power-of-two scales.
QUANT = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
    "activation_scheme": "dynamic",
}


def real_format(config: dict) -> dict:
    """`config` in DeepSeek's shipped formats: FP8 linears (QUANT) and MXFP4 routed experts."""
    return dict(config, quantization_config=dict(QUANT), expert_dtype="fp4")
