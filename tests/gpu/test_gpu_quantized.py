"""DeepSeek's shipped formats on the CUDA backend, on the real-format tiny checkpoints of the CPU
tests (test_quantized_parity.CASES: FP8 blocks 16x16 / 128x128 / 64x32, MXFP4 and FP8 experts,
both tensor spellings):

* the GPU's W8A8 / W4A8 path (activation_quant "auto" on CUDA) against the CPU's exact emulation
  of it (activation_quant "fp8"): max |gpu - cpu| <= 1e-2 * max |cpu| on one-shot, chunked and
  token-by-token schedules. The measured ratio is printed (run with -s to see it);
* greedy tokens against the CPU's exact dequantized reference (activation_quant "none"): the
  argmax of every teacher-forced position of the prompt and of a 32-token continuation agree on
  at least 99% of positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import quant_checkpoint as qc
import v4_reference as ref
from runner_driver import RunnerDriver
from test_quantized_parity import CASES, GREEDY_TOKENS

pytestmark = pytest.mark.gpu
EMULATION_TOL = 1e-2
MIN_AGREEMENT = 0.99


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    c = CASES[request.param]
    model = qc.make_quantizable_model(c.config, c.seed)
    ckpt = qc.write_quantized_checkpoint(model, tmp_path_factory.mktemp("gpuq") / request.param, c.spec)
    prompt = ref.random_tokens(c.prompt_len, c.config["vocab_size"], c.seed + 7)
    return request.param, str(ckpt.path), prompt, c.schedule


def driver(path: str, prompt: list[int], device: str, mode: str) -> RunnerDriver:
    return RunnerDriver(
        path, max_seqs=3, max_len=len(prompt) + GREEDY_TOKENS + 8, device=device,
        activation_quant=mode,
    )


def test_gpu_w8a8_matches_the_cpu_emulation(case) -> None:
    name, path, prompt, schedule = case
    gpu = driver(path, prompt, "cuda", "auto")
    cpu = driver(path, prompt, "cpu", "fp8")
    schedules = {"one-shot": [len(prompt)], "chunked": schedule, "decode": [1] * len(prompt)}
    for slot, (label, s) in enumerate(schedules.items()):
        ours = gpu.run_schedule(prompt, s, slot=slot)
        want = cpu.run_schedule(prompt, s, slot=slot)
        ratio = float(np.abs(ours - want).max()) / float(np.abs(want).max())
        print(f"\nQUANT-GPU {name} {label}: max|gpu - cpu fp8 emulation| / max|cpu| = {ratio:.2e}")
        assert ratio <= EMULATION_TOL, f"{name} {label}: {ratio:.3e} > {EMULATION_TOL}"


def test_gpu_greedy_tokens_agree_with_the_cpu_dequantized_reference(case) -> None:
    name, path, prompt, _ = case
    gpu = driver(path, prompt, "cuda", "auto")
    cpu = driver(path, prompt, "cpu", "none")
    continuation = gpu.greedy(prompt, GREEDY_TOKENS)
    tokens = prompt + continuation
    # Teacher forcing: both read the same tokens, so one early disagreement does not cascade.
    ours = gpu.run_schedule(tokens, [len(tokens)]).argmax(axis=1)
    want = cpu.run_schedule(tokens, [len(tokens)]).argmax(axis=1)
    agree = float(np.mean(ours == want))
    print(f"\nQUANT-GPU {name}: greedy argmax agreement with the CPU dequantized reference = "
          f"{agree:.4f} over {len(tokens)} positions")
    assert agree >= MIN_AGREEMENT, f"{name}: {agree:.4f} < {MIN_AGREEMENT}"
