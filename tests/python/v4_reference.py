"""Tiny random DeepSeek-V4 checkpoints written by transformers, and the reference's logits.

transformers' ``DeepseekV4ForCausalLM`` is the independent oracle for the parity tests. The
checkpoints are saved with ``save_pretrained`` so the loader sees the same hybrid tensor names a
user's converted checkpoint has.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, DynamicCache

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"

# docs/model.md#tiny-test-configurations: every layer type, HCA ratio 8 and window 8 so short
# prompts close windows and evict keys; 16 index heads keep index top-k free of exact ties.
F2_CONFIG = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=6,
    layer_types=[SLIDING, SLIDING, CSA, HCA, CSA, HCA],
    compress_rates={CSA: 4, HCA: 8},
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    partial_rotary_factor=0.25,
    q_lora_rank=32,
    o_groups=2,
    o_lora_rank=16,
    sliding_window=8,
    index_n_heads=16,
    index_head_dim=32,
    index_topk=3,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    rms_norm_eps=1e-6,
    swiglu_limit=10.0,
    rope_theta=1e4,
    compress_rope_theta=1.6e5,
    rope_parameters={
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    max_position_embeddings=4096,
    # Larger than the 0.02 default so every sub-layer moves the logits by far more than the
    # tolerance: a wrong attention, compressor or router result cannot hide under it.
    initializer_range=0.1,
)

# The real ratios and window (HCA 128, CSA 4, W 128) at tiny widths, for ~400-token prompts:
# CSA keeps 16 of ~100 entries, HCA closes 3 windows, chunks outgrow the 134-slot ring.
REAL_RATIO_CONFIG = dict(
    F2_CONFIG,
    num_hidden_layers=4,
    layer_types=[SLIDING, CSA, HCA, CSA],
    compress_rates={CSA: 4, HCA: 128},
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    sliding_window=128,
    index_topk=16,
    rope_parameters={
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 256,
        "beta_fast": 32,
        "beta_slow": 1,
    },
)


def make_model(config_kwargs: dict, seed: int) -> DeepseekV4ForCausalLM:
    """A random fp32 model whose degenerate default initialisations are randomised
    (docs/model.md#tiny-test-configurations): sinks and position biases, HC base/scale, norm
    weights, router bias, hash tables."""
    config = DeepseekV4Config(**config_kwargs, attn_implementation="eager")
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed + 1000)

    def normal_(t: torch.Tensor, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=gen) * std)

    def uniform_(t: torch.Tensor, lo: float, hi: float) -> None:
        t.copy_(torch.rand(t.shape, generator=gen) * (hi - lo) + lo)

    k = config.num_experts_per_tok
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("sinks", "position_bias") or leaf in ("base", "hc_base"):
                normal_(p, 0.5)
            elif leaf in ("scale", "hc_scale"):
                uniform_(p, 0.5, 1.5)
            elif "norm" in name and leaf == "weight":
                uniform_(p, 0.8, 1.2)
            elif leaf == "e_score_correction_bias":
                normal_(p, 0.1)
            elif leaf == "tid2eid":
                rows = [
                    torch.randperm(config.n_routed_experts, generator=gen)[:k]
                    for _ in range(p.shape[0])
                ]
                p.copy_(torch.stack(rows))
    return model


def save(model: DeepseekV4ForCausalLM, path: Path) -> Path:
    model.save_pretrained(str(path))
    return path


def random_tokens(n: int, vocab: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, vocab, size=n)]


@torch.no_grad()
def logits_one_shot(model: DeepseekV4ForCausalLM, tokens: Sequence[int]) -> np.ndarray:
    out = model(input_ids=torch.tensor([list(tokens)]), use_cache=False)
    return out.logits[0].float().numpy()


@torch.no_grad()
def logits_scheduled(
    model: DeepseekV4ForCausalLM, tokens: Sequence[int], schedule: Sequence[int]
) -> np.ndarray:
    """The reference run chunk by chunk with its own cache; rows for every position."""
    assert sum(schedule) == len(tokens)
    cache = DynamicCache(config=model.config)
    rows, pos = [], 0
    for n in schedule:
        ids = torch.tensor([list(tokens[pos : pos + n])])
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        rows.append(out.logits[0].float().numpy())
        pos += n
    return np.concatenate(rows, axis=0)


@torch.no_grad()
def greedy_continuation(model: DeepseekV4ForCausalLM, tokens: Sequence[int], n: int) -> list[int]:
    """Greedy decoding with the reference's own forward and cache.

    Not ``model.generate``: on these configs generate()'s logits differ from the model's forward
    (by 0.07 at its very first step on F2_CONFIG, seed 0), because generate builds its
    attention masks through another path; the forward is the oracle every other test uses.
    """
    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([list(tokens)]), past_key_values=cache, use_cache=True)
    generated = [int(out.logits[0, -1].argmax())]
    while len(generated) < n:
        out = model(
            input_ids=torch.tensor([[generated[-1]]]), past_key_values=cache, use_cache=True
        )
        generated.append(int(out.logits[0, -1].argmax()))
    return generated


@torch.no_grad()
def selection_margins(model: DeepseekV4ForCausalLM, tokens: Sequence[int]) -> dict[str, float]:
    """Smallest relative gap (divided by the largest score), over every position, between the
    last selected and the first rejected score of each discrete selection in the reference's
    one-shot forward: the lightning indexer's top-k (CSA layers) and the MoE router's top-k (moe
    layers). A gap within rounding means two implementations that sum in different orders may
    legitimately pick different entries (docs/model.md#top-k-near-ties), so parity cases keep
    clear of it."""
    cfg = model.config
    margins = {"indexer": float("inf"), "router": float("inf")}
    hooks = []

    def on_scores(module, args, out):
        scores = out[0].float()  # [S, T]
        ratio = cfg.compress_rates["compressed_sparse_attention"]
        for p in range(scores.shape[0]):
            n = (p + 1) // ratio
            if n <= cfg.index_topk:
                continue
            v = scores[p, :n].sort(descending=True).values
            margins["indexer"] = min(
                margins["indexer"], float(v[cfg.index_topk - 1] - v[cfg.index_topk])
            )

    def on_router(module, args, out):
        if not hasattr(module, "e_score_correction_bias"):
            return  # hash routing: the table picks the experts
        scores = (
            torch.nn.functional.softplus(out[0].float()).sqrt() + module.e_score_correction_bias
        )
        v = scores.sort(dim=-1, descending=True).values
        k = cfg.num_experts_per_tok
        gap = (v[:, k - 1] - v[:, k]) / v.abs().max(dim=-1).values.clamp_min(1e-30)
        margins["router"] = min(margins["router"], float(gap.min()))

    for layer in model.model.layers:
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            hooks.append(comp.indexer.scorer.register_forward_hook(on_scores))
        hooks.append(layer.mlp.gate.register_forward_hook(on_router))
    try:
        model(input_ids=torch.tensor([list(tokens)], device=model.device), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return margins


def tie_free(margins: dict[str, float], threshold: float = 1e-5) -> bool:
    return all(m > threshold for m in margins.values())


def original_name(name: str) -> str:
    """DeepSeek's spelling of a name written by transformers' save_pretrained (model.md A.14)."""
    name = name.removeprefix("model.")
    name = {"embed_tokens.weight": "embed.weight"}.get(name, name)
    name = name.replace("hc_head.hc_", "hc_head_")
    if name.endswith(".attn.norm.weight"):
        name = name.replace(".attn.norm.weight", ".attn.kv_norm.weight")
    return name
