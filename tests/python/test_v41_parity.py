"""The DeepSeek-V4.1 text graph (CPU backend, fp32, YOCO off) against the torch reference
v41_reference.py, on the tiny configs A, B and C that together cover every layer role.

Each case writes the reference's random weights as a checkpoint (config.json, model.safetensors
with the model.md C.9 names, engram_tables.json) and loads it with deepinfer_core.ModelRunner,
which picks the V4.1 graph by model_type. Logits of one-shot prefill, chunked prefill and
token-by-token decode must match the reference run on the same schedule within
1e-4 * max |logit|; greedy continuations must be identical. The loader tests check the notes of
skipped tensor families and that errors name the offending tensor and the expected shape.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import v41_reference as ref
from runner_driver import RunnerDriver

deepinfer_core = pytest.importorskip("deepinfer_core")

REL_TOL = 1e-4
SEED = 0
PROMPT_LEN = 40
CHUNKS = [13, 9, 1, 1, 1, 1, 1, 13]  # 40 tokens
GREEDY_TOKENS = 16


# Tiny torch ops on one thread (conftest.py).
pytestmark = pytest.mark.usefixtures("torch_one_thread")


def write_checkpoint(model: ref.V41Model, path: Path, extra: dict | None = None) -> Path:
    """config.json, model.safetensors and engram_tables.json of a reference model."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.cfg.to_hf_config()))
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    tensors.update(extra or {})
    save_file(tensors, str(path / "model.safetensors"))
    tables = {
        "token_map": [int(t) for t in model.token_map],
        "multipliers": {
            str(layer): [int(m) for m in mult] for layer, mult in model.engram_mult.items()
        },
    }
    (path / "engram_tables.json").write_text(json.dumps(tables))
    return path


_models: dict = {}
_drivers: dict = {}


def model(name: str) -> ref.V41Model:
    if name not in _models:
        _models[name] = ref.V41Model(ref.TINY_CONFIGS[name], seed=SEED)
    return _models[name]


def driver(name: str, tmp_path_factory) -> RunnerDriver:
    if name not in _drivers:
        path = write_checkpoint(model(name), tmp_path_factory.mktemp(f"v41_{name}"))
        _drivers[name] = RunnerDriver(str(path), max_seqs=2, max_len=PROMPT_LEN + 64)
    return _drivers[name]


def prompt(name: str) -> list[int]:
    return ref.random_tokens(PROMPT_LEN, ref.TINY_CONFIGS[name].vocab_size, SEED + 11)


def reference_schedule(m: ref.V41Model, tokens: list[int], schedule: list[int]) -> np.ndarray:
    cache = m.new_cache("off")
    out, pos = [], 0
    for n in schedule:
        out.append(m.forward_chunk(cache, tokens[pos : pos + n]).numpy())
        pos += n
    return np.concatenate(out, axis=0)


def assert_close(ours: np.ndarray, want: np.ndarray, what: str) -> None:
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} != {want.shape}"
    scale = float(np.abs(want).max())
    err = float(np.abs(ours - want).max())
    assert err <= REL_TOL * scale, f"{what}: max abs diff {err:.3e} > {REL_TOL} * {scale:.3e}"


SCHEDULES = {
    "one_shot": [PROMPT_LEN],
    "chunked": CHUNKS,
    "token_by_token": [1] * PROMPT_LEN,
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_v41_logits_match_reference(name: str, schedule: str, tmp_path_factory) -> None:
    d = driver(name, tmp_path_factory)
    tokens = prompt(name)
    ours = d.run_schedule(tokens, SCHEDULES[schedule])
    want = reference_schedule(model(name), tokens, SCHEDULES[schedule])
    assert_close(ours, want, f"config {name}, {schedule}")


@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_v41_batch_of_two_sequences(name: str, tmp_path_factory) -> None:
    """A prefill chunk and decode rows of another sequence share calls (slots 0 and 1)."""
    d = driver(name, tmp_path_factory)
    cfg = ref.TINY_CONFIGS[name]
    a = prompt(name)
    b = ref.random_tokens(23, cfg.vocab_size, SEED + 5)
    outs = d.run_batched([a, b], [CHUNKS, [10, 1, 1, 1, 1, 1, 8]])
    assert_close(outs[0], reference_schedule(model(name), a, CHUNKS), f"config {name}, seq 0")
    assert_close(outs[1], model(name).forward(b).numpy(), f"config {name}, seq 1")


@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_v41_greedy_continuation(name: str, tmp_path_factory) -> None:
    d = driver(name, tmp_path_factory)
    m = model(name)
    tokens = prompt(name)
    ours = d.greedy(tokens, GREEDY_TOKENS)
    cache = m.new_cache("off")
    logits = m.forward_chunk(cache, tokens)
    want = []
    for _ in range(GREEDY_TOKENS):
        want.append(int(torch.argmax(logits[-1])))
        logits = m.forward_chunk(cache, [want[-1]])
    assert ours == want


# ---------------------------------------------------------------------------------------------
# Loader


def test_v41_loader_notes_skipped_families(tmp_path) -> None:
    m = model("C")
    h = m.cfg.hidden_size
    extra = {
        "vision.blocks.0.attn.qkv.weight": torch.zeros(4, 4),
        "image_start": torch.zeros(h),
        "image_newline": torch.zeros(h),
    }
    path = write_checkpoint(m, tmp_path / "ckpt", extra)
    runner = deepinfer_core.ModelRunner(str(path), num_blocks=4, num_state_slots=1, device="cpu")
    notes = "\n".join(runner.load_notes)
    assert "skipped 1 vision.* tensors" in notes
    assert "skipped 2 image_* tensors" in notes
    assert runner.config.vocab_size == m.cfg.vocab_size


def role_tensors(cfg: ref.V41TextConfig) -> list[tuple[str, list[int]]]:
    """One tensor of each layer role of config A, with the shape the loader expects."""
    h, d, di = cfg.hidden_size, cfg.head_dim, cfg.index_head_dim
    e_dim = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads * cfg.engram_head_dim
    return [
        ("layers.2.attn.compressor.wgate.weight", [d, h]),  # C2 kv source
        ("layers.6.attn.compressor.wkv.weight", [d, h]),  # C1 kv source
        ("layers.4.attn.indexer.wk.weight", [di, d]),  # index-K source
        ("layers.8.attn.indexer.weights_proj.weight", [cfg.index_n_heads, h]),  # restricted
        ("layers.4.engram.wkv.weight", [(cfg.hc_mult + 1) * h, e_dim]),  # Engram
        ("layers.3.ffn.gate.bias", [cfg.n_routed_experts]),  # every layer
    ]


@pytest.mark.parametrize("which", range(6))
def test_v41_loader_requires_each_role_tensor(which: int, tmp_path) -> None:
    m = model("A")
    name, shape = role_tensors(m.cfg)[which]
    state = m.state_dict()
    assert list(state[name].shape) == shape
    path = write_checkpoint(m, tmp_path / "ckpt")
    from safetensors.torch import save_file

    save_file(
        {k: v.contiguous() for k, v in state.items() if k != name},
        str(path / "model.safetensors"),
    )
    with pytest.raises(Exception) as err:
        deepinfer_core.ModelRunner(str(path), num_blocks=4, num_state_slots=1, device="cpu")
    msg = str(err.value)
    assert f"'{name}'" in msg and "expected shape [" + ", ".join(map(str, shape)) + "]" in msg


def test_v41_loader_names_a_wrong_shape(tmp_path) -> None:
    m = model("B")
    name = "layers.1.attn.indexer.wk.weight"
    state = {k: v.contiguous() for k, v in m.state_dict().items()}
    want = list(state[name].shape)
    state[name] = torch.zeros(want[0] + 1, want[1])
    from safetensors.torch import save_file

    path = write_checkpoint(m, tmp_path / "ckpt")
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(Exception) as err:
        deepinfer_core.ModelRunner(str(path), num_blocks=4, num_state_slots=1, device="cpu")
    msg = str(err.value)
    assert f"'{name}'" in msg
    assert f"[{want[0] + 1}, {want[1]}]" in msg and f"[{want[0]}, {want[1]}]" in msg


def test_v41_loader_needs_engram_tables(tmp_path) -> None:
    path = write_checkpoint(model("C"), tmp_path / "ckpt")
    tables = json.loads((path / "engram_tables.json").read_text())
    tables["multipliers"]["1"][2] = 4  # even
    (path / "engram_tables.json").write_text(json.dumps(tables))
    with pytest.raises(Exception, match=r"multipliers\.1.*odd positive"):
        deepinfer_core.ModelRunner(str(path), num_blocks=4, num_state_slots=1, device="cpu")
    (path / "engram_tables.json").unlink()
    with pytest.raises(Exception, match=r"engram_tables\.json"):
        deepinfer_core.ModelRunner(str(path), num_blocks=4, num_state_slots=1, device="cpu")


# ---------------------------------------------------------------------------------------------
# Real formats: FP8 on 32x32 blocks, MXFP4 experts, BF16 dense (model.md C.9)

_FP8 = re.compile(
    r"layers\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123]"
    r"|engram\.wkv)\.weight"
)
_FP4 = re.compile(r"layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight")
# The Engram table: FP8 with one UE8M0 scale per row and 32 columns (C.7.4, C.9).
_FP8_ROWS = re.compile(r"layers\.\d+\.engram\.embed\.weight")
# Dense tensors V4.1 ships in F32; the other dense float tensors are BF16.
_F32 = re.compile(r".*\.(hc_(attn|ffn)_(fn|base|scale)|attn_sink|gate\.bias|gate\.bias_vl)")


def quantize_like_v41(m: ref.V41Model) -> tuple[ref.V41Model, dict]:
    """The checkpoint tensors of `m` in V4.1's shipped formats, and a copy of `m` whose every
    weight is the exact value stored (codes times scales, or the bf16 value)."""
    import quant_checkpoint as qc

    exact = copy.deepcopy(m)
    tensors = {}
    params = dict(exact.named_parameters())
    with torch.no_grad():
        for name, w in m.state_dict().items():
            base = name[: -len(".weight")]
            if _FP4.fullmatch(name):
                packed, scale = qc.quantize_mxfp4(w)
                tensors[name], tensors[base + ".scale"] = packed, qc.as_e8m0(scale)
                params[name].copy_(qc.dequantize_mxfp4(packed, qc.e8m0_decode(scale)))
            elif _FP8_ROWS.fullmatch(name):
                codes, scale = qc.quantize_fp8_blocks(w, (1, 32))
                tensors[name], tensors[base + ".scale"] = codes, qc.as_e8m0(scale)
                params[name].copy_(qc.dequantize_fp8_blocks(codes, qc.e8m0_decode(scale), (1, 32)))
            elif _FP8.fullmatch(name):
                codes, scale = qc.quantize_fp8_blocks(w, (32, 32))
                tensors[name], tensors[base + ".scale"] = codes, qc.as_e8m0(scale)
                params[name].copy_(qc.dequantize_fp8_blocks(codes, qc.e8m0_decode(scale), (32, 32)))
            elif _F32.fullmatch(name):
                tensors[name] = w.contiguous()
            else:
                tensors[name] = w.to(torch.bfloat16)
                params[name].copy_(tensors[name].float())
    return exact, tensors


@pytest.mark.parametrize("schedule", ["one_shot", "chunked"])
@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_v41_real_format_checkpoint(name: str, schedule: str, tmp_path_factory) -> None:
    from safetensors.torch import save_file

    key = f"fp8_{name}"
    if key not in _drivers:
        exact, tensors = quantize_like_v41(model(name))
        path = write_checkpoint(exact, tmp_path_factory.mktemp(f"v41_{key}"))
        save_file(tensors, str(path / "model.safetensors"))
        _models[key] = exact
        _drivers[key] = RunnerDriver(
            str(path), max_seqs=1, max_len=PROMPT_LEN + 64, activation_quant="none"
        )
    tokens = prompt(name)
    ours = _drivers[key].run_schedule(tokens, SCHEDULES[schedule])
    want = reference_schedule(_models[key], tokens, SCHEDULES[schedule])
    assert_close(ours, want, f"config {name} (FP8 + MXFP4), {schedule}")
    # The quantization moved the logits: the test compares against the dequantized reference.
    assert float(np.abs(want - model(name).forward(tokens).numpy()).max()) > 1e-3


def test_v41_fp8_engram_table_of_several_scale_groups(tmp_path) -> None:
    """Config A with 64-wide Engram rows (two UE8M0 scales per row, as Flash's 256 has eight):
    the FP8 table's lookup decodes each 32-column group with its own scale."""
    from safetensors.torch import save_file

    m = ref.V41Model(replace(ref.TINY_A, engram_head_dim=64), seed=SEED)
    exact, tensors = quantize_like_v41(m)
    scale = tensors["layers.1.engram.embed.scale"]
    assert scale.shape == (m.cfg.engram_num_embeddings[0], 2)
    path = write_checkpoint(exact, tmp_path / "ckpt")
    save_file(tensors, str(path / "model.safetensors"))
    d = RunnerDriver(str(path), max_seqs=1, max_len=PROMPT_LEN + 64, activation_quant="none")
    tokens = prompt("A")
    ours = d.run_schedule(tokens, SCHEDULES["chunked"])
    want = reference_schedule(exact, tokens, SCHEDULES["chunked"])
    assert_close(ours, want, "config A, 64-wide FP8 Engram rows, chunked")


def fp8_engram_checkpoint(tmp_path: Path, scale_of=None) -> tuple[Path, str]:
    """Config C's weights with layer 0's Engram table in FP8; `scale_of(codes, scale)` returns
    the scale tensor to store (None: none)."""
    import quant_checkpoint as qc
    from safetensors.torch import save_file

    m = model("C")
    state = {k: v.contiguous() for k, v in m.state_dict().items()}
    name = "layers.0.engram.embed.weight"
    codes, scale = qc.quantize_fp8_blocks(state[name], (1, 32))
    state[name] = codes
    stored = scale_of(codes, qc.as_e8m0(scale)) if scale_of else None
    if stored is not None:
        state["layers.0.engram.embed.scale"] = stored
    path = write_checkpoint(m, tmp_path / "ckpt")
    save_file(state, str(path / "model.safetensors"))
    return path, name


def open_runner(path: Path) -> None:
    deepinfer_core.ModelRunner(str(path), num_blocks=4, num_state_slots=1, device="cpu")


def test_v41_loader_names_a_wrong_fp8_engram_scale_shape(tmp_path) -> None:
    path, name = fp8_engram_checkpoint(tmp_path, lambda codes, s: torch.cat([s, s], dim=1))
    rows = model("C").cfg.engram_num_embeddings[0]
    scale = "layers.0.engram.embed.scale"
    with pytest.raises(
        Exception,
        match=rf"scale tensor '{re.escape(scale)}' has shape \[{rows}, 2\] but "
        rf"'{re.escape(name)}' \[{rows}, 8\] needs \[{rows}, 1\]",
    ):
        open_runner(path)


def test_v41_loader_needs_the_fp8_engram_scale(tmp_path) -> None:
    path, name = fp8_engram_checkpoint(tmp_path)
    with pytest.raises(Exception, match=rf"'{re.escape(name)}' is F8_E4M3 but has no scale"):
        open_runner(path)


def test_v41_loader_names_a_wrong_fp8_engram_scale_dtype(tmp_path) -> None:
    path, _ = fp8_engram_checkpoint(tmp_path, lambda codes, s: s.float())
    with pytest.raises(Exception, match=r"engram\.embed\.scale' has dtype F32, expected F8_E8M0"):
        open_runner(path)


def test_v41_loader_names_a_nan_fp8_engram_scale(tmp_path) -> None:
    def nan_at_3_0(codes: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        b = s.view(torch.uint8).clone()
        b[3, 0] = 0xFF
        return b.view(torch.float8_e8m0fnu)

    path, _ = fp8_engram_checkpoint(tmp_path, nan_at_3_0)
    with pytest.raises(Exception, match=r"holds 0xff \(e8m0 NaN\) at \[3, 0\]"):
        open_runner(path)


def test_v41_loader_names_a_wrong_fp8_engram_row_count(tmp_path) -> None:
    import quant_checkpoint as qc
    from safetensors.torch import save_file

    m = model("C")
    state = {k: v.contiguous() for k, v in m.state_dict().items()}
    name = "layers.0.engram.embed.weight"
    codes, scale = qc.quantize_fp8_blocks(state[name][:-1], (1, 32))
    state[name], state["layers.0.engram.embed.scale"] = codes, qc.as_e8m0(scale)
    path = write_checkpoint(m, tmp_path / "ckpt")
    save_file(state, str(path / "model.safetensors"))
    rows = m.cfg.engram_num_embeddings[0]
    with pytest.raises(
        Exception,
        match=rf"'{re.escape(name)}' \(F8_E4M3\) has shape \[{rows - 1}, 8\] but config\.json "
        rf"implies \[{rows}, 8\]",
    ):
        open_runner(path)


def test_v41_engram_table_memory_option(tmp_path) -> None:
    """engram_table_memory: on the CPU every placement is the same host memory (the checkpoint's
    mapping), so "host" and "device" give the reference's logits too; an unknown mode, and a
    placement for a model without Engram layers, fail naming the option."""
    from safetensors.torch import save_file

    exact, tensors = quantize_like_v41(model("C"))
    path = write_checkpoint(exact, tmp_path / "ckpt")
    save_file(tensors, str(path / "model.safetensors"))
    tokens = prompt("C")
    want = reference_schedule(exact, tokens, [PROMPT_LEN])
    for mode in ("host", "device"):
        d = RunnerDriver(
            str(path),
            max_seqs=1,
            max_len=PROMPT_LEN + 64,
            activation_quant="none",
            engram_table_memory=mode,
        )
        assert_close(d.run_schedule(tokens, [PROMPT_LEN]), want, f"engram_table_memory {mode}")
    with pytest.raises(Exception, match=r"'engram_table_memory' must be \"auto\", \"device\" or"):
        deepinfer_core.ModelRunner(
            str(path), num_blocks=4, num_state_slots=1, device="cpu", engram_table_memory="disk"
        )
    engine = deepinfer_core.EngineConfig(device="cpu", engram_table_memory="disk")
    engine.model_path = str(path)
    with pytest.raises(Exception, match=r"'engram_table_memory' must be"):
        deepinfer_core.Engine(engine)

    # Config C without its Engram layers.
    no_engram = write_checkpoint(
        ref.V41Model(replace(ref.TINY_C, engram_layer_ids=(), engram_num_embeddings=()), seed=SEED),
        tmp_path / "no_engram",
    )
    with pytest.raises(Exception, match=r"'engram_table_memory' \"host\" needs a DeepSeek-V4\.1"):
        deepinfer_core.ModelRunner(
            str(no_engram),
            num_blocks=4,
            num_state_slots=1,
            device="cpu",
            engram_table_memory="host",
        )
