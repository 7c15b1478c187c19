"""load_format "dummy": an engine from a config.json alone, with random weights (benchmarks and
load tests at full widths without a checkpoint on disk)."""

from __future__ import annotations

import shutil

import deepinfer_core as dc
import pytest
from engine_helpers import assert_pools_full, run_all


def test_dummy_weights_need_only_the_config(tiny_checkpoint, tmp_path) -> None:
    shutil.copy(tiny_checkpoint / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        dc.Engine(str(tmp_path), device="cpu")
    params = dc.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine = dc.Engine(str(tmp_path), device="cpu", load_format="dummy", seed=3)
    assert any("random weights" in n for n in engine.load_notes)
    outs = run_all(engine, [[5, 6, 7], [9] * 40], params)[0]
    assert all(len(o) == 8 for o in outs)
    # The engine seed picks the weights: the same seed gives the same tokens, another does not.
    again = dc.Engine(str(tmp_path), device="cpu", load_format="dummy", seed=3)
    other = dc.Engine(str(tmp_path), device="cpu", load_format="dummy", seed=4)
    assert run_all(again, [[5, 6, 7]], params)[0][0] == outs[0]
    assert run_all(other, [[5, 6, 7]], params)[0][0] != outs[0]
    assert_pools_full(engine)


def test_load_format_is_checked(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match="load_format"):
        dc.Engine(str(tiny_checkpoint), device="cpu", load_format="pt")
