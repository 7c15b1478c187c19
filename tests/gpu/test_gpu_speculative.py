"""Speculative decoding on the CUDA backend: verify rows (1 + d tokens, run as chunks over the
KV) and the host-side acceptance. Drafts that are always right must give the plain greedy
output; on the device a verify row's logits come from the chunk attention path rather than the
decode kernel, so agreement is measured and printed, and required to be high."""

from __future__ import annotations

import random

import deepinfer_core as dc
import pytest
from deepinfer.tiny import ensure_tiny_checkpoint

pytestmark = pytest.mark.gpu


class Oracle(dc.Drafter):
    def __init__(self, prompts, outputs) -> None:
        super().__init__()
        self.by_prompt = {tuple(p): o for p, o in zip(prompts, outputs, strict=True)}

    def propose(self, request_id: int, tokens: list[int], max_drafts: int) -> list[int]:
        for prompt, out in self.by_prompt.items():
            if tuple(tokens[: len(prompt)]) == prompt:
                i = len(tokens) - len(prompt)
                return out[i : i + max_drafts]
        return []


def run(engine: dc.Engine, prompts, params) -> list[list[int]]:
    ids = [engine.add_request(p, params) for p in prompts]
    out: dict[int, list[int]] = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.id] += o.tokens
    engine.step()
    s = engine.stats()
    assert s["num_blocks_free"] == s["num_blocks_total"], s
    return [out[i] for i in ids]


@pytest.mark.parametrize("zero_overhead", [True, False], ids=["zos", "sync"])
def test_speculative_decoding_on_the_device(zero_overhead: bool) -> None:
    path = str(ensure_tiny_checkpoint())
    rng = random.Random(9)
    prompts = [[rng.randrange(2, 129000) for _ in range(n)] for n in (5, 40, 130, 260, 17, 90)]
    params = dc.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = run(dc.Engine(path, device="cuda", max_num_seqs=8), prompts, params)
    engine = dc.Engine(
        path,
        device="cuda",
        max_num_seqs=8,
        num_speculative_tokens=4,
        speculative_method="external",
        zero_overhead=zero_overhead,
        speculative_zero_overhead=zero_overhead,
    )
    engine.set_drafter(Oracle(prompts, plain))
    spec = run(engine, prompts, params)
    s = engine.stats()
    same = sum(a == b for x, y in zip(plain, spec, strict=True) for a, b in zip(x, y, strict=True))
    total = sum(len(x) for x in plain)
    print(
        f"\nSPEC-GPU zero_overhead={zero_overhead} greedy agreement {same}/{total}, drafts "
        f"{s['draft_tokens']} accepted "
        f"{s['accepted_draft_tokens']} verify rows {s['verify_rows']} steps {s['num_steps']}"
    )
    assert s["accepted_draft_tokens"] > 0.8 * s["draft_tokens"]
    assert same >= 0.97 * total


@pytest.mark.parametrize("zero_overhead", [False, True], ids=["sync", "zos"])
def test_mtp_drafting_on_the_device(zero_overhead: bool) -> None:
    """The checkpoint's MTP block drafting inside the engine on the GPU (speculative_method
    "mtp"; drafts made on the device within each step, with and without zero-overhead
    scheduling): greedy tokens against the same engine without drafts, and the draft
    statistics."""
    path = str(ensure_tiny_checkpoint(mtp=True))
    rng = random.Random(10)
    prompts = [[rng.randrange(2, 129000) for _ in range(n)] for n in (5, 40, 130, 260)]
    params = dc.SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    plain = run(dc.Engine(path, device="cuda", max_num_seqs=8), prompts, params)
    engine = dc.Engine(
        path,
        device="cuda",
        max_num_seqs=8,
        num_speculative_tokens=3,
        speculative_method="mtp",
        speculative_zero_overhead=zero_overhead,
    )
    assert engine.config.scheduler.zero_overhead is zero_overhead
    spec = run(engine, prompts, params)
    s = engine.stats()
    same = sum(a == b for x, y in zip(plain, spec, strict=True) for a, b in zip(x, y, strict=True))
    total = sum(len(x) for x in plain)
    print(
        f"\nMTP-SPEC-GPU zero_overhead={zero_overhead} greedy agreement {same}/{total}, "
        f"drafts {s['draft_tokens']} accepted "
        f"{s['accepted_draft_tokens']} verify rows {s['verify_rows']} steps {s['num_steps']} "
        f"device-carried rows {s['device_carried_rows']} "
        f"(verify {s['device_carried_verify_rows']}) "
        f"mean estimate {s['spec_mean_estimate']:.3g} calibration error "
        f"{s['spec_calibration_error']:.3g}"
    )
    assert s["draft_tokens"] > 0
    assert same >= 0.97 * total
    # Under zero-overhead scheduling each row is planned while the one before it runs, its tokens
    # and drafts carried and moved on the device.
    assert (s["device_carried_verify_rows"] > 0) is zero_overhead
    # Each verified draft's estimate is its MTP probability product, from the device's sample op.
    assert sum(s["spec_calibration_drafts"]) == s["draft_tokens"]
    assert 0 < s["spec_mean_estimate"] <= 1
