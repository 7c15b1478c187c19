"""logit_bias, penalties and token constraints on the CUDA backend: the adjustments run on the
device, and a constrained request under zero-overhead scheduling (the deferred sample) emits
exactly what its constraint allows while its neighbours decode as they would alone."""

from __future__ import annotations

import random

import deepinfer_core as dc
import numpy as np
import pytest
from deepinfer.tiny import ensure_tiny_checkpoint

pytestmark = pytest.mark.gpu


class ForceSequence(dc.TokenConstraint):
    def __init__(self, tokens: list[int]) -> None:
        super().__init__()
        self.tokens = tokens
        self.pos = 0

    def fill_allowed(self, mask: np.ndarray) -> None:
        t = self.tokens[self.pos]
        mask[t // 32] |= np.uint32(1 << (t % 32))

    def accept(self, token: int) -> bool:
        ok = self.pos < len(self.tokens) and token == self.tokens[self.pos]
        self.pos += ok
        return ok

    def is_terminated(self) -> bool:
        return self.pos == len(self.tokens)


def run(engine: dc.Engine, prompts: list[list[int]], params: list[dc.SamplingParams]):
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    tokens: dict[int, list[int]] = {i: [] for i in ids}
    finish: dict[int, str] = {}
    while engine.has_unfinished():
        for o in engine.step():
            tokens[o.id] += o.tokens
            if o.finish is not None:
                finish[o.id] = o.finish
    engine.step()
    s = engine.stats()
    assert s["num_blocks_free"] == s["num_blocks_total"], s
    return [tokens[i] for i in ids], [finish[i] for i in ids]


@pytest.mark.parametrize("zero_overhead", [True, False])
def test_constraints_bias_and_penalties_on_the_device(zero_overhead: bool) -> None:
    path = str(ensure_tiny_checkpoint())
    engine = dc.Engine(path, device="cuda", max_num_seqs=8, zero_overhead=zero_overhead)
    rng = random.Random(4)
    prompts = [[rng.randrange(2, 129000) for _ in range(n)] for n in (6, 50, 200, 17)]
    greedy = dc.SamplingParams(temperature=0.0, max_tokens=12)
    plain, _ = run(engine, prompts, [greedy] * 4)
    wanted = [5, 900, 5, 128000, 42]
    params = [
        greedy,
        dc.SamplingParams(temperature=0.0, max_tokens=12, constraint=ForceSequence(wanted)),
        dc.SamplingParams(temperature=0.0, max_tokens=12, logit_bias={777: 100.0}),
        dc.SamplingParams(
            temperature=0.0, max_tokens=12, presence_penalty=2.0, frequency_penalty=2.0
        ),
    ]
    outs, finish = run(engine, prompts, params)
    print(f"\nLOGIT-ADJUST-GPU zero_overhead={zero_overhead} outs={outs} finish={finish}")
    assert outs[0] == plain[0]
    assert outs[1] == wanted and finish[1] == "stop"
    assert outs[2] == [777] * 12
    # With both penalties at 2 the greedy output repeats less than the plain one.
    assert len(set(outs[3])) >= len(set(plain[3]))
