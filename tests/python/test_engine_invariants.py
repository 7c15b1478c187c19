"""Engine invariants and leaks on every terminal path.

The randomized runs drive >= 10^4 events (adds, aborts at any stage, steps) through the engine
with the scripted executor (outputs are a hash of each request's own context, so the expected
tokens are known), checking the engine's invariants after every step: KV block refcounts equal
the block tables holding them, free + used == total, no block both free and referenced, state
slots, in-flight ledgers (0, R or 2R; at most two steps in flight), queues. After the drain every
pool is full again. A smaller run does the same on the real tiny model. Another run puts the KV
tiers under it: store hits wait fetching while the fetch pool is held and released at random,
store files are damaged at random (the fetch fails and the request recomputes), and aborts land
on fetching requests too.
"""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

import deepinfer_core as dc
import pytest
from engine_helpers import KV_DTYPES, Trace, assert_pools_full, drain, run_all

VOCAB = 1000


class ScriptedEngine:
    """An engine over the scripted executor, with the model emulation that predicts its tokens."""

    def __init__(self, eos_probability: float = 0.0, **kw):
        options = dict(
            num_kv_blocks=32,
            num_prefix_snapshots=8,
            max_num_seqs=8,
            max_num_batched_tokens=256,
            max_model_len=2048,
        )
        options.update(kw)
        self.model = dc.testing.ScriptedModel(vocab_size=VOCAB, eos_probability=eos_probability)
        self.engine = dc.testing.scripted_engine(self.model, **options)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


def scripted(**kw) -> ScriptedEngine:
    return ScriptedEngine(**kw)


class OracleDrafter(dc.Drafter):
    """Drafts the emulation's own continuation, each draft right with probability 0.7 (decided
    by the context length and the draft index, so every run sees the same drafts)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def propose(self, request_id: int, tokens: list[int], max_drafts: int) -> list[int]:
        ctx, drafts = list(tokens), []
        for j in range(max_drafts):
            t = self.model.next_token(ctx)
            if random.Random(len(ctx) * 131 + j).random() >= 0.7:
                t = 2 + (t + 1) % (VOCAB - 2)
            drafts.append(t)
            ctx.append(t)
        return drafts


def live_slots(engine) -> int:
    return engine.stats()["num_state_slots_free"]


def reference(engine, prompt: list[int], n: int) -> list[int]:
    ctx, out = list(prompt), []
    for _ in range(n):
        t = engine.model.next_token(ctx)
        out.append(t)
        ctx.append(t)
    return out


def random_events(engine, rng: random.Random, n_events: int) -> tuple[Trace, dict, set]:
    trace, prompts, aborted = Trace(), {}, set()
    events = 0
    bases = [[rng.randrange(2, VOCAB) for _ in range(1024)] for _ in range(3)]
    while events < n_events:
        r = rng.random()
        live = [rid for rid in prompts if trace.finish(rid) is None and rid not in aborted]
        if r < 0.22 and len(live) < 40:
            kind = rng.random()
            if kind < 0.3:  # shares a cached prefix with earlier prompts
                base = rng.choice(bases)
                prompt = base[: rng.randrange(129, 1024)] + [rng.randrange(2, VOCAB)]
            else:
                n = rng.choice(
                    [rng.randrange(1, 40), rng.randrange(40, 300), rng.randrange(300, 900)]
                )
                prompt = [rng.randrange(2, VOCAB) for _ in range(n)]
            if rng.random() < 0.02:
                prompt = [5] * 2100  # longer than max_model_len: rejected
            # Some long generations grow past block boundaries, which forces preemption.
            max_tokens = rng.randrange(1, 48) if rng.random() < 0.7 else rng.randrange(48, 300)
            params = dc.SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=rng.random() < 0.2
            )
            prompts[engine.add_request(prompt, params)] = prompt
        elif r < 0.30 and live:
            rid = rng.choice(live)
            engine.abort(rid)
            aborted.add(rid)
        else:
            trace.record(engine.step())
            engine.check_invariants()
        events += 1
    drain(engine, trace)
    return trace, prompts, aborted


@pytest.mark.parametrize(
    "options",
    [
        dict(zero_overhead=True, preemption="recompute"),
        dict(
            zero_overhead=False,
            preemption="stop",
            enable_chunked_prefill=False,
            max_num_batched_tokens=2048,
        ),
        dict(zero_overhead=True, preemption="stop", enable_prefix_cache=False),
        dict(
            zero_overhead=True,
            preemption="recompute",
            num_speculative_tokens=3,
            speculative_method="external",
            speculative_zero_overhead=True,
        ),
    ],
    ids=["zos-recompute", "sync-stop-unchunked", "zos-stop-nocache", "zos-recompute-drafts"],
)
def test_invariants_randomized_scripted(options) -> None:
    engine = scripted(eos_probability=0.02, **options)
    drafting = options.get("speculative_method") == "external"
    if drafting:
        engine.drafter = OracleDrafter(engine.model)  # kept alive beside the engine
        engine.set_drafter(engine.drafter)
    slots = live_slots(engine)
    # A seed from the options' text: hash() of strings changes per process (PYTHONHASHSEED), which
    # made the event trace, and whether it reached a preemption, differ from run to run.
    rng = random.Random(zlib.crc32(repr(sorted(options.items())).encode()))
    trace, prompts, aborted = random_events(engine, rng, 10_000)
    assert_pools_full(engine, slots)
    finishes = {}
    for rid, prompt in prompts.items():
        trace.check_contract(rid)
        finish = trace.finish(rid)
        finishes[finish] = finishes.get(finish, 0) + 1
        tokens = trace.tokens(rid)
        # Outputs are exactly the model's, whatever batching, chunking, caching, preemption or
        # abort happened; an aborted or preempted request stops early.
        assert tokens == reference(engine, prompt, len(tokens)), f"request {rid} ({finish})"
        if finish in ("stop", "length"):
            assert rid not in aborted or finish != "abort"
    stats = engine.stats()
    # The run reached the paths it is meant to cover.
    assert finishes.get("abort", 0) > 10 and finishes.get("length", 0) > 50, finishes
    assert finishes.get("rejected", 0) > 0 and finishes.get("stop", 0) > 0, finishes
    assert stats["num_preemptions"] > 0, stats
    if options.get("enable_prefix_cache", True):
        assert stats["prompt_tokens_cached"] > 0, stats
    if drafting:
        assert 0 < stats["accepted_draft_tokens"] < stats["draft_tokens"], stats


def damage_one_file(root: Path, rng: random.Random) -> bool:
    """Flips a payload byte of a random block file (size and expiry kept): a fetch that reads it
    fails its checksum."""
    files = sorted(root.rglob("*.kvb"))
    if not files:
        return False
    target = rng.choice(files)
    try:
        times = target.stat()
        data = bytearray(target.read_bytes())
        data[-1 - rng.randrange(8)] ^= 0xFF
        target.write_bytes(bytes(data))
        os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))
    except FileNotFoundError:  # removed meanwhile (a fetch found it damaged already)
        return False
    return True


@pytest.mark.parametrize("window_state", ["exact", "bounded_replay"])
@pytest.mark.parametrize("zero_overhead", [True, False], ids=["zos", "sync"])
def test_invariants_randomized_with_fetch_states(
    tmp_path, zero_overhead: bool, window_state: str
) -> None:
    # 16 usable blocks: shared prefixes leave the GPU index soon, so hits come from the store.
    # bounded_replay: hits end at any stored block and replay the 128 tokens before it (the
    # scripted model's outputs do not depend on the window, so they still equal the reference).
    engine = scripted(
        eos_probability=0.02,
        num_kv_blocks=17,
        max_num_seqs=6,
        kv_store_path=str(tmp_path),
        zero_overhead=zero_overhead,
        kv_window_state=window_state,
    )
    slots = live_slots(engine)
    rng = random.Random(11 if zero_overhead else 12)
    bases = [[rng.randrange(2, VOCAB) for _ in range(700)] for _ in range(3)]
    trace, prompts, aborted = Trace(), {}, set()
    held = False
    aborts_while_fetching = damaged = 0
    for _ in range(3000):
        r = rng.random()
        live = [rid for rid in prompts if trace.finish(rid) is None and rid not in aborted]
        if r < 0.15 and len(live) < 12:
            if rng.random() < 0.7:
                prompt = rng.choice(bases)[: rng.randrange(129, 700)] + [rng.randrange(2, VOCAB)]
            else:
                prompt = [rng.randrange(2, VOCAB) for _ in range(rng.randrange(1, 300))]
            params = dc.SamplingParams(temperature=0.0, max_tokens=rng.randrange(1, 24))
            prompts[engine.add_request(prompt, params)] = prompt
        elif r < 0.20 and live:
            rid = rng.choice(live)
            # Likely a fetching one: not ready yet while fetches are under way.
            aborts_while_fetching += engine.stats()["num_fetching"] > 0 and not trace.ready(rid)
            engine.abort(rid)
            aborted.add(rid)
        elif r < 0.26:
            held = not held  # fetches finish at whichever step comes after the release
            engine.hold_kv_fetches(held)
        elif r < 0.275:
            damaged += damage_one_file(tmp_path, rng)
        elif r < 0.29:
            engine.flush_kv_tiers()
        else:
            trace.record(engine.step())
            engine.check_invariants()
    engine.hold_kv_fetches(False)
    drain(engine, trace)
    assert_pools_full(engine, slots)
    stats = engine.stats()
    assert stats["num_fetching"] == 0, stats
    for rid, prompt in prompts.items():
        trace.check_contract(rid)
        # Exactly the model's outputs whether the prefix was fetched, recomputed after a failed
        # fetch, or taken from the GPU.
        tokens = trace.tokens(rid)
        assert tokens == reference(engine, prompt, len(tokens)), f"request {rid}"
    # The run reached the paths it is meant to cover.
    assert stats["kv_fetches"] > 20 and stats["store_hit_tokens"] > 0, stats
    # Requests sharing a base prefix waited for one another's fetch instead of reading it again.
    assert stats["kv_fetch_waits"] > 0, stats
    assert stats["kv_tier_fetch_failures"] > 0 and damaged > 0, (stats, damaged)
    assert aborts_while_fetching > 0


class RepeatDrafter(dc.Drafter):
    """Proposes the last token again, every time."""

    def propose(self, request_id: int, tokens: list[int], max_drafts: int) -> list[int]:
        return [tokens[-1]] * max_drafts


@pytest.mark.parametrize(
    ("kv_cache_dtype", "drafts"),
    [(dtype, 0) for dtype in KV_DTYPES] + [(KV_DTYPES[0], 3)],
)
def test_invariants_randomized_tiny_model(tiny_checkpoint, kv_cache_dtype, drafts) -> None:
    # drafts > 0: drafts that repeat the last token, under zero-overhead scheduling.
    engine = dc.Engine(
        str(tiny_checkpoint),
        max_num_seqs=6,
        num_kv_blocks=14,
        max_num_batched_tokens=256,
        max_model_len=1024,
        kv_cache_dtype=kv_cache_dtype,
        num_speculative_tokens=drafts,
        speculative_method="external",
        speculative_zero_overhead=True,
    )
    repeat = RepeatDrafter()
    if drafts:
        engine.set_drafter(repeat)
    assert engine.config.cache.kv_cache_dtype == kv_cache_dtype
    slots = live_slots(engine)
    rng = random.Random(7)
    trace, prompts = Trace(), {}
    for _ in range(300):
        r = rng.random()
        live = [rid for rid in prompts if trace.finish(rid) is None]
        if r < 0.2:
            n = rng.choice([rng.randrange(1, 60), rng.randrange(100, 400)])
            prompt = [rng.randrange(2, 129000) for _ in range(n)]
            params = dc.SamplingParams(temperature=0.0, max_tokens=rng.randrange(1, 24))
            prompts[engine.add_request(prompt, params)] = prompt
        elif r < 0.27 and live:
            engine.abort(rng.choice(live))
        else:
            trace.record(engine.step())
            engine.check_invariants()
    drain(engine, trace)
    assert_pools_full(engine, slots)
    for rid in prompts:
        trace.check_contract(rid)
    if drafts:
        assert engine.config.scheduler.zero_overhead
        assert engine.stats()["draft_tokens"] > 0


# ---- leaks: one targeted run per terminal path -------------------------------------------------


def test_leak_abort_while_waiting() -> None:
    engine = scripted(max_num_seqs=1)
    slots = live_slots(engine)
    first = engine.add_request(list(range(2, 50)), dc.SamplingParams(max_tokens=30))
    second = engine.add_request(list(range(2, 60)), dc.SamplingParams(max_tokens=30))
    trace = Trace()
    trace.record(engine.step())
    engine.abort(second)  # never admitted: max_num_seqs = 1
    drain(engine, trace)
    assert trace.finish(second) == "abort" and trace.ready(second) is None
    assert trace.finish(first) == "length"
    assert_pools_full(engine, slots)


@pytest.mark.parametrize("zero_overhead", [False, True])
def test_leak_abort_between_prefill_chunks(zero_overhead: bool) -> None:
    # The reference engine leaks a sequence aborted while parked between prefill chunks.
    engine = scripted(max_num_batched_tokens=64, zero_overhead=zero_overhead)
    slots = live_slots(engine)
    rid = engine.add_request([7] * 500, dc.SamplingParams(max_tokens=5))
    trace = Trace()
    trace.record(engine.step())
    trace.record(engine.step())
    assert engine.stats()["num_blocks_free"] < engine.stats()["num_blocks_total"]
    engine.abort(rid)
    drain(engine, trace)
    assert trace.finish(rid) == "abort" and not trace.tokens(rid)
    assert_pools_full(engine, slots)


def test_leak_abort_in_flight_and_running() -> None:
    engine = scripted(zero_overhead=True)
    slots = live_slots(engine)
    a = engine.add_request([3] * 40, dc.SamplingParams(max_tokens=40))
    b = engine.add_request([4] * 40, dc.SamplingParams(max_tokens=40))
    trace = Trace()
    trace.record(engine.step())  # prefill of both launched, not committed
    assert engine.num_inflight_steps == 1
    engine.abort(a)  # aborted with its prefill in flight
    for _ in range(4):
        trace.record(engine.step())
    engine.abort(b)  # aborted while decoding, a step in flight
    drain(engine, trace)
    assert trace.finish(a) == "abort" and trace.finish(b) == "abort"
    assert not trace.tokens(a) and 0 < len(trace.tokens(b)) < 40
    assert_pools_full(engine, slots)


@pytest.mark.parametrize("mode", ["recompute", "stop"])
def test_leak_preemption(mode: str) -> None:
    engine = scripted(num_kv_blocks=7, max_num_seqs=8, preemption=mode)
    slots = live_slots(engine)
    prompts = [[10 + i] * (110 + i) for i in range(6)]
    tokens, trace = run_all(engine, prompts, dc.SamplingParams(max_tokens=40, ignore_eos=True))
    assert engine.stats()["num_preemptions"] > 0
    finishes = sorted(trace.finish(rid) for rid in trace.outputs)
    if mode == "stop":
        assert "preempted" in finishes
    else:
        assert finishes == ["length"] * 6
        for p, t in zip(prompts, tokens, strict=True):
            assert t == reference(engine, p, 40)
    assert_pools_full(engine, slots)


def test_leak_rejected_prompts() -> None:
    engine = scripted(num_kv_blocks=5, max_model_len=2048)
    slots = live_slots(engine)
    too_long = engine.add_request([5] * 2048, dc.SamplingParams())
    never_fits = engine.add_request([5] * 1000, dc.SamplingParams())  # 8 blocks > 4 usable
    ok = engine.add_request([5] * 100, dc.SamplingParams(max_tokens=3))
    trace = Trace()
    drain(engine, trace)
    assert (
        trace.finish(too_long) == "rejected"
        and "max_model_len" in trace.outputs[too_long][-1].finish_detail
    )
    assert (
        trace.finish(never_fits) == "rejected"
        and "KV blocks" in trace.outputs[never_fits][-1].finish_detail
    )
    assert trace.finish(ok) == "length"
    assert_pools_full(engine, slots)


def test_leak_stop_paths_eos_max_tokens_and_max_model_len() -> None:
    engine = scripted(eos_probability=0.3, max_model_len=64)
    slots = live_slots(engine)
    prompts = [[20 + i] * 10 for i in range(8)] + [[30] * 60]
    params = [dc.SamplingParams(max_tokens=20)] * 8 + [
        dc.SamplingParams(max_tokens=20, ignore_eos=True)
    ]
    tokens, trace = run_all(engine, prompts, params)
    finishes = [trace.finish(rid) for rid in sorted(trace.outputs)]
    assert "stop" in finishes and finishes[-1] == "length" and len(tokens[-1]) == 4  # 60 + 4 = 64
    assert_pools_full(engine, slots)


def test_invariants_output_contract_on_stop_token_ids() -> None:
    engine = scripted()
    prompt = [9] * 30
    want = reference(engine, prompt, 10)
    stop_at = want[4]
    first = want.index(stop_at)
    tokens, trace = run_all(
        engine, [prompt], dc.SamplingParams(max_tokens=10, stop_token_ids=[stop_at])
    )
    assert tokens[0] == want[: first + 1] and trace.finish(next(iter(trace.outputs))) == "stop"


@pytest.mark.parametrize("zero_overhead", [True, False])
def test_invariants_forced_tokens_feed_the_model(zero_overhead: bool) -> None:
    # The test hook: forced output tokens are emitted and fed back like sampled ones, so the
    # tokens after them are what the model samples after that context.
    engine = scripted(zero_overhead=zero_overhead)
    prompt = [11] * 20
    forced = [5, 6, 7]
    tokens, _ = run_all(engine, [prompt], dc.SamplingParams(max_tokens=8, forced_tokens=forced))
    assert tokens[0][:3] == forced
    assert tokens[0][3:] == reference(engine, prompt + forced, 5)
    with pytest.raises(ValueError, match="forced_tokens"):
        engine.add_request(prompt, dc.SamplingParams(forced_tokens=[VOCAB]))
