"""Speculative decoding on the real tiny model (CPU): drafts verified by the target model change
nothing in the output. Greedy outputs are identical with drafts that are always right (an oracle
fed the known greedy continuation), always wrong, or a mix, and with prompt-lookup drafts; with
prefix-cache hits, preemption and aborts; nothing leaks. Sampled outputs keep the target's
distribution (a chi-square over many seeded runs on a tiny effective vocabulary)."""

from __future__ import annotations

import random

import deepinfer_core as dc
import pytest
from engine_helpers import Trace, assert_pools_full, cpu_engine, drain, run_all

VOCAB = 129280


def greedy(n: int = 16) -> dc.SamplingParams:
    return dc.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(21)
    return [[rng.randrange(2, 129000) for _ in range(n)] for n in (4, 37, 130, 260, 9, 70)]


@pytest.fixture(scope="module")
def plain(tiny_checkpoint, prompts) -> list[list[int]]:
    return run_all(cpu_engine(tiny_checkpoint, max_num_seqs=8), prompts, greedy())[0]


class Oracle(dc.Drafter):
    """Proposes the known continuation, right at positions where `right(i)` holds, else a wrong
    token (the right one plus 1)."""

    def __init__(self, prompts, outputs, right=lambda i: True) -> None:
        super().__init__()
        self.by_prompt = {tuple(p): o for p, o in zip(prompts, outputs, strict=True)}
        self.right = right
        self.calls = 0

    def propose(self, request_id: int, tokens: list[int], max_drafts: int) -> list[int]:
        self.calls += 1
        for prompt, out in self.by_prompt.items():
            if tuple(tokens[: len(prompt)]) == prompt and len(tokens) - len(prompt) <= len(out):
                i = len(tokens) - len(prompt)
                cont = out[i : i + max_drafts]
                return [t if self.right(i + k) else (t + 1) % VOCAB for k, t in enumerate(cont)]
        return []


def spec_engine(checkpoint, drafter=None, k: int = 3, **options) -> dc.Engine:
    """Drafting engine; zero_overhead (default on) asks for host drafts under zero-overhead
    scheduling (speculative_zero_overhead), which the engine otherwise turns off."""
    method = "external" if drafter is not None else "ngram"
    options.setdefault("speculative_zero_overhead", options.get("zero_overhead", True))
    engine = cpu_engine(checkpoint, num_speculative_tokens=k, speculative_method=method, **options)
    if drafter is not None:
        engine.set_drafter(drafter)
    return engine


@pytest.mark.parametrize("zero_overhead", [True, False], ids=["zos", "sync"])
@pytest.mark.parametrize(
    ("name", "right"),
    [
        ("always_right", lambda i: True),
        ("always_wrong", lambda i: False),
        ("mixed", lambda i: (i * 7919) % 3 != 0),
    ],
)
def test_greedy_outputs_identical_with_drafts(
    tiny_checkpoint, prompts, plain, name, right, zero_overhead
) -> None:
    drafter = Oracle(prompts, plain, right)
    engine = spec_engine(tiny_checkpoint, drafter, max_num_seqs=8, zero_overhead=zero_overhead)
    outs = run_all(engine, prompts, greedy())[0]
    assert outs == plain, name
    s = engine.stats()
    assert drafter.calls > 0 and s["draft_tokens"] > 0 and s["verify_rows"] > 0
    drafted, accepted = s["drafts_at_position"], s["accepted_at_position"]
    assert sum(drafted) == s["draft_tokens"] and sum(accepted) == s["accepted_draft_tokens"]
    assert_spec_metrics_consistent(s)
    if name == "always_right":
        # Every draft is accepted, so a request needs far fewer decode steps than tokens.
        assert s["accepted_draft_tokens"] == s["draft_tokens"] and accepted == drafted
    elif name == "always_wrong":
        assert s["accepted_draft_tokens"] == 0
    else:
        assert 0 < s["accepted_draft_tokens"] < s["draft_tokens"]
        # Acceptance is a prefix: a later position is accepted only after the earlier ones.
        assert all(accepted[j + 1] <= accepted[j] for j in range(4))
    assert_pools_full(engine)


def assert_spec_metrics_consistent(s: dict) -> None:
    """The derived speculative values agree with the counters they come from."""
    rows, steps = s["verify_rows"], s["verify_steps"]
    assert 0 < steps <= rows
    assert s["spec_mean_acceptance_length"] == pytest.approx(1 + s["accepted_draft_tokens"] / rows)
    assert s["spec_mean_verified_per_step"] == pytest.approx(s["draft_tokens"] / steps)
    assert s["spec_mean_accepted_per_step"] == pytest.approx(s["accepted_draft_tokens"] / steps)
    for rate, n, a in zip(
        s["spec_acceptance_rate_at_position"],
        s["drafts_at_position"],
        s["accepted_at_position"],
        strict=True,
    ):
        assert rate == pytest.approx(a / n if n else 0.0)
    # Every verified draft is in the calibration bins, with its outcome and estimate.
    assert sum(s["spec_calibration_drafts"]) == s["draft_tokens"]
    assert sum(s["spec_calibration_accepted"]) == s["accepted_draft_tokens"]
    assert s["spec_mean_acceptance"] == pytest.approx(
        s["accepted_draft_tokens"] / s["draft_tokens"]
    )
    assert s["spec_mean_estimate"] == pytest.approx(
        sum(s["spec_calibration_estimate_sum"]) / s["draft_tokens"]
    )
    assert 0 < s["spec_mean_estimate"] <= 1


def test_acceptance_metrics_with_always_right_drafts(tiny_checkpoint, prompts) -> None:
    """1 + 3 (k + 1) tokens: the prefill's token, then three verify rows of k drafts each, all
    accepted, so every verify row commits 1 + k tokens."""
    k, n = 3, 13
    want = run_all(cpu_engine(tiny_checkpoint, max_num_seqs=8), prompts, greedy(n))[0]
    engine = spec_engine(tiny_checkpoint, Oracle(prompts, want), k=k, max_num_seqs=8)
    assert run_all(engine, prompts, greedy(n))[0] == want
    s = engine.stats()
    assert_spec_metrics_consistent(s)
    assert s["verify_rows"] == 3 * len(prompts)
    assert s["spec_mean_acceptance_length"] == 1 + k
    assert s["spec_acceptance_rate_at_position"] == [1.0] * k + [0.0] * (5 - k)
    assert s["spec_mean_acceptance"] == 1.0
    # Every outcome is 1: the calibration error is the estimates' shortfall from it.
    assert s["spec_mean_estimate"] < 1
    assert s["spec_calibration_error"] == pytest.approx(1 - s["spec_mean_estimate"])


def test_acceptance_metrics_with_always_wrong_drafts(tiny_checkpoint, prompts, plain) -> None:
    engine = spec_engine(
        tiny_checkpoint, Oracle(prompts, plain, right=lambda i: False), max_num_seqs=8
    )
    assert run_all(engine, prompts, greedy())[0] == plain
    s = engine.stats()
    assert_spec_metrics_consistent(s)
    assert s["spec_mean_acceptance_length"] == 1.0
    assert s["spec_mean_accepted_per_step"] == 0.0
    assert s["spec_acceptance_rate_at_position"] == [0.0] * 5
    assert s["spec_mean_acceptance"] == 0.0
    # Every outcome is 0: the calibration error is the mean estimate.
    assert s["spec_calibration_error"] == pytest.approx(s["spec_mean_estimate"])


@pytest.mark.parametrize("zero_overhead", [False, True], ids=["sync", "zos"])
def test_always_right_drafts_take_fewer_steps(
    tiny_checkpoint, prompts, plain, zero_overhead
) -> None:
    """Without zero-overhead scheduling every step verifies; with it a sequence skips the step
    after its verify row (other sequences' rows and prefill chunks run in it), so the steps
    drop less."""
    base = cpu_engine(tiny_checkpoint, max_num_seqs=8, zero_overhead=zero_overhead)
    run_all(base, prompts, greedy())
    fast = spec_engine(
        tiny_checkpoint, Oracle(prompts, plain), k=4, max_num_seqs=8, zero_overhead=zero_overhead
    )
    run_all(fast, prompts, greedy())
    steps_plain, steps_spec = base.stats()["num_steps"], fast.stats()["num_steps"]
    print(f"\nSPEC steps plain {steps_plain} with k=4 always-right drafts {steps_spec}")
    assert steps_spec * (1.5 if zero_overhead else 2) < steps_plain


def test_prompt_lookup_drafts(tiny_checkpoint) -> None:
    # logit_bias keeps the model on two tokens, so its output repeats n-grams of the prompt and
    # prompt lookup has something to propose (logit_bias alone still allows drafting).
    a, b = 1000, 2000
    prompts = [[a, b] * 6, [b, b, a] * 4]
    params = dc.SamplingParams(
        temperature=0.0, max_tokens=20, ignore_eos=True, logit_bias={a: 40.0, b: 40.0}
    )
    want = run_all(cpu_engine(tiny_checkpoint), prompts, params)[0]
    engine = spec_engine(tiny_checkpoint, k=4, max_num_seqs=4)
    assert run_all(engine, prompts, params)[0] == want
    s = engine.stats()
    print(f"\nSPEC ngram drafts {s['draft_tokens']} accepted {s['accepted_draft_tokens']}")
    assert s["draft_tokens"] > 0 and s["accepted_draft_tokens"] > 0
    assert_pools_full(engine)


def test_drafts_with_prefix_hits(tiny_checkpoint, prompts) -> None:
    shared = prompts[3][:256]
    variants = [shared + [11, 12], shared + [21, 22, 23], prompts[2]]
    cold = run_all(cpu_engine(tiny_checkpoint, max_num_seqs=4), variants, greedy(24))[0]
    drafter = Oracle(variants, cold, right=lambda i: i % 2 == 0)
    engine = spec_engine(tiny_checkpoint, drafter, max_num_seqs=4)
    run_all(engine, [shared + [99]], greedy(4))
    outs, trace = run_all(engine, variants, greedy(24))
    assert outs == cold
    hits = [trace.ready(rid).prompt_cache_hit_tokens for rid in sorted(trace.outputs)]
    assert hits[0] == 256 and hits[1] == 256, hits
    assert_pools_full(engine)


def test_drafts_with_preemption_recompute(tiny_checkpoint) -> None:
    rng = random.Random(5)
    prompts = [[rng.randrange(2, 129000) for _ in range(rng.randrange(100, 126))] for _ in range(8)]
    roomy = run_all(cpu_engine(tiny_checkpoint), prompts, greedy(30))[0]
    drafter = Oracle(prompts, roomy, right=lambda i: i % 3 != 1)
    tight = spec_engine(tiny_checkpoint, drafter, k=4, num_kv_blocks=7)
    assert run_all(tight, prompts, greedy(30))[0] == roomy
    assert tight.stats()["num_preemptions"] > 0
    assert_pools_full(tight)


def test_aborts_with_drafts_leak_nothing(tiny_checkpoint, prompts, plain) -> None:
    engine = spec_engine(tiny_checkpoint, Oracle(prompts, plain), max_num_seqs=8)
    ids = [engine.add_request(p, greedy(40)) for p in prompts]
    trace = Trace()
    for _ in range(5):
        trace.record(engine.step())
    engine.abort(ids[1])
    engine.abort(ids[4])
    drain(engine, trace)
    assert trace.finish(ids[1]) == "abort"
    assert_pools_full(engine)


def test_drafts_stop_at_max_tokens_and_eos(tiny_checkpoint, prompts, plain) -> None:
    # max_tokens inside a run of accepted drafts: exactly max_tokens come out.
    engine = spec_engine(tiny_checkpoint, Oracle(prompts, plain), k=5, max_num_seqs=8)
    outs = run_all(engine, prompts, greedy(7))[0]
    assert outs == [o[:7] for o in plain]
    # A stop token among accepted drafts ends the request there.
    stop = plain[0][3]
    params = dc.SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop])
    out = run_all(engine, prompts[:1], params)[0][0]
    assert out == plain[0][: plain[0].index(stop) + 1]
    assert_pools_full(engine)


def test_forced_tokens_next_to_verify_rows(tiny_checkpoint, prompts, plain) -> None:
    """Under zero-overhead scheduling a request with forced tokens (no drafts) decodes on in steps
    whose other rows verify drafts; its next row takes the forced token from that step's device
    output, which holds one sample per logits row."""
    forced = [7, 8, 9, 10, 11, 12]

    def params() -> list[dc.SamplingParams]:
        ps = [greedy() for _ in prompts]
        ps[3] = dc.SamplingParams(
            temperature=0.0, max_tokens=16, ignore_eos=True, forced_tokens=forced
        )
        return ps

    want = run_all(cpu_engine(tiny_checkpoint, max_num_seqs=8), prompts, params())[0]
    assert want[3][: len(forced)] == forced
    engine = spec_engine(tiny_checkpoint, Oracle(prompts, plain), max_num_seqs=8)
    assert engine.config.scheduler.zero_overhead
    assert run_all(engine, prompts, params())[0] == want
    assert engine.stats()["accepted_draft_tokens"] > 0
    assert_pools_full(engine)


def test_bad_drafters_mean_no_drafts(tiny_checkpoint, prompts, plain) -> None:
    class Broken(dc.Drafter):
        def propose(self, request_id, tokens, max_drafts):
            raise RuntimeError("drafter broke")

    class OutOfVocab(dc.Drafter):
        def propose(self, request_id, tokens, max_drafts):
            return [VOCAB + 5]

    for drafter in (Broken(), OutOfVocab()):
        engine = spec_engine(tiny_checkpoint, drafter, max_num_seqs=8)
        assert run_all(engine, prompts, greedy())[0] == plain
        assert engine.stats()["drafter_errors"] > 0


def test_speculative_options_are_checked(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        cpu_engine(tiny_checkpoint, num_speculative_tokens=6)
    with pytest.raises(ValueError, match="speculative_method"):
        cpu_engine(tiny_checkpoint, num_speculative_tokens=2, speculative_method="eagle")
    # Drafting turns zero-overhead scheduling off unless speculative_zero_overhead asks for it
    # (host drafters: a sequence skips the step after a verify row).
    engine = cpu_engine(tiny_checkpoint, num_speculative_tokens=2)
    assert engine.config.scheduler.zero_overhead is False
    engine = cpu_engine(tiny_checkpoint, num_speculative_tokens=2, speculative_zero_overhead=True)
    assert engine.config.scheduler.zero_overhead is True


# A tiny effective vocabulary: these four tokens get +40 on their logits, so the rest have
# probability below e^-30.
SMALL = [5, 6, 7, 8]
BIAS = {t: 40.0 for t in SMALL}


class RandomDrafter(dc.Drafter):
    """Proposes tokens of SMALL from a skewed distribution unrelated to the model's."""

    def propose(self, request_id: int, tokens: list[int], max_drafts: int) -> list[int]:
        rng = random.Random(hash((request_id, len(tokens))))
        return rng.choices(SMALL, weights=[6, 1, 1, 1], k=max_drafts)


def histograms(engine: dc.Engine, runs: int, position: int, max_tokens: int = 0) -> list[int]:
    prompt = [11, 12, 13, 14]
    n = max_tokens or position + 1
    params = [
        dc.SamplingParams(temperature=1.0, seed=s, max_tokens=n, logit_bias=BIAS)
        for s in range(runs)
    ]
    outs = run_all(engine, [prompt] * runs, params)[0]
    counts = [0] * len(SMALL)
    for o in outs:
        counts[SMALL.index(o[position])] += 1
    return counts


def two_sample_chi_square(a: list[int], b: list[int]) -> float:
    na, nb = sum(a), sum(b)
    x = 0.0
    for ca, cb in zip(a, b, strict=True):
        if ca + cb == 0:
            continue
        ea = (ca + cb) * na / (na + nb)
        eb = (ca + cb) * nb / (na + nb)
        x += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    return x


@pytest.mark.parametrize("zero_overhead", [False, True], ids=["sync", "zos"])
def test_sampled_tokens_keep_the_target_distribution(tiny_checkpoint, zero_overhead) -> None:
    """The 3rd generated token's distribution with drafts equals the one without (df 3:
    P(chi2 > 21.1) = 1e-4). The drafts' own distribution is far from it, which the same check
    flags: a verifier that accepted every draft would fail. With zero-overhead scheduling the
    requests run longer, so that skipping a step to draft pays (Scheduler::sits_out) and the 3rd
    token is verified."""
    runs = 600
    without = histograms(cpu_engine(tiny_checkpoint, max_num_seqs=32), runs, 2)
    engine = spec_engine(
        tiny_checkpoint, RandomDrafter(), k=3, max_num_seqs=32, zero_overhead=zero_overhead
    )
    with_drafts = histograms(engine, runs, 2, max_tokens=8 if zero_overhead else 0)
    stats = engine.stats()
    print(f"\nSPEC-CHI2 without {without} with drafts {with_drafts} stats {stats}")
    assert stats["draft_tokens"] > 0 and 0 < stats["accepted_draft_tokens"] < stats["draft_tokens"]
    assert two_sample_chi_square(without, with_drafts) < 21.1
    drafted = [round(runs * w / 9) for w in (6, 1, 1, 1)]
    assert two_sample_chi_square(without, drafted) > 21.1


class TwoTokens(dc.TokenConstraint):
    """Allows only tokens a and b, for n tokens; keeps its history so it can roll back."""

    def __init__(self, a: int, b: int, n: int) -> None:
        super().__init__()
        self.allowed, self.n, self.accepted = (a, b), n, []
        self.rollbacks = 0

    def fill_allowed(self, mask) -> None:
        for t in self.allowed:
            mask[t // 32] |= 1 << (t % 32)

    def accept(self, token: int) -> bool:
        if token not in self.allowed or len(self.accepted) >= self.n:
            return False
        self.accepted.append(token)
        return True

    def is_terminated(self) -> bool:
        return len(self.accepted) == self.n

    def can_rollback(self) -> bool:
        return True

    def rollback(self, num_tokens: int) -> None:
        self.rollbacks += 1
        del self.accepted[len(self.accepted) - num_tokens :]


def test_constrained_requests_draft_with_a_mask_per_verify_row(tiny_checkpoint, prompts) -> None:
    a, b = 1000, 2000

    def constrained() -> list[dc.SamplingParams]:
        return [
            dc.SamplingParams(temperature=0.0, max_tokens=30, constraint=TwoTokens(a, b, 12))
            for _ in prompts
        ]

    want = run_all(cpu_engine(tiny_checkpoint, max_num_seqs=8), prompts, constrained())[0]
    assert all(len(o) == 12 and set(o) <= {a, b} for o in want)
    # Drafts: the right continuation at even positions, a token the constraint refuses at odd.
    drafter = Oracle(prompts, want, right=lambda i: i % 2 == 0)
    engine = spec_engine(tiny_checkpoint, drafter, k=4, max_num_seqs=8)
    params = constrained()
    outs = run_all(engine, prompts, params)[0]
    assert outs == want
    s = engine.stats()
    assert s["accepted_draft_tokens"] > 0 and s["draft_tokens"] > s["accepted_draft_tokens"]
    assert all(p.constraint.accepted == o for p, o in zip(params, outs, strict=True))
    assert any(p.constraint.rollbacks > 0 for p in params)
    assert_pools_full(engine)


def test_xgrammar_constraint_drafts_and_rolls_back(tiny_checkpoint, prompts) -> None:
    pytest.importorskip("xgrammar")
    from deepinfer.server.app import tokenizer_json_path
    from deepinfer.structured import (
        StructuredCompiler,
        constraint_spec_from_request,
        make_constraint,
    )

    plain_engine = cpu_engine(tiny_checkpoint, max_num_seqs=8)
    vocab = plain_engine.vocab_size
    compiler = StructuredCompiler(tokenizer_json_path(), vocab, plain_engine.eos_token_ids)
    body = {"structured_outputs": {"regex": "[a-c]{3}-[0-9]{2}"}}
    compiled = compiler.compile(constraint_spec_from_request("chat", body))

    def params() -> list[dc.SamplingParams]:
        return [
            dc.SamplingParams(
                temperature=0.0, max_tokens=20, constraint=make_constraint(compiled, vocab, False)
            )
            for _ in prompts
        ]

    want = run_all(plain_engine, prompts, params())[0]
    drafter = Oracle(prompts, want, right=lambda i: i % 2 == 0)
    engine = spec_engine(tiny_checkpoint, drafter, k=3, max_num_seqs=8)
    assert run_all(engine, prompts, params())[0] == want
    assert engine.stats()["accepted_draft_tokens"] > 0
    assert_pools_full(engine)


def test_confidence_budget_drops_drafts_that_fail_and_keeps_those_that_pay(
    tiny_checkpoint, prompts, plain
) -> None:
    """speculative_budget confidence: once the step-cost model has samples, a request whose
    drafts are always rejected stops drafting, one whose drafts are always right keeps all k,
    and the output stays the same. (Without zero-overhead scheduling: only then is a step's wall
    time the step's, the cost model's samples.)"""
    right = {tuple(p) for p in prompts[:3]}

    class Split(Oracle):
        def propose(self, request_id, tokens, max_drafts):
            drafts = super().propose(request_id, tokens, max_drafts)
            for p in right:
                if tuple(tokens[: len(p)]) == p:
                    return drafts
            return [(t + 1) % VOCAB for t in drafts]

    want = run_all(cpu_engine(tiny_checkpoint, max_num_seqs=8), prompts, greedy(40))[0]
    ratios = {}
    for budget in ("fixed", "confidence"):
        engine = spec_engine(
            tiny_checkpoint,
            Split(prompts, want),
            k=3,
            max_num_seqs=8,
            speculative_budget=budget,
            zero_overhead=False,
        )
        outs = run_all(engine, prompts, greedy(40))[0]
        assert outs == want
        s = engine.stats()
        ratios[budget] = (s["draft_tokens"], s["accepted_draft_tokens"])
        assert s["accepted_draft_tokens"] > 0
        assert_pools_full(engine)
    print(f"\nSPEC budget: (drafts, accepted) {ratios}")
    # The rejected half stops drafting under the confidence budget; the right half keeps its
    # accepted drafts.
    assert ratios["confidence"][0] < 0.8 * ratios["fixed"][0], ratios
    assert ratios["confidence"][1] > 0.8 * ratios["fixed"][1], ratios


def test_speculative_budget_option_is_checked(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match="speculative_budget"):
        cpu_engine(tiny_checkpoint, num_speculative_tokens=2, speculative_budget="magic")


def test_drafts_with_a_tight_cache_and_preemption_stop(tiny_checkpoint) -> None:
    """With preemption "stop" and a tight cache, drafting kills no more requests than plain
    decoding does, the requests that finish give the plain greedy tokens, and nothing leaks.
    (Draft blocks come only from spare blocks; this workload does not reach the case where that
    rule is what saves a request.)"""
    rng = random.Random(6)
    prompts = [[rng.randrange(2, 129000) for _ in range(rng.randrange(100, 126))] for _ in range(8)]
    tight = {"num_kv_blocks": 9, "preemption": "stop"}
    plain_engine = cpu_engine(tiny_checkpoint, zero_overhead=False, **tight)
    plain_trace = run_all(plain_engine, prompts, greedy(30))[1]
    killed_plain = sum(plain_trace.finish(r) == "preempted" for r in plain_trace.outputs)
    oracle_outs = run_all(cpu_engine(tiny_checkpoint), prompts, greedy(30))[0]
    engine = spec_engine(tiny_checkpoint, Oracle(prompts, oracle_outs), k=4, **tight)
    outs, trace = run_all(engine, prompts, greedy(30))
    ids = sorted(trace.outputs)  # in prompt order
    killed = sum(trace.finish(r) == "preempted" for r in ids)
    print(f"\nSPEC tight cache: preempted without drafts {killed_plain}, with drafts {killed}")
    assert killed <= killed_plain
    assert engine.stats()["accepted_draft_tokens"] > 0
    # Requests that ran to the end give the plain greedy tokens.
    for i, r in enumerate(ids):
        if trace.finish(r) == "length":
            assert outs[i] == oracle_outs[i]
    assert_pools_full(engine)
