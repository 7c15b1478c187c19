"""A torch reference for DeepSeek-V4's multi-token-prediction block (docs/model.md#mtp-block).

transformers does not implement ``mtp.*``, so the reference assembles DeepSeek's
``MTPBlock.forward`` from transformers' V4 pieces:

    e = enorm(embed(token at p + 1))                  shared embedding
    x = e_proj(e) (added to every stream) + h_proj(hnorm(trunk at p))   per HC stream
    x = one V4 decoder layer (mHC, attention, MoE)    transformers' DeepseekV4DecoderLayer
    logits = head(norm(hc_head(x)))                   the block's own HC head and norm

The decoder layer is loaded through transformers' own conversion of DeepSeek's names: the block's
layer tensors are written as layer ``num_hidden_layers`` of a model one layer deeper, whose
attention kind is the block's (sliding for V4-Flash) and whose MoE routes by score.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4ForCausalLM
from transformers.masking_utils import create_sliding_window_causal_mask
from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
    DeepseekV4HyperHead,
    DeepseekV4RMSNorm,
)

# mtp.0.* tensors that are not part of the decoder layer.
_BLOCK_OWN = ("enorm.weight", "hnorm.weight", "e_proj.weight", "h_proj.weight", "norm.weight")
_HC_HEAD = ("hc_head_fn", "hc_head_base", "hc_head_scale")


class MtpReference:
    def __init__(self, checkpoint: Path, work: Path) -> None:
        cfg = json.loads((checkpoint / "config.json").read_text())
        tensors = load_file(str(checkpoint / "model.safetensors"))
        n = cfg["num_hidden_layers"]
        self.main = DeepseekV4ForCausalLM.from_pretrained(
            str(checkpoint), dtype=torch.float32
        ).eval()

        prefix = "mtp.0."
        mtp = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        deeper = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
        for k, v in mtp.items():
            if k not in _BLOCK_OWN and k not in _HC_HEAD:
                deeper[f"layers.{n}.{k}"] = v
        deeper_cfg = dict(cfg)
        deeper_cfg["num_hidden_layers"] = n + 1
        deeper_cfg["layer_types"] = [*cfg["layer_types"], "sliding_attention"]
        deeper_cfg["mlp_layer_types"] = [*cfg["mlp_layer_types"], "moe"]
        work.mkdir(parents=True, exist_ok=True)
        save_file(deeper, str(work / "model.safetensors"), metadata={"format": "pt"})
        (work / "config.json").write_text(json.dumps(deeper_cfg))
        model = DeepseekV4ForCausalLM.from_pretrained(str(work), dtype=torch.float32).eval()
        self.layer = model.model.layers[n]
        self.config = model.config
        # The conversion must have put the block's tensors where the layer reads them.
        assert torch.equal(self.layer.self_attn.q_a_proj.weight, mtp["attn.wq_a.weight"])
        assert torch.equal(self.layer.mlp.gate.e_score_correction_bias, mtp["ffn.gate.bias"])
        assert torch.equal(
            self.layer.mlp.experts.gate_up_proj[1, : cfg["moe_intermediate_size"]],
            mtp["ffn.experts.1.w1.weight"],
        )

        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.enorm = DeepseekV4RMSNorm(h, eps=eps)
        self.hnorm = DeepseekV4RMSNorm(h, eps=eps)
        self.norm = DeepseekV4RMSNorm(h, eps=eps)
        self.e_proj = torch.nn.Linear(h, h, bias=False)
        self.h_proj = torch.nn.Linear(h, h, bias=False)
        self.hc_head = DeepseekV4HyperHead(self.config)
        with torch.no_grad():
            for module, name in [
                (self.enorm, "enorm"),
                (self.hnorm, "hnorm"),
                (self.norm, "norm"),
                (self.e_proj, "e_proj"),
                (self.h_proj, "h_proj"),
            ]:
                module.weight.copy_(mtp[f"{name}.weight"])
            self.hc_head.hc_fn.copy_(mtp["hc_head_fn"])
            self.hc_head.hc_base.copy_(mtp["hc_head_base"])
            self.hc_head.hc_scale.copy_(mtp["hc_head_scale"])
        self.router_margin = float("inf")

    @torch.no_grad()
    def main_forward(self, tokens: Sequence[int]) -> tuple[np.ndarray, torch.Tensor]:
        """The main model's logits [S, V] and the HC trunk its head collapses [S, N, H]."""
        seen: list[torch.Tensor] = []
        hook = self.main.model.hc_head.register_forward_pre_hook(
            lambda module, args: seen.append(args[0].detach().clone())
        )
        try:
            out = self.main(input_ids=torch.tensor([list(tokens)]), use_cache=False)
        finally:
            hook.remove()
        return out.logits[0].float().numpy(), seen[0][0]

    @torch.no_grad()
    def block(
        self, hidden: torch.Tensor, next_tokens: Sequence[int]
    ) -> tuple[np.ndarray, torch.Tensor]:
        """One-shot pass over positions 0..S-1: hidden [S, N, H] is the trunk at p, next_tokens
        the token at p + 1. Returns logits [S, V] (for the token at p + 2) and the block's trunk
        [S, N, H]."""
        ids = torch.tensor([list(next_tokens)])
        e = self.enorm(self.main.model.embed_tokens(ids))  # [1, S, H]
        x = self.e_proj(e).unsqueeze(2) + self.h_proj(self.hnorm(hidden.unsqueeze(0)))
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        rotary = self.main.model.rotary_emb
        position_embeddings = {
            "main": rotary(e, position_ids=pos, layer_type="main"),
            "compress": rotary(e, position_ids=pos, layer_type="compress"),
        }
        mask = create_sliding_window_causal_mask(
            config=self.config,
            inputs_embeds=e,
            attention_mask=None,
            past_key_values=None,
            position_ids=pos,
        )
        hook = self.layer.mlp.gate.register_forward_hook(self._on_router)
        try:
            x = self.layer(
                x,
                position_embeddings=position_embeddings,
                position_ids=pos,
                attention_mask=mask,
                input_ids=ids,
                past_key_values=None,
            )
        finally:
            hook.remove()
        logits = self.main.lm_head(self.norm(self.hc_head(x)))
        return logits[0].float().numpy(), x[0]

    def draft(
        self, hidden: torch.Tensor, next_tokens: Sequence[int], num_drafts: int
    ) -> tuple[list[int], np.ndarray]:
        """Greedy drafts: the block over the prompt drafts from its last row; each further step
        appends (the previous step's trunk at the last row, the previous draft) at the next
        position. The pass is causal, so re-running it one-shot over the longer input equals an
        incremental step with a cache. Returns the drafts and their logits [num_drafts, V]."""
        tokens, rows = list(next_tokens), []
        logits, out = self.block(hidden, tokens)
        drafts = [int(np.argmax(logits[-1]))]
        rows.append(logits[-1])
        while len(drafts) < num_drafts:
            hidden = torch.cat([hidden, out[-1:]], dim=0)
            tokens.append(drafts[-1])
            logits, out = self.block(hidden, tokens)
            drafts.append(int(np.argmax(logits[-1])))
            rows.append(logits[-1])
        return drafts, np.stack(rows)

    def _on_router(self, module, args, out) -> None:
        """Smallest relative gap between the last chosen and the first rejected routing score:
        a near-tie could let two summation orders pick different experts."""
        scores = F.softplus(out[0].float()).sqrt() + module.e_score_correction_bias
        v = scores.sort(dim=-1, descending=True).values
        k = self.config.num_experts_per_tok
        gap = (v[:, k - 1] - v[:, k]) / v.abs().max(dim=-1).values.clamp_min(1e-30)
        self.router_margin = min(self.router_margin, float(gap.min()))
