"""kv_window_state bounded_replay on the real tiny model (docs/kv_store.md#window-state-on-a-hit):
the tiers store blocks without the window state, and a hit of h tokens recomputes the last 128
before it (from r = max(0, h - 128)) with every sliding window confined to keys >= r, keeping the
compressed entries of the stored blocks.

When the replay covers everything the exact state depends on, the hit is bit-identical to a cold
run: (a) r = 0 (nothing is clamped; the replayed rows write no compressed entry, and the stored
ones are the cold run's bytes); (b) a window W small enough that the rings at h depend only on
positions >= r: a layer-l key at p depends on layer-(l-1) keys in [p - W + 1, p], so the rings at
h (positions [h - W, h) in each of the L layers) reach back L * (W - 1) + W tokens, and the
compressor rings hold at most 2 * 4 positions of the same hidden states; with W = 8 and 4 layers
that is 36 <= 128. Otherwise (the tiny model's W = 128) the hit is close to, but not, the cold
run. The stores of the two modes never serve each other; an abort while fetching frees
everything."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import deepinfer_core as dc
import pytest
from engine_helpers import Trace, assert_pools_full, cpu_engine, drain, run_all

REPLAY = {"kv_window_state": "bounded_replay"}
LOGPROBS = dc.SamplingParams(temperature=0.0, max_tokens=12, logprobs=5)
SMALL_GPU = {"num_kv_blocks": 8}


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 129000) for _ in range(n)]


SHARED = tokens(600, 1)  # checkpoint at 512: the writer stores blocks [0, 4)
PROMPT = SHARED + [11, 12, 13]  # a hit of 512 tokens, replayed from 384
SHORT = SHARED[:200]  # checkpoint at 128: a hit of 128 tokens, replayed from 0


@pytest.fixture(scope="module")
def narrow_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint with a sliding window of 8 (same weights: the window is no tensor)."""
    out = tmp_path_factory.mktemp("narrow")
    for f in Path(tiny_checkpoint).iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    config["sliding_window"] = 8
    (out / "config.json").write_text(json.dumps(config))
    return out


def run_traced(engine, prompt: list[int], params) -> tuple[list[int], list[float], int]:
    """Tokens, their logprobs and the prompt cache hit of one request."""
    rid = engine.add_request(list(prompt), params)
    trace = Trace()
    drain(engine, trace)
    trace.check_contract(rid)
    lps = [lp[0] for o in trace.outputs[rid] for lp in o.logprobs]  # (logprob, top)
    return trace.tokens(rid), lps, trace.ready(rid).prompt_cache_hit_tokens


def replay_hit(checkpoint, root: Path, prompt: list[int], writer_prompt: list[int], **options):
    """A bounded_replay reader over a store a bounded_replay writer filled with writer_prompt."""
    writer = cpu_engine(checkpoint, kv_store_path=str(root), **REPLAY, **options)
    run_all(writer, [writer_prompt], LOGPROBS)
    writer.flush_kv_tiers()
    del writer
    reader = cpu_engine(checkpoint, kv_store_path=str(root), **REPLAY, **options)
    result = run_traced(reader, prompt, LOGPROBS)
    assert_pools_full(reader)
    return result, reader


def test_replay_from_zero_equals_cold(tiny_checkpoint, tmp_path) -> None:
    cold = run_traced(cpu_engine(tiny_checkpoint), SHORT, LOGPROBS)
    (toks, lps, hit), reader = replay_hit(tiny_checkpoint, tmp_path, SHORT, SHORT)
    assert hit == 128
    assert (toks, lps) == cold[:2]
    s = reader.stats()
    assert s["store_hit_tokens"] == 128 and s["kv_tier_fetch_failures"] == 0, s


@pytest.mark.parametrize("kv_cache_dtype", ["f32", "bf16", "fp8"])
def test_replay_within_a_narrow_window_equals_cold(
    narrow_checkpoint, tmp_path, kv_cache_dtype
) -> None:
    kv = {"kv_cache_dtype": kv_cache_dtype}
    cold = run_traced(cpu_engine(narrow_checkpoint, **kv), PROMPT, LOGPROBS)
    (toks, lps, hit), reader = replay_hit(narrow_checkpoint, tmp_path, PROMPT, SHARED + [99], **kv)
    assert hit == 512
    assert (toks, lps) == cold[:2]  # bit for bit: the replayed rings are the exact ones
    # The prompt was computed from r = 384 on (the 128 replayed tokens, then the rest), not 512.
    assert reader.stats()["prompt_tokens_computed"] == len(PROMPT) - 384


def test_replay_under_the_full_window_is_close_but_not_exact(tiny_checkpoint, tmp_path) -> None:
    cold_toks, cold_lps, _ = run_traced(cpu_engine(tiny_checkpoint), PROMPT, LOGPROBS)
    (toks, lps, hit), _ = replay_hit(tiny_checkpoint, tmp_path, PROMPT, SHARED + [99])
    assert hit == 512
    # The first token's distribution comes from the same prompt in both runs: compare it (later
    # ones only while the tokens agree).
    pairs = enumerate(zip(cold_toks, toks, strict=True))
    agree = next((i for i, (a, b) in pairs if a != b), len(toks))
    drift = max(abs(a - b) for a, b in zip(cold_lps[: agree + 1], lps[: agree + 1], strict=True))
    assert drift > 0, "W = 128 reaches before the replay: the hit cannot be exact"
    assert drift < 1.0 and all(math.isfinite(x) for x in lps), (drift, cold_lps, lps)


@pytest.mark.parametrize(("writer", "reader"), [({}, REPLAY), (REPLAY, {})])
def test_the_modes_do_not_share_a_store(tiny_checkpoint, tmp_path, writer, reader) -> None:
    w = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), **writer)
    run_all(w, [SHARED + [99]], LOGPROBS)
    w.flush_kv_tiers()
    del w
    r = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), **reader)
    _, _, hit = run_traced(r, PROMPT, LOGPROBS)
    assert hit == 0
    r.flush_kv_tiers()
    assert len([d for d in tmp_path.iterdir() if d.is_dir()]) == 2  # one fingerprint each


def test_host_tier_replay_hit(tiny_checkpoint) -> None:
    engine = cpu_engine(tiny_checkpoint, kv_host_cache_bytes=1 << 30, **SMALL_GPU, **REPLAY)
    run_all(engine, [SHARED + [99]], LOGPROBS)
    run_all(engine, [tokens(800, 2)], LOGPROBS)  # evicts the shared prefix from the GPU
    toks, _, hit = run_traced(engine, PROMPT, LOGPROBS)
    assert hit == 512 and len(toks) == 12
    assert engine.stats()["host_hit_tokens"] == 512
    assert_pools_full(engine)


def test_abort_while_fetching_a_replay_hit_frees_everything(tiny_checkpoint, tmp_path) -> None:
    writer = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), **REPLAY)
    run_all(writer, [SHARED + [99]], LOGPROBS)
    writer.flush_kv_tiers()
    del writer
    reader = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), **REPLAY)
    slots = reader.stats()["num_state_slots_free"]
    reader.hold_kv_fetches(True)
    trace = Trace()
    rid = reader.add_request(PROMPT, LOGPROBS)
    for _ in range(3):
        trace.record(reader.step())
        reader.check_invariants()
    s = reader.stats()
    assert s["num_fetching"] == 1 and s["num_state_slots_free"] == slots - 1, s
    reader.abort(rid)
    trace.record(reader.step())
    reader.check_invariants()
    assert trace.finish(rid) == "abort" and not trace.tokens(rid)
    assert reader.stats()["num_fetching"] == 0
    assert_pools_full(reader, slots)
    reader.hold_kv_fetches(False)
    toks, _, hit = run_traced(reader, PROMPT, LOGPROBS)
    assert hit == 512 and len(toks) == 12
    assert_pools_full(reader, slots)


def test_window_state_option_is_checked(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match="kv_window_state"):
        cpu_engine(tiny_checkpoint, kv_window_state="approximate")


@pytest.mark.parametrize(("mode", "hit"), [({}, 0), (REPLAY, 256)])
def test_a_replay_hit_may_end_at_any_stored_block(tiny_checkpoint, tmp_path, mode, hit) -> None:
    # The writer stores blocks [0, 4) with the exact state only after block 3 (its checkpoint).
    # A prompt sharing 2 of them: exact mode has no snapshot there; bounded_replay hits 256.
    writer = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), **mode)
    run_all(writer, [SHARED + [99]], LOGPROBS)
    writer.flush_kv_tiers()
    del writer
    reader = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), **mode)
    toks, _, got = run_traced(reader, SHARED[:300] + [7, 8, 9], LOGPROBS)
    assert got == hit and len(toks) == 12
    assert_pools_full(reader)


def test_mtp_drafting_after_a_replay_hit_keeps_the_outputs(tiny_checkpoint, tmp_path) -> None:
    # The MTP block's first row of a replay starts at r (no trunk before it in a zeroed slot);
    # drafts are verified, so the tokens equal the same replay hit without drafting.
    from deepinfer.tiny import ensure_tiny_checkpoint

    checkpoint = ensure_tiny_checkpoint(Path(tiny_checkpoint).parent, mtp=True)
    params = dc.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = []
    for k, spec in ((0, {}), (2, {"speculative_method": "mtp"})):
        root = tmp_path / f"k{k}"
        # The same drafting in both engines: the MTP block's caches are part of the blocks.
        options = {"kv_store_path": str(root), "num_speculative_tokens": k, **spec, **REPLAY}
        writer = cpu_engine(checkpoint, **options)
        run_all(writer, [SHARED + [99]], params)
        writer.flush_kv_tiers()
        del writer
        reader = cpu_engine(checkpoint, **options)
        toks, _, hit = run_traced(reader, PROMPT, params)
        assert hit == 512 and len(toks) == 12
        assert_pools_full(reader)
        outputs.append(toks)
    assert outputs[0] == outputs[1]


def test_decode_graphs_refuse_rows_whose_window_is_clamped(narrow_checkpoint) -> None:
    # W = 8: a decode row at p with swa_valid_start > p - 7 must run eagerly (the recording has
    # no swa_start), giving the eager runner's logits; once p - 7 >= the start, graphs take it.
    def runner(graphs: int) -> dc.ModelRunner:
        return dc.ModelRunner(
            str(narrow_checkpoint),
            num_blocks=4,
            num_state_slots=2,
            device="cpu",
            decode_graph_max_batch=graphs,
        )

    prompt = tokens(16, 5)
    logits = []
    for r in (runner(0), runner(4)):
        r.forward([dc.SequenceChunk(1, 0, prompt, [1])], "last")
        clamped = r.forward([dc.SequenceChunk(1, 16, [7], [1], swa_valid_start=12)], "last")
        assert r.decode_graph_stats()["num_calls"] == 0
        free = r.forward([dc.SequenceChunk(1, 17, [8], [1], swa_valid_start=10)], "last")
        logits.append((clamped, free))
        graph_calls = r.decode_graph_stats()["num_calls"]
    assert graph_calls == 1  # the second runner's unclamped row
    for a, b in zip(logits[0], logits[1], strict=True):
        assert (a == b).all()


def agent_turn(
    checkpoint, root: Path, prompt: list[int], mode: dict, max_tokens: int
) -> tuple[list[int], int, int]:
    """One turn on a fresh engine over the store at root (flushed after it): its tokens, its
    prompt cache hit, and the blocks it wrote through."""
    engine = cpu_engine(checkpoint, kv_store_path=str(root), **mode)
    params = dc.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    toks, _, hit = run_traced(engine, prompt, params)
    engine.flush_kv_tiers()
    written = engine.stats()["kv_blocks_written_through"]
    assert_pools_full(engine)
    return toks, hit, written


@pytest.mark.parametrize("max_tokens", [12, 1], ids=["decoding", "prefill_only"])
@pytest.mark.parametrize("mode", [REPLAY, {}], ids=["bounded_replay", "exact"])
def test_an_agent_turn_hits_the_previous_turns_blocks(
    tiny_checkpoint, tmp_path, mode, max_tokens
) -> None:
    # Turn 1 (300 tokens) stores blocks [0, 2). Turn 2 resends it with its output and 300 new
    # tokens (601 or 612): a hit of 256, in bounded_replay replayed from 128 and so without a
    # prefix checkpoint; its full prompt blocks [0, 4) must still reach the store (2 and 3 are
    # new), so that turn 3 (turn 2's prompt and output, then 50 new tokens) hits 512, not turn
    # 1's 256. With max_tokens 1 (a prefill card's requests) turn 2 finishes in the row that
    # completes its prompt: its blocks must go through before the finish releases them.
    def turn(prompt: list[int]) -> tuple[list[int], int, int]:
        return agent_turn(tiny_checkpoint, tmp_path, prompt, mode, max_tokens)

    turn1 = tokens(300, 7)
    out1, hit1, written1 = turn(turn1)
    assert (hit1, written1) == (0, 2)
    turn2 = turn1 + out1 + tokens(300, 8)
    out2, hit2, written2 = turn(turn2)
    assert (hit2, written2) == (256, 2)
    _, hit3, _ = turn(turn2 + out2 + tokens(50, 9))
    assert hit3 == 512
    # A prompt sharing 3 of turn 2's blocks: bounded_replay hits any stored block; exact mode
    # only where a checkpoint stored the exact state (256, turn 1's), as before.
    _, partial, _ = turn(turn2[:400] + [7, 8, 9])
    assert partial == (384 if mode else 256)
