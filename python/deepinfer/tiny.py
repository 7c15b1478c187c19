"""The embedded tiny default model: a small random DeepSeek-V4 checkpoint.

It is generated deterministically (NumPy, fixed seed; no torch) on first use into a cache
directory and reused afterwards. It has every layer type (sliding, CSA with its indexer, HCA),
the real compression ratios and window, hash and top-k MoE layers, and the vocabulary of the
DeepSeek-V4 tokenizer, so the whole engine runs on it in seconds on a CPU. Its outputs are random
text: it exists to exercise the engine, not to answer questions.

``python -m deepinfer.tiny`` prints the checkpoint directory (creating it if needed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

TOKENIZER_VOCAB = 129280  # DeepSeek-V4's model vocabulary; the tokenizer's ids all fall below it

TINY_CONFIG: dict = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": TOKENIZER_VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "partial_rotary_factor": 0.25,
    "q_lora_rank": 32,
    "o_groups": 2,
    "o_lora_rank": 16,
    "sliding_window": 128,
    "index_n_heads": 16,
    "index_head_dim": 32,
    "index_topk": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "swiglu_limit": 10.0,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_parameters": {
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "compress": {
            "rope_type": "yarn",
            "rope_theta": 160000.0,
            "partial_rotary_factor": 0.25,
            "factor": 16.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "attention_factor": 1.0,
        },
    },
    "max_position_embeddings": 65536,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "dtype": "float32",
}
SEED = 20261129


def _tensors(cfg: dict, rng: np.random.Generator, mtp: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint, in the original DeepSeek naming; with `mtp`, also one
    multi-token-prediction block ``mtp.0.*`` (drawn after the main tensors, which stay the same)
    with a sliding-window attention and a score-routed MoE, as V4-Flash ships it."""
    h, v, n = cfg["hidden_size"], cfg["vocab_size"], cfg["hc_mult"]
    nh, d, q = cfg["num_attention_heads"], cfg["head_dim"], cfg["q_lora_rank"]
    g, og = cfg["o_groups"], cfg["o_lora_rank"]
    e, k, inter = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    hi, di = cfg["index_n_heads"], cfg["index_head_dim"]

    # Projections are scaled by 1/sqrt(fan_in) so every sub-layer changes the residual trunk by
    # O(1): the output then depends on the whole context (as a trained model's does), which the
    # engine's equivalence tests rely on to notice a wrong position, slot or cached prefix.
    def normal(*shape: int, scale: float | None = None) -> np.ndarray:
        std = scale if scale is not None else shape[-1] ** -0.5
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight(size: int) -> np.ndarray:
        return rng.uniform(0.8, 1.2, size).astype(np.float32)

    def hc(prefix: str, rows: int, scales: int) -> dict[str, np.ndarray]:
        return {
            f"{prefix}fn": normal(rows, n * h),
            f"{prefix}base": normal(rows, scale=0.5),
            f"{prefix}scale": rng.uniform(0.5, 1.5, scales).astype(np.float32),
        }

    t: dict[str, np.ndarray] = {
        "embed.weight": normal(v, h, scale=1.0),
        "head.weight": normal(v, h),
        "norm.weight": norm_weight(h),
        **hc("hc_head_", n, 1),
    }

    def layer(p: str, attn: str, mlp: str) -> None:
        t.update({f"{p}attn_norm.weight": norm_weight(h), f"{p}ffn_norm.weight": norm_weight(h)})
        t.update(hc(f"{p}hc_attn_", (2 + n) * n, 3) | hc(f"{p}hc_ffn_", (2 + n) * n, 3))
        t.update(
            {
                f"{p}attn.wq_a.weight": normal(q, h),
                f"{p}attn.q_norm.weight": norm_weight(q),
                f"{p}attn.wq_b.weight": normal(nh * d, q),
                f"{p}attn.wkv.weight": normal(d, h),
                f"{p}attn.kv_norm.weight": norm_weight(d),
                f"{p}attn.wo_a.weight": normal(g * og, nh * d // g),
                f"{p}attn.wo_b.weight": normal(h, g * og),
                f"{p}attn.attn_sink": normal(nh, scale=0.5),
            }
        )
        if attn != "sliding_attention":
            m = cfg["compress_rates"][attn]
            c = 2 * d if attn == "compressed_sparse_attention" else d
            t.update(
                {
                    f"{p}attn.compressor.wkv.weight": normal(c, h),
                    f"{p}attn.compressor.wgate.weight": normal(c, h),
                    f"{p}attn.compressor.ape": normal(m, c, scale=0.5),
                    f"{p}attn.compressor.norm.weight": norm_weight(d),
                }
            )
        if attn == "compressed_sparse_attention":
            m = cfg["compress_rates"][attn]
            t.update(
                {
                    f"{p}attn.indexer.compressor.wkv.weight": normal(2 * di, h),
                    f"{p}attn.indexer.compressor.wgate.weight": normal(2 * di, h),
                    f"{p}attn.indexer.compressor.ape": normal(m, 2 * di, scale=0.5),
                    f"{p}attn.indexer.compressor.norm.weight": norm_weight(di),
                    f"{p}attn.indexer.wq_b.weight": normal(hi * di, q),
                    f"{p}attn.indexer.weights_proj.weight": normal(hi, h),
                }
            )
        t[f"{p}ffn.gate.weight"] = normal(e, h)
        if mlp == "hash_moe":
            t[f"{p}ffn.gate.tid2eid"] = np.stack([rng.permutation(e)[:k] for _ in range(v)]).astype(
                np.int32
            )
        else:
            t[f"{p}ffn.gate.bias"] = normal(e, scale=0.1)
        for x in range(e):
            t[f"{p}ffn.experts.{x}.w1.weight"] = normal(inter, h)
            t[f"{p}ffn.experts.{x}.w3.weight"] = normal(inter, h)
            t[f"{p}ffn.experts.{x}.w2.weight"] = normal(h, inter)
        t[f"{p}ffn.shared_experts.w1.weight"] = normal(inter, h)
        t[f"{p}ffn.shared_experts.w3.weight"] = normal(inter, h)
        t[f"{p}ffn.shared_experts.w2.weight"] = normal(h, inter)

    for li, (attn, mlp) in enumerate(zip(cfg["layer_types"], cfg["mlp_layer_types"], strict=True)):
        layer(f"layers.{li}.", attn, mlp)
    if mtp:
        # docs/model.md#mtp-block: DeepSeek's MTPBlock is a decoder layer plus these.
        p = "mtp.0."
        t.update(
            {
                f"{p}enorm.weight": norm_weight(h),
                f"{p}hnorm.weight": norm_weight(h),
                f"{p}e_proj.weight": normal(h, h),
                f"{p}h_proj.weight": normal(h, h),
            }
        )
        layer(p, "sliding_attention", "moe")
        t.update(hc(f"{p}hc_head_", n, 1))
        t[f"{p}norm.weight"] = norm_weight(h)
    return t


_DTYPE_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Writes the safetensors format (8-byte header length, JSON header, data) without torch."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, arr in tensors.items():
        size = arr.nbytes
        header[name] = {
            "dtype": _DTYPE_NAMES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data section 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in tensors.values():
            f.write(np.ascontiguousarray(arr).tobytes())


def cache_root() -> Path:
    env = os.environ.get("DEEPINFER_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "deepinfer"


def _config(mtp: bool) -> dict:
    return TINY_CONFIG | {"num_nextn_predict_layers": 1} if mtp else TINY_CONFIG


def checkpoint_id(mtp: bool = False) -> str:
    spec = json.dumps({"config": _config(mtp), "seed": SEED, "format": 2}, sort_keys=True)
    return ("tiny-v4-mtp-" if mtp else "tiny-v4-") + hashlib.sha256(spec.encode()).hexdigest()[:12]


def ensure_tiny_checkpoint(root: Path | None = None, *, mtp: bool = False) -> Path:
    """The tiny checkpoint directory, generated on first use (atomically: a concurrent first use
    by another process either finds the finished directory or builds its own copy). With `mtp`
    it also ships an MTP block (``mtp.0.*``); its main tensors equal the plain checkpoint's."""
    root = Path(root) if root is not None else cache_root()
    target = root / checkpoint_id(mtp)
    if (target / "model.safetensors").exists() and (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=root))
    try:
        rng = np.random.default_rng(SEED)
        write_safetensors(tmp / "model.safetensors", _tensors(TINY_CONFIG, rng, mtp))
        (tmp / "config.json").write_text(json.dumps(_config(mtp), indent=1))
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "model.safetensors").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def main() -> None:
    print(ensure_tiny_checkpoint())


if __name__ == "__main__":
    main()
