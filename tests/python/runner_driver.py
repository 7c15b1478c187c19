"""Drives deepinfer_core.ModelRunner the way the engine will: each sequence owns a state slot and
a fixed set of paged blocks (block 0 is left unused, as the engine's BlockPool never hands it out).
Its KV caches are f32 unless asked otherwise: it is the parity harness, and "auto" would pick
bf16 or fp8 KV on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import deepinfer_core
import numpy as np

BLOCK_SIZE = 128


class RunnerDriver:
    def __init__(
        self,
        checkpoint: str,
        max_seqs: int = 4,
        max_len: int = 1024,
        device: str = "cpu",
        activation_quant: str = "auto",
        kv_cache_dtype: str = "f32",
        **runner_options: Any,
    ) -> None:
        self.blocks_per_seq = (max_len + BLOCK_SIZE - 1) // BLOCK_SIZE
        self.runner = deepinfer_core.ModelRunner(
            checkpoint,
            num_blocks=1 + max_seqs * self.blocks_per_seq,
            num_state_slots=max_seqs,
            device=device,
            activation_quant=activation_quant,
            kv_cache_dtype=kv_cache_dtype,
            **runner_options,
        )

    def block_table(self, slot: int) -> list[int]:
        first = 1 + slot * self.blocks_per_seq
        return list(range(first, first + self.blocks_per_seq))

    def chunk(
        self, slot: int, start: int, tokens: Sequence[int], prompt_end: int = 0
    ) -> deepinfer_core.SequenceChunk:
        return deepinfer_core.SequenceChunk(
            slot, start, list(tokens), self.block_table(slot), prompt_end
        )

    def run_schedule(
        self, tokens: Sequence[int], schedule: Sequence[int], slot: int = 0, prompt_end: int = 0
    ) -> np.ndarray:
        """Feeds `tokens` in chunks of the given sizes; logits of every position. Every chunk
        names `prompt_end` (0: its own end) as the end of its prefill (YOCO truncation)."""
        assert sum(schedule) == len(tokens)
        rows, pos = [], 0
        for n in schedule:
            chunk = self.chunk(slot, pos, tokens[pos : pos + n], prompt_end)
            rows.append(self.runner.forward([chunk]))
            pos += n
        return np.concatenate(rows, axis=0)

    def run_batched(
        self, prompts: Sequence[Sequence[int]], schedules: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Runs several sequences together: call k carries chunk k of every sequence that still
        has one, so prefill chunks and single-token decode rows share calls."""
        outputs: list[list[np.ndarray]] = [[] for _ in prompts]
        cursors = [0] * len(prompts)
        steps = max(len(s) for s in schedules)
        for k in range(steps):
            members = [i for i, s in enumerate(schedules) if k < len(s)]
            batch = []
            for i in members:
                n = schedules[i][k]
                batch.append(self.chunk(i, cursors[i], prompts[i][cursors[i] : cursors[i] + n]))
            logits = self.runner.forward(batch)
            row = 0
            for i in members:
                n = schedules[i][k]
                outputs[i].append(logits[row : row + n])
                row += n
                cursors[i] += n
        return [np.concatenate(o, axis=0) for o in outputs]

    def greedy(self, tokens: Sequence[int], n: int, slot: int = 0) -> list[int]:
        logits = self.runner.forward([self.chunk(slot, 0, tokens)], logits="last")
        out = [int(np.argmax(logits[0]))]
        for _ in range(n - 1):
            pos = len(tokens) + len(out) - 1
            logits = self.runner.forward([self.chunk(slot, pos, [out[-1]])], logits="last")
            out.append(int(np.argmax(logits[0])))
        return out
