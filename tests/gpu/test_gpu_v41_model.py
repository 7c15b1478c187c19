"""DeepSeek-V4.1 on the CUDA backend against the CPU reference backend: the same tiny fp32
checkpoints as tests/python/test_v41_parity.py (configs A, B, C), f32 KV, logits of a chunked
schedule within 1e-4 * max |logit| and identical greedy continuations; the FP8 Engram table in
device and in pinned host memory (engram_table_memory). Prints the measured error (`-s` shows
it)."""

from __future__ import annotations

import numpy as np
import pytest
import v41_reference as ref
from runner_driver import RunnerDriver
from test_v41_parity import CHUNKS, PROMPT_LEN, assert_close, prompt, write_checkpoint

pytestmark = pytest.mark.gpu
GREEDY_TOKENS = 16


def driver(path: str, device: str) -> RunnerDriver:
    return RunnerDriver(
        path, max_seqs=1, max_len=PROMPT_LEN + 64, device=device, activation_quant="none"
    )


@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_gpu_v41_matches_cpu(name: str, tmp_path) -> None:
    path = str(write_checkpoint(ref.V41Model(ref.TINY_CONFIGS[name], seed=0), tmp_path / name))
    tokens = prompt(name)
    cpu = driver(path, "cpu")
    want = cpu.run_schedule(tokens, CHUNKS)
    ours = driver(path, "cuda").run_schedule(tokens, CHUNKS)
    assert np.isfinite(ours).all()
    rel = float(np.abs(ours - want).max() / np.abs(want).max())
    greedy_gpu = driver(path, "cuda").greedy(tokens, GREEDY_TOKENS)
    greedy_cpu = cpu.greedy(tokens, GREEDY_TOKENS)
    same = sum(a == b for a, b in zip(greedy_gpu, greedy_cpu, strict=True))
    print(
        f"\nV41-GPU config {name}: max|cuda - cpu| / max|cpu| = {rel:.2e} over {ours.shape[0]} "
        f"positions; greedy {same}/{len(greedy_cpu)} identical"
    )
    assert_close(ours, want, f"config {name}, cuda vs cpu")
    assert greedy_gpu == greedy_cpu


@pytest.mark.parametrize("mode", ["mask", "compact"])
@pytest.mark.parametrize("name", ["A", "B"])
def test_gpu_v41_yoco_truncation_matches_cpu(name: str, mode: str, tmp_path) -> None:
    """YOCO prefill truncation (docs/model.md#yoco-prefill-truncation) on CUDA: the attention
    kernels' swa_start bound and compact's dropped rows, chunked with every chunk naming the
    prefill's end; compact's dropped rows are NaN on both."""
    cfg = ref.TINY_CONFIGS[name]
    path = str(write_checkpoint(ref.V41Model(cfg, seed=0), tmp_path / name))
    tokens = prompt(name)
    options = {
        "yoco_prefill_truncation": mode,
        "yoco_keep_tokens": cfg.yoco_keep_tokens,
        "max_backtrack": 1,  # keep >= sliding_window + max_backtrack on the tiny configs
    }

    def run(device: str) -> RunnerDriver:
        return RunnerDriver(
            path,
            max_seqs=1,
            max_len=PROMPT_LEN + 64,
            device=device,
            activation_quant="none",
            **options,
        )

    want = run("cpu").run_schedule(tokens, CHUNKS, prompt_end=PROMPT_LEN)
    ours = run("cuda").run_schedule(tokens, CHUNKS, prompt_end=PROMPT_LEN)
    kept = ~np.isnan(want).any(-1)
    assert np.array_equal(kept, ~np.isnan(ours).any(-1))
    assert kept.sum() >= cfg.yoco_keep_tokens
    rel = float(np.abs(ours[kept] - want[kept]).max() / np.abs(want[kept]).max())
    greedy_gpu = run("cuda").greedy(tokens, GREEDY_TOKENS)
    greedy_cpu = run("cpu").greedy(tokens, GREEDY_TOKENS)
    print(f"\nV41-GPU YOCO {mode} config {name}: max|cuda - cpu| / max|cpu| = {rel:.2e} (kept)")
    assert_close(ours[kept], want[kept], f"config {name}, yoco {mode}, cuda vs cpu")
    assert greedy_gpu == greedy_cpu


def fp8_engram_checkpoint(cfg: ref.V41TextConfig, path) -> str:
    """The model's f32 weights with its Engram tables in V4.1's shipped format: e4m3 rows with a
    UE8M0 scale per 32 columns (model.md C.7.4); the lookup is the only FP8 op."""
    import quant_checkpoint as qc
    from safetensors.torch import save_file

    m = ref.V41Model(cfg, seed=0)
    write_checkpoint(m, path)
    state = {k: v.contiguous() for k, v in m.state_dict().items()}
    for layer in cfg.engram_layer_ids:
        name = f"layers.{layer}.engram.embed.weight"
        codes, scale = qc.quantize_fp8_blocks(state[name], (1, 32))
        state[name] = codes
        state[f"layers.{layer}.engram.embed.scale"] = qc.as_e8m0(scale)
    save_file(state, str(path / "model.safetensors"))
    return str(path)


@pytest.mark.parametrize("memory", ["device", "host"])
def test_gpu_v41_fp8_engram_table_matches_cpu(memory: str, tmp_path) -> None:
    """The FP8 Engram table (embedding_fp8) on CUDA in device memory and in pinned host memory
    the kernel reads in place (engram_table_memory), against the CPU; 64-wide rows: two scales
    per row."""
    from dataclasses import replace

    path = fp8_engram_checkpoint(replace(ref.TINY_A, engram_head_dim=64), tmp_path / "A")
    tokens = prompt("A")

    def run(device: str) -> RunnerDriver:
        return RunnerDriver(
            path,
            max_seqs=1,
            max_len=PROMPT_LEN + 64,
            device=device,
            activation_quant="none",
            engram_table_memory=memory,
        )

    want = run("cpu").run_schedule(tokens, CHUNKS)
    gpu = run("cuda")
    on_host = [n for n in gpu.runner.load_notes if "pinned host memory" in n]
    assert len(on_host) == (2 if memory == "host" else 0), gpu.runner.load_notes
    ours = gpu.run_schedule(tokens, CHUNKS)
    rel = float(np.abs(ours - want).max() / np.abs(want).max())
    print(f"\nV41-GPU FP8 Engram table in {memory} memory: max|cuda - cpu| / max|cpu| = {rel:.2e}")
    assert_close(ours, want, f"FP8 Engram table in {memory} memory, cuda vs cpu")
