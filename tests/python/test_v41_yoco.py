"""DeepSeek-V4.1's YOCO prefill truncation (engine.md 6.3, model.md C.6) in the engine (CPU, f32
KV) against the torch reference v41_reference.py run in the same mode, on the tiny configs with a
YOCO boundary (A and B; C has none, so its modes equal off).

* ModelRunner, one-shot and chunked prefill whose chunks name the prefill's end (chunk boundaries
  before, at and inside the kept positions): ``mask`` and ``compact`` logits equal the reference's
  within 1e-5 * max |logit| on the kept rows, and each other; compact reports the rows it dropped
  as NaN, like the reference.
* Greedy continuations under mask and compact equal the reference's in the same mode, through the
  runner and through the engine (chunked prefill, batching, a prefix-cache hit that the
  truncation shortens so that it ends before the kept positions).
* The option is validated: unknown modes, too small keep counts, non-V4.1 models.
"""

from __future__ import annotations

import numpy as np
import pytest
import quantized_kv_checks as qkv
import torch
import v41_reference as ref
from engine_helpers import assert_pools_full, cpu_engine, run_all
from runner_driver import RunnerDriver
from test_v41_parity import write_checkpoint

dc = pytest.importorskip("deepinfer_core")

REL_TOL = 1e-5
PROMPT_LEN = 40
MODES = ["mask", "compact"]
YOCO_CONFIGS = ["A", "B"]
# max_backtrack of the runners: keep >= sliding_window + max_backtrack (A: 12 >= 8 + 1, B: 7 >= 6
# + 1).
BACKTRACK = 1


# Tiny torch ops on one thread (conftest.py).
pytestmark = pytest.mark.usefixtures("torch_one_thread")


_models: dict = {}
_checkpoints: dict = {}
_drivers: dict = {}


def model(name: str) -> ref.V41Model:
    if name not in _models:
        _models[name] = ref.V41Model(ref.TINY_CONFIGS[name], seed=0)
    return _models[name]


def checkpoint(name: str, tmp_path_factory):
    if name not in _checkpoints:
        _checkpoints[name] = write_checkpoint(model(name), tmp_path_factory.mktemp(f"yoco_{name}"))
    return _checkpoints[name]


def driver(name: str, mode: str, tmp_path_factory) -> RunnerDriver:
    if (name, mode) not in _drivers:
        _drivers[name, mode] = RunnerDriver(
            str(checkpoint(name, tmp_path_factory)),
            max_seqs=2,
            max_len=PROMPT_LEN + 64,
            max_backtrack=BACKTRACK,
            yoco_prefill_truncation=mode,
            yoco_keep_tokens=ref.TINY_CONFIGS[name].yoco_keep_tokens,
        )
    return _drivers[name, mode]


def prompt(name: str, n: int = PROMPT_LEN, seed: int = 11) -> list[int]:
    return ref.random_tokens(n, ref.TINY_CONFIGS[name].vocab_size, seed)


def schedules(name: str) -> dict[str, list[int]]:
    """Chunk sizes of a PROMPT_LEN prefill: one shot, and boundaries before, at and inside the
    kept positions [PROMPT_LEN - keep, PROMPT_LEN)."""
    first = PROMPT_LEN - ref.TINY_CONFIGS[name].yoco_keep_tokens
    return {
        "one_shot": [PROMPT_LEN],
        "before": [first - 6, 6, PROMPT_LEN - first],  # the second chunk ends at the rectangle
        "at": [first, PROMPT_LEN - first],
        "inside": [5, first - 5 + 3, 1, PROMPT_LEN - first - 4],
    }


def reference_run(m: ref.V41Model, mode: str, tokens: list[int], schedule: list[int]) -> np.ndarray:
    cache, out, pos = m.new_cache(mode), [], 0
    for n in schedule:
        out.append(m.forward_chunk(cache, tokens[pos : pos + n], prompt_end=len(tokens)).numpy())
        pos += n
    return np.concatenate(out)


def assert_close_kept(ours: np.ndarray, want: np.ndarray, kept: np.ndarray, what: str) -> None:
    scale = float(np.abs(want[kept]).max())
    err = float(np.abs(ours[kept] - want[kept]).max())
    assert err <= REL_TOL * scale, f"{what}: max abs diff {err:.3e} > {REL_TOL} * {scale:.3e}"


@pytest.mark.parametrize("schedule", ["one_shot", "before", "at", "inside"])
@pytest.mark.parametrize("name", YOCO_CONFIGS)
def test_yoco_logits_match_reference(name: str, schedule: str, tmp_path_factory) -> None:
    cfg, m, tokens = ref.TINY_CONFIGS[name], model(name), prompt(name)
    sizes = schedules(name)[schedule]
    kept = np.arange(PROMPT_LEN) >= PROMPT_LEN - cfg.yoco_keep_tokens
    outs = {}
    for mode in MODES:
        ours = driver(name, mode, tmp_path_factory).run_schedule(
            tokens, sizes, prompt_end=PROMPT_LEN
        )
        want = reference_run(m, mode, tokens, sizes)
        # compact drops (NaN) exactly the rows before the kept positions; mask computes them all.
        assert np.array_equal(np.isnan(ours).any(-1), np.isnan(want).any(-1)), mode
        dropped = ~kept if mode == "compact" else np.zeros_like(kept)
        assert np.array_equal(np.isnan(ours).any(-1), dropped), mode
        assert_close_kept(ours, want, kept, f"config {name}, {schedule}, {mode} vs reference")
        outs[mode] = ours
    assert_close_kept(outs["compact"], outs["mask"], kept, f"config {name}, {schedule}")
    # Truncation is an approximation: off differs on the kept rows.
    off = model(name)(tokens).numpy()
    assert float(np.abs(outs["mask"][kept] - off[kept]).max()) > 1e-4 * np.abs(off).max()


@pytest.mark.parametrize("mode", MODES)
def test_yoco_narrowed_one_token_chunk_runs_eagerly_under_graphs(mode: str, tmp_path_factory):
    """Decode graphs (cpp/src/model/decode_graphs.h) carry no YOCO consumer rows. The "inside"
    schedule's one-token chunk wants its logits and is narrowed (its prefill ends later), so it
    must run eagerly; the decode steps after the prefill (never narrowed) replay graphs. On the
    CPU, which re-issues the recorded calls, every logit equals the eager runner's bitwise."""
    name = "A"
    tokens = prompt(name)
    sizes = schedules(name)["inside"]
    assert 1 in sizes

    def run(graphs: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        d = RunnerDriver(
            str(checkpoint(name, tmp_path_factory)),
            max_seqs=2,
            max_len=PROMPT_LEN + 64,
            max_backtrack=BACKTRACK,
            yoco_prefill_truncation=mode,
            yoco_keep_tokens=ref.TINY_CONFIGS[name].yoco_keep_tokens,
            decode_graph_max_batch=graphs,
        )
        prefill = d.run_schedule(tokens, sizes, prompt_end=PROMPT_LEN)
        prefill_calls = d.runner.decode_graph_stats()["num_calls"]
        out, decode = [int(np.argmax(prefill[-1]))], []
        for _ in range(4):
            chunk = d.chunk(0, PROMPT_LEN + len(out) - 1, [out[-1]])
            decode.append(d.runner.forward([chunk], logits="last"))
            out.append(int(np.argmax(decode[-1][0])))
        calls = d.runner.decode_graph_stats()["num_calls"]
        return prefill, np.concatenate(decode), prefill_calls, calls

    eager_prefill, eager_decode, _, eager_calls = run(0)
    prefill, decode, prefill_calls, calls = run(2)
    assert eager_calls == 0
    assert prefill_calls == 0, "the narrowed one-token chunk replayed a graph"
    assert calls == 4
    np.testing.assert_array_equal(prefill, eager_prefill)  # compact's dropped rows: NaN on both
    np.testing.assert_array_equal(decode, eager_decode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", YOCO_CONFIGS)
def test_yoco_runner_greedy_equals_reference(name: str, mode: str, tmp_path_factory) -> None:
    m, tokens = model(name), prompt(name)
    ours = driver(name, mode, tmp_path_factory).greedy(tokens, 10, slot=1)
    cache = m.new_cache(mode)
    logits = m.forward_chunk(cache, tokens)
    want = []
    for _ in range(10):
        want.append(int(torch.argmax(logits[-1])))
        logits = m.forward_chunk(cache, [want[-1]])
    assert ours == want


def greedy_reference(m: ref.V41Model, mode: str, prompt_ids: list[int], n: int) -> list[int]:
    cache = m.new_cache(mode)
    logits = m.forward_chunk(cache, prompt_ids)
    out = []
    for _ in range(n):
        out.append(int(torch.argmax(logits[-1])))
        logits = m.forward_chunk(cache, [out[-1]])
    return out


def yoco_engine(name: str, mode: str, tmp_path_factory, **options) -> dc.Engine:
    return cpu_engine(
        checkpoint(name, tmp_path_factory),
        yoco_prefill_truncation=mode,
        yoco_keep_tokens=ref.TINY_CONFIGS[name].yoco_keep_tokens,
        **options,
    )


GREEDY = dc.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.mark.parametrize("graphs", [0, 4], ids=["eager", "graphs"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", YOCO_CONFIGS)
def test_yoco_engine_greedy_equals_reference(
    name: str, mode: str, graphs: int, tmp_path_factory
) -> None:
    """Chunked prefill (16-token steps: chunks end before, at and inside the kept positions) and
    batching of three prompts; with decode graphs, the decode rows (never narrowed: keep >=
    sliding_window) replay them."""
    vocab = ref.TINY_CONFIGS[name].vocab_size
    ps = [ref.random_tokens(n, vocab, 100 + i) for i, n in enumerate([37, 21, 50])]
    engine = yoco_engine(
        name,
        mode,
        tmp_path_factory,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        decode_graph_max_batch=graphs,
    )
    outs, _ = run_all(engine, ps, GREEDY)
    assert outs == [greedy_reference(model(name), mode, p, 8) for p in ps]
    assert (engine.stats()["num_graph_steps"] > 0) == (graphs > 0)
    assert_pools_full(engine)


@pytest.mark.parametrize("mode", MODES)
def test_yoco_engine_prefix_hit_ends_before_the_kept_positions(mode: str, tmp_path_factory) -> None:
    """A hit never covers the last keep tokens: the consumer rings of another prompt's prefill
    (truncated at its own end) are never read, and a hit equals a cold run."""
    name = "A"
    keep = ref.TINY_CONFIGS[name].yoco_keep_tokens
    vocab = ref.TINY_CONFIGS[name].vocab_size
    shared = ref.random_tokens(300, vocab, 7)
    engine = yoco_engine(name, mode, tmp_path_factory)
    # Snapshots at 128 (a 200-token prompt's checkpoint) and 256.
    run_all(engine, [shared[:200], shared[:270] + [17]], GREEDY)
    # 300 tokens: the hit may end at 256 <= 300 - keep. 262: it must end at 128 < 262 - keep.
    for n, hit in ((300, 256), (256 + keep // 2, 128)):
        p = shared[:n]
        outs, trace = run_all(engine, [p], GREEDY)
        (rid,) = list(trace.outputs)
        assert trace.ready(rid).prompt_cache_hit_tokens == hit, n
        assert outs == [greedy_reference(model(name), mode, p, 8)], n
    # A repeated prompt hits: its checkpoint (the snapshot) lies before its own tail too.
    fresh = ref.random_tokens(256 + keep // 2, vocab, 9)
    for hit in (0, 128):
        outs, trace = run_all(engine, [fresh], GREEDY)
        (rid,) = list(trace.outputs)
        assert trace.ready(rid).prompt_cache_hit_tokens == hit
        assert outs == [greedy_reference(model(name), mode, fresh, 8)]
    assert_pools_full(engine)


def test_yoco_store_leaves_consumer_rings_out(tmp_path, tmp_path_factory) -> None:
    """Bounded replay: under truncation the store's snapshots hold no consumer SWA rings (the
    prefill of the tail a hit leaves rebuilds them), and a hit from the store after a restart
    equals the reference."""
    name, mode = "A", "compact"
    cfg = ref.TINY_CONFIGS[name]
    shared = ref.random_tokens(300, cfg.vocab_size, 7)
    written = {}
    for m in ("off", mode):
        engine = yoco_engine(name, m, tmp_path_factory, kv_store_path=str(tmp_path / m))
        run_all(engine, [shared[:270] + [17]], GREEDY)  # 2 blocks, the snapshot at 256
        engine.flush_kv_tiers()
        written[m] = engine.stats()["store_bytes_written"]
        del engine
    consumers = cfg.num_hidden_layers - cfg.n_prefill_layer
    ring_bytes = (cfg.sliding_window + 6) * cfg.head_dim * 4  # the engine's 6 rollback slots
    assert written["off"] - written[mode] == consumers * ring_bytes
    engine = yoco_engine(name, mode, tmp_path_factory, kv_store_path=str(tmp_path / mode))
    outs, trace = run_all(engine, [shared], GREEDY)
    (rid,) = list(trace.outputs)
    assert trace.ready(rid).prompt_cache_hit_tokens == 256
    assert engine.stats()["store_hit_tokens"] == 256
    assert outs == [greedy_reference(model(name), mode, shared, 8)]
    assert_pools_full(engine)


def test_yoco_options_are_validated(tmp_path_factory) -> None:
    path = str(checkpoint("A", tmp_path_factory))
    with pytest.raises(Exception, match=r"'yoco_prefill_truncation' must be"):
        dc.ModelRunner(path, num_blocks=4, num_state_slots=1, yoco_prefill_truncation="drop")
    # keep 12 < sliding_window 8 + max_backtrack 6
    with pytest.raises(Exception, match=r"'yoco_keep_tokens' must be >= sliding_window \(8\)"):
        dc.ModelRunner(
            path,
            num_blocks=4,
            num_state_slots=1,
            yoco_prefill_truncation="mask",
            yoco_keep_tokens=12,
        )
    with pytest.raises(Exception, match=r"'yoco_keep_tokens' must be >= .* = 11, got 10"):
        cpu_engine(
            path,
            yoco_prefill_truncation="compact",
            yoco_keep_tokens=10,
            num_speculative_tokens=3,
            speculative_method="ngram",
        )
    # off ignores the keep count.
    dc.ModelRunner(path, num_blocks=4, num_state_slots=1, yoco_keep_tokens=1)


def test_yoco_needs_a_v41_model(tiny_checkpoint) -> None:
    with pytest.raises(Exception, match=r"'yoco_prefill_truncation' \"mask\" needs a DeepSeek-V4"):
        cpu_engine(tiny_checkpoint, yoco_prefill_truncation="mask")


def test_yoco_needs_a_boundary(tmp_path_factory) -> None:
    """Config C has no C1 layer, so no YOCO consumers: truncation is refused, naming why (it
    used to blame a kv source for coming after boundary -1)."""
    path = str(checkpoint("C", tmp_path_factory))
    with pytest.raises(Exception, match=r"has no YOCO boundary \(no layer with compress ratio 1\)"):
        cpu_engine(path, yoco_prefill_truncation="compact")
    cpu_engine(path, yoco_prefill_truncation="off")


def test_runner_greedy_refuses_a_dropped_last_row_before_running(tmp_path_factory) -> None:
    """ModelRunner.greedy of a chunk whose last token compact truncation drops raises before the
    forward: the slot's caches and Engram history stay as they were, so the prompt run again
    after the refusal gives the reference's token."""
    d = driver("A", "compact", tmp_path_factory)
    tokens = prompt("A")
    with pytest.raises(Exception, match=r"lies before its prompt_end's YOCO kept positions"):
        d.runner.greedy([d.chunk(1, 0, tokens[:10], prompt_end=PROMPT_LEN)])
    (token,) = d.runner.greedy([d.chunk(1, 0, tokens, prompt_end=PROMPT_LEN)]).tolist()
    assert token == greedy_reference(model("A"), "compact", tokens, 1)[0]


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("mode", MODES)
def test_yoco_with_kv_formats_equals_reference(mode: str, kv: str, tmp_path_factory) -> None:
    """Truncation with V4.1's bf16 and FP8/FP4 caches: the consumer rings hold records, and the
    engine's greedy tokens are those of the reference that fake-quantizes its caches the same way,
    fed the same tokens (but for a flipped near-tie: quantized_kv_checks.py)."""
    name = "A"
    m = model(name)
    ps = [ref.random_tokens(n, m.cfg.vocab_size, 200 + i) for i, n in enumerate([37, 50])]
    engine = yoco_engine(name, mode, tmp_path_factory, kv_cache_dtype=kv, max_num_batched_tokens=16)
    outs, _ = run_all(engine, ps, GREEDY)
    flips = []
    for i, (p, tokens) in enumerate(zip(ps, outs, strict=True)):
        assert len(tokens) == GREEDY.max_tokens
        want = qkv.teacher_forced_logprobs(m, m.new_cache(mode, kv_format=kv), p, tokens)
        flips += qkv.greedy_flips(want, tokens, f"{mode}, {kv} KV, prompt {i}")
    assert len(flips) <= qkv.MAX_FLIPS, flips
    assert_pools_full(engine)


@pytest.mark.parametrize("mode", ["off", *MODES])
def test_bounded_replay_hit_equals_cold(mode: str, tmp_path, tmp_path_factory) -> None:
    """kv_window_state bounded_replay (docs/kv_store.md#window-state-on-a-hit) on V4.1: config A's
    window of 8 over 10 layers reaches back 10 * 7 + 8 = 78 <= 128 tokens, so a hit replayed from
    r = h - 128 (windows clamped to r in producer and consumer layers, stored compressed entries
    kept) rebuilds the exact rings: tokens and logprobs equal the cold run's bit for bit."""
    name = "A"
    cfg = ref.TINY_CONFIGS[name]
    shared = ref.random_tokens(400, cfg.vocab_size, 7)
    params = dc.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3)
    replay = {"kv_window_state": "bounded_replay", "kv_store_path": str(tmp_path)}
    writer = yoco_engine(name, mode, tmp_path_factory, **replay)
    run_all(writer, [shared[:300] + [17]], params)  # stores blocks [0, 2): its checkpoint is 256
    writer.flush_kv_tiers()
    del writer

    def run(engine: dc.Engine) -> tuple[list[int], list, int]:
        outs, trace = run_all(engine, [shared], params)
        (rid,) = list(trace.outputs)
        lps = [lp for o in trace.outputs[rid] for lp in o.logprobs]
        return outs[0], lps, trace.ready(rid).prompt_cache_hit_tokens

    reader = yoco_engine(name, mode, tmp_path_factory, **replay)
    toks, lps, hit = run(reader)
    assert hit == 256 and reader.stats()["store_hit_tokens"] == 256
    assert_pools_full(reader)
    cold_toks, cold_lps, cold_hit = run(yoco_engine(name, mode, tmp_path_factory))
    assert cold_hit == 0
    assert (toks, lps) == (cold_toks, cold_lps)
