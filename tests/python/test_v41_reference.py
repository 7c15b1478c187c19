"""Self-consistency and role tests of the hand-written DeepSeek-V4.1 reference (v41_reference.py).

There is no independent V4.1 oracle, so these tests check what the spec (model.md section C) pins:
incremental decoding equals one-shot, YOCO ``mask`` equals ``compact`` (and the truncation drift
against ``off`` is printed), every layer role is wired to the source the spec names (each test
perturbs one source and checks who changes and who does not), the Engram hash and placement,
the shifted-mHC timing, and the checkpoint names of model.md C.9. CPU, a few seconds.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
import v41_reference as ref

CONFIGS = list(ref.TINY_CONFIGS)
PROMPT_LEN = 40
SCHEDULE = [13, 9, 1, 1, 1, 1, 1, 20 - 7]  # 40 tokens in chunks
SEED = 0

_models: dict = {}
DRIFT: dict = {}


# Tiny torch ops on one thread (conftest.py).
pytestmark = pytest.mark.usefixtures("torch_one_thread")


def model(name: str) -> ref.V41Model:
    if name not in _models:
        _models[name] = ref.V41Model(ref.TINY_CONFIGS[name], seed=SEED)
    return _models[name]


def prompt(name: str, n: int = PROMPT_LEN) -> list[int]:
    return ref.random_tokens(n, ref.TINY_CONFIGS[name].vocab_size, SEED + 11)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def traced(m: ref.V41Model, tokens, mode: str = "off") -> dict:
    tr: dict = {}
    m.forward(tokens, yoco_mode=mode, trace=tr)
    return tr


def perturbed(m: ref.V41Model, name: str, fn) -> ref.V41Model:
    m2 = copy.deepcopy(m)
    with torch.no_grad():
        p = dict(m2.named_parameters())[name]
        p.copy_(fn(p.clone()))
    return m2


def fresh_random(p: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(p.shape, generator=g) * p.std()


# ---------------------------------------------------------------------------------------------
# Config


def test_flash_config_derived_roles():
    """V4.1-Flash's text_config gives model.md B.3/C.2's derived maps."""
    c = ref.V41_FLASH
    c.validate()  # includes the Engram prime chain against engram_num_embeddings
    assert c.n_prefill_layer == 20 and c.rms_norm_eps == 1e-20 and len(c.compress_ratios) == 43
    kv = {layer: c.kv_source(layer) for layer in range(40)}
    assert [kv[i] for i in (0, 1, 2, 7, 8, 13, 14, 19, 20, 39)] == [
        None, None, 2, 2, 8, 8, 14, 14, 20, 20,
    ]  # fmt: skip
    idx = [c.index_source(i) for i in (2, 7, 8, 19, 20, 23, 24, 27, 28, 35, 36, 39)]
    assert idx == [2, 2, 8, 14, 20, 20, 24, 24, 28, 32, 36, 36]
    assert [c.index_k_source(i) for i in (24, 36, 14)] == [20, 20, 14]
    assert [i for i in range(40) if c.uses_candidates(i)] == [24, 28, 32, 36]
    assert c.layer_rope(1) == (10000.0, None) and c.layer_rope(2)[0] == 160000.0
    assert c.layer_rope(30)[1]["factor"] == 16.0
    hf = c.to_hf_config()
    assert hf["model_type"] == "deepseek_v41"
    assert hf["text_config"]["kv_source_layer_ids"] == [2, 8, 14, 20]
    assert "yoco_keep_tokens" not in hf["text_config"]


def test_engram_primes_and_multipliers():
    c = ref.V41_FLASH
    primes, offsets = ref.engram_primes(c)
    flat = torch.cat([p.flatten() for p in primes]).tolist()
    assert len(set(flat)) == len(flat) == 48 and min(flat) > c.engram_vocab_size - 1
    assert flat == sorted(flat) and all(ref.is_prime(p) for p in flat[:3])
    assert [int(p.sum()) for p in primes] == list(c.engram_num_embeddings)
    assert offsets[0][0, 0] == 0 and offsets[0][0, 1] == primes[0][0, 0]
    bound = (ref.INT64_MAX // c.engram_compressed_vocab_size) // 2
    for layer in c.engram_layer_ids:
        m = ref.engram_multipliers(c, layer)
        assert len(m) == 4 and all(x % 2 == 1 and 0 < x <= 2 * bound + 1 for x in m)
        assert max(m) * (c.engram_compressed_vocab_size - 1) < 2**63
        assert m == ref.engram_multipliers(c, layer)
    assert ref.engram_multipliers(c, 1) != ref.engram_multipliers(c, 14)


# ---------------------------------------------------------------------------------------------
# Checkpoint names (model.md C.9)


def expected_names(cfg: ref.V41TextConfig) -> set[str]:
    names = {"embed.weight", "head.weight", "norm.weight"}
    for layer in range(cfg.num_hidden_layers):
        p = f"layers.{layer}."
        names |= {p + "attn_norm.weight", p + "ffn_norm.weight"}
        names |= {f"{p}hc_{a}_{b}" for a in ("attn", "ffn") for b in ("fn", "base", "scale")}
        for w in ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm", "wo_a", "wo_b"):
            names.add(f"{p}attn.{w}.weight")
        names |= {p + "attn.attn_sink", p + "ffn.gate.weight", p + "ffn.gate.bias"}
        names.add(p + "ffn.gate.bias_vl")
        for w in ("w1", "w2", "w3"):
            names.add(f"{p}ffn.shared_experts.{w}.weight")
            names |= {f"{p}ffn.experts.{e}.{w}.weight" for e in range(cfg.n_routed_experts)}
        if layer in cfg.kv_source_layer_ids:
            names |= {p + "attn.compressor.wkv.weight", p + "attn.compressor.norm.weight"}
            if cfg.compress_ratios[layer] == 2:
                names.add(p + "attn.compressor.wgate.weight")
        if layer in cfg.index_source_layer_ids:
            names |= {p + "attn.indexer.wq_b.weight", p + "attn.indexer.weights_proj.weight"}
            if layer in cfg.kv_source_layer_ids:
                names |= {p + "attn.indexer.wk.weight", p + "attn.indexer.k_norm.weight"}
        if layer in cfg.engram_layer_ids:
            names |= {p + "engram.embed.weight", p + "engram.wkv.weight"}
            names |= {p + "engram.q_weight", p + "engram.k_weight"}
    return names


@pytest.mark.parametrize("name", CONFIGS)
def test_checkpoint_names_and_shapes(name):
    cfg, m = ref.TINY_CONFIGS[name], model(name)
    sd = m.state_dict()
    assert set(sd) == expected_names(cfg)
    assert not any("hc_head" in k for k in sd)
    h, d, nh, g = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.o_groups
    n, hi, di = cfg.hc_mult, cfg.index_n_heads, cfg.index_head_dim
    src = cfg.kv_source_layer_ids[0]
    want = {
        "layers.0.hc_attn_fn": (24 if n == 4 else (2 + n) * n, n * h),
        "layers.0.attn.wq_b.weight": (nh * d, cfg.q_lora_rank),
        "layers.0.attn.wo_a.weight": (g * cfg.o_lora_rank, nh * d // g),
        "layers.0.attn.wo_b.weight": (h, g * cfg.o_lora_rank),
        f"layers.{src}.attn.compressor.wkv.weight": (d, h),
        f"layers.{src}.attn.indexer.wq_b.weight": (hi * di, cfg.q_lora_rank),
        f"layers.{src}.attn.indexer.weights_proj.weight": (hi, h),
        f"layers.{src}.attn.indexer.wk.weight": (di, d),
    }
    for layer, rows in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings, strict=True):
        e_dim = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads * cfg.engram_head_dim
        want[f"layers.{layer}.engram.embed.weight"] = (rows, cfg.engram_head_dim)
        want[f"layers.{layer}.engram.wkv.weight"] = ((n + 1) * h, e_dim)
        want[f"layers.{layer}.engram.q_weight"] = (n, h)
    for k, shape in want.items():
        assert tuple(sd[k].shape) == shape, k


def test_safetensors_round_trip(tmp_path):
    from safetensors.torch import load_file, save_file

    m = model("B")
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, tmp_path / "m.safetensors")
    m2 = ref.V41Model(ref.TINY_CONFIGS["B"], seed=99)
    m2.load_state_dict(load_file(tmp_path / "m.safetensors"))
    toks = prompt("B", 12)
    assert torch.equal(m(toks), m2(toks))


# ---------------------------------------------------------------------------------------------
# Incremental == one-shot, YOCO truncation


@pytest.mark.parametrize("name", CONFIGS)
def test_incremental_equals_one_shot(name):
    m, toks = model(name), prompt(name)
    one = m(toks)
    assert torch.isfinite(one).all()
    cache, rows, pos = m.new_cache(), [], 0
    for n in SCHEDULE:
        rows.append(m.forward_chunk(cache, toks[pos : pos + n]))
        pos += n
    assert rel_err(torch.cat(rows), one) <= 1e-5
    cache = m.new_cache()
    tbt = torch.cat([m.forward_chunk(cache, [t]) for t in toks])
    assert rel_err(tbt, one) <= 1e-5
    # A prefix run agrees on the shared rows (causality).
    assert rel_err(m(toks[:23]), one[:23]) <= 1e-5


@pytest.mark.parametrize("name", CONFIGS)
def test_yoco_mask_equals_compact(name):
    cfg, m, toks = ref.TINY_CONFIGS[name], model(name), prompt(name)
    off, mask = m(toks), m(toks, yoco_mode="mask")
    cache = m.new_cache("compact")
    compact = m.forward_chunk(cache, toks)
    kept = ~compact.isnan().any(-1)
    if cfg.n_prefill_layer is None:
        assert kept.all() and torch.equal(mask, off) and torch.equal(compact, off)
    else:
        assert int(kept.sum()) == cfg.yoco_keep_tokens and kept[-cfg.yoco_keep_tokens :].all()
    assert rel_err(compact[kept], mask[kept]) <= 1e-6
    b = cfg.n_prefill_layer
    if b is not None:
        # The boundary layer's C1 entries (and index K) still cover every token (C.6).
        full = m.new_cache()
        m.forward_chunk(full, toks)
        assert cache.comp_kv[b].shape[0] == len(toks)
        assert rel_err(cache.comp_kv[b], full.comp_kv[b]) <= 1e-6
        assert rel_err(cache.index_k[b], full.index_k[b]) <= 1e-6
        # Chunked prefill: the rows compact computes agree with mask.
        c2, m2 = m.new_cache("compact"), m.new_cache("mask")
        for lo, hi in ((0, 25), (25, len(toks))):
            a, w = m.forward_chunk(c2, toks[lo:hi]), m.forward_chunk(m2, toks[lo:hi])
            k = ~a.isnan().any(-1)
            assert k.any() and rel_err(a[k], w[k]) <= 1e-6
    # Decoding after a truncated prefill: compact and mask caches keep agreeing.
    mcache = m.new_cache("mask")
    m.forward_chunk(mcache, toks)
    more = prompt(name, PROMPT_LEN + 4)[PROMPT_LEN:]
    for t in more:
        assert rel_err(m.forward_chunk(cache, [t]), m.forward_chunk(mcache, [t])) <= 1e-6
    drift = (mask[kept] - off[kept]).abs()
    scale = float(off.abs().max())
    DRIFT[name] = (float(drift.max()) / scale, float(drift[-1].max()) / scale)
    assert math.isfinite(DRIFT[name][0])
    print(
        f"\n[{name}] YOCO truncation drift vs off (keep={cfg.yoco_keep_tokens}, S={len(toks)}): "
        f"max over kept rows {DRIFT[name][0]:.3e}, last row {DRIFT[name][1]:.3e} (x max|logit|)"
    )


@pytest.mark.parametrize("mode", ["mask", "compact"])
@pytest.mark.parametrize("name", CONFIGS)
def test_yoco_chunked_prefill_naming_its_end_equals_one_shot(name, mode):
    """Chunks that name the prefill's end keep the same rectangle as one-shot prefill (engine.md
    6.3), whether a chunk boundary lies before, inside or at the start of the kept positions."""
    cfg, m, toks = ref.TINY_CONFIGS[name], model(name), prompt(name)
    one = m(toks, yoco_mode=mode)
    kept = ~one.isnan().any(-1)
    first_kept = len(toks) - cfg.yoco_keep_tokens
    for cuts in ((10,), (first_kept,), (first_kept + 3,), (5, first_kept - 2, len(toks) - 1)):
        cache, rows, lo = m.new_cache(mode), [], 0
        for hi in (*cuts, len(toks)):
            rows.append(m.forward_chunk(cache, toks[lo:hi], prompt_end=len(toks)))
            lo = hi
        chunked = torch.cat(rows)
        assert torch.equal(chunked.isnan(), one.isnan()), cuts
        assert rel_err(chunked[kept], one[kept]) <= 1e-5, cuts


def test_yoco_truncation_is_exercised():
    for name in CONFIGS:
        if name not in DRIFT:
            test_yoco_mask_equals_compact(name)
    assert max(d[0] for d in DRIFT.values()) > 1e-3


# ---------------------------------------------------------------------------------------------
# Roles. Perturbations of cache entries happen between two layers of the second chunk, through a
# wrapper of V41Model.attention, so only the layers after the perturbation can see them.


def run_with_poke(m, toks, split, at_layer, poke):
    """Two chunks; in the second, ``poke(cache)`` runs just before layer ``at_layer``'s
    attention. Returns the trace of the second chunk."""
    m = copy.copy(m)
    cache = m.new_cache()
    m.forward_chunk(cache, toks[:split])
    inner = ref.V41Model.attention.__get__(m)

    def attention(layer, *args):
        if layer == at_layer and poke is not None:
            poke(cache)
        return inner(layer, *args)

    m.attention = attention
    tr: dict = {}
    m.forward_chunk(cache, toks[split:], trace=tr)
    return tr


def noise(key, layer):
    def poke(cache):
        d = getattr(cache, key)
        g = torch.Generator().manual_seed(5)
        d[layer] = d[layer] + torch.randn(d[layer].shape, generator=g)

    return poke


def test_share_kv_readers_read_their_source():
    """TINY_A: layer 3 reads layer 2's C2 entries, layer 7 reads layer 6's C1 entries; neither
    reads a later source; a reader owns no compressor."""
    m, toks = model("A"), prompt("A")
    base = run_with_poke(m, toks, 30, 3, None)
    for reader, src, other in ((3, 2, 4), (5, 4, 2), (7, 6, 4), (9, 6, 4)):
        assert m.layers[reader].attn.compressor is None
        assert ref.TINY_A.kv_source(reader) == src
        hit = run_with_poke(m, toks, 30, reader, noise("comp_kv", src))
        miss = run_with_poke(m, toks, 30, reader, noise("comp_kv", other))
        assert torch.equal(hit[f"attn.{reader - 1}"], base[f"attn.{reader - 1}"])
        assert rel_err(hit[f"attn.{reader}"], base[f"attn.{reader}"]) > 1e-3
        assert torch.equal(miss[f"attn.{reader}"], base[f"attn.{reader}"])


def test_share_index_and_index_k_sources():
    """Readers reuse their index source's top-k set (perturbing index K no longer matters to
    them); an index source that owns no wk scores with its index-K source's keys."""
    cfg, m, toks = ref.TINY_A, model("A"), prompt("A")
    tr = traced(m, toks)
    for reader, src in ((3, 2), (5, 4), (7, 6), (9, 8)):
        assert cfg.index_source(reader) == src and m.layers[reader].attn.indexer is None
        assert torch.equal(tr[f"sel.{reader}"], tr[f"sel.{src}"])
    # Sparse at this length: fewer selected than visible entries.
    assert (tr["sel.2"].sum(1) == cfg.index_topk).any() and (tr["sel.2"].sum(1).max() <= 4)
    base = run_with_poke(m, toks, 30, 7, None)
    assert torch.equal(run_with_poke(m, toks, 30, 7, noise("index_k", 6))["attn.7"], base["attn.7"])
    # Layer 8 owns wq_b/weights_proj but no wk: its scores use layer 6's index K.
    assert m.layers[8].attn.indexer.wk is None and m.layers[6].attn.indexer.wk is not None
    hit = run_with_poke(m, toks, 30, 8, noise("index_k", 6))
    miss = run_with_poke(m, toks, 30, 8, noise("index_k", 4))
    assert not torch.equal(hit["score.8"], base["score.8"])
    assert torch.equal(miss["score.8"], base["score.8"])
    # Index K is wk + k_norm on the *pre-RoPE* normed entries, RoPE'd at j*ratio.
    cache = m.new_cache()
    m.forward_chunk(cache, toks)
    ix, inv = m.layers[6].attn.indexer, m.inv_freq[6]
    j = torch.arange(cache.comp_pre[6].shape[0])
    want = ref.apply_rope(ix.k_norm(ix.wk(cache.comp_pre[6])), j, inv)
    assert torch.allclose(cache.index_k[6], want, atol=1e-6)


def test_compressor_entries():
    """C2: entry j = norm(sum over tokens 2j, 2j+1 of per-channel softmax(wgate) * wkv), RoPE at
    2j; C1: one entry per token."""
    m, toks = model("A"), prompt("A", 21)
    tr, cache = {}, m.new_cache()
    m.forward_chunk(cache, toks, trace=tr)
    blk = m.layers[2]
    xn = blk.attn_norm(tr["y.4"])
    comp = blk.attn.compressor
    sc, lat = comp.wgate(xn), comp.wkv(xn)
    assert cache.comp_kv[2].shape[0] == 10  # 21 tokens: 10 complete pairs
    for j in (0, 4, 9):
        a = torch.softmax(sc[2 * j : 2 * j + 2], dim=0)
        pre = comp.norm((a * lat[2 * j : 2 * j + 2]).sum(0))
        assert torch.allclose(cache.comp_pre[2][j], pre, atol=1e-5)
        want = ref.apply_rope(pre, torch.tensor(2 * j), m.inv_freq[2])
        assert torch.allclose(cache.comp_kv[2][j], want, atol=1e-5)
    xn6 = m.layers[6].attn_norm(tr["y.12"])
    c6 = m.layers[6].attn.compressor
    assert c6.wgate is None and cache.comp_kv[6].shape[0] == 21
    assert torch.allclose(cache.comp_pre[6], c6.norm(c6.wkv(xn6)), atol=1e-5)


@pytest.mark.parametrize("name", ["A", "B", "C"])
def test_candidate_blocks_restrict_later_index_sources(name):
    cfg, m, toks = ref.TINY_CONFIGS[name], model(name), prompt(name)
    c = cfg.candidate_source_layer_id
    restricted = [i for i in cfg.index_source_layer_ids if i > c]
    tr = traced(m, toks)
    free_model = copy.copy(m)
    free_model.cfg = replace(cfg, candidate_source_layer_id=None)
    free = traced(free_model, toks)
    assert torch.equal(tr[f"sel.{c}"], free[f"sel.{c}"])  # the source itself scans everything
    cand, score = tr[f"cand.{c}"], tr[f"score.{c}"]
    ratio, bs = cfg.compress_ratios[c], cfg.candidate_block_size
    # Recompute the candidate blocks of each row from the source's scores.
    for r, p in enumerate(range(len(toks))):
        n_vis = (p + 1) // ratio
        blocks = [(max(score[r, b : min(b + bs, n_vis)].tolist()), b) for b in range(0, n_vis, bs)]
        blocks.sort(key=lambda x: (-x[0], x[1]))
        want = {
            j for _, b in blocks[: cfg.candidate_topk_blocks] for j in range(b, min(b + bs, n_vis))
        }
        assert set(cand[r].nonzero().flatten().tolist()) == want
    assert (cand.sum(1) < (torch.arange(len(toks)) + 1) // ratio).any()  # not a no-op
    for layer in restricted:
        sel = tr[f"sel.{layer}"]
        assert not (sel & ~cand).any()  # chosen inside the candidates only
        assert not torch.equal(sel, free[f"sel.{layer}"])  # and that changes the choice
    # With every block a candidate the restriction is a no-op.
    all_model = copy.copy(m)
    all_model.cfg = replace(cfg, candidate_topk_blocks=len(toks))
    everything = traced(all_model, toks)
    for layer in restricted:
        assert torch.equal(everything[f"sel.{layer}"], free[f"sel.{layer}"])


def test_engram_rows_depend_on_last_ngram():
    for name in ("A", "B"):
        cfg, m = ref.TINY_CONFIGS[name], model(name)
        layer, n = cfg.engram_layer_ids[-1], cfg.engram_max_ngram_size
        i = cfg.engram_layer_ids.index(layer)
        toks = prompt(name, 12)
        t = 9
        rows = m.engram_rows(layer, toks, [t])[0]
        assert rows.numel() == (n - 1) * cfg.engram_n_heads
        lo = m.engram_offsets[i].flatten()
        assert ((rows >= lo) & (rows < lo + m.engram_primes[i].flatten())).all()
        by_cid: dict = {}
        for tok, cid in enumerate(m.token_map):
            by_cid.setdefault(cid, []).append(tok)
        for back in range(n + 2):
            other = list(toks)
            cid = m.token_map[toks[t - back]]
            other[t - back] = next(x for x in range(cfg.vocab_size) if m.token_map[x] != cid)
            changed = m.engram_rows(layer, other, [t])[0] != rows
            per_order = changed.view(n - 1, cfg.engram_n_heads).any(1).tolist()
            # order k+2 (index k) hashes ids t..t-k-1: a change at t-back hits orders > back-1.
            assert per_order == [k + 1 >= back for k in range(n - 1)], (name, back)
            same = [x for x in by_cid[cid] if x != toks[t - back]]
            if same:  # a token with the same compressed id changes nothing
                other[t - back] = same[0]
                assert torch.equal(m.engram_rows(layer, other, [t])[0], rows)
        # Before the start the n-gram is padded with the pad token's compressed id.
        pad = [cfg.engram_pad_token_id] * n
        assert torch.equal(
            m.engram_rows(layer, pad + toks[:2], [n + 1])[0], m.engram_rows(layer, toks[:2], [1])[0]
        )


@pytest.mark.parametrize("name", CONFIGS)
def test_engram_acts_before_its_layers_attention(name):
    """Zeroing an Engram layer's wkv leaves every sub-layer input before that layer's attention
    unchanged and changes that one."""
    cfg, m, toks = ref.TINY_CONFIGS[name], model(name), prompt(name, 16)
    base = traced(m, toks)
    for layer in cfg.engram_layer_ids:
        off = traced(perturbed(m, f"layers.{layer}.engram.wkv.weight", torch.zeros_like), toks)
        for k in range(2 * layer):
            assert torch.equal(off[f"y.{k}"], base[f"y.{k}"])
        assert rel_err(off[f"y.{2 * layer}"], base[f"y.{2 * layer}"]) > 1e-3


@pytest.mark.parametrize("name", ["A", "B"])
def test_shifted_mhc_pre_reaches_the_next_sub_layer(name):
    """Sub-layer k's pre-mix parameters (first N of its hc base) change sub-layer k+1's input,
    not its own; the last FFN's pre only changes the final collapse; y_0 is stream 0."""
    cfg, m, toks = ref.TINY_CONFIGS[name], model(name), prompt(name, 16)
    n, last = cfg.hc_mult, 2 * cfg.num_hidden_layers - 1
    base = traced(m, toks)
    assert torch.equal(base["y.0"], base["trunk.0"][:, 0])

    def bump(p):
        p[:n] += torch.linspace(-1.0, 1.0, n)
        return p

    for k in (1, 2, 5, last):
        part = "attn" if k % 2 == 0 else "ffn"
        tr = traced(perturbed(m, f"layers.{k // 2}.hc_{part}_base", bump), toks)
        for j in range(k + 1):
            assert torch.equal(tr[f"y.{j}"], base[f"y.{j}"]), (k, j)
        nxt = tr[f"y.{k + 1}"] if k < last else tr["h"]
        ref_nxt = base[f"y.{k + 1}"] if k < last else base["h"]
        assert rel_err(nxt, ref_nxt) > 1e-4, k
    # The post/comb part acts at once: it changes the very next input too, not its own.
    tr = traced(perturbed(m, "layers.1.hc_attn_base", lambda p: p + 0.5), toks)
    assert torch.equal(tr["y.2"], base["y.2"]) and rel_err(tr["y.3"], base["y.3"]) > 1e-4


def test_moe_routing():
    m = model("A")
    moe = m.layers[3].ffn
    x = torch.randn(5, ref.TINY_A.hidden_size, generator=torch.Generator().manual_seed(3))
    idx, w = moe.route(x)
    cfg = ref.TINY_A
    assert torch.allclose(w.sum(-1), torch.full((5,), cfg.routed_scaling_factor))
    scores = torch.sqrt(torch.nn.functional.softplus(x @ moe.gate.weight.T))
    moe2 = copy.deepcopy(moe)
    with torch.no_grad():
        moe2.gate.bias[6] = 100.0  # the bias selects ...
    idx2, w2 = moe2.route(x)
    assert (idx2 == 6).any(-1).all()
    sel = scores.gather(1, idx2)  # ... but the weights come from the unbiased scores
    assert torch.allclose(w2, sel / sel.sum(-1, keepdim=True) * cfg.routed_scaling_factor)
    assert idx.shape == (5, cfg.num_experts_per_tok)
    # SwiGLU clamp: gate <= limit, up in [-limit, limit], so a huge input saturates.
    e, lim = moe.shared_experts, cfg.swiglu_limit
    big = x * 1e4
    want = e.w2(torch.nn.functional.silu(e.w1(big).clamp(max=lim)) * e.w3(big).clamp(-lim, lim))
    assert torch.allclose(moe.swiglu(e, big), want)


def test_rope_tables_follow_layer_roles():
    cfg, m = ref.TINY_A, model("A")
    plain = ref.rope_inv_freq(cfg.rope_theta, cfg.qk_rope_head_dim, None)
    assert torch.equal(m.inv_freq[0], plain) and torch.equal(m.inv_freq[1], plain)
    yarn = ref.rope_inv_freq(cfg.compress_rope_theta, cfg.qk_rope_head_dim, cfg.rope_scaling)
    unscaled = ref.rope_inv_freq(cfg.compress_rope_theta, cfg.qk_rope_head_dim, None)
    for layer in range(2, 10):
        assert torch.equal(m.inv_freq[layer], yarn)
    assert not torch.equal(yarn, unscaled)  # YaRN bites at these sizes
    v = torch.randn(3, 32)
    back = ref.apply_rope(ref.apply_rope(v, torch.arange(3), yarn), torch.arange(3), yarn, True)
    assert torch.allclose(back, v, atol=1e-6) and torch.equal(
        ref.apply_rope(v, torch.arange(3), yarn)[:, :24], v[:, :24]
    )
