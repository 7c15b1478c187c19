"""A pure-torch fp32 reference of DeepSeek-V4.1's DSpark drafter (model.md C.8, C.9), written from
the spec on top of v41_reference.py (no DeepInfer code was copied).

The drafter is ``num_nextn_predict_layers`` extra V4.1 blocks ``mtp.K.*`` (sliding-window
attention with theta ``rope_theta`` and no YaRN, a ``dspark_n_routed_experts`` top
``dspark_num_experts_per_tok`` MoE with a shared expert, shifted mHC). Parameter ownership: the
first block holds ``main_proj`` / ``main_norm``, the last one ``norm``, ``markov_head.{embed,head}``
and ``confidence_head.proj`` (with one block, mtp.0 holds both sets).

* **Main keys** (every main forward, every position the call computes): the HC trunk entering the
  attention sub-layer of each ``dspark_target_layer_ids`` layer, averaged over the streams and
  concatenated in list order, gives ``mh = main_norm(main_proj(feat))``; block K stores
  ``kv_norm_K(wkv_K(mh))`` RoPE'd at the token's position as its sliding key there.
* **Draft step** after the main model sampled the golden token at ``ap + 1`` (``ap`` = the last
  position in the main cache): inputs ``[golden, noise x (B-1)]`` at ``ap+1 .. ap+B``
  (``B = dspark_block_size``), embedded with the shared embedding and expanded to the HC streams,
  through the blocks in order as decoder layers (the first sub-layer's input is stream 0, as in
  the main model). Every draft query attends to the same keys: block K's main keys at
  ``[ap-W+1, ap]`` and the block's B draft keys (non-causal inside the block, gotcha 26); the draft
  keys are then stored at ``ap+1 .. ap+B`` (the next main forward overwrites the ones it reaches).
  The final collapse with the last FFN pre gives ``h_i`` (pre-norm).
* **Sampling**, sequential over i: ``logits_i = head(norm(h_i)) + markov.head(markov.embed(prev))``
  with ``prev`` the golden token for i = 0 and draft i-1 after; draft i = argmax (lowest id on
  ties) and predicts the token at ``ap+2+i``. Confidence
  ``c_i = sigmoid(proj . [h_i ; markov.embed(prev)] / T)`` (T = 1, DeepInfer's default).

Keys are stored through the cache's KV format (v41_reference ``_KV_QUANT``: what the engine's SWA
ring records hold). Spec readings are marked "Spec reading".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn as nn
import v41_reference as ref


class MarkovHead(nn.Module):
    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, rank)
        self.head = ref.linear(rank, vocab)


class ConfidenceHead(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = ref.linear(width, 1)


class DSparkBlock(ref.Block):
    """``mtp.K``: a V4.1 block at layer index num_hidden_layers + K with the DSpark MoE, plus the
    parts the first and the last block own."""

    def __init__(self, cfg: ref.V41TextConfig, k: int):
        moe_cfg = replace(
            cfg,
            n_routed_experts=cfg.dspark_n_routed_experts,
            num_experts_per_tok=cfg.dspark_num_experts_per_tok,
        )
        super().__init__(moe_cfg, cfg.n_layers + k, None)
        h = cfg.hidden_size
        if k == 0:
            self.main_proj = ref.linear(len(cfg.dspark_target_layer_ids) * h, h)
            self.main_norm = ref.RMSNorm(h, cfg.rms_norm_eps)
        if k == cfg.num_nextn_predict_layers - 1:
            self.norm = ref.RMSNorm(h, cfg.rms_norm_eps)
            self.markov_head = MarkovHead(cfg.vocab_size, cfg.dspark_markov_rank)
            self.confidence_head = ConfidenceHead(h + cfg.dspark_markov_rank)


@dataclass
class DSparkCache:
    """The main model's cache and each block's sliding keys by position (a dict, not a ring)."""

    main: ref.V41Cache
    keys: list = field(default_factory=list)  # per block: {position: [D] key}


@dataclass
class Draft:
    tokens: list  # B draft ids; draft i predicts the token at ap + 2 + i
    confidences: list  # B floats in (0, 1)
    logits: torch.Tensor  # [B, vocab] (Markov term included)


class DSparkModel(nn.Module):
    """A V41Model (the target) plus the DSpark blocks ``mtp``."""

    def __init__(self, main: ref.V41Model, seed: int = 1):
        super().__init__()
        cfg = main.cfg
        assert cfg.num_nextn_predict_layers >= 1 and cfg.dspark_target_layer_ids
        assert all(0 <= t < cfg.n_layers for t in cfg.dspark_target_layer_ids)
        assert all(cfg.ratio(cfg.n_layers + k) == 0 for k in range(cfg.num_nextn_predict_layers))
        self.cfg = cfg
        self.main = main
        self.mtp = nn.ModuleList(DSparkBlock(cfg, k) for k in range(cfg.num_nextn_predict_layers))
        # C.2: the DSpark blocks rope with theta rope_theta, no YaRN.
        self.inv_freq = ref.rope_inv_freq(cfg.rope_theta, cfg.qk_rope_head_dim, None)
        self._init_mtp(seed)

    @torch.no_grad()
    def _init_mtp(self, seed: int) -> None:
        # The same init rules as V41Model.reset_parameters, over the mtp parameters only (the
        # target's weights stay those of its own seed).
        holder = nn.Module()
        holder.mtp = self.mtp
        ref.V41Model.reset_parameters(holder, seed)  # type: ignore[arg-type]

    def state_dict_with_mtp(self) -> dict:
        """The target's tensors and the mtp.* ones, with the model.md C.9 names."""
        out = dict(self.main.state_dict())
        for name, t in self.mtp.state_dict().items():
            out[f"mtp.{name}"] = t
        return {k: v.detach().contiguous() for k, v in out.items()}

    def new_cache(self, yoco_mode: str = "off", kv_format: str = "f32") -> DSparkCache:
        return DSparkCache(
            self.main.new_cache(yoco_mode, kv_format), [{} for _ in range(len(self.mtp))]
        )

    def _store(self, cache: DSparkCache, k: int, keys: torch.Tensor, pos: torch.Tensor) -> None:
        quant = ref._KV_QUANT[cache.main.kv_format][0]
        keys = quant(keys)
        for i, p in enumerate(pos.tolist()):
            cache.keys[k][p] = keys[i]

    @torch.no_grad()
    def forward_chunk(self, cache: DSparkCache, tokens, prompt_end: int | None = None):
        """The target's forward_chunk (logits [S, vocab]) plus the blocks' main keys."""
        trace: dict = {}
        logits = self.main.forward_chunk(cache.main, tokens, trace, prompt_end)
        cfg = self.cfg
        # Spec reading: the trunk entering layer l is the one its attention mix reads ("after the
        # previous post"); under compact YOCO a consumer layer holds only the kept (last) rows.
        feats = [trace[f"trunk.{t}"].mean(1) for t in cfg.dspark_target_layer_ids]
        rows = min(f.shape[0] for f in feats)
        feats = [f[-rows:] for f in feats]
        total = cache.main.length
        pos = torch.arange(total - rows, total)
        first = self.mtp[0]
        mh = first.main_norm(first.main_proj(torch.cat(feats, dim=-1)))
        for k, blk in enumerate(self.mtp):
            key = ref.apply_rope(blk.attn.kv_norm(blk.attn.wkv(mh)), pos, self.inv_freq)
            self._store(cache, k, key, pos)
        return logits

    def _draft_attention(self, k: int, xn: torch.Tensor, ap: int, cache: DSparkCache):
        cfg, attn = self.cfg, self.mtp[k].attn
        nh, d, inv = cfg.num_attention_heads, cfg.head_dim, self.inv_freq
        b = xn.shape[0]
        pos = torch.arange(ap + 1, ap + 1 + b)
        qa = attn.q_norm(attn.wq_a(xn))
        q = ref.apply_rope(attn.wq_b(qa).view(-1, nh, d), pos[:, None], inv)
        c = ref.apply_rope(attn.kv_norm(attn.wkv(xn)), pos, inv)
        c = ref._KV_QUANT[cache.main.kv_format][0](c)
        lo = max(0, ap - cfg.sliding_window + 1)
        main_keys = [cache.keys[k][p] for p in range(lo, ap + 1)]
        keys = torch.cat((torch.stack(main_keys), c))  # every query sees all of them (C.8)
        logits = torch.einsum("shd,kd->hsk", q, keys) * d**-0.5
        sink = attn.attn_sink[:, None, None].expand(nh, b, 1)
        prob = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
        o = torch.einsum("hsk,kd->shd", prob, keys)
        o = ref.apply_rope(o, pos[:, None], inv, inverse=True)
        g = cfg.o_groups
        wa = attn.wo_a.weight.view(g, cfg.o_lora_rank, -1)
        z = torch.einsum("sgi,goi->sgo", o.reshape(b, g, nh * d // g), wa).flatten(1)
        self._store(cache, k, c, pos)  # after the attention read the window
        return attn.wo_b(z)

    @torch.no_grad()
    def draft(self, cache: DSparkCache, golden: int, temperature: float = 1.0) -> Draft:
        """One draft step after the target sampled ``golden`` at cache.main.length."""
        cfg, main = self.cfg, self.main
        n_hc, b = cfg.hc_mult, cfg.dspark_block_size
        ap = cache.main.length - 1
        toks = torch.tensor([golden] + [cfg.dspark_noise_token_id] * (b - 1), dtype=torch.int64)
        trunk = main.embed(toks)[:, None, :].expand(b, n_hc, cfg.hidden_size).clone()
        pre_prev = torch.zeros(b, n_hc)
        pre_prev[:, 0] = 1.0  # Spec reading: the first sub-layer reads stream 0, as in C.4
        for k, blk in enumerate(self.mtp):
            pre, post, comb = main.hc_mix(blk, "attn", trunk)
            y = (pre_prev[..., None] * trunk).sum(1)
            a = self._draft_attention(k, blk.attn_norm(y), ap, cache)
            trunk = post[..., None] * a[:, None, :] + torch.einsum("sij,sih->sjh", comb, trunk)
            pre_prev = pre
            pre, post, comb = main.hc_mix(blk, "ffn", trunk)
            y = (pre_prev[..., None] * trunk).sum(1)
            f = blk.ffn(blk.ffn_norm(y))
            trunk = post[..., None] * f[:, None, :] + torch.einsum("sij,sih->sjh", comb, trunk)
            pre_prev = pre
        h = (pre_prev[..., None] * trunk).sum(1)  # [B, H], pre-norm
        last = self.mtp[-1]
        base = main.head(last.norm(h))
        prev = golden
        tokens, confs, rows = [], [], []
        for i in range(b):
            memb = last.markov_head.embed(torch.tensor([prev]))[0]
            logits = base[i] + last.markov_head.head(memb)
            z = last.confidence_head.proj(torch.cat((h[i], memb)))[0]
            confs.append(float(torch.sigmoid(z / temperature)))
            prev = int(torch.argmax(logits))
            tokens.append(prev)
            rows.append(logits)
        return Draft(tokens, confs, torch.stack(rows))


# --------------------------------------------------------------------------------------------
# Tiny configs with DSpark blocks (targets inside the consumer half, as V4.1-Flash's 37-39)

# A with 3 blocks of block size 4, targets 7 and 9 (consumers, after the YOCO boundary 6).
TINY_DA = replace(
    ref.TINY_A,
    compress_ratios=(0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0),
    num_nextn_predict_layers=3,
    dspark_block_size=4,
    dspark_target_layer_ids=(7, 9),
    dspark_markov_rank=8,
)
# B (hc_mult 2, window 6) with one block of size 3 owning everything, one target (6).
TINY_DB = replace(ref.TINY_B, dspark_block_size=3, dspark_target_layer_ids=(6,))
# C (no YOCO) with 2 blocks of size 5 (V4.1-Flash's), targets 3, 4, 5.
TINY_DC = replace(
    ref.TINY_C,
    compress_ratios=(0, 0, 2, 2, 2, 2, 0, 0),
    num_nextn_predict_layers=2,
    dspark_block_size=5,
    dspark_target_layer_ids=(3, 4, 5),
)
TINY_DSPARK_CONFIGS = {"A": TINY_DA, "B": TINY_DB, "C": TINY_DC}


def make_model(name: str, seed: int = 0) -> DSparkModel:
    cfg = TINY_DSPARK_CONFIGS[name]
    cfg.validate()
    return DSparkModel(ref.V41Model(cfg, seed=seed), seed=seed + 1)


def write_checkpoint(model: DSparkModel, path: Path, with_mtp: bool = True) -> Path:
    """config.json, model.safetensors (mtp.* included unless ``with_mtp`` is off) and
    engram_tables.json, as test_v41_parity writes the target's."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    main = model.main
    (path / "config.json").write_text(json.dumps(model.cfg.to_hf_config()))
    tensors = model.state_dict_with_mtp()
    if not with_mtp:
        tensors = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    save_file(tensors, str(path / "model.safetensors"))
    tables = {
        "token_map": [int(t) for t in main.token_map],
        "multipliers": {
            str(layer): [int(m) for m in mult] for layer, mult in main.engram_mult.items()
        },
    }
    (path / "engram_tables.json").write_text(json.dumps(tables))
    return path
