"""gpu_trace_decode.py's step listing (benchmarks/): with side branches a step's kernels run on
two streams, and a kernel's idle time is measured on its own stream."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpu_trace_decode import step_sequence


def kernel(name: str, ts: float, dur: float, stream: int) -> dict:
    return {
        "name": f"void deepinfer::cuda::{name}(int)",
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream},
    }


def test_idle_is_measured_on_the_kernels_own_stream() -> None:
    step = [
        kernel("a", 100.0, 5.0, 7),  # main: 0 .. 5
        kernel("side_a", 102.0, 10.0, 9),  # side: 2 .. 12
        kernel("b", 106.0, 3.0, 7),  # main: 1 us after a, though side_a still runs
        kernel("side_b", 113.0, 1.0, 9),  # side: 1 us after side_a
        kernel("c", 110.0, 2.0, 7),  # main: 1 us after b
    ]
    rows = step_sequence(step)
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [
        (0.0, 0.0, "main", "a"),
        (2.0, 0.0, "side", "side_a"),
        (6.0, 1.0, "main", "b"),
        (13.0, 1.0, "side", "side_b"),
        (10.0, 1.0, "main", "c"),
    ]


def test_events_without_a_stream_count_as_one_stream() -> None:
    step = [{"name": "k1", "ts": 0.0, "dur": 2.0}, {"name": "k2", "ts": 5.0, "dur": 1.0}]
    assert [(r[2], r[3]) for r in step_sequence(step)] == [(0.0, "main"), (3.0, "main")]
