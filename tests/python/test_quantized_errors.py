"""Bad quantized checkpoints: each is one clear Python exception (never a crash) whose message names
the tensor or config field, and the shapes involved where a shape is wrong.

The exception types follow the loader's error codes (bindings/module.cpp): a corrupt or
inconsistent file or config is ValueError, a missing tensor FileNotFoundError, a format the loader
does not support RuntimeError.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import deepinfer_core
import pytest
import quant_checkpoint as qc
import torch
import v4_reference as ref
from safetensors.torch import load_file, save_file

SPEC = qc.QuantSpec(block=(16, 32), experts="fp4")
WQ_A = "layers.0.attn.wq_a"  # [32, 64] F8_E4M3, scale [2, 2]
EXPERT = "layers.2.ffn.experts.1.w2"  # logical [64, 32]: I8 [64, 16], scale [64, 1]
SHARED = "layers.2.ffn.shared_experts.w1"  # [32, 64] F8_E4M3


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    model = qc.make_quantizable_model(ref.F2_CONFIG, seed=5)
    path = tmp_path_factory.mktemp("errors") / "ckpt"
    qc.write_quantized_checkpoint(model, path, SPEC)
    return path


@pytest.fixture
def ckpt(saved, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(saved, dst)
    return dst


def edit_tensors(path: Path, edit) -> None:
    f = path / "model.safetensors"
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f))


def edit_config(path: Path, edit) -> None:
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def load_error(path: Path, kind: type[Exception]) -> str:
    with pytest.raises(kind) as err:
        deepinfer_core.ModelRunner(str(path), num_blocks=2, num_state_slots=1)
    return str(err.value)


def assert_names(msg: str, *parts: str) -> None:
    for p in parts:
        assert p in msg, f"{p!r} not in: {msg}"


def test_the_unedited_checkpoint_loads(saved) -> None:
    runner = deepinfer_core.ModelRunner(str(saved), num_blocks=2, num_state_slots=1)
    chunk = deepinfer_core.SequenceChunk(0, 0, [1, 2, 3], [1])
    assert runner.forward([chunk]).shape == (3, 128)


# ---- Scales ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [WQ_A, EXPERT])
def test_nan_e8m0_scale_names_the_tensor_and_entry(ckpt, name) -> None:
    def edit(t):
        s = t[name + ".scale"].view(torch.uint8).clone()
        s[-1, -1] = 0xFF
        t[name + ".scale"] = qc.as_e8m0(s)

    edit_tensors(ckpt, edit)
    msg = load_error(ckpt, ValueError)
    rows, cols = load_file(str(ckpt / "model.safetensors"))[name + ".scale"].shape
    assert_names(msg, f"'{name}.scale'", f"[{rows - 1}, {cols - 1}]", "0xff", "model.safetensors")


@pytest.mark.parametrize(
    ("name", "bad_shape", "want"), [(WQ_A, (2, 3), "[2, 2]"), (EXPERT, (64, 2), "[64, 1]")]
)
def test_scale_of_the_wrong_shape_names_both_shapes(ckpt, name, bad_shape, want) -> None:
    def edit(t):
        t[name + ".scale"] = qc.as_e8m0(torch.full(bad_shape, 127, dtype=torch.uint8))

    edit_tensors(ckpt, edit)
    msg = load_error(ckpt, ValueError)
    assert_names(
        msg, f"'{name}.scale'", f"[{bad_shape[0]}, {bad_shape[1]}]", want, f"'{name}.weight'"
    )


def test_scale_of_an_unsupported_dtype(ckpt) -> None:
    edit_tensors(ckpt, lambda t: t.update({WQ_A + ".scale": torch.ones(2, 2, dtype=torch.float16)}))
    msg = load_error(ckpt, RuntimeError)
    assert_names(msg, f"'{WQ_A}.scale'", "F16", "F8_E8M0")


@pytest.mark.parametrize("name", [WQ_A, EXPERT])
def test_non_power_of_two_scale_under_ue8m0(ckpt, name) -> None:
    """A float scale must still be a power of two for ue8m0 FP8 blocks and for MXFP4."""

    def edit(t):
        s = qc.e8m0_decode(t[name + ".scale"].view(torch.uint8))
        s[0, 0] = 0.3
        t[name + ".scale"] = s

    edit_tensors(ckpt, edit)
    msg = load_error(ckpt, ValueError)
    assert_names(msg, f"'{name}.scale'", "0.3", "[0, 0]", "power of two")


@pytest.mark.parametrize("value", [0.0, -0.25, float("inf")])
def test_float_scale_must_be_finite_and_positive(ckpt, value) -> None:
    edit_config(ckpt, lambda c: c["quantization_config"].update(scale_fmt="float"))

    def edit(t):
        s = qc.e8m0_decode(t[WQ_A + ".scale"].view(torch.uint8))
        s[1, 0] = value
        t[WQ_A + ".scale"] = s

    edit_tensors(ckpt, edit)
    assert_names(load_error(ckpt, ValueError), f"'{WQ_A}.scale'", "[1, 0]", "finite positive")


@pytest.mark.parametrize("name", [WQ_A, EXPERT])
def test_missing_scale_names_it_and_its_expected_shape(ckpt, name) -> None:
    edit_tensors(ckpt, lambda t: t.pop(name + ".scale"))
    msg = load_error(ckpt, FileNotFoundError)
    want = "[2, 2]" if name == WQ_A else "[64, 1]"
    assert_names(msg, f"'{name}.weight'", f"'{name}.scale'", want)


def test_scale_beside_a_dense_weight(ckpt) -> None:
    def edit(t):
        codes, scale = t[WQ_A + ".weight"], t[WQ_A + ".scale"].view(torch.uint8)
        t[WQ_A + ".weight"] = qc.dequantize_fp8_blocks(codes, qc.e8m0_decode(scale), SPEC.block)

    edit_tensors(ckpt, edit)
    assert_names(load_error(ckpt, ValueError), f"'{WQ_A}.weight'", "F32", f"'{WQ_A}.scale'")


# ---- Packing and dtypes ----------------------------------------------------------------------


def test_packed_expert_of_the_wrong_width(ckpt) -> None:
    """Unpacked int8 [64, 32] where two e2m1 values per byte give [64, 16]."""
    edit_tensors(
        ckpt, lambda t: t.update({EXPERT + ".weight": torch.zeros(64, 32, dtype=torch.int8)})
    )
    msg = load_error(ckpt, ValueError)
    assert_names(msg, f"'{EXPERT}.weight'", "[64, 32]", "[64, 16]", "two e2m1 values per byte")


def test_int8_where_fp8_is_expected(ckpt) -> None:
    """A shared expert is FP8 even when the routed experts are MXFP4."""

    def edit(t):
        t[SHARED + ".weight"] = torch.zeros(32, 32, dtype=torch.int8)
        t[SHARED + ".scale"] = qc.as_e8m0(torch.full((32, 2), 127, dtype=torch.uint8))

    edit_tensors(ckpt, edit)
    assert_names(load_error(ckpt, ValueError), f"'{SHARED}.weight'", "I8", "expected F8_E4M3")


def test_fp8_routed_expert_when_expert_dtype_is_fp4(ckpt) -> None:
    def edit(t):
        t[EXPERT + ".weight"] = torch.zeros(64, 32).to(torch.float8_e4m3fn)
        t[EXPERT + ".scale"] = qc.as_e8m0(torch.full((4, 1), 127, dtype=torch.uint8))

    edit_tensors(ckpt, edit)
    msg = load_error(ckpt, ValueError)
    assert_names(msg, f"'{EXPERT}.weight'", "F8_E4M3", "I8 packed e2m1", "expert_dtype")


def test_packed_experts_without_expert_dtype(ckpt) -> None:
    edit_config(ckpt, lambda c: c.pop("expert_dtype"))
    msg = load_error(ckpt, ValueError)
    assert_names(msg, ".ffn.experts.", "I8", "expected F8_E4M3", "expert_dtype")


def test_fp8_weights_without_quantization_config(ckpt) -> None:
    edit_config(ckpt, lambda c: (c.pop("quantization_config"), c.pop("expert_dtype")))
    msg = load_error(ckpt, ValueError)
    assert_names(msg, f"'{WQ_A}.weight'", "F8_E4M3", "quantization_config")


def test_quantized_tensor_where_deepseek_ships_bf16(ckpt) -> None:
    name = "layers.2.attn.compressor.wkv"

    def edit(t):
        codes, scale = qc.quantize_fp8_blocks(t[name + ".weight"].float(), SPEC.block)
        t[name + ".weight"] = codes
        t[name + ".scale"] = qc.as_e8m0(scale)

    edit_tensors(ckpt, edit)
    msg = load_error(ckpt, RuntimeError)
    assert_names(msg, f"'{name}.weight'", "F8_E4M3", "bf16")


# ---- config.json -----------------------------------------------------------------------------


def test_unknown_quant_method_names_the_field_and_value(ckpt) -> None:
    edit_config(ckpt, lambda c: c["quantization_config"].update(quant_method="awq"))
    msg = load_error(ckpt, RuntimeError)
    assert_names(msg, "config.json", "'quantization_config.quant_method'", '"awq"', '"fp8"')


@pytest.mark.parametrize("block", [[96, 128], [128], [0, 128], "128x128"])
def test_bad_weight_block_size(ckpt, block) -> None:
    edit_config(ckpt, lambda c: c["quantization_config"].update(weight_block_size=block))
    assert_names(load_error(ckpt, ValueError), "config.json", "weight_block_size")


def test_block_size_that_disagrees_with_the_scales(ckpt) -> None:
    """weight_block_size [32, 32] while the scales were written for [16, 32] blocks."""
    edit_config(ckpt, lambda c: c["quantization_config"].update(weight_block_size=[32, 32]))
    msg = load_error(ckpt, ValueError)
    assert_names(msg, ".scale'", "[2, 2]", "[1, 2]", "blocks 32x32")


def test_expert_dtype_without_quantization_config(ckpt) -> None:
    edit_config(ckpt, lambda c: c.pop("quantization_config"))
    assert_names(load_error(ckpt, ValueError), "expert_dtype", "quantization_config")


def test_conflicting_expert_dtypes(ckpt) -> None:
    edit_config(ckpt, lambda c: c["quantization_config"].update(expert_dtype="fp8"))
    assert_names(load_error(ckpt, ValueError), "expert_dtype", '"fp8"', '"fp4"')


def test_unknown_expert_dtype(ckpt) -> None:
    edit_config(ckpt, lambda c: c.update(expert_dtype="int4"))
    assert_names(load_error(ckpt, ValueError), "expert_dtype", "int4")


def test_runner_still_loads_after_errors(saved, tmp_path) -> None:
    """The failures above leave nothing behind: a good checkpoint still loads and runs."""
    bad = tmp_path / "bad"
    shutil.copytree(saved, bad)
    edit_tensors(bad, lambda t: t.pop(WQ_A + ".scale"))
    for _ in range(3):
        load_error(bad, FileNotFoundError)
    test_the_unedited_checkpoint_loads(saved)
