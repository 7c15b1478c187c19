"""DeepSeek-V4.1 through the engine (deepinfer_core.Engine, CPU, f32 KV unless a test says
otherwise: bf16 and V4.1's FP8/FP4 formats are checked too, against the reference fed the
engine's tokens, as rounding to their grids can flip a near-tie): greedy continuations
equal the torch reference v41_reference.py on tiny configs A, B and C (every layer role, Engram),
under chunked prefill, batching, zero-overhead scheduling on and off (a decode row's first token is
carried on the device, so its Engram n-gram is patched there) and prefix-cache hits (the V4.1
state snapshot: SWA rings and C2 compressor rings; the n-gram history comes from the sequence's
tokens).
"""

from __future__ import annotations

import json

import pytest
import quantized_kv_checks as qkv
import torch
import v41_reference as ref
from engine_helpers import assert_pools_full, cpu_engine, run_all
from test_v41_parity import write_checkpoint

dc = pytest.importorskip("deepinfer_core")

NAME = "A"
MAX_TOKENS = 12


# Tiny torch ops on one thread (conftest.py).
pytestmark = pytest.mark.usefixtures("torch_one_thread")


_models: dict = {}
_checkpoints: dict = {}


def model_of(name: str) -> ref.V41Model:
    if name not in _models:
        _models[name] = ref.V41Model(ref.TINY_CONFIGS[name], seed=0)
    return _models[name]


def checkpoint_of(name: str, tmp_path_factory):
    if name not in _checkpoints:
        _checkpoints[name] = write_checkpoint(
            model_of(name), tmp_path_factory.mktemp(f"v41_engine_{name}")
        )
    return _checkpoints[name]


@pytest.fixture
def model() -> ref.V41Model:
    return model_of(NAME)


@pytest.fixture
def checkpoint(tmp_path_factory):
    return checkpoint_of(NAME, tmp_path_factory)


def greedy_reference(m: ref.V41Model, prompt: list[int], n: int) -> list[int]:
    cache = m.new_cache("off")
    logits = m.forward_chunk(cache, prompt)
    out = []
    for _ in range(n):
        out.append(int(torch.argmax(logits[-1])))
        logits = m.forward_chunk(cache, [out[-1]])
    return out


def prompts(n: int, lengths: list[int], name: str = NAME) -> list[list[int]]:
    vocab = ref.TINY_CONFIGS[name].vocab_size
    return [ref.random_tokens(length, vocab, 100 + i) for i, length in enumerate(lengths[:n])]


GREEDY = dc.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.mark.parametrize(
    ("name", "zero_overhead"), [("A", True), ("A", False), ("B", True), ("C", True)]
)
def test_v41_engine_greedy_equals_reference(
    name: str, zero_overhead: bool, tmp_path_factory
) -> None:
    ps = prompts(3, [37, 21, 50], name)
    engine = cpu_engine(
        checkpoint_of(name, tmp_path_factory),
        max_num_seqs=4,
        max_num_batched_tokens=32,
        zero_overhead=zero_overhead,
    )
    outs, _ = run_all(engine, ps, GREEDY)
    assert outs == [greedy_reference(model_of(name), p, MAX_TOKENS) for p in ps]
    assert_pools_full(engine)


LOGPROB_TOL = 0.02  # |ours - reference| logprob of the sampled token, all but MAX_FLIPS steps
MAX_LOGPROB_DIFF = 0.5  # at every step


def assert_tracks_reference(m: ref.V41Model, prompts_: list, outs: list, trace, kv: str) -> None:
    """Greedy tokens and their logprobs against the reference fed the same tokens, with
    quantized_kv_checks' allowance for flipped near-ties (a wrong layout or scale moves every
    step's logprobs by far more than LOGPROB_TOL)."""
    flips, far = [], []
    rids = sorted(trace.outputs)
    for rid, prompt, tokens in zip(rids, prompts_, outs, strict=True):
        assert trace.tokens(rid) == tokens and len(tokens) == MAX_TOKENS
        ours = [lp[0] for lp in logprob_trace(trace, rid)]
        want = qkv.teacher_forced_logprobs(m, m.new_cache("off", kv_format=kv), prompt, tokens)
        flips += qkv.greedy_flips(want, tokens, f"request {rid}")
        for step, (t, lp) in enumerate(zip(tokens, ours, strict=True)):
            got = float(want[step, t])
            where = f"request {rid} step {step} token {t}: logprob {lp:.4f}, reference {got:.4f}"
            assert abs(lp - got) <= MAX_LOGPROB_DIFF, where
            if abs(lp - got) > LOGPROB_TOL:
                far.append(where)
    assert len(flips) <= qkv.MAX_FLIPS, flips
    assert len(far) <= qkv.MAX_FLIPS, far


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_v41_engine_quantized_kv_tracks_reference(kv: str, tmp_path_factory) -> None:
    """kv_cache_dtype bf16, and fp8 (V4.1's FP8 SWA + FP4 entries and index keys): batched,
    chunked, zero-overhead; the reference emulates the same formats (quantized_kv_checks.py)."""
    ps = prompts(3, [37, 21, 50], "A")
    engine = cpu_engine(
        checkpoint_of("A", tmp_path_factory),
        max_num_seqs=4,
        max_num_batched_tokens=32,
        kv_cache_dtype=kv,
    )
    assert engine.config.cache.kv_cache_dtype == kv
    params = dc.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    outs, trace = run_all(engine, ps, params)
    assert_tracks_reference(model_of("A"), ps, outs, trace, kv)
    assert_pools_full(engine)


@pytest.mark.parametrize("graphs", [0, 4], ids=["eager", "graphs"])
def test_v41_engine_prefix_hit_equals_cold_run(model, checkpoint, graphs: int) -> None:
    (p,) = prompts(1, [300])
    params = dc.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=5)
    cold_engine = cpu_engine(checkpoint, enable_prefix_cache=False, decode_graph_max_batch=0)
    cold, cold_trace = run_all(cold_engine, [p], params)
    # With graphs the warm run's decode steps replay them (its n-grams from the hit's history).
    warm_engine = cpu_engine(checkpoint, decode_graph_max_batch=graphs)
    run_all(warm_engine, [p[:270] + [17]], params)  # caches 2 blocks and the snapshot at 256
    warm, warm_trace = run_all(warm_engine, [p], params)
    (cold_id,), (warm_id,) = list(cold_trace.outputs), list(warm_trace.outputs)
    assert warm_trace.ready(warm_id).prompt_cache_hit_tokens == 256
    cold_lp = [lp for o in cold_trace.outputs[cold_id] for lp in o.logprobs]
    warm_lp = [lp for o in warm_trace.outputs[warm_id] for lp in o.logprobs]
    assert warm_lp == cold_lp
    assert warm == cold == [greedy_reference(model, p, 6)]
    assert (warm_engine.stats()["num_graph_steps"] > 0) == (graphs > 0)
    assert_pools_full(warm_engine)


def logprob_trace(trace, rid: int) -> list:
    return [lp for o in trace.outputs[rid] for lp in o.logprobs]


@pytest.mark.parametrize("zero_overhead", [True, False], ids=["zos", "sync"])
def test_v41_engine_decode_graphs_equal_eager(checkpoint, zero_overhead: bool) -> None:
    """Decode graphs (cpp/src/model/decode_graphs.h) on the CPU backend re-issue their recorded
    calls: the padding to a bucket (a batch of 3 runs as 4), the scratch slot, the staged
    metadata and Engram n-grams, and under zero-overhead scheduling the carried token patched into
    both on the device are the code CUDA graphs replay. The CPU computes each row on its own, so
    tokens and logprobs equal the eager engine's bitwise. Requests of different lengths finish
    apart, so decode batches shrink from 4 to 1; a limit of 2 sends the larger ones eagerly."""
    ps = prompts(4, [37, 21, 50, 9])
    params = [
        dc.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=3)
        for n in (12, 9, 6, 3)
    ]

    def run(graphs: int) -> tuple[list[list[int]], list[list], int]:
        engine = cpu_engine(
            checkpoint,
            max_num_seqs=4,
            max_num_batched_tokens=32,
            zero_overhead=zero_overhead,
            decode_graph_max_batch=graphs,
        )
        outs, trace = run_all(engine, ps, params)
        assert_pools_full(engine)
        lps = [logprob_trace(trace, rid) for rid in sorted(trace.outputs)]
        return outs, lps, engine.stats()["num_graph_steps"]

    eager_outs, eager_lps, eager_steps = run(0)
    assert eager_steps == 0
    assert eager_outs == [
        greedy_reference(model_of(NAME), p, len(o)) for p, o in zip(ps, eager_outs, strict=True)
    ]
    for limit in (4, 2):
        outs, lps, steps = run(limit)
        assert steps > 0, f"limit {limit}: no decode step replayed a graph"
        assert outs == eager_outs, f"limit {limit}"
        assert lps == eager_lps, f"limit {limit}"


def test_v41_engine_refuses_what_it_lacks(checkpoint) -> None:
    with pytest.raises(Exception, match=r"DeepSeek-V4\.1 runs on one rank only"):
        cpu_engine(checkpoint, data_parallel_size=2)


@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_v41_engine_random_weights(name: str, tmp_path) -> None:
    """load_format dummy (the benchmarks' V4.1-Flash-width models): only config.json is read, the
    weights are random in the config's formats (FP8 32x32 and MXFP4 experts here), and the same
    seed gives the same tokens."""
    (tmp_path / "config.json").write_text(json.dumps(ref.TINY_CONFIGS[name].to_hf_config()))
    params = dc.SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    runs = []
    for _ in range(2):
        engine = cpu_engine(tmp_path, load_format="dummy", seed=3)
        assert any("random weights" in note for note in engine.load_notes)
        outs, _ = run_all(engine, prompts(2, [40, 150], name), params)
        assert [len(o) for o in outs] == [5, 5]
        assert_pools_full(engine)
        runs.append(outs)
    assert runs[0] == runs[1]
    # Random weights keep a dense Engram table in the backend's memory: "host" is refused.
    if not ref.TINY_CONFIGS[name].engram_layer_ids:
        return
    with pytest.raises(ValueError, match=r"engram\.embed\.weight: 'engram_table_memory' \"host\""):
        cpu_engine(tmp_path, load_format="dummy", seed=3, engram_table_memory="host")


def test_v41_engine_load_notes(model, tmp_path) -> None:
    extra = {"mtp.0.attn.wq_a.weight": torch.zeros(4, 4), "vision.patch.weight": torch.zeros(2)}
    engine = cpu_engine(write_checkpoint(model, tmp_path / "ckpt", extra))
    notes = "\n".join(engine.load_notes)
    assert "skipped 1 mtp.* tensors" in notes and "skipped 1 vision.* tensors" in notes


def test_v41_engine_host_tier_hit_equals_reference(model, checkpoint) -> None:
    """Blocks (compressed entries and index keys of the sources) and the state snapshot written
    through to the host tier come back as a hit equal to the reference."""
    vocab = ref.TINY_CONFIGS[NAME].vocab_size
    shared = ref.random_tokens(300, vocab, 7)  # 2 full blocks before the last prompt token
    unrelated = ref.random_tokens(400, vocab, 8)
    variants = [shared + [11, 12], shared + [21]]
    params = dc.SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    # 4 usable blocks: the unrelated prompt reuses every cached one.
    engine = cpu_engine(checkpoint, kv_host_cache_bytes=1 << 28, num_kv_blocks=5)
    run_all(engine, [shared + [99]], params)
    run_all(engine, [unrelated], params)
    assert engine.stats()["prompt_tokens_cached"] == 0
    warm, trace = run_all(engine, variants, params)
    assert [trace.ready(r).prompt_cache_hit_tokens for r in sorted(trace.outputs)] == [256, 256]
    assert engine.stats()["host_hit_tokens"] > 0
    assert warm == [greedy_reference(model, p, 4) for p in variants]
    assert_pools_full(engine)


class ReferenceDrafter(dc.Drafter):
    """Drafts the reference's own greedy continuation, wrong at every third position."""

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]]) -> None:
        super().__init__()
        self.by_prompt = {tuple(p): o for p, o in zip(prompts, outputs, strict=True)}

    def propose(self, request_id: int, tokens: list[int], max_drafts: int) -> list[int]:
        for prompt, out in self.by_prompt.items():
            if tuple(tokens[: len(prompt)]) == prompt:
                i = len(tokens) - len(prompt)
                vocab = ref.TINY_CONFIGS[NAME].vocab_size
                cont = out[i : i + max_drafts]
                return [t if (i + k) % 3 != 2 else (t + 1) % vocab for k, t in enumerate(cont)]
        return []


@pytest.mark.parametrize("zero_overhead", [False, True], ids=["sync", "zos"])
def test_v41_engine_speculation_equals_reference(model, checkpoint, zero_overhead: bool) -> None:
    """Verify rows (the last token and the drafts at once) hash the drafts into their n-grams;
    accepted drafts become the history of the next rows. Under zero-overhead scheduling a
    drafting sequence sits out the step after its verify row while the others' carried rows
    patch their first token into the n-grams on the device."""
    ps = prompts(2, [30, 19])
    want = [greedy_reference(model, p, MAX_TOKENS) for p in ps]
    engine = cpu_engine(
        checkpoint,
        num_speculative_tokens=3,
        speculative_method="external",
        speculative_zero_overhead=zero_overhead,
    )
    assert engine.config.scheduler.zero_overhead is zero_overhead
    engine.set_drafter(ReferenceDrafter(ps, want))
    outs, _ = run_all(engine, ps, GREEDY)
    s = engine.stats()
    assert s["accepted_draft_tokens"] > 0 and s["accepted_draft_tokens"] < s["draft_tokens"], s
    assert outs == want
    assert_pools_full(engine)


def test_v41_engine_auto_kv_is_f32_on_the_cpu(checkpoint) -> None:
    """kv_cache_dtype "auto" on the CPU is f32 for V4.1 as for V4 (the tiny checkpoints declare
    FP8 weights; on a GPU "auto" is fp8, V4.1's formats: tests/gpu/test_gpu_v41_kv.py)."""
    assert cpu_engine(checkpoint).config.cache.kv_cache_dtype == "f32"
