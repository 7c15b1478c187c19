"""A pure-torch fp32 reference of the DeepSeek-V4.1 text model, written from the spec.

There is no transformers V4.1, so this module is the oracle for V4.1 work. It was written from
/work/shared/reference/model.md (section C, the delta on section A's V4 forward); no DeepInfer
code was copied. Parameter names are the V4.1 checkpoint names of model.md C.9, without a prefix,
so ``V41Model.state_dict()`` can be saved with safetensors as a tiny checkpoint.

Implemented (model.md section in brackets):

* ``V41TextConfig``: the ``text_config`` of a ``deepseek_v41`` checkpoint (B.3), with the derived
  maps of B.3/C.2 (kv, index, index-K and candidate sources; YOCO boundary ``n_prefill_layer``);
  ``to_hf_config`` writes the outer ``config.json`` dict. ``TINY_CONFIGS`` are small configs that
  together exercise every layer role.
* Shifted mHC (C.4): each sub-layer's block input uses the previous sub-layer's ``pre``; layer 0's
  first input is stream 0; no HyperHead, the final collapse uses the last FFN sub-layer's ``pre``.
* V4.1 attention (C.3): no per-head q norm; SWA; C2 and C1 compressors on kv sources only;
  share-KV readers; indexer with index-K sources (``wk`` + ``k_norm`` on the normed pre-RoPE
  compressed kv), index sources computing top-k and share-index readers; candidate blocks at the
  candidate source and candidate-restricted scoring at later index sources; sinks; inverse RoPE
  on the output; grouped ``wo_a``. RoPE per C.2 (theta 10000 without YaRN on SWA-only layers,
  160000 with YaRN (A.4's formula) for everything in compressed layers).
* V4.1 MoE (C.5): fp32 gate, sqrt(softplus) scores, selection by scores + ``gate.bias``,
  weights normalised with +1e-20 and scaled, SwiGLU clamp, shared expert, no hash layers.
* YOCO (C.6) with truncation modes ``off`` (exact), ``mask`` and ``compact``
  (``yoco_keep_tokens``, DeepInfer's KEEP_TOKENS, default 140).
* Engram (C.7): n-gram hash rows (multipliers from NumPy ``default_rng(10007*l)``, primes from a
  ``nextprime`` chain, which reproduces V4.1-Flash's ``engram_num_embeddings`` exactly), the
  lookup, ``wkv`` and the per-stream gate, applied to the trunk before layer l's attention mix.
* ``V41Model.forward`` (one shot) and ``forward_chunk`` with an explicit ``V41Cache`` (prefill in
  chunks, token-by-token decode). The cache keeps every position (no rings, no paging).

KV formats (opt-in, ``new_cache(kv_format=...)``): "f32" (default) keeps every cached key in
fp32; "bf16" rounds them to bf16; "fp8" fake-quantizes them exactly like the engine's V4.1 records
(cpp/src/tensor/kv_record.h): SWA keys FP8 (e4m3, UE8M0 per 32), compressed entries FP4 (e2m1,
e4m3 per 16, rounded up) and index keys FP4 (e2m1, UE8M0 per 32). The quantize-dequantize value
is what attention and the indexer read, in prefill too (C.3.2 "cast_back"); the normed pre-RoPE
entry handed to the index-K projection is not quantized.

Not implemented: the DSpark/DFlash drafter (C.8; ``mtp.*``), quantized weights and the FP4
quantization of the indexer queries (this is fp32 apart from the opt-in KV formats above, so it
is NOT bit-comparable with quantized kernels, see G.24/G.25), vision and image tokens (``vision.*``,
``image_*``, ``gate.bias_vl`` exists but is never used, Engram's image cut-off), the compressed
tokenizer itself (the token -> compressed-id map is an input table), rollback, batching.

Spec readings (where model.md leaves a choice; each is also marked "Spec reading:" in the code):

1. Top-k (index, candidate blocks, router) is a set; ties go to the lower index (stable sort), so
   results do not depend on the run length (F.3, G.9). Fewer valid entries than k: all of them.
2. Candidate blocks group the visible entries of the candidate source into blocks
   ``[b*bs, (b+1)*bs)``; the last, partly visible block is scored by the max over its visible
   entries. The candidate entries are the visible entries of the chosen blocks. Index sources
   *after* the candidate source (same kv segment, validated) score only those; the candidate
   source itself scans every visible entry.
3. Index K is RoPE'd at ``j*ratio`` with the layer's (compress) rope on its trailing R channels,
   the same as the main entries (C.3.4); no 1/sqrt(Di), 1/sqrt(hi) factors (C.3.4, G.24).
4. Index-K sources are the kv sources (B.3 "layer_index_k_map defaults to the kv sources"); an
   index source reads the index K of the nearest index-K source at or before it.
5. The candidate source map covers the index sources after the candidate source only; the config
   must keep them in the candidate source's kv segment (validated), as in V4.1-Flash.
6. Engram modifies the trunk X_k that sub-layer k (layer l's attention) then uses for its mix, its
   collapse with pre_{k-1} and its residual (C.7 "after the previous post, before the attention
   pre-mix"). ``cpad`` = the compressed id of ``engram_pad_token_id``.
7. Engram primes: one ``nextprime`` chain starting above ``engram_vocab_size - 1``, continued
   across layers, orders and heads in config order (C.7.3); checked against V4.1-Flash's
   ``engram_num_embeddings`` in the tests.
8. YOCO truncation (``mask``/``compact``) applies in every forward call: with ``L`` the end of the
   prefill the call belongs to (``prompt_end``; by default the cache length after the call, so
   one-shot prefill and decode need not name it; the chunks of a chunked prefill name the same
   ``L`` as engine.md 6.3 does, so chunked equals one-shot), consumer layers (>= n_prefill_layer)
   see SWA keys only in ``[L - keep, L)``; ``compact`` runs the consumer layers (and the head)
   only on those rows, after the boundary layer's compressor/index-K have run on every row.
   Logits of dropped rows are NaN in ``compact``; in ``mask`` they are computed but meaningless.
   keep >= window, so single-token decode is never truncated.
9. The SWA key of a token and its C1 entry are separate keys; nothing is deduplicated (A.8).
10. HC norm: unweighted RMSNorm with rms_norm_eps (fn has the weight folded in, C.4); mHC update
    and all arithmetic in fp32 (no bf16 rounding points are modelled).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

INT64_MAX = 2**63 - 1
YOCO_MODES = ("off", "mask", "compact")


# --------------------------------------------------------------------------------------------
# Configuration (model.md B.3)


def _yarn_16() -> dict:
    return {
        "type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    }


@dataclass(frozen=True)
class V41TextConfig:
    """``text_config`` of a ``deepseek_v41`` config.json (defaults: V4.1-Flash, model.md B.3)."""

    vocab_size: int = 129280
    hidden_size: int = 5120
    num_hidden_layers: int = 40
    num_attention_heads: int = 64
    num_key_value_heads: int = 1
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1280
    o_groups: int = 8
    o_lora_rank: int = 1024
    n_routed_experts: int = 384
    num_experts_per_tok: int = 6
    n_shared_experts: int = 1
    moe_intermediate_size: int = 2304
    scoring_func: str = "sqrtsoftplus"
    topk_method: str = "noaux_tc"
    routed_scaling_factor: float = 1.5
    norm_topk_prob: bool = True
    swiglu_limit: float = 10.0
    max_position_embeddings: int = 1048576
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: dict = field(default_factory=_yarn_16)
    sliding_window: int = 128
    rms_norm_eps: float = 1e-20
    # One entry per backbone layer plus one per DSpark block (num_nextn_predict_layers).
    compress_ratios: tuple = (0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0)
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    kv_source_layer_ids: tuple = (2, 8, 14, 20)
    index_source_layer_ids: tuple = (2, 8, 14, 20, 24, 28, 32, 36)
    candidate_source_layer_id: int | None = 20
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    hc_shifted: bool = True
    engram_layer_ids: tuple = (1, 14)
    engram_num_embeddings: tuple = (384006168, 384016682)
    engram_max_ngram_size: int = 4
    engram_vocab_size: int = 16_000_000
    engram_n_heads: int = 8
    engram_head_dim: int = 256
    engram_compressed_vocab_size: int = 99092
    engram_pad_token_id: int = 2
    num_nextn_predict_layers: int = 3
    dspark_block_size: int = 5
    dspark_target_layer_ids: tuple = (37, 38, 39)
    dspark_markov_rank: int = 256
    dspark_noise_token_id: int = 128799
    dspark_n_routed_experts: int = 128
    dspark_num_experts_per_tok: int = 3
    image_token_id: int = 129264
    hidden_act: str = "silu"
    attention_bias: bool = False
    attention_dropout: float = 0.0
    # Not a config.json field: DeepInfer's YOCO KEEP_TOKENS (README default 140), used by the
    # ``mask``/``compact`` truncation modes. ``to_hf_config`` leaves it out.
    yoco_keep_tokens: int = 140

    # ---- derived (model.md B.3 "Values derived by DeepInfer", C.2) ----

    @property
    def n_layers(self) -> int:
        return self.num_hidden_layers

    def ratio(self, layer: int) -> int:
        return self.compress_ratios[layer]

    @property
    def n_prefill_layer(self) -> int | None:
        """First backbone layer with ratio 1: the YOCO boundary (first consumer), or None."""
        for layer in range(self.n_layers):
            if self.ratio(layer) == 1:
                return layer
        return None

    def is_yoco_consumer(self, layer: int) -> bool:
        b = self.n_prefill_layer
        return b is not None and layer >= b

    def _nearest(self, sources: Sequence[int], layer: int) -> int | None:
        if self.ratio(layer) == 0:
            return None
        before = [s for s in sources if s <= layer]
        return max(before) if before else None

    def kv_source(self, layer: int) -> int | None:
        return self._nearest(self.kv_source_layer_ids, layer)

    def index_source(self, layer: int) -> int | None:
        return self._nearest(self.index_source_layer_ids, layer)

    @property
    def index_k_source_layer_ids(self) -> tuple:
        # Spec reading: index-K sources are the kv sources (B.3 layer_index_k_map default).
        return tuple(self.kv_source_layer_ids)

    def index_k_source(self, layer: int) -> int | None:
        return self._nearest(self.index_k_source_layer_ids, layer)

    def uses_candidates(self, layer: int) -> bool:
        """An index source after the candidate source scores only inside its candidate blocks."""
        # Spec reading: only index sources after the candidate source, all in its kv segment
        # (checked by validate), as layer_candidate_source_map {20..39 -> 20} implies.
        c = self.candidate_source_layer_id
        return c is not None and layer in self.index_source_layer_ids and layer > c

    def layer_rope(self, layer: int) -> tuple[float, dict | None]:
        """(theta, yarn params or None) for every rope of a layer (C.2)."""
        if self.ratio(layer) == 0:
            return self.rope_theta, None
        return self.compress_rope_theta, self.rope_scaling

    def validate(self) -> None:
        n = self.n_layers
        assert len(self.compress_ratios) == n + self.num_nextn_predict_layers
        assert all(r in (0, 1, 2) for r in self.compress_ratios)
        assert self.num_key_value_heads == 1 and self.hc_shifted
        assert (
            self.head_dim >= self.qk_rope_head_dim and self.index_head_dim >= self.qk_rope_head_dim
        )
        assert self.num_attention_heads % self.o_groups == 0
        for s in self.kv_source_layer_ids:
            assert self.ratio(s) > 0, f"kv source {s} must be compressed"
        for layer in range(n):
            if self.ratio(layer) == 0:
                assert layer not in self.index_source_layer_ids
                continue
            kv, idx = self.kv_source(layer), self.index_source(layer)
            assert kv is not None and idx is not None, f"layer {layer} has no kv/index source"
            # Segments nest (C.3.7): the index source lies inside the layer's kv segment and
            # reads the kv source's ratio.
            assert kv <= idx and self.ratio(kv) == self.ratio(layer)
            assert self.index_k_source(idx) == kv
        b = self.n_prefill_layer
        if b is not None:
            assert all(self.ratio(layer) == 1 for layer in range(b, n))
            assert b in self.kv_source_layer_ids  # share-KV does not cross the boundary
            assert all(e < b for e in self.engram_layer_ids)  # Engram layers are producers
            assert self.yoco_keep_tokens >= self.sliding_window
        c = self.candidate_source_layer_id
        if c is not None:
            assert c in self.index_source_layer_ids
            for layer in self.index_source_layer_ids:
                if layer > c:
                    assert self.kv_source(layer) == self.kv_source(c)
        assert len(self.engram_num_embeddings) == len(self.engram_layer_ids)
        assert all(0 <= layer < n for layer in self.engram_layer_ids)
        primes, _ = engram_primes(self)
        assert tuple(int(p.sum()) for p in primes) == tuple(self.engram_num_embeddings)

    def to_text_config(self) -> dict:
        d = asdict(self)
        d.pop("yoco_keep_tokens")
        d["compress_ratios"] = list(self.compress_ratios)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    def to_hf_config(self) -> dict:
        """The outer config.json of a V4.1 checkpoint (B.3)."""
        return {
            "model_type": "deepseek_v41",
            "architectures": ["DeepseekV41ForCausalLM"],
            "dtype": "bfloat16",
            "text_config": self.to_text_config(),
            "vision_config": {},
            "quantization_config": {
                "quant_method": "fp8",
                "expert_dtype": "fp4",
                "activation_scheme": "dynamic",
                "weight_block_size": [32, 32],
                "scale_fmt": "ue8m0",
            },
        }


V41_FLASH = V41TextConfig()


# --------------------------------------------------------------------------------------------
# Engram hashing (model.md C.7)


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0:
            return False
        i += 2
    return True


def nextprime(n: int) -> int:
    """Smallest prime > n (sympy's ``nextprime`` semantics; deterministic trial division)."""
    n += 1
    while not is_prime(n):
        n += 1
    return n


def engram_primes(cfg: V41TextConfig) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per engram layer: primes ``[orders, heads]`` and row offsets (exclusive prefix sums).

    Real checkpoints derive (or ship) their primes and multipliers per model.md C.7 / G.27; this
    chain reproduces V4.1-Flash's ``engram_num_embeddings`` exactly. Spec reading: one chain
    starting above ``engram_vocab_size - 1``, continued over layers, orders and heads.
    """
    orders = cfg.engram_max_ngram_size - 1
    p = cfg.engram_vocab_size - 1
    primes, offsets = [], []
    for _ in cfg.engram_layer_ids:
        rows = []
        for _ in range(orders * cfg.engram_n_heads):
            p = nextprime(p)
            rows.append(p)
        flat = torch.tensor(rows, dtype=torch.int64)
        primes.append(flat.view(orders, cfg.engram_n_heads))
        offsets.append((torch.cumsum(flat, 0) - flat).view(orders, cfg.engram_n_heads))
    return primes, offsets


def engram_multipliers(cfg: V41TextConfig, layer: int) -> list[int]:
    """The odd multipliers M_l[0..n-1] from NumPy ``default_rng(seed=10007*l)`` (C.7.3)."""
    bound = (INT64_MAX // cfg.engram_compressed_vocab_size) // 2
    rng = np.random.default_rng(seed=10007 * layer)
    return [int(m) * 2 + 1 for m in rng.integers(0, bound, cfg.engram_max_ngram_size)]


def engram_hash_rows(
    ngram: Sequence[int], mult: Sequence[int], primes: torch.Tensor, offsets: torch.Tensor
) -> list[int]:
    """Row ids, in (order, head) order, for one position's n-gram ``[c(t), c(t-1), ...]``."""
    h = ngram[0] * mult[0]
    rows = []
    for n in range(1, len(ngram)):
        h ^= ngram[n] * mult[n]
        for head in range(primes.shape[1]):
            p, off = int(primes[n - 1, head]), int(offsets[n - 1, head])
            rows.append(h % p + off)  # Python's % is the non-negative modulo
    return rows


def tiny_compressed_map(vocab: int, compressed_vocab: int, seed: int = 0) -> list[int]:
    """A deterministic many-to-one token -> compressed-id map standing in for the normalising
    compressed tokenizer (C.7.1): every compressed id is used, several tokens share ids."""
    assert vocab >= compressed_vocab
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat(
        [
            torch.arange(compressed_vocab),
            torch.randint(0, compressed_vocab, (vocab - compressed_vocab,), generator=g),
        ]
    )
    return ids[torch.randperm(vocab, generator=g)].tolist()


# --------------------------------------------------------------------------------------------
# Tiny configs


def tiny_config(**kw) -> V41TextConfig:
    """Tiny widths (H 64, 4 heads x 32 with rope 8, vocab 192, window 8); ``kw`` sets the layer
    roles. ``engram_num_embeddings`` is derived from the prime chain."""
    base = dict(
        vocab_size=192,
        hidden_size=64,
        num_attention_heads=4,
        head_dim=32,
        qk_rope_head_dim=8,
        q_lora_rank=32,
        o_groups=2,
        o_lora_rank=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        max_position_embeddings=4096,
        rope_scaling={
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        sliding_window=8,
        index_n_heads=16,  # F.3: enough heads that index scores rarely tie at exactly 0
        index_head_dim=16,
        index_topk=4,
        candidate_topk_blocks=3,
        candidate_block_size=2,
        engram_max_ngram_size=4,
        engram_vocab_size=40,
        engram_n_heads=2,
        engram_head_dim=8,
        engram_compressed_vocab_size=48,
        engram_pad_token_id=2,
        num_nextn_predict_layers=1,
        dspark_block_size=3,
        dspark_target_layer_ids=(),
        dspark_markov_rank=8,
        dspark_noise_token_id=191,
        dspark_n_routed_experts=4,
        dspark_num_experts_per_tok=2,
        image_token_id=190,
        yoco_keep_tokens=12,
    )
    base.update(kw)
    cfg = V41TextConfig(**base, engram_num_embeddings=())
    primes, _ = engram_primes(cfg)
    cfg = replace(cfg, engram_num_embeddings=tuple(int(p.sum()) for p in primes))
    cfg.validate()
    return cfg


# A: the V4.1-Flash layout in miniature. 0-1 sliding (1: Engram), C2 sources 2 and 4 (4: Engram)
# with share-KV readers 3 and 5, C1 source 6 = YOCO boundary = candidate source, C1 readers 7-9,
# index source 8 restricted to candidates (reads 6's index K), readers 3, 5, 7, 9 reuse top-k.
TINY_A = tiny_config(
    num_hidden_layers=10,
    compress_ratios=(0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0),
    kv_source_layer_ids=(2, 4, 6),
    index_source_layer_ids=(2, 4, 6, 8),
    candidate_source_layer_id=6,
    engram_layer_ids=(1, 4),
    dspark_target_layer_ids=(8, 9),
)

# B: hc_mult 2, window 6, trigram Engram on a share-KV reader (2), an index source that is not an
# index-K source (2 reads 1's index K), C1 consumers 3-6 with two restricted index sources (4, 6).
TINY_B = tiny_config(
    num_hidden_layers=7,
    compress_ratios=(0, 2, 2, 1, 1, 1, 1, 0),
    kv_source_layer_ids=(1, 3),
    index_source_layer_ids=(1, 2, 3, 4, 6),
    candidate_source_layer_id=3,
    candidate_block_size=3,
    candidate_topk_blocks=2,
    index_topk=3,
    hc_mult=2,
    sliding_window=6,
    yoco_keep_tokens=7,
    engram_layer_ids=(2,),
    engram_max_ngram_size=3,
    engram_n_heads=3,
)

# C: no YOCO (no C1 layer), so the truncation modes equal off; a candidate source on a C2 layer (3)
# and a restricted C2 index source (5); Engram at layers 0 (before the very first mix) and 1.
TINY_C = tiny_config(
    num_hidden_layers=6,
    compress_ratios=(0, 0, 2, 2, 2, 2, 0),
    kv_source_layer_ids=(2,),
    index_source_layer_ids=(2, 3, 5),
    candidate_source_layer_id=3,
    index_topk=3,
    engram_layer_ids=(0, 1),
)

TINY_CONFIGS = {"A": TINY_A, "B": TINY_B, "C": TINY_C}


# --------------------------------------------------------------------------------------------
# RoPE (model.md A.4, C.2)


def rope_inv_freq(theta: float, dim: int, yarn: dict | None) -> torch.Tensor:
    """inv_freq for i < dim/2: plain ``theta^(-2i/R)``, or YaRN by A.4 (no mscale)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if yarn is None:
        return 1.0 / pos_freqs
    factor, orig = float(yarn["factor"]), yarn["original_max_position_embeddings"]

    def corr(n_rot: float) -> float:
        return dim * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr(yarn["beta_fast"])), 0)
    high = min(math.ceil(corr(yarn["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extra_mask = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extra_mask) + (1.0 / pos_freqs) * extra_mask


def apply_rope(v: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, inverse=False):
    """Rotate the trailing 2*len(inv_freq) channels of v (interleaved pairs) by pos*inv_freq.
    ``pos`` broadcasts against ``v.shape[:-1]``."""
    r = 2 * inv_freq.numel()
    ang = pos.to(torch.float32)[..., None] * inv_freq
    cos, sin = ang.cos(), ang.sin()
    if inverse:
        sin = -sin
    a, b = v[..., -r::2], v[..., -r + 1 :: 2]
    rot = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    return torch.cat((v[..., :-r], rot), dim=-1)


# --------------------------------------------------------------------------------------------
# Modules (parameter names are model.md C.9's)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def linear(n_in: int, n_out: int) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=False)


class Compressor(nn.Module):
    """``attn.compressor.*`` of a kv source: ``wkv``, ``wgate`` (C2 only), ``norm``."""

    def __init__(self, cfg: V41TextConfig, ratio: int):
        super().__init__()
        self.wkv = linear(cfg.hidden_size, cfg.head_dim)
        self.wgate = linear(cfg.hidden_size, cfg.head_dim) if ratio == 2 else None
        self.norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)


class Indexer(nn.Module):
    """``attn.indexer.*`` of an index source; ``wk``/``k_norm`` only on index-K sources."""

    def __init__(self, cfg: V41TextConfig, owns_k: bool):
        super().__init__()
        hi, di = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b = linear(cfg.q_lora_rank, hi * di)
        self.weights_proj = linear(cfg.hidden_size, hi)
        self.wk = linear(cfg.head_dim, di) if owns_k else None
        self.k_norm = RMSNorm(di, cfg.rms_norm_eps) if owns_k else None


class Attention(nn.Module):
    def __init__(self, cfg: V41TextConfig, layer: int):
        super().__init__()
        h, d, nh, g = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.o_groups
        self.wq_a = linear(h, cfg.q_lora_rank)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.wq_b = linear(cfg.q_lora_rank, nh * d)
        self.wkv = linear(h, d)
        self.kv_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.wo_a = linear(nh * d // g, g * cfg.o_lora_rank)
        self.wo_b = linear(g * cfg.o_lora_rank, h)
        self.attn_sink = nn.Parameter(torch.zeros(nh))
        ratio = cfg.ratio(layer)
        is_kv_source = layer in cfg.kv_source_layer_ids
        self.compressor = Compressor(cfg, ratio) if is_kv_source else None
        is_index_source = layer in cfg.index_source_layer_ids
        owns_k = layer in cfg.index_k_source_layer_ids
        self.indexer = Indexer(cfg, owns_k) if is_index_source else None


class Expert(nn.Module):
    def __init__(self, h: int, inter: int):
        super().__init__()
        self.w1 = linear(h, inter)  # gate
        self.w2 = linear(inter, h)  # down
        self.w3 = linear(h, inter)  # up


class Gate(nn.Module):
    def __init__(self, cfg: V41TextConfig):
        super().__init__()
        e = cfg.n_routed_experts
        self.weight = nn.Parameter(torch.zeros(e, cfg.hidden_size))
        self.bias = nn.Parameter(torch.zeros(e))
        self.bias_vl = nn.Parameter(torch.zeros(e))  # image tokens only: unused here


class MoE(nn.Module):
    """V4.1 MoE (C.5)."""

    def __init__(self, cfg: V41TextConfig):
        super().__init__()
        self.cfg = cfg
        self.gate = Gate(cfg)
        i = cfg.moe_intermediate_size
        self.experts = nn.ModuleList(
            Expert(cfg.hidden_size, i) for _ in range(cfg.n_routed_experts)
        )
        self.shared_experts = Expert(cfg.hidden_size, i)

    def swiglu(self, e: Expert, x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        lim = self.cfg.swiglu_limit
        g = e.w1(x).clamp(max=lim)
        u = e.w3(x).clamp(-lim, lim)
        h = F.silu(g) * u
        if w is not None:
            h = h * w[:, None]  # the routing weight multiplies before w2 (C.5)
        return e.w2(h)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(selected expert ids [S,k], weights [S,k])."""
        cfg = self.cfg
        scores = torch.sqrt(F.softplus(x @ self.gate.weight.T))
        biased = scores + self.gate.bias
        # Spec reading: top-k is a set; ties go to the lower expert id (stable sort).
        idx = torch.sort(biased, dim=-1, descending=True, stable=True).indices
        idx = idx[:, : cfg.num_experts_per_tok]
        w = scores.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling_factor
        return idx, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx, w = self.route(x)
        out = self.swiglu(self.shared_experts, x)
        for e, expert in enumerate(self.experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, self.swiglu(expert, x[rows], w[rows, slot]))
        return out


class Engram(nn.Module):
    """``layers.L.engram.*`` (C.7). ``embed`` rows are looked up by n-gram hash."""

    def __init__(self, cfg: V41TextConfig, rows: int):
        super().__init__()
        n, h = cfg.hc_mult, cfg.hidden_size
        e_dim = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads * cfg.engram_head_dim
        self.embed = nn.Embedding(rows, cfg.engram_head_dim)
        self.wkv = linear(e_dim, (n + 1) * h)
        self.q_weight = nn.Parameter(torch.ones(n, h))
        self.k_weight = nn.Parameter(torch.ones(n, h))


class Block(nn.Module):
    def __init__(self, cfg: V41TextConfig, layer: int, engram_rows: int | None):
        super().__init__()
        n, h = cfg.hc_mult, cfg.hidden_size
        self.attn_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(h, cfg.rms_norm_eps)
        mix = (2 + n) * n
        for part in ("attn", "ffn"):
            setattr(self, f"hc_{part}_fn", nn.Parameter(torch.zeros(mix, n * h)))
            setattr(self, f"hc_{part}_base", nn.Parameter(torch.zeros(mix)))
            setattr(self, f"hc_{part}_scale", nn.Parameter(torch.ones(3)))
        self.attn = Attention(cfg, layer)
        self.ffn = MoE(cfg)
        self.engram = Engram(cfg, engram_rows) if engram_rows is not None else None


# --------------------------------------------------------------------------------------------
# KV formats: quantize-dequantize of the engine's records (kv_record.h), in fp32 like the C++ code

KV_FORMATS = ("f32", "bf16", "fp8")


def _groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """[..., D] -> [..., ceil(D/group), group], zero-padded (zeros leave a group's amax alone)."""
    pad = -x.shape[-1] % group
    return F.pad(x, (0, pad)).unflatten(-1, (-1, group))


def _ungroup(g: torch.Tensor, dim: int) -> torch.Tensor:
    return g.flatten(-2)[..., :dim]


def _pow2_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """2^ceil(log2(max(amax, 1e-4) / qmax)) (kv_record.cpp pow2_scale)."""
    ratio = amax.clamp(min=1e-4) / qmax
    m, e = torch.frexp(ratio)
    return torch.ldexp(torch.ones_like(ratio), torch.where(m == 0.5, e - 1, e))


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e4m3fn).float()


def _e4m3_scale_up(amax: torch.Tensor) -> torch.Tensor:
    """Smallest e4m3 value >= max(amax, 1e-4) / 6, at most 448 (kv_record fp4_e4m3_scale)."""
    want = amax.clamp(min=1e-4) / 6.0
    code = want.clamp(max=448.0).to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32)
    below = (_e4m3_of_code(code) < want) & (code < 0x7E)
    return _e4m3_of_code(code + below.to(torch.int32))


def _e4m3_of_code(code: torch.Tensor) -> torch.Tensor:
    return code.to(torch.uint8).view(torch.float8_e4m3fn).float()


def _e2m1(v: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 value, ties to the even code, saturating at +-6 (kv_record f32_to_e2m1)."""
    a = v.abs()
    mag = torch.full_like(a, 6.0)
    for bound, value, inclusive in (
        (5.0, 4.0, True),
        (3.5, 3.0, False),
        (2.5, 2.0, True),
        (1.75, 1.5, False),
        (1.25, 1.0, True),
        (0.75, 0.5, False),
        (0.25, 0.0, True),
    ):
        mag = torch.where(a <= bound if inclusive else a < bound, value, mag)
    return torch.where(v < 0, -mag, mag)


def fake_fp8_v41(x: torch.Tensor) -> torch.Tensor:
    """The V4.1 FP8 record (SWA keys): e4m3 with a UE8M0 scale per 32 channels."""
    g = _groups(x, 32)
    scale = _pow2_scale(g.abs().amax(-1, keepdim=True), 448.0)
    return _ungroup(_e4m3(g / scale) * scale, x.shape[-1])


def fake_fp4_main(x: torch.Tensor) -> torch.Tensor:
    """The V4.1 FP4 main record (compressed entries): e2m1 with an e4m3 scale per 16."""
    g = _groups(x, 16)
    scale = _e4m3_scale_up(g.abs().amax(-1, keepdim=True))
    return _ungroup(_e2m1(g / scale) * scale, x.shape[-1])


def fake_fp4_index(x: torch.Tensor) -> torch.Tensor:
    """The V4.1 FP4 index-key record: e2m1 with a UE8M0 scale per 32."""
    g = _groups(x, 32)
    scale = _pow2_scale(g.abs().amax(-1, keepdim=True), 6.0)
    return _ungroup(_e2m1(g / scale) * scale, x.shape[-1])


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def _keep(x: torch.Tensor) -> torch.Tensor:
    return x


# kv_format -> (SWA keys, compressed entries, index keys)
_KV_QUANT = {
    "f32": (_keep, _keep, _keep),
    "bf16": (_bf16, _bf16, _bf16),
    "fp8": (fake_fp8_v41, fake_fp4_main, fake_fp4_index),
}


# --------------------------------------------------------------------------------------------
# Cache


@dataclass
class V41Cache:
    """Everything a later call needs, kept for every position (a reference, not a ring)."""

    yoco_mode: str = "off"
    kv_format: str = "f32"  # KV_FORMATS: how cached keys are stored (quantize-dequantize)
    tokens: list = field(default_factory=list)
    swa: dict = field(default_factory=dict)  # layer -> [n, D] post-RoPE SWA keys by position
    comp_in: dict = field(default_factory=dict)  # C2 source -> [n, 2, D] (score, latent)
    comp_pre: dict = field(default_factory=dict)  # kv source -> [T, D] normed, pre-RoPE
    comp_kv: dict = field(default_factory=dict)  # kv source -> [T, D] RoPE'd entries
    index_k: dict = field(default_factory=dict)  # index-K source -> [T, Di]

    @property
    def length(self) -> int:
        return len(self.tokens)


def _topk_mask(scores: torch.Tensor, allowed: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean [q, T]: up to k allowed entries with the highest scores per row.
    Spec reading: a set; exact ties go to the lower index (stable sort)."""
    if scores.shape[-1] == 0:
        return allowed.clone()
    s = scores.masked_fill(~allowed, -math.inf)
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices[:, :k]
    sel = torch.zeros_like(allowed).scatter_(1, order, True)
    return sel & allowed


# --------------------------------------------------------------------------------------------
# The model


class V41Model(nn.Module):
    def __init__(self, cfg: V41TextConfig, seed: int = 0, token_map: Sequence[int] | None = None):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        rows = dict(zip(cfg.engram_layer_ids, cfg.engram_num_embeddings, strict=True))
        self.layers = nn.ModuleList(Block(cfg, i, rows.get(i)) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = linear(cfg.hidden_size, cfg.vocab_size)
        self.inv_freq = []
        for i in range(cfg.n_layers):
            theta, yarn = cfg.layer_rope(i)
            self.inv_freq.append(rope_inv_freq(theta, cfg.qk_rope_head_dim, yarn))
        # Engram tables that are not weights: the compressed-token map (an input table, C.7.1),
        # multipliers and primes (C.7.3).
        if token_map is None:  # tokenizer-derived, so independent of the weight seed
            token_map = tiny_compressed_map(cfg.vocab_size, cfg.engram_compressed_vocab_size)
        self.token_map = list(token_map)
        # Spec reading: cpad is the compressed id of the pad token (C.7.1).
        self.cpad = self.token_map[cfg.engram_pad_token_id]
        self.engram_primes, self.engram_offsets = engram_primes(cfg)
        self.engram_mult = {layer: engram_multipliers(cfg, layer) for layer in cfg.engram_layer_ids}
        self.reset_parameters(seed)
        self.eval()

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Deterministic random init that keeps every sub-layer significant: linears
        N(0, 1/fan_in), norms U(0.8, 1.2), sinks and HC bases N(0, 0.5), HC scales U(0.5, 1.5),
        router biases N(0, 0.1), Engram gate weights U(0.5, 1.5), embeddings N(0, 1)."""
        g = torch.Generator().manual_seed(seed)

        def normal(p, std):
            p.copy_(torch.randn(p.shape, generator=g) * std)

        def uniform(p, lo, hi):
            p.copy_(torch.rand(p.shape, generator=g) * (hi - lo) + lo)

        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("norm.weight"):
                uniform(p, 0.8, 1.2)
            elif leaf == "attn_sink" or "_base" in leaf:
                normal(p, 0.5)
            elif "_scale" in leaf:
                uniform(p, 0.5, 1.5)
            elif leaf in ("bias", "bias_vl"):
                normal(p, 0.1)
            elif leaf in ("q_weight", "k_weight"):
                uniform(p, 0.5, 1.5)
            elif name.endswith("embed.weight"):
                normal(p, 1.0)
            else:
                normal(p, p.shape[-1] ** -0.5)

    # ---- pieces ----

    def hc_mix(self, block: Block, part: str, x: torch.Tensor):
        """(pre [S,N], post [S,N], comb [S,N,N]) from trunk x [S,N,H] (A.3 formulas, C.4 eps)."""
        cfg, n = self.cfg, self.cfg.hc_mult
        fn = getattr(block, f"hc_{part}_fn")
        base = getattr(block, f"hc_{part}_base")
        scale = getattr(block, f"hc_{part}_scale")
        # Spec reading: unweighted RMSNorm (fn has the weight folded in), all in fp32.
        flat = x.flatten(1)
        flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
        mix = flat @ fn.T
        pre = torch.sigmoid(mix[:, :n] * scale[0] + base[:n]) + cfg.hc_eps
        post = 2.0 * torch.sigmoid(mix[:, n : 2 * n] * scale[1] + base[n : 2 * n])
        comb = mix[:, 2 * n :].view(-1, n, n) * scale[2] + base[2 * n :].view(n, n)
        c = torch.softmax(comb, dim=-1) + cfg.hc_eps
        c = c / (c.sum(-2, keepdim=True) + cfg.hc_eps)
        for _ in range(cfg.hc_sinkhorn_iters - 1):
            c = c / (c.sum(-1, keepdim=True) + cfg.hc_eps)
            c = c / (c.sum(-2, keepdim=True) + cfg.hc_eps)
        return pre, post, c

    def engram_rows(self, layer: int, tokens: Sequence[int], positions: Sequence[int]):
        """[len(positions), orders*heads] row ids of ``layers.layer.engram.embed``."""
        i = self.cfg.engram_layer_ids.index(layer)
        m = self.cfg.engram_max_ngram_size
        out = []
        for t in positions:
            ng = [self.token_map[tokens[t - r]] if t - r >= 0 else self.cpad for r in range(m)]
            out.append(
                engram_hash_rows(
                    ng, self.engram_mult[layer], self.engram_primes[i], self.engram_offsets[i]
                )
            )
        return torch.tensor(out, dtype=torch.int64)

    def engram(self, layer: int, x: torch.Tensor, tokens, positions) -> torch.Tensor:
        """C.7.4-6 on the trunk x [S,N,H]."""
        cfg, eg = self.cfg, self.layers[layer].engram
        n, h = cfg.hc_mult, cfg.hidden_size
        e = eg.embed(self.engram_rows(layer, tokens, positions)).flatten(1)
        kv = eg.wkv(e)
        k, v = kv[:, : n * h].view(-1, n, h), kv[:, n * h :]
        rx = torch.rsqrt(x.pow(2).mean(-1) + cfg.rms_norm_eps)
        rk = torch.rsqrt(k.pow(2).mean(-1) + cfg.rms_norm_eps)
        d = (x * eg.q_weight * eg.k_weight * k).sum(-1) * rx * rk / math.sqrt(h)
        gate = torch.sigmoid(torch.sign(d) * torch.sqrt(d.abs().clamp(min=1e-6)))
        return x + gate[..., None] * v[:, None, :]

    def compress(self, layer: int, xn: torch.Tensor, pos: torch.Tensor, cache: V41Cache):
        """Kv-source compressor (C.3.3) and index K (C.3.4) over the rows xn at positions pos
        (every row of the call, contiguous, ending at cache.length)."""
        cfg, attn = self.cfg, self.layers[layer].attn
        comp, ratio, inv = attn.compressor, cfg.ratio(layer), self.inv_freq[layer]
        total = cache.length
        start = int(pos[0])
        if ratio == 2:
            new = torch.stack((comp.wgate(xn), comp.wkv(xn)), dim=1)  # [S, 2(score, lat), D]
            hist = torch.cat((cache.comp_in.get(layer, xn.new_zeros(0, 2, cfg.head_dim)), new))
            cache.comp_in[layer] = hist
            j = torch.arange(start // 2, total // 2)
            pair = hist[torch.stack((2 * j, 2 * j + 1), 1)]  # [T_new, 2 tokens, 2, D]
            alpha = torch.softmax(pair[:, :, 0], dim=1)  # per-channel softmax over the 2 tokens
            u = (alpha * pair[:, :, 1]).sum(1)
        else:
            j = pos
            u = comp.wkv(xn)  # C1: one entry per token
        pre = comp.norm(u)
        _, quant_entry, quant_index = _KV_QUANT[cache.kv_format]
        kv = quant_entry(apply_rope(pre, j * ratio, inv))
        d = cfg.head_dim
        cache.comp_pre[layer] = torch.cat((cache.comp_pre.get(layer, xn.new_zeros(0, d)), pre))
        cache.comp_kv[layer] = torch.cat((cache.comp_kv.get(layer, xn.new_zeros(0, d)), kv))
        ix = attn.indexer
        if ix is not None and ix.wk is not None:
            # Spec reading: index K rotates at j*ratio with the layer rope like the entries.
            ki = quant_index(apply_rope(ix.k_norm(ix.wk(pre)), j * ratio, inv))
            di = cfg.index_head_dim
            cache.index_k[layer] = torch.cat((cache.index_k.get(layer, xn.new_zeros(0, di)), ki))
        assert cache.comp_kv[layer].shape[0] == total // ratio

    def select(self, layer, xn, qa, pos, cache, shared, trace):
        """The compressed entries each row attends to (C.3.4): boolean [S, T]."""
        cfg = self.cfg
        src = cfg.kv_source(layer)
        ratio = cfg.ratio(layer)
        t = cache.comp_kv[src].shape[0]
        visible = torch.arange(t)[None, :] < ((pos + 1) // ratio)[:, None]
        if layer not in cfg.index_source_layer_ids:  # share-index reader
            sel = shared["topk", cfg.index_source(layer)]
            assert sel.shape == visible.shape
            return sel
        ix = self.layers[layer].attn.indexer
        hi, di = cfg.index_n_heads, cfg.index_head_dim
        qi = apply_rope(ix.wq_b(qa).view(-1, hi, di), pos[:, None], self.inv_freq[layer])
        wts = ix.weights_proj(xn)
        ki = cache.index_k[cfg.index_k_source(layer)]
        # Spec reading: no 1/sqrt(Di), 1/sqrt(hi) factors (C.3.4); they cannot change top-k.
        score = torch.einsum("sh,sht->st", wts, torch.relu(torch.einsum("shd,td->sht", qi, ki)))
        allowed = visible
        if cfg.uses_candidates(layer):
            allowed = visible & shared["cand", cfg.candidate_source_layer_id]
        sel = _topk_mask(score, allowed, cfg.index_topk)
        if layer == cfg.candidate_source_layer_id:
            # Spec reading: blocks [b*bs, (b+1)*bs) of visible entries, block score = max over its
            # visible entries, top candidate_topk_blocks blocks, candidates = their visible entries.
            bs = cfg.candidate_block_size
            nb = -(-t // bs)
            pad = nb * bs - t
            rows = score.shape[0]
            sc = F.pad(score.masked_fill(~visible, -math.inf), (0, pad), value=-math.inf)
            vis_b = F.pad(visible, (0, pad)).view(rows, nb, bs).any(-1)
            block_score = sc.view(rows, nb, bs).amax(-1) if nb else sc.new_zeros(rows, 0)
            chosen = _topk_mask(block_score, vis_b, cfg.candidate_topk_blocks)
            cand = chosen.repeat_interleave(bs, dim=1)[:, :t] & visible
            shared["cand", layer] = cand
            if trace is not None:
                trace[f"cand.{layer}"] = cand
        shared["topk", layer] = sel
        if trace is not None:
            trace[f"score.{layer}"] = score
        return sel

    def attention(self, layer, xn, pos, cache, shared, swa_start, n_dropped, trace):
        """V4.1 attention (C.3) for rows xn [S,H] at positions pos; the compressor already ran."""
        cfg, attn = self.cfg, self.layers[layer].attn
        nh, d, inv = cfg.num_attention_heads, cfg.head_dim, self.inv_freq[layer]
        qa = attn.q_norm(attn.wq_a(xn))
        q = apply_rope(attn.wq_b(qa).view(-1, nh, d), pos[:, None], inv)  # no per-head q norm
        # The stored (quantize-dequantized) key is the one attention reads, now and later.
        c = _KV_QUANT[cache.kv_format][0](apply_rope(attn.kv_norm(attn.wkv(xn)), pos, inv))
        old = cache.swa.get(layer, xn.new_zeros(0, d))
        # compact YOCO: rows this call dropped hold zero keys; visibility never reaches them.
        keys = torch.cat((old, xn.new_zeros(n_dropped, d), c))
        cache.swa[layer] = keys
        j = torch.arange(keys.shape[0])[None, :]
        p = pos[:, None]
        swa_vis = (j <= p) & (j > p - cfg.sliding_window) & (j >= swa_start)
        if cfg.ratio(layer) > 0:
            # Spec reading: a token's SWA key and its C1 entry are separate keys (A.8, no dedup).
            sel = self.select(layer, xn, qa, pos, cache, shared, trace)
            keys = torch.cat((keys, cache.comp_kv[cfg.kv_source(layer)]))
            vis = torch.cat((swa_vis, sel), dim=1)
            if trace is not None:
                trace[f"sel.{layer}"] = sel
        else:
            vis = swa_vis
        logits = torch.einsum("shd,kd->hsk", q, keys) * d**-0.5
        logits = logits.masked_fill(~vis[None], -math.inf)
        sink = attn.attn_sink[:, None, None].expand(nh, logits.shape[1], 1)
        prob = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
        o = torch.einsum("hsk,kd->shd", prob, keys)
        o = apply_rope(o, pos[:, None], inv, inverse=True)
        g = cfg.o_groups
        wa = attn.wo_a.weight.view(g, cfg.o_lora_rank, -1)
        z = torch.einsum("sgi,goi->sgo", o.reshape(o.shape[0], g, nh * d // g), wa).flatten(1)
        return attn.wo_b(z)

    # ---- forward ----

    def new_cache(self, yoco_mode: str = "off", kv_format: str = "f32") -> V41Cache:
        assert yoco_mode in YOCO_MODES
        assert kv_format in KV_FORMATS
        return V41Cache(yoco_mode=yoco_mode, kv_format=kv_format)

    @torch.no_grad()
    def forward(self, tokens, yoco_mode: str = "off", trace: dict | None = None) -> torch.Tensor:
        """Logits [S, vocab] of a whole prompt in one call."""
        return self.forward_chunk(self.new_cache(yoco_mode), tokens, trace)

    @torch.no_grad()
    def forward_chunk(
        self,
        cache: V41Cache,
        tokens,
        trace: dict | None = None,
        prompt_end: int | None = None,
    ) -> torch.Tensor:
        """Feed ``tokens`` after what ``cache`` holds; logits [S, vocab] of these tokens.

        ``prompt_end``: the end of the prefill this chunk belongs to, for YOCO truncation (Spec
        reading 8); None: the cache length after this call.

        ``trace`` (optional dict) receives per-row intermediates: ``y.k`` (sub-layer k's block
        input before its norm, k = 2*layer (+1 for the FFN)), ``trunk.l`` (trunk entering layer
        l, after Engram), ``attn.l``, ``sel.l`` / ``cand.l`` / ``score.l`` (compressed entries,
        candidates, index scores), ``h`` (the final collapse).
        """
        cfg, n_hc, vocab = self.cfg, self.cfg.hc_mult, self.cfg.vocab_size
        tokens = [int(t) for t in (tokens.tolist() if torch.is_tensor(tokens) else tokens)]
        s = len(tokens)
        start = cache.length
        cache.tokens.extend(tokens)
        total = cache.length
        pos = torch.arange(start, total)
        mode = cache.yoco_mode
        boundary = cfg.n_prefill_layer
        # Spec reading: truncation holds in every call: consumer SWA keys only in
        # [L - keep, L), L = the prefill's end (by default the cache length after this call; C.6).
        truncating = mode != "off" and boundary is not None
        end = total if prompt_end is None else prompt_end
        assert end >= total, f"prompt_end {end} lies before the chunk's end {total}"
        keep_from = max(0, end - cfg.yoco_keep_tokens) if truncating else 0

        x = self.embed(torch.tensor(tokens, dtype=torch.int64))
        trunk = x[:, None, :].expand(s, n_hc, cfg.hidden_size).clone()
        pre_prev = torch.zeros(s, n_hc)
        pre_prev[:, 0] = 1.0  # C.4: the first sub-layer's input is stream 0
        shared: dict = {}
        rows = torch.arange(s)  # chunk rows still computed (compact YOCO drops some)
        n_dropped = 0
        sub = 0

        for layer, block in enumerate(self.layers):
            if block.engram is not None:
                # Spec reading: Engram rewrites the trunk X_k itself, so the mix, the collapse with
                # pre_{k-1} and the residual of layer l's attention sub-layer all see it (C.7).
                trunk = self.engram(layer, trunk, cache.tokens, pos.tolist())
            if trace is not None:
                trace[f"trunk.{layer}"] = trunk
            consumer = cfg.is_yoco_consumer(layer)
            # attention sub-layer
            pre, post, comb = self.hc_mix(block, "attn", trunk)
            y = (pre_prev[..., None] * trunk).sum(1)
            xn = block.attn_norm(y)
            if block.attn.compressor is not None:
                self.compress(
                    layer, xn, pos, cache
                )  # always on every row (C.6 _store_yoco_full_kv)
            if layer == boundary and mode == "compact":
                keep = pos >= keep_from
                n_dropped = int((~keep).sum())
                rows, trunk, pre_prev, pre, post, comb, y, xn, pos = (
                    t[keep] for t in (rows, trunk, pre_prev, pre, post, comb, y, xn, pos)
                )
            if trace is not None:
                trace[f"y.{sub}"] = y
            swa_start = keep_from if consumer else 0
            a = self.attention(
                layer, xn, pos, cache, shared, swa_start, n_dropped if consumer else 0, trace
            )
            if trace is not None:
                trace[f"attn.{layer}"] = a
            trunk = post[..., None] * a[:, None, :] + torch.einsum("sij,sih->sjh", comb, trunk)
            pre_prev, sub = pre, sub + 1
            # FFN sub-layer
            pre, post, comb = self.hc_mix(block, "ffn", trunk)
            y = (pre_prev[..., None] * trunk).sum(1)
            if trace is not None:
                trace[f"y.{sub}"] = y
            f = block.ffn(block.ffn_norm(y))
            trunk = post[..., None] * f[:, None, :] + torch.einsum("sij,sih->sjh", comb, trunk)
            pre_prev, sub = pre, sub + 1

        h = (pre_prev[..., None] * trunk).sum(1)  # no HyperHead: the last FFN's pre (C.4)
        if trace is not None:
            trace["h"] = h
        out = torch.full((s, vocab), math.nan)
        out[rows] = self.head(self.norm(h))
        return out


def random_tokens(n: int, vocab: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, vocab, size=n)]
