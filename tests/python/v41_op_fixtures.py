"""Prints the C++ literals of tests/cpp/test_cpu_v41_ops.cpp from the V4.1 torch reference.

Run: ``python3 tests/python/v41_op_fixtures.py`` (system python3 with torch and numpy). The
inputs are exact binary fractions from ``pat`` (the C++ test computes the same formula), so both
sides start from identical fp32 values; every expected value comes from a function of
``v41_reference.py`` (``V41Model.hc_mix``, ``engram_rows``, ``engram``, ``compress``,
``select``, ``engram_primes``, ``engram_multipliers``), called on a stand-in ``self`` that holds
only what the method reads.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import v41_reference as ref


def pat(i: int, a: int, b: int) -> float:
    """((i*a + b) mod 97 - 48) / 64: exact in fp32, the same formula as the C++ test's."""
    return ((i * a + b) % 97 - 48) / 64.0


def pats(n: int, a: int, b: int, shape) -> torch.Tensor:
    return torch.tensor([pat(i, a, b) for i in range(n)], dtype=torch.float32).view(*shape)


def cpp_float(v: float) -> str:
    s = f"{v:.9g}"
    return (s if any(c in s for c in ".e") else s + ".0") + "f"


def cpp_floats(name: str, t: torch.Tensor) -> str:
    vals = ", ".join(cpp_float(v) for v in t.flatten().tolist())
    return f"const std::vector<float> {name} = {{{vals}}};"


def cpp_ints(name: str, t, kind: str = "int32_t") -> str:
    vals = ", ".join(str(int(v)) for v in (t.flatten().tolist() if torch.is_tensor(t) else t))
    return f"const std::vector<{kind}> {name} = {{{vals}}};"


def shifted_hc() -> None:
    """Two shifted sub-layers and the final collapse (C.4): T 2, N 4, H 2."""
    t, n, h = 2, 4, 2
    cfg = SimpleNamespace(hc_mult=n, rms_norm_eps=1e-20, hc_eps=1e-6, hc_sinkhorn_iters=20)
    model = SimpleNamespace(cfg=cfg)
    rows = (2 + n) * n
    block = SimpleNamespace(
        hc_attn_fn=pats(rows * n * h, 31, 7, (rows, n * h)),
        hc_attn_base=pats(rows, 13, 5, (rows,)),
        hc_attn_scale=torch.tensor([0.75, 1.25, 0.5]),
        hc_ffn_fn=pats(rows * n * h, 29, 3, (rows, n * h)),
        hc_ffn_base=pats(rows, 11, 17, (rows,)),
        hc_ffn_scale=torch.tensor([1.5, 0.625, 1.0]),
    )
    emb = pats(t * h, 37, 11, (t, h))
    outs = [pats(t * h, 23, 41, (t, h)), pats(t * h, 19, 2, (t, h))]
    trunk = emb[:, None, :].expand(t, n, h).clone()
    pre_prev = torch.zeros(t, n)
    pre_prev[:, 0] = 1.0  # C.4: the first sub-layer reads stream 0
    for k, part in enumerate(("attn", "ffn")):
        pre, post, comb = ref.V41Model.hc_mix(model, block, part, trunk)
        y = (pre_prev[..., None] * trunk).sum(1)  # forward_chunk's collapse
        print(cpp_floats(f"kWantPre{k}", pre))
        print(cpp_floats(f"kWantPost{k}", post))
        print(cpp_floats(f"kWantComb{k}", comb))
        print(cpp_floats(f"kWantY{k}", y))
        a = outs[k]  # stands in for the sub-block's output
        trunk = post[..., None] * a[:, None, :] + torch.einsum("sij,sih->sjh", comb, trunk)
        pre_prev = pre
    print(cpp_floats("kWantH", (pre_prev[..., None] * trunk).sum(1)))


def flash_hash() -> None:
    """V4.1-Flash's hash at layer 14 (4-grams, 8 heads) for two sequences near their start."""
    cfg = ref.V41_FLASH
    primes, offsets = ref.engram_primes(cfg)
    layer = 14
    i = cfg.engram_layer_ids.index(layer)
    token_map = [99091, 17, 31337, 50000, 12345, 0, 77777, 4242]
    model = SimpleNamespace(
        cfg=cfg,
        token_map=token_map,
        cpad=token_map[cfg.engram_pad_token_id],
        engram_mult={layer: ref.engram_multipliers(cfg, layer)},
        engram_primes=primes,
        engram_offsets=offsets,
    )
    print(cpp_ints("kFlashMult14", model.engram_mult[layer], "int64_t"))
    print(cpp_ints("kFlashPrimes14", primes[i], "int64_t"))
    seq_a = [5, 3, 0, 7, 1]  # positions 0..4: 1, 2, 3 then 4+ real tokens
    seq_b = [6, 2, 4, 1, 0, 3, 7]  # rows at positions 5, 6 only (a decode-like tail)
    rows_a = ref.V41Model.engram_rows(model, layer, seq_a, range(5))
    rows_b = ref.V41Model.engram_rows(model, layer, seq_b, [5, 6])
    print(cpp_ints("kFlashRows14", torch.cat((rows_a, rows_b))))


def tiny_engram() -> None:
    """Hash, lookup, wkv and gate of one tiny Engram layer: N 2, H 4, trigrams, 2 heads of 2."""
    n, h, layer = 2, 4, 1
    cfg = replace(
        ref.V41_FLASH,
        hidden_size=h,
        hc_mult=n,
        engram_layer_ids=(layer,),
        engram_max_ngram_size=3,
        engram_n_heads=2,
        engram_head_dim=2,
        engram_vocab_size=40,
        engram_compressed_vocab_size=48,
        engram_num_embeddings=(),
    )
    primes, offsets = ref.engram_primes(cfg)
    rows_total = int(primes[0].sum())
    token_map = [7, 45, 3, 0, 30, 12, 47, 21, 3, 9]
    eg = SimpleNamespace(
        embed=nn.Embedding(rows_total, 2),
        wkv=nn.Linear(2 * 2 * 2, (n + 1) * h, bias=False),
        q_weight=1.0 + pats(n * h, 7, 1, (n, h)) / 2,
        k_weight=1.0 + pats(n * h, 5, 9, (n, h)) / 2,
    )
    with torch.no_grad():
        eg.embed.weight.copy_(pats(rows_total * 2, 17, 3, (rows_total, 2)) * 2)
        eg.wkv.weight.copy_(pats((n + 1) * h * 8, 43, 6, ((n + 1) * h, 8)))
    model = SimpleNamespace(
        cfg=cfg,
        token_map=token_map,
        cpad=token_map[cfg.engram_pad_token_id],
        engram_mult={layer: ref.engram_multipliers(cfg, layer)},
        engram_primes=primes,
        engram_offsets=offsets,
        layers={layer: SimpleNamespace(engram=eg)},
    )
    model.engram_rows = lambda lay, toks, pos: ref.V41Model.engram_rows(model, lay, toks, pos)
    tokens = [4, 9, 1, 6]
    x = pats(4 * n * h, 41, 13, (4, n, h))
    print(cpp_ints("kTinyMult", model.engram_mult[layer], "int64_t"))
    print(cpp_ints("kTinyPrimes", primes[0], "int64_t"))
    print(cpp_ints("kTinyRows", model.engram_rows(layer, tokens, range(4))))
    with torch.no_grad():
        print(cpp_floats("kTinyGated", ref.V41Model.engram(model, layer, x, tokens, range(4))))


def compressor() -> None:
    """C2 and C1 kv-source compressors (C.3.3) over 4 tokens: H 6, D 4, rope on the last 2."""
    h, d, layer = 6, 4, 0
    xn = pats(4 * h, 53, 21, (4, h))
    inv = ref.rope_inv_freq(160000.0, 2, None)
    print(cpp_floats("kInvFreq", inv))
    for ratio in (2, 1):
        cfg = replace(ref.V41_FLASH, hidden_size=h, head_dim=d, compress_ratios=(ratio,))
        comp = ref.Compressor(cfg, ratio)
        with torch.no_grad():
            comp.wkv.weight.copy_(pats(d * h, 61, 4, (d, h)))
            if comp.wgate is not None:
                comp.wgate.weight.copy_(pats(d * h, 59, 30, (d, h)) * 2)
            comp.norm.weight.copy_(1.0 + pats(d, 3, 8, (d,)) / 4)
        model = SimpleNamespace(
            cfg=cfg,
            layers=[SimpleNamespace(attn=SimpleNamespace(compressor=comp, indexer=None))],
            inv_freq=[inv],
        )
        cache = SimpleNamespace(length=4, comp_in={}, comp_pre={}, comp_kv={}, index_k={})
        with torch.no_grad():
            ref.V41Model.compress(model, layer, xn, torch.arange(4), cache)
        print(cpp_floats(f"kWantPreC{ratio}", cache.comp_pre[layer]))
        print(cpp_floats(f"kWantKvC{ratio}", cache.comp_kv[layer]))


def coarse(n: int, a: int, b: int, shape) -> torch.Tensor:
    """(i*a + b) mod 5 - 2: small integers, so scores are exact and full of ties."""
    return torch.tensor([(i * a + b) % 5 - 2 for i in range(n)], dtype=torch.float32).view(*shape)


def index_sets(mask: torch.Tensor, width: int) -> list[int]:
    """Each row's selected indices, ascending, padded with -1 to ``width``."""
    out = []
    for row in mask:
        idx = torch.nonzero(row).flatten().tolist()
        assert len(idx) <= width
        out += idx + [-1] * (width - len(idx))
    return out


def candidates() -> None:
    """V41Model.select at TINY_A's candidate source (layer 6) and a restricted index source
    (layer 8): 2 index heads of 4, 20 entries, rows at positions 12..19, blocks of 3."""
    hi, di, s, t = 2, 4, 8, 20
    cfg = replace(
        ref.TINY_A,
        index_n_heads=hi,
        index_head_dim=di,
        index_topk=4,
        candidate_block_size=3,
        candidate_topk_blocks=3,
    )
    layers = {}
    for layer, (a, b) in ((6, (7, 1)), (8, (3, 4))):
        ix = SimpleNamespace(
            wq_b=nn.Linear(cfg.q_lora_rank, hi * di, bias=False),
            weights_proj=nn.Linear(cfg.hidden_size, hi, bias=False),
        )
        with torch.no_grad():
            ix.wq_b.weight.copy_(coarse(hi * di * cfg.q_lora_rank, a, b, (hi * di, -1)))
            ix.weights_proj.weight.copy_(coarse(hi * cfg.hidden_size, b, a, (hi, -1)))
        layers[layer] = SimpleNamespace(attn=SimpleNamespace(indexer=ix))
    zero_rope = torch.zeros(1)  # rotates the last 2 channels by 0: the C++ q is unroped
    model = SimpleNamespace(cfg=cfg, layers=layers, inv_freq={6: zero_rope, 8: zero_rope})
    cache = SimpleNamespace(
        comp_kv={6: torch.zeros(t, cfg.head_dim)}, index_k={6: coarse(t * di, 3, 2, (t, di))}
    )
    xn = coarse(s * cfg.hidden_size, 2, 0, (s, -1))
    qa = coarse(s * cfg.q_lora_rank, 4, 3, (s, -1)) / 4
    pos = torch.arange(12, 12 + s)
    shared, trace = {}, {}
    with torch.no_grad():
        sel6 = ref.V41Model.select(model, 6, xn, qa, pos, cache, shared, trace)
        sel8 = ref.V41Model.select(model, 8, xn, qa, pos, cache, shared, trace)
    print(cpp_ints("kWantTopk6", index_sets(sel6, cfg.index_topk)))
    print(cpp_ints("kWantCandEntries6", index_sets(shared["cand", 6], t)))
    print(cpp_ints("kWantTopk8", index_sets(sel8, cfg.index_topk)))
    for name in ("score.6", "score.8"):  # how tied the scores are, for the record
        print(f"// {name} distinct values per row:", [len(set(r.tolist())) for r in trace[name]])


if __name__ == "__main__":
    torch.set_printoptions(precision=9)
    for fixture in (shifted_hc, flash_hash, tiny_engram, compressor, candidates):
        print(f"// ---- {fixture.__name__}")
        fixture()
