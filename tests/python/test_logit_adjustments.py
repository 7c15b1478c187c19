"""logit_bias, presence/frequency penalties and token constraints (SamplingParams) on the real
tiny model: the adjustment is exactly OpenAI's formula, it sees the token the previous step
sampled even under zero-overhead scheduling (the deferred sample), and a constraint that
rejects a token or throws ends only its own request, with nothing leaked."""

from __future__ import annotations

import math
import random

import deepinfer_core as dc
import numpy as np
import pytest
from engine_helpers import assert_pools_full, cpu_engine, run_all

VOCAB = 129280


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(2, 129000) for _ in range(n)] for n in (5, 40, 130, 9)]


def greedy(**kw) -> dc.SamplingParams:
    return dc.SamplingParams(temperature=0.0, max_tokens=kw.pop("max_tokens", 12), **kw)


class ForceSequence(dc.TokenConstraint):
    """Allows exactly `tokens`, in order, then ends the output."""

    def __init__(self, tokens: list[int]) -> None:
        super().__init__()
        self.tokens = tokens
        self.pos = 0
        self.masks_filled = 0

    def fill_allowed(self, mask: np.ndarray) -> None:
        assert mask.dtype == np.uint32 and mask.shape == ((VOCAB + 31) // 32,)
        assert not mask.any(), "the engine hands over a zeroed mask"
        t = self.tokens[self.pos]
        mask[t // 32] |= np.uint32(1 << (t % 32))
        self.masks_filled += 1

    def accept(self, token: int) -> bool:
        if self.pos >= len(self.tokens) or token != self.tokens[self.pos]:
            return False
        self.pos += 1
        return True

    def is_terminated(self) -> bool:
        return self.pos == len(self.tokens)


class FailsAfter(ForceSequence):
    def __init__(self, tokens: list[int], fail_at: int) -> None:
        super().__init__(tokens)
        self.fail_at = fail_at

    def fill_allowed(self, mask: np.ndarray) -> None:
        if self.pos == self.fail_at:
            raise RuntimeError("matcher broke")
        super().fill_allowed(mask)


def test_logit_bias_forces_and_forbids(tiny_checkpoint, prompts) -> None:
    engine = cpu_engine(tiny_checkpoint, max_num_seqs=4)
    plain = run_all(engine, prompts, greedy())[0]
    forced = run_all(engine, prompts, greedy(logit_bias={777: 100.0}))[0]
    assert all(t == [777] * 12 for t in forced), forced
    # Forbidding each request's first greedy token changes its first token.
    banned = [greedy(logit_bias={p[0]: -100.0}) for p in plain]
    changed = run_all(engine, prompts, banned)[0]
    assert all(c[0] != p[0] for c, p in zip(changed, plain, strict=True))
    assert_pools_full(engine)


@pytest.mark.parametrize("zero_overhead", [True, False])
def test_penalties_follow_openai_formula(tiny_checkpoint, prompts, zero_overhead) -> None:
    """The adjusted log-probabilities differ from the raw ones (same context, via forced tokens)
    by exactly -(presence * [count > 0] + frequency * count) + bias, up to one constant a row."""
    # Negative penalties (allowed) make repeats likely, so repeated tokens show in both top lists.
    presence, frequency, bias = -0.6, -0.35, {31: 1.5}
    engine = cpu_engine(tiny_checkpoint, max_num_seqs=4, zero_overhead=zero_overhead)
    adjusted = greedy(
        max_tokens=16,
        logprobs=20,
        presence_penalty=presence,
        frequency_penalty=frequency,
        logit_bias=bias,
    )
    outs, trace = run_all(engine, prompts, adjusted)
    raw_params = [greedy(max_tokens=16, logprobs=20, forced_tokens=o) for o in outs]
    _, raw_trace = run_all(engine, prompts, raw_params)
    checked_repeats = 0
    for rid, raw_rid, out in zip(
        sorted(trace.outputs), sorted(raw_trace.outputs), outs, strict=True
    ):
        adj_lp = [lp for o in trace.outputs[rid] for lp in o.logprobs]
        raw_lp = [lp for o in raw_trace.outputs[raw_rid] for lp in o.logprobs]
        for i, (a, r) in enumerate(zip(adj_lp, raw_lp, strict=True)):
            counts: dict[int, int] = {}
            for t in out[:i]:
                counts[t] = counts.get(t, 0) + 1
            raw = dict(r[1])
            shifts = []
            for token, lp in a[1]:
                if token not in raw or math.isinf(lp):
                    continue
                c = counts.get(token, 0)
                expected = bias.get(token, 0.0) - (presence if c else 0.0) - frequency * c
                shifts.append(lp - raw[token] - expected)
                checked_repeats += c > 0
            assert len(shifts) >= 2, "top lists should overlap"
            assert max(shifts) - min(shifts) < 2e-4, (i, shifts)
    assert checked_repeats > 0, "no repeated token was checked: the penalty went untested"
    assert_pools_full(engine)


def test_penalties_same_with_and_without_zero_overhead(tiny_checkpoint, prompts) -> None:
    # Negative penalties: the tiny random model never repeats under greedy, so only a reward for
    # repeats changes its output, and it does so through the token sampled one step before.
    params = greedy(max_tokens=20, presence_penalty=-2.0, frequency_penalty=-1.0)
    on = run_all(cpu_engine(tiny_checkpoint, max_num_seqs=4), prompts, params)[0]
    off = run_all(
        cpu_engine(tiny_checkpoint, max_num_seqs=4, zero_overhead=False), prompts, params
    )[0]
    plain = run_all(cpu_engine(tiny_checkpoint, max_num_seqs=4), prompts, greedy(max_tokens=20))[0]
    assert on == off
    assert on != plain


@pytest.mark.parametrize("zero_overhead", [True, False])
def test_constraint_forces_its_tokens_and_leaves_others_alone(
    tiny_checkpoint, prompts, zero_overhead
) -> None:
    engine = cpu_engine(tiny_checkpoint, max_num_seqs=4, zero_overhead=zero_overhead)
    plain = run_all(engine, prompts, greedy())[0]
    wanted = [5, 900, 5, 128000, 42]
    constraint = ForceSequence(wanted)
    params = [greedy(), greedy(constraint=constraint), greedy(), greedy()]
    outs, trace = run_all(engine, prompts, params)
    rid = sorted(trace.outputs)[1]
    assert outs[1] == wanted and trace.finish(rid) == "stop"
    assert constraint.masks_filled == len(wanted)
    assert [outs[i] for i in (0, 2, 3)] == [plain[i] for i in (0, 2, 3)]
    assert_pools_full(engine)


def test_constraint_with_sampling_and_penalties(tiny_checkpoint, prompts) -> None:
    wanted = [7, 7, 7, 8]
    params = dc.SamplingParams(
        temperature=1.0,
        seed=3,
        max_tokens=10,
        frequency_penalty=2.0,
        constraint=ForceSequence(wanted),
    )
    outs = run_all(cpu_engine(tiny_checkpoint), prompts[:1], params)[0]
    assert outs[0] == wanted


def test_rejected_token_and_throwing_constraint_end_only_their_request(
    tiny_checkpoint, prompts
) -> None:
    engine = cpu_engine(tiny_checkpoint, max_num_seqs=4)
    plain = run_all(engine, prompts, greedy())[0]
    # forced_tokens emit a token the constraint does not allow at output 2.
    rejecting = greedy(constraint=ForceSequence([5, 6, 7, 8]), forced_tokens=[5, 6, 9])
    throwing = greedy(constraint=FailsAfter([5, 6, 7, 8, 10, 11], fail_at=3))
    params = [greedy(), rejecting, throwing, greedy()]
    outs, trace = run_all(engine, prompts, params)
    ids = sorted(trace.outputs)
    # The refused token is not reported.
    assert outs[1] == [5, 6] and trace.finish(ids[1]) == "grammar_error"
    detail = next(o.finish_detail for o in trace.outputs[ids[1]] if o.finish)
    assert "does not allow token 9" in detail
    # The token drawn while the constraint was broken is not reported.
    assert outs[2] == [5, 6, 7] and trace.finish(ids[2]) == "grammar_error"
    detail = next(o.finish_detail for o in trace.outputs[ids[2]] if o.finish)
    assert "matcher broke" in detail, detail
    assert [outs[0], outs[3]] == [plain[0], plain[3]]
    assert_pools_full(engine)


def test_constraint_abort_while_deferred_leaks_nothing(tiny_checkpoint, prompts) -> None:
    engine = cpu_engine(tiny_checkpoint, max_num_seqs=4)
    ids = [
        engine.add_request(p, greedy(max_tokens=50, constraint=ForceSequence([3] * 50)))
        for p in prompts
    ]
    for _ in range(6):
        engine.step()
    engine.abort(ids[0])
    engine.abort(ids[2])
    while engine.has_unfinished():
        engine.step()
        engine.check_invariants()
    engine.step()
    assert_pools_full(engine)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"logit_bias": {VOCAB: 1.0}}, "logit_bias"),
        ({"logit_bias": {5: float("nan")}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
    ],
)
def test_invalid_adjustments_name_the_field(tiny_checkpoint, kwargs, field) -> None:
    engine = cpu_engine(tiny_checkpoint)
    with pytest.raises(ValueError, match=field):
        engine.add_request([1, 2, 3], dc.SamplingParams(**kwargs))


def test_sampling_params_round_trip() -> None:
    c = ForceSequence([1])
    p = dc.SamplingParams(logit_bias={3: -1.5, 9: 2.0}, presence_penalty=0.5, constraint=c)
    assert p.logit_bias == {3: -1.5, 9: 2.0}
    assert p.presence_penalty == 0.5 and p.frequency_penalty == 0.0
    assert p.constraint is c
    p.constraint = None
    assert p.constraint is None
