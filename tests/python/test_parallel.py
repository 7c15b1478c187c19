"""Data-parallel attention with expert-parallel MoE on the CPU (docs/parallel.md): N ranks are
threads of this process over the in-process communicator, each with its own scheduler, KV pools and
requests, the routed experts of every MoE layer split across them.

What is held:
  - greedy tokens equal to one rank's, and the top-5 logprobs within 1e-5 relative, on the tiny
    checkpoints (with top-2 routing the combine of a token's experts is one addition, so these are
    bit-identical; the top-4 config exercises a longer sum, where only rounding may differ), with 2
    and 4 ranks, with redundant expert slots, with and without zero-overhead scheduling;
  - `LLM(config)` and `python -m deepinfer.run` with `parallel: {data: N, expert: N}`;
  - the vote in the engine: a request reaching a rank while the others decode waits for the next
    ANY point and no longer; the dummy decodes are counted;
  - aborts mid-step on every rank free every block and slot;
  - least-loaded routing, and errors that name the option for every unsupported layout.
"""

from __future__ import annotations

import random
from pathlib import Path

import deepinfer_core as dc
import pytest
import v4_reference as ref
from deepinfer import LLM, run
from deepinfer import SamplingParams as PySamplingParams
from engine_helpers import Trace, cpu_engine, drain

GREEDY = dc.SamplingParams(temperature=0.0, max_tokens=16, logprobs=5)
REL_TOL = 1e-5


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """The embedded tiny model, the two parity configs, and f2 with top-4 of 16 experts."""
    tmp = tmp_path_factory.mktemp("parallel")
    out = {"tiny": Path(tiny_checkpoint)}
    out["f2"] = ref.save(ref.make_model(ref.F2_CONFIG, 0), tmp / "f2")
    out["real_ratio"] = ref.save(ref.make_model(ref.REAL_RATIO_CONFIG, 12), tmp / "real")
    top4 = dict(ref.F2_CONFIG, n_routed_experts=16, num_experts_per_tok=4)
    out["f2_top4"] = ref.save(ref.make_model(top4, 3), tmp / "f2_top4")
    return out


def prompts_for(vocab: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(n)] for n in (3, 17, 64, 129, 200, 90, 41)]


def run_engine(engine, prompts, params=GREEDY):
    ids = [engine.add_request(p, params) for p in prompts]
    trace = Trace()
    drain(engine, trace)
    for rid in ids:
        trace.check_contract(rid)
    return [trace.tokens(r) for r in ids], [
        [lp for o in trace.outputs[r] for lp in o.logprobs] for r in ids
    ]


def assert_logprobs_close(ours, want) -> None:
    for a, b in zip(ours, want, strict=True):
        assert len(a) == len(b)
        for (la, top_a), (lb, top_b) in zip(a, b, strict=True):
            assert [t for t, _ in top_a] == [t for t, _ in top_b]
            assert abs(la - lb) <= REL_TOL * max(abs(lb), 1.0)
            for (_, x), (_, y) in zip(top_a, top_b, strict=True):
                assert abs(x - y) <= REL_TOL * max(abs(y), 1.0), (x, y)


@pytest.mark.parametrize("name", ["tiny", "f2", "real_ratio", "f2_top4"])
@pytest.mark.parametrize(
    "layout",
    [
        {"data_parallel_size": 2, "expert_parallel_size": 2},
        {"data_parallel_size": 4, "expert_parallel_size": 4},
        {"data_parallel_size": 2, "expert_parallel_size": 2, "redundant_experts_per_rank": 1},
        {"data_parallel_size": 2},
    ],
    ids=["dp2-ep2", "dp4-ep4", "dp2-ep2-redundant1", "dp2-replicas"],
)
def test_parallel_ranks_equal_one_rank(checkpoints, name, layout) -> None:
    path = checkpoints[name]
    vocab = dc.Engine(str(path), device="cpu").vocab_size
    prompts = prompts_for(vocab)
    single_tokens, single_lps = run_engine(cpu_engine(path, max_num_seqs=8), prompts)
    engine = cpu_engine(path, max_num_seqs=8, **layout)
    tokens, lps = run_engine(engine, prompts)
    assert tokens == single_tokens
    assert_logprobs_close(lps, single_lps)
    stats = engine.stats()
    assert stats["dp_group_steps"] > 0
    assert stats["generated_tokens"] == sum(len(t) for t in tokens)


def test_parallel_without_zero_overhead_and_with_chunking(checkpoints) -> None:
    path = checkpoints["real_ratio"]
    prompts = prompts_for(128, seed=9)
    want, _ = run_engine(cpu_engine(path, max_num_seqs=8), prompts)
    for options in (
        {"zero_overhead": False},
        {"max_num_batched_tokens": 48},
        {"max_num_seqs": 2},  # most requests wait: prefill points while others decode
    ):
        engine = cpu_engine(
            path, **{"max_num_seqs": 8, **options}, data_parallel_size=2, expert_parallel_size=2
        )
        got, _ = run_engine(engine, prompts)
        assert got == want, options


def test_eplb_rebalances_without_changing_outputs(checkpoints) -> None:
    """EPLB in the engine (docs/architecture.md#eplb-in-the-engine): rebalances after group steps
    4 and 20 move experts between the ranks, the greedy tokens stay those of EPLB off, and the
    stats reach the dict (a group reports rank 0's)."""
    path = checkpoints["tiny"]
    prompts = prompts_for(4096, seed=5)
    params = dc.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5)
    layout = {"data_parallel_size": 2, "expert_parallel_size": 2, "redundant_experts_per_rank": 1}
    want, _ = run_engine(cpu_engine(path, max_num_seqs=8, **layout), prompts, params)
    engine = cpu_engine(
        path,
        max_num_seqs=8,
        **layout,
        enable_eplb=True,
        eplb_window_steps=8,
        eplb_rebalance_interval=16,
    )
    assert engine.config.parallel.enable_eplb
    got, _ = run_engine(engine, prompts, params)
    assert got == want
    s = engine.stats()
    assert s["eplb_rebalances"] >= 2
    assert s["eplb_last_pause_seconds"] > 0
    assert 1.0 <= s["eplb_max_over_mean_after"] <= s["eplb_max_over_mean_before"]
    assert s["num_blocks_free"] == s["num_blocks_total"]
    with pytest.raises(ValueError, match="enable_eplb"):
        cpu_engine(path, data_parallel_size=2, enable_eplb=True)


def test_llm_and_run_take_the_parallel_section(tmp_path, tiny_checkpoint, capsys) -> None:
    config = tmp_path / "dp.yaml"
    config.write_text(
        f"model: {tiny_checkpoint}\n"
        "engine: {device: cpu, max_num_seqs: 4}\n"
        "parallel: {data: 2, expert: 2}\n"
        'prompts: ["Hello", "The capital of France is", "1 2 3"]\n'
    )
    params = PySamplingParams(temperature=0.0, max_tokens=8)
    single = LLM(str(tiny_checkpoint), device="cpu", max_num_seqs=4)
    group = LLM(str(config))
    assert group.engine.config.parallel.data_parallel_size == 2
    prompts = ["Hello", "The capital of France is", "1 2 3"]
    want = [o.token_ids for o in single.generate(prompts, params)]
    got = [o.token_ids for o in group.generate(prompts, params)]
    assert got == want

    args = ["--config", str(config), "--quiet", "--no-progress", "--max-tokens", "4"]
    assert run.main(args) == 0
    out = capsys.readouterr().out
    assert "parallel:       2 data-parallel ranks, the routed experts split across them" in out
    assert run.main([*args, "--data-parallel-size", "4", "--expert-parallel-size", "4"]) == 0
    assert "parallel:       4 data-parallel ranks" in capsys.readouterr().out


def test_a_request_reaching_a_decoding_group_waits_for_the_any_point(tiny_checkpoint) -> None:
    any_interval = 5
    engine = cpu_engine(
        tiny_checkpoint,
        data_parallel_size=2,
        expert_parallel_size=2,
        dp_prefill_any_interval=any_interval,
        dp_prefill_all_interval=1000,
    )
    params = dc.SamplingParams(temperature=0.0, max_tokens=40)
    first = engine.add_request(list(range(5, 40)), params)
    trace = Trace()
    for _ in range(4):  # prefill, then decode steps: rank 1 runs dummy decodes
        trace.record(engine.step())
    assert trace.ready(first) is not None
    assert engine.stats()["dp_idle_passes"] >= 3
    second = engine.add_request(list(range(50, 70)), params)
    assert (first - 1) % 2 != (second - 1) % 2, "the idle rank takes the new request"
    steps = 0
    while trace.ready(second) is None:
        trace.record(engine.step())
        steps += 1
        assert steps <= any_interval + 1, "the new request waited past the ANY point"
    # It did wait: the group was decoding and the ALL point is far away.
    assert steps > 1
    drain(engine, trace)
    assert trace.finish(first) == "length" and trace.finish(second) == "length"


def test_a_request_reaching_an_idle_group_prefills_at_once(tiny_checkpoint) -> None:
    engine = cpu_engine(tiny_checkpoint, data_parallel_size=2, expert_parallel_size=2)
    trace = Trace()
    rid = engine.add_request([5, 6, 7], dc.SamplingParams(temperature=0.0, max_tokens=2))
    trace.record(engine.step())
    assert trace.ready(rid) is not None
    drain(engine, trace)
    # Nobody had work before: the group stays idle (no forward) once the request is done.
    steps = engine.stats()["dp_group_steps"]
    engine.step()
    assert engine.stats()["dp_group_steps"] == steps


def test_aborts_mid_step_on_every_rank_free_everything(tiny_checkpoint) -> None:
    engine = cpu_engine(tiny_checkpoint, data_parallel_size=2, expert_parallel_size=2)
    total_blocks = engine.stats()["num_blocks_total"]
    rng = random.Random(11)
    params = dc.SamplingParams(temperature=0.0, max_tokens=30)
    prompts = [[rng.randrange(2, 1000) for _ in range(60)] for _ in range(8)]
    ids = [engine.add_request(p, params) for p in prompts]
    assert {(i - 1) % 2 for i in ids} == {0, 1}
    trace = Trace()
    for _ in range(3):
        trace.record(engine.step())
    for rid in ids[::2]:
        engine.abort(rid)
    drain(engine, trace)
    for rid in ids:
        trace.check_contract(rid)
        assert trace.finish(rid) == ("abort" if rid in ids[::2] else "length")
    s = engine.stats()
    assert s["num_running"] == 0 and s["num_waiting"] == 0
    assert s["num_blocks_free"] == s["num_blocks_total"] == total_blocks
    engine.check_invariants()


def test_requests_go_to_the_least_loaded_rank(tiny_checkpoint) -> None:
    engine = cpu_engine(tiny_checkpoint, data_parallel_size=2, expert_parallel_size=2)
    params = dc.SamplingParams(temperature=0.0, max_tokens=4)
    rank = lambda rid: (rid - 1) % 2  # noqa: E731 (an id names its rank)
    long = engine.add_request(list(range(2, 500)), params)
    short = engine.add_request([5, 6], params)
    assert rank(long) != rank(short)  # one request each
    third = engine.add_request([7, 8], params)
    assert rank(third) == rank(short)  # tied on requests: fewer tokens of context
    run_trace = Trace()
    drain(engine, run_trace)
    fourth = engine.add_request([9], params)
    assert rank(fourth) == 0  # all finished: every rank is empty again, the lowest wins


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"data_parallel_size": 2, "tensor_parallel_size": 2}, "tensor_parallel_size"),
        ({"data_parallel_size": 2, "expert_parallel_size": 3}, "expert_parallel_size"),
        ({"data_parallel_size": 3, "expert_parallel_size": 3}, "expert_parallel_size"),
        ({"data_parallel_size": 0}, "data_parallel_size"),
        ({"redundant_experts_per_rank": 1}, "redundant_experts_per_rank"),
        ({"data_parallel_size": 2, "num_speculative_tokens": 2}, "num_speculative_tokens"),
        ({"data_parallel_size": 2, "dp_prefill_any_interval": 0}, "dp_prefill_any_interval"),
    ],
)
def test_unsupported_layouts_name_the_option(tiny_checkpoint, options, field) -> None:
    with pytest.raises(ValueError, match=f"'{field}'"):
        cpu_engine(tiny_checkpoint, **options)


def test_unknown_parallel_key_names_it(tmp_path) -> None:
    from deepinfer.config import ConfigError, load_config

    path = tmp_path / "bad.yaml"
    path.write_text("parallel: {data: 2, pipeline: 2}\n")
    with pytest.raises(ConfigError, match=r"parallel\.pipeline"):
        load_config(path)
    path.write_text("parallel: {data: two}\n")
    with pytest.raises(ConfigError, match=r"parallel\.data"):
        load_config(path)


def test_the_server_fronts_a_group() -> None:
    """`serve --data-parallel-size 2`: concurrent completions spread over both ranks, each equal
    to a single-rank server's, and /metrics shows the group's steps."""
    import httpx
    from server_process import MODEL, server_process

    prompts = [[5 + i, 6 + i, 7 + i, 8 + i] for i in range(6)]
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0.0}

    def completions(*args: str) -> tuple[list[str], str]:
        with (
            server_process("--device", "cpu", *args) as (_, url),
            httpx.Client(base_url=url, timeout=60) as client,
        ):
            texts = [
                client.post("/v1/completions", json={**body, "prompt": p}).json()["choices"][0][
                    "text"
                ]
                for p in prompts
            ]
            return texts, client.get("/metrics").text

    want, _ = completions()
    got, metrics = completions("--data-parallel-size", "2", "--expert-parallel-size", "2")
    assert got == want
    steps = [ln for ln in metrics.splitlines() if ln.startswith("deepinfer_engine_dp_group_steps ")]
    assert steps and float(steps[0].split()[1]) > 0, steps


def test_one_process_per_rank_equals_one_rank(tiny_checkpoint) -> None:
    """data_parallel_backend "processes": this process is rank 0 (the front) and starts rank 1
    as `python -m deepinfer.ranks`; they talk over TCP on loopback."""
    prompts = ["Hello", "The capital of France is", "1 2 3", "A long time ago"]
    params = PySamplingParams(temperature=0.0, max_tokens=8)
    want = [o.token_ids for o in LLM(str(tiny_checkpoint), device="cpu").generate(prompts, params)]
    llm = LLM(
        str(tiny_checkpoint),
        device="cpu",
        data_parallel_size=2,
        expert_parallel_size=2,
        data_parallel_backend="processes",
    )
    assert any("one process each" in n for n in llm.engine.load_notes)
    got = [o.token_ids for o in llm.generate(prompts, params)]
    assert got == want
    stats = llm.engine.stats()
    assert stats["dp_group_steps"] > 0
    assert stats["num_blocks_free"] == stats["num_blocks_total"]


def test_torchrun_environment_makes_rank_processes(tmp_path, tiny_checkpoint) -> None:
    """What torchrun does on several hosts, on one: two processes of `deepinfer.run` with RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT; rank 1 serves and exits 0, rank 0 prints the run."""
    import os
    import subprocess
    import sys

    from server_process import free_port

    config = tmp_path / "dp.yaml"
    config.write_text(
        f"model: {tiny_checkpoint}\n"
        "engine: {device: cpu, data_parallel_backend: processes}\n"
        "parallel: {data: 2, expert: 2}\n"
        'prompts: ["Hello", "The capital of France is"]\n'
    )
    port = free_port()
    procs = []
    for rank in (1, 0):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        args = ["--config", str(config), "--quiet", "--no-progress", "--max-tokens", "4"]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "deepinfer.run", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "parallel:       2 data-parallel ranks" in outs[1]
    assert "output tokens:  8" in outs[1], outs[1]
