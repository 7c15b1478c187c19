"""The source tree's rooms and their one-way doors (DESIGN.md section 2, docs/architecture.md).

Every quoted include of the C++ sources is read and checked against the allowed room -> room
edges below, so a header that reaches up a level (kv/ including sched/, the engine loop pulled
into the model, a test double compiled into the core) fails the suite instead of slowly turning
the layers into a knot. Public headers (cpp/include/deepinfer) include only public headers, and
the bindings and examples use only the public API.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Room -> the rooms it may include, downwards only: engine -> sched -> model/kv -> backend ->
# tensor -> common, with config and sample where their includes put them. `deepinfer/` (the
# public headers) may be included from every room.
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "tensor": {"common"},
    "config": {"common", "tensor"},
    "sample": {"common"},
    "kv": {"common"},
    # Expert parallelism: EPLB statistics, placement policy, the Communicator. The communicator
    # takes backend tensors through the public headers (deepinfer/backend.h), so no backend edge.
    "dist": {"common"},
    # Speculative decoding's drafters (host side): the public Drafter interface only.
    "spec": {"common"},
    "backend": {"common", "tensor", "sample"},
    # The model runs the expert-parallel MoE (dist::ep_moe_experts) when its experts are split.
    "model": {"backend", "kv", "config", "dist", "sample", "tensor", "common"},
    "sched": {"model", "kv", "config", "sample", "tensor", "common"},
    "engine": {
        "sched",
        "model",
        "kv",
        "backend",
        "config",
        "dist",
        "sample",
        "spec",
        "tensor",
        "common",
    },
    # Test doubles: compiled into libdeepinfer_testing, never into the core.
    "testing": {
        "engine",
        "sched",
        "model",
        "kv",
        "backend",
        "dist",
        "sample",
        "spec",
        "tensor",
        "common",
    },
    # The CUDA backend implements backend/ and may use the shared lower rooms; cuda/dist/ is the
    # NCCL implementation of dist's Communicator.
    "cuda": {"backend", "dist", "sample", "tensor", "common"},
}
# Where only the public API may be used (quoted includes with a directory must be deepinfer/...).
PUBLIC_ONLY = ("cpp/include", "bindings", "examples")
# The testing API (deepinfer/testing/...) is for tests, benchmarks and the bindings' testing
# submodule, not for the core.
TESTING_API_USERS = {"testing", "bindings", "tests", "benchmarks"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"}


def sources(root: Path, sub: str):
    base = root / sub
    if not base.is_dir():
        return
    for path in sorted(base.rglob("*")):
        if path.suffix in SOURCE_SUFFIXES and path.is_file():
            yield path


def room_of(root: Path, path: Path) -> str | None:
    rel = path.relative_to(root).parts
    if rel[:2] == ("cpp", "src") and len(rel) > 3:
        return rel[2]
    if rel[0] == "cuda":
        return "cuda"
    return None


def find_violations(root: Path) -> list[str]:
    """Every include in `root`'s C++ sources that crosses a door the wrong way."""
    problems = []
    for sub in ("cpp", "cuda", "bindings", "examples", "tests", "benchmarks"):
        for path in sources(root, sub):
            rel = path.relative_to(root).as_posix()
            room = room_of(root, path)
            public_only = rel.startswith(PUBLIC_ONLY)
            top = rel.split("/")[0]
            for target in INCLUDE.findall(path.read_text(errors="ignore")):
                first = target.split("/")[0] if "/" in target else None
                where = f'{rel}: #include "{target}"'
                if target.startswith("deepinfer/testing/"):
                    user = room if room is not None else top
                    if user not in TESTING_API_USERS:
                        problems.append(f"{where}: the testing API is not for '{user}'")
                    continue
                if first is None or first == "deepinfer":
                    continue
                if public_only:
                    problems.append(f"{where}: only the public headers (deepinfer/...) here")
                elif room is not None and first != room and first in ALLOWED:
                    if first not in ALLOWED.get(room, set()):
                        problems.append(f"{where}: room '{room}' may not include room '{first}'")
                elif room is not None and first != room and first not in ALLOWED:
                    problems.append(f"{where}: '{first}' is not a known room")
    return problems


def test_rooms_are_known() -> None:
    rooms = {p.name for p in (REPO / "cpp" / "src").iterdir() if p.is_dir()}
    assert rooms <= set(ALLOWED), f"rooms without door rules: {sorted(rooms - set(ALLOWED))}"


def test_doors_go_one_way() -> None:
    problems = find_violations(REPO)
    assert not problems, "includes crossing a door the wrong way:\n" + "\n".join(problems)


def test_allowed_edges_have_no_cycle() -> None:
    state: dict[str, int] = {}

    def visit(room: str, path: list[str]) -> None:
        if state.get(room) == 1:
            pytest.fail("the allowed edges form a cycle: " + " -> ".join([*path, room]))
        if state.get(room) == 2:
            return
        state[room] = 1
        for nxt in sorted(ALLOWED.get(room, ())):
            visit(nxt, [*path, room])
        state[room] = 2

    for room in sorted(ALLOWED):
        visit(room, [])


def plant(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("rel", "text", "expected"),
    [
        ("cpp/src/kv/block_pool.h", '#include "sched/scheduler.h"\n', "may not include room"),
        ("cpp/src/model/graph.cpp", '#include "engine/engine_impl.h"\n', "may not include room"),
        ("cpp/src/sched/x.cpp", '#include "testing/scripted_executor.h"\n', "may not include"),
        ("cpp/src/engine/x.cpp", '#include "deepinfer/testing/scripted_engine.h"\n', "testing"),
        ("bindings/module.cpp", '#include "engine/engine_impl.h"\n', "only the public headers"),
        ("cpp/include/deepinfer/x.h", '#include "sched/step_plan.h"\n', "only the public"),
        ("cuda/ops.cu", '#include "engine/engine_impl.h"\n', "may not include room"),
        ("cpp/src/sched/x.cpp", '#include "nowhere/x.h"\n', "not a known room"),
    ],
)
def test_a_planted_back_edge_is_found(tmp_path: Path, rel: str, text: str, expected: str) -> None:
    for room in ALLOWED:
        if room != "cuda":
            (tmp_path / "cpp" / "src" / room).mkdir(parents=True, exist_ok=True)
    plant(tmp_path, "cpp/src/sched/ok.cpp", '#include "kv/x.h"\n#include "deepinfer/x.h"\n')
    assert find_violations(tmp_path) == []
    plant(tmp_path, rel, text)
    problems = find_violations(tmp_path)
    assert len(problems) == 1 and expected in problems[0], problems
