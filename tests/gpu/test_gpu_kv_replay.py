"""kv_window_state bounded_replay on the CUDA backend (docs/kv_store.md, "Window state on a hit"):
a store hit of 512 tokens recomputes the 128 tokens before it with every sliding window clamped
to the replay start (AttentionSpec::swa_start in prefill and decode) and keeps the stored
compressed entries. With a sliding window of 8 the replay covers everything the rings can reach,
so the hit must give the cold run's greedy tokens and, up to the GPU's chunk-shape rounding,
its log-probabilities; tests/python/test_kv_replay.py checks the same bit for bit on the CPU.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import deepinfer_core as dc
import pytest
from deepinfer.tiny import ensure_tiny_checkpoint

pytestmark = pytest.mark.gpu


def narrow_checkpoint(out: Path) -> Path:
    """The tiny checkpoint with a sliding window of 8 (same weights: the window is no tensor)."""
    out.mkdir()
    for f in Path(ensure_tiny_checkpoint()).iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    config["sliding_window"] = 8
    (out / "config.json").write_text(json.dumps(config))
    return out


def generate(engine: dc.Engine, prompt: list[int]) -> tuple[list[int], list[float], int]:
    params = dc.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    rid = engine.add_request(prompt, params)
    tokens, lps, hit = [], [], 0
    while engine.has_unfinished():
        for o in engine.step():
            if o.id == rid:
                tokens += o.tokens
                lps += [lp[0] for lp in o.logprobs]
                hit = o.prompt_cache_hit_tokens if o.ready else hit
    engine.step()
    return tokens, lps, hit


@pytest.mark.parametrize("kv", ["f32", "fp8"])
def test_gpu_bounded_replay_hit_equals_the_cold_run(tmp_path, kv: str) -> None:
    path = str(narrow_checkpoint(tmp_path / "narrow"))
    rng = random.Random(1)
    shared = [rng.randrange(2, 129000) for _ in range(600)]
    prompt = shared + [11, 12, 13]
    options = {"device": "cuda", "kv_cache_dtype": kv, "max_num_seqs": 2, "max_model_len": 1024}
    cold_tokens, cold_lps, _ = generate(
        dc.Engine(path, enable_prefix_cache=False, **options), prompt
    )
    store = {"kv_store_path": str(tmp_path / "store"), "kv_window_state": "bounded_replay"}
    writer = dc.Engine(path, **options, **store)
    generate(writer, shared + [99])
    writer.flush_kv_tiers()
    del writer
    reader = dc.Engine(path, **options, **store)  # a restart: the hit comes from the store
    tokens, lps, hit = generate(reader, prompt)
    stats = reader.stats()
    assert tokens == cold_tokens
    worst = max(abs(a - b) for a, b in zip(lps, cold_lps, strict=True))
    print(
        f"KV-REPLAY-GPU {kv}: hit {hit}, computed {stats['prompt_tokens_computed']}, "
        f"max |logprob - cold| {worst:.2e}"
    )
    assert hit == 512 and stats["kv_tier_fetch_failures"] == 0
    assert stats["prompt_tokens_computed"] == len(prompt) - 384  # replayed from 384
    assert worst < 1e-3
