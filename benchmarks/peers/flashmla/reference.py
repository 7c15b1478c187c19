"""Float32 torch references and the comparison rule of bench.py's correctness checks: FlashMLA's
sparse decode over dequantized caches and its sparse prefill (our own code, written against its
documented semantics: attention sink, invalid or out-of-length indices masked)."""

import torch

D_QK = 512
D_V = 512


def ref_decode(q, main, extra, sink, sm_scale):
    """Float32 torch reference on the dequantized caches: out [b,s_q,h,dv], lse [b,h,s_q]."""
    b, s_q, h_q, _ = q.shape
    gathered = []
    for scope in [main] + ([extra] if extra is not None else []):
        flat = scope.dequant.view(-1, D_QK)
        gathered.append(flat.index_select(0, scope.indices.view(-1).long()).view(b, s_q, -1, D_QK))
    kv = torch.cat(gathered, dim=2).float()  # [b, s_q, keys, d]
    logits = torch.einsum("bshd,bskd->bshk", q.float(), kv) * sm_scale
    lse = torch.logsumexp(logits, dim=-1)  # [b, s_q, h]
    out = torch.einsum("bshk,bskd->bshd", torch.exp(logits - lse.unsqueeze(-1)), kv[..., :D_V])
    out = out * (1.0 / (1.0 + torch.exp(sink.view(1, 1, h_q) - lse))).unsqueeze(-1)
    return out, lse.transpose(1, 2)


def ref_prefill(q, kv, indices, sm_scale, sink, topk_length):
    """Returns out [s_q,h,dv] fp32, max_logits [s_q,h], lse [s_q,h] (natural log)."""
    s_q, h_q, _ = q.shape
    s_kv = kv.shape[0]
    idx = indices.view(s_q, -1).long()
    topk = idx.shape[1]
    invalid = (idx < 0) | (idx >= s_kv)
    if topk_length is not None:
        invalid |= torch.arange(topk, device=idx.device).view(1, topk) >= topk_length.view(s_q, 1)
    g = (
        kv.view(s_kv, -1)
        .index_select(0, idx.clamp(0, s_kv - 1).view(-1))
        .view(s_q, topk, -1)
        .float()
    )
    logits = torch.einsum("shd,skd->shk", q.float(), g) * sm_scale
    logits.masked_fill_(invalid.view(s_q, 1, topk), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    max_logits = logits.max(dim=-1).values
    lse_o = torch.logaddexp(lse, sink.view(1, h_q))
    out = torch.einsum("shk,skd->shd", torch.exp(logits - lse_o.unsqueeze(-1)), g[..., :D_V])
    return out, max_logits, lse


def compare(name, got, ref, atol, rtol, min_cos):
    got = got.float()
    ref = ref.float()
    finite = torch.isfinite(ref)
    same_inf = (got == ref) | finite
    diff = (got - ref).abs()
    diff[~finite] = 0
    # NaN/inf in `got` where the reference is finite counts as bad (a NaN diff compares False).
    bad = ((diff > atol + rtol * ref.abs()) | ~torch.isfinite(got)) & finite
    diff = torch.nan_to_num(diff, nan=float("inf"))
    g, r = got[finite].double(), ref[finite].double()
    cos = float((g * r).sum() / (g.norm() * r.norm() + 1e-30)) if g.numel() else 1.0
    ok = bool(same_inf.all()) and int(bad.sum()) == 0 and cos >= min_cos
    return ok, {
        f"{name}_max_abs_err": float(diff.max()),
        f"{name}_num_bad": int(bad.sum()),
        f"{name}_cos": cos,
        f"{name}_inf_mismatch": int((~same_inf).sum()),
    }
