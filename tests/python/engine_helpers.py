"""Shared helpers for the engine tests: running requests to completion and checking the output
contract (ready first, tokens, exactly one finish) and that every pool is full after a drain."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import deepinfer_core as dc

# KV cache dtypes the engine tests run under (docs/model.md#kv-cache-dtypes).
KV_DTYPES = ["f32", "bf16", "fp8"]


def cpu_engine(checkpoint, **options) -> dc.Engine:
    """An engine on the CPU backend, whose rows are computed independently and in a fixed order,
    so outputs compare bitwise across batchings, schedules and cache hits, whatever device "auto"
    would pick on this machine."""
    return dc.Engine(str(checkpoint), device="cpu", **options)


@dataclass
class Trace:
    outputs: dict[int, list] = field(default_factory=lambda: defaultdict(list))

    def record(self, outs: list) -> None:
        for o in outs:
            self.outputs[o.id].append(o)

    def tokens(self, rid: int) -> list[int]:
        return [t for o in self.outputs[rid] for t in o.tokens]

    def finish(self, rid: int) -> str | None:
        done = [o.finish for o in self.outputs[rid] if o.finish is not None]
        return done[-1] if done else None

    def ready(self, rid: int):
        return next((o for o in self.outputs[rid] if o.ready), None)

    def check_contract(self, rid: int) -> None:
        outs = self.outputs[rid]
        finishes = [i for i, o in enumerate(outs) if o.finish is not None]
        assert len(finishes) == 1, f"request {rid}: {len(finishes)} finish outputs"
        assert finishes[0] == len(outs) - 1, f"request {rid}: output after its finish"
        readies = [i for i, o in enumerate(outs) if o.ready]
        assert len(readies) <= 1, f"request {rid}: ready twice"
        if readies:
            assert readies[0] == 0, f"request {rid}: output before ready"
        elif self.tokens(rid):
            raise AssertionError(f"request {rid}: tokens without ready")


def drain(engine, trace: Trace, check: bool = True, max_steps: int = 100000) -> None:
    steps = 0
    while engine.has_unfinished():
        trace.record(engine.step())
        if check:
            engine.check_invariants()
        steps += 1
        assert steps < max_steps, "engine did not drain"
    # One more step commits anything still in flight.
    trace.record(engine.step())
    assert engine.num_inflight_steps == 0


def assert_pools_full(engine, live_slots: int | None = None) -> None:
    s = engine.stats()
    assert s["num_running"] == 0 and s["num_waiting"] == 0, s
    assert s["num_blocks_free"] == s["num_blocks_total"], f"leaked KV blocks: {s}"
    if live_slots is not None:
        assert s["num_state_slots_free"] == live_slots, f"leaked state slots: {s}"
    engine.check_invariants()


def run_all(engine, prompts, params) -> tuple[list[list[int]], Trace]:
    """Adds every prompt, runs to completion, returns each request's tokens (in prompt order)."""
    if isinstance(params, dc.SamplingParams):
        params = [params] * len(prompts)
    ids = [engine.add_request(list(p), sp) for p, sp in zip(prompts, params, strict=True)]
    trace = Trace()
    drain(engine, trace)
    for rid in ids:
        trace.check_contract(rid)
    return [trace.tokens(rid) for rid in ids], trace
