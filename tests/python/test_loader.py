"""Checkpoint loading: both tensor namings, shards, bf16 weights, and one clear error (naming the
file and the tensor or field) for each kind of bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import deepinfer_core
import numpy as np
import pytest
import torch
import v4_reference as ref
from runner_driver import RunnerDriver
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4ForCausalLM

PROMPT = ref.random_tokens(40, 128, 5)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[object, Path]:
    model = ref.make_model(ref.F2_CONFIG, seed=3)
    return model, ref.save(model, tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture
def copy(saved, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(saved[1], dst)
    return dst


def logits(path: Path) -> np.ndarray:
    return RunnerDriver(str(path), max_seqs=1, max_len=128).run_schedule(PROMPT, [len(PROMPT)])


def test_original_names_in_shards_give_identical_logits(saved, tmp_path) -> None:
    _, path = saved
    tensors = load_file(str(path / "model.safetensors"))
    renamed = {ref.original_name(k): v for k, v in tensors.items()}
    names = sorted(renamed)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    out = tmp_path / "original"
    out.mkdir()
    shutil.copy(path / "config.json", out / "config.json")
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: renamed[k] for k in keys}, str(out / file))
        weight_map.update({k: file for k in keys})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    assert "layers.0.attn.kv_norm.weight" in renamed and "embed.weight" in renamed
    np.testing.assert_array_equal(logits(out), logits(path))


def test_bf16_checkpoint_matches_reference_on_the_same_weights(saved, tmp_path) -> None:
    model, _ = saved
    path = tmp_path / "bf16"
    model.to(torch.bfloat16).save_pretrained(str(path))
    model.to(torch.float32)
    # The reference runs the bf16-rounded weights in fp32, as our CPU backend does.
    reference = DeepseekV4ForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    want = ref.logits_one_shot(reference, PROMPT)
    ours = logits(path)
    assert np.abs(ours - want).max() <= 1e-4 * np.abs(want).max()


def test_truncated_safetensors_is_one_clear_error(copy) -> None:
    f = copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ValueError) as err:
        deepinfer_core.ModelRunner(str(copy))
    msg = str(err.value)
    assert str(f) in msg and "truncated" in msg, msg


def test_corrupt_safetensors_header_is_one_clear_error(copy) -> None:
    f = copy / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:12] = b"\x00\x01\x02\x03"  # garbage in the JSON header
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        deepinfer_core.ModelRunner(str(copy))


def edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_config_with_a_wrong_field_is_one_clear_error(copy) -> None:
    edit_config(copy, hidden_size="64")
    with pytest.raises(ValueError) as err:
        deepinfer_core.ModelRunner(str(copy))
    msg = str(err.value)
    assert str(copy / "config.json") in msg and "'hidden_size'" in msg and '"64"' in msg, msg


def test_config_inconsistent_with_weights_names_the_tensor(copy) -> None:
    edit_config(copy, q_lora_rank=48)
    with pytest.raises(ValueError) as err:
        deepinfer_core.ModelRunner(str(copy))
    msg = str(err.value)
    assert "layers.0.attn.wq_a.weight" in msg and "[32, 64]" in msg and "[48, 64]" in msg, msg


def test_unknown_model_type(copy) -> None:
    edit_config(copy, model_type="deepseek_v3")
    with pytest.raises(ValueError, match=r"model_type.*deepseek_v4.*deepseek_v3"):
        deepinfer_core.ModelRunner(str(copy))


def test_missing_tensor_names_it(copy) -> None:
    f = copy / "model.safetensors"
    tensors = load_file(str(f))
    del tensors["model.layers.3.attn.compressor.ape"]
    save_file(tensors, str(f))
    with pytest.raises(FileNotFoundError, match=r"layers\.3\.attn\.compressor\.ape"):
        deepinfer_core.ModelRunner(str(copy))


def test_missing_directory_and_config() -> None:
    with pytest.raises(FileNotFoundError, match="/nonexistent/ckpt"):
        deepinfer_core.ModelRunner("/nonexistent/ckpt")


def test_bad_batches_name_the_sequence_and_field(saved) -> None:
    _, path = saved
    runner = deepinfer_core.ModelRunner(str(path), num_blocks=4, num_state_slots=2)
    chunk = deepinfer_core.SequenceChunk
    cases = [
        ([chunk(5, 0, [1, 2], [1])], "'slot' 5"),
        ([chunk(0, 0, [1, 999], [1])], r"'tokens'\[1\] = 999"),
        ([chunk(0, 0, [1, 2], [])], "'block_table' has 0 blocks"),
        ([chunk(0, 0, [1, 2], [7])], r"'block_table'\[0\] = 7"),
        ([chunk(0, 0, [], [1])], "'tokens' is empty"),
        ([chunk(0, 0, [1], [1]), chunk(0, 0, [2], [2])], "used by another sequence"),
    ]
    for batch, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            runner.forward(batch)
    with pytest.raises(ValueError, match="logits"):
        runner.forward([chunk(0, 0, [1], [1])], logits="first")
    # The runner still works after rejected batches.
    assert runner.forward([chunk(0, 0, [1, 2, 3], [1])]).shape == (3, 128)


def test_build_info() -> None:
    info = deepinfer_core.build_info()
    assert info["backends"][0] == "cpu"
    assert info["version"] and info["compiler"] and info["build_type"]
    import deepinfer

    assert deepinfer.__version__ == info["version"]
