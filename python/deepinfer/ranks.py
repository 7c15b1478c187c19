"""One process per rank (docs/parallel.md#one-process-per-rank).

With ``data_parallel_backend: processes`` (or ``auto`` on device "cuda": one process per GPU),
``LLM``, ``python -m deepinfer.run`` and ``python -m deepinfer.serve`` are rank 0: they listen
for the other ranks, start them as child processes (``python -m deepinfer.ranks``) on this host,
and drive the group through the front engine (``deepinfer_core.Engine.front``), which routes
each request to the least-loaded rank. The ranks' votes, requests and outputs go over TCP; the
expert exchange goes over NCCL when each rank has its own GPU (device "cuda").

Several hosts use torchrun's environment instead of starting children: run the same command on
every host under ``torchrun --nnodes H --nproc-per-node G ...``; the process with ``RANK`` 0 is
the front and listens on ``MASTER_ADDR:MASTER_PORT + 1`` (torchrun's own store holds
``MASTER_PORT``), every other process serves its rank on ``cuda:LOCAL_RANK`` and exits when the
front shuts the group down.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import deepinfer_core

# How long rank 0 waits for the others to connect, and they for it (seconds).
CONNECT_TIMEOUT_S = 120


@dataclass(frozen=True)
class TorchrunRank:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    port: int  # deepinfer's: MASTER_PORT + 1


def torchrun_rank(environ: dict[str, str] | None = None) -> TorchrunRank | None:
    """This process's place in a torchrun launch (None outside one, or with one process)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or int(env.get("WORLD_SIZE", "1")) <= 1:
        return None
    return TorchrunRank(
        rank=int(env["RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        port=int(env.get("MASTER_PORT", "29500")) + 1,
    )


def _reap(proc: subprocess.Popen) -> None:
    """Waits for a rank process in the background, so an exited one leaves no zombie."""
    threading.Thread(target=proc.wait, name=f"reap-rank-{proc.pid}", daemon=True).start()


def _die_with_parent() -> None:
    """In a rank process (before exec): the kernel sends it SIGTERM when rank 0 dies, so no rank
    outlives its front holding a GPU (Linux: prctl PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def start_group(
    config: deepinfer_core.EngineConfig, progress: Callable[[int, int], None] | None = None
) -> deepinfer_core.Engine:
    """Rank 0 of a group of processes: starts ranks 1..N-1 here (or joins a torchrun launch) and
    returns the front engine once every rank has connected and rank 0 has loaded."""
    size = config.parallel.data_parallel_size
    launch = torchrun_rank()
    if launch is not None:
        if launch.rank != 0:
            raise ValueError(
                f"this process is torchrun rank {launch.rank}: only rank 0 makes the engine; "
                "the others serve their rank (deepinfer.run and deepinfer.serve do it, or call "
                "deepinfer.ranks.serve_torchrun_rank first)"
            )
        if launch.world_size != size:
            raise ValueError(
                f"engine config: 'data_parallel_size' is {size} but torchrun started "
                f"{launch.world_size} processes (WORLD_SIZE)"
            )
        listener = deepinfer_core.RankListener("0.0.0.0", launch.port)
        return deepinfer_core.Engine.front(config, listener, progress, CONNECT_TIMEOUT_S)
    listener = deepinfer_core.RankListener("127.0.0.1", 0)
    options = json.dumps(config.options())
    procs = []
    for rank in range(1, size):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "deepinfer.ranks", "--rank", str(rank), "--size", str(size)]
                + ["--master", f"127.0.0.1:{listener.port}", "--options", options],
                preexec_fn=_die_with_parent,
            )
        )
    try:
        engine = deepinfer_core.Engine.front(config, listener, progress, CONNECT_TIMEOUT_S)
    except BaseException:
        # Rank 0 could not start (its load failed, a rank never connected): the others would
        # load to the end before noticing, holding their devices meanwhile.
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        raise
    for proc in procs:
        _reap(proc)
    return engine


def serve(options: dict[str, Any], rank: int, master: str, local_rank: int) -> None:
    """Ranks 1..N-1: loads this rank and serves rank 0's steps until it closes the group."""
    host, _, port = master.rpartition(":")
    config = deepinfer_core.EngineConfig(**options)
    deepinfer_core.serve_rank(config, rank, local_rank, host, int(port), CONNECT_TIMEOUT_S)


def serve_torchrun_rank(run: Any) -> bool:
    """For run and serve under torchrun: on a rank other than 0, serves it (until rank 0 closes
    the group) and returns True; elsewhere returns False at once. `run` is the RunConfig."""
    launch = torchrun_rank()
    if launch is None or launch.rank == 0:
        return False
    config = run.engine_config()
    if config.parallel.data_parallel_backend == "threads":
        raise ValueError(
            "engine config: 'data_parallel_backend' is \"threads\" but torchrun started "
            f'{launch.world_size} processes: use "processes" (one process per rank)'
        )
    if config.parallel.data_parallel_size != launch.world_size:
        raise ValueError(
            f"engine config: 'data_parallel_size' is {config.parallel.data_parallel_size} but "
            f"torchrun started {launch.world_size} processes (WORLD_SIZE)"
        )
    serve(config.options(), launch.rank, f"{launch.master_addr}:{launch.port}", launch.local_rank)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deepinfer.ranks",
        description="One rank of a data-parallel group of processes, started by rank 0 "
        "(deepinfer.run, deepinfer.serve or LLM with data_parallel_backend: processes). Not "
        "meant to be run by hand.",
    )
    parser.add_argument("--rank", type=int, required=True, help="this process's rank (>= 1)")
    parser.add_argument("--size", type=int, required=True, help="ranks in the group")
    parser.add_argument("--master", required=True, help="rank 0's HOST:PORT")
    parser.add_argument("--options", required=True, help="the engine options (JSON)")
    args = parser.parse_args(argv)
    options = json.loads(args.options)
    if options.get("data_parallel_size") != args.size:
        print("error: --size differs from the options' data_parallel_size", file=sys.stderr)
        return 2
    try:
        serve(options, args.rank, args.master, local_rank=args.rank)
    except Exception as e:  # the group was aborted, or this rank failed: say why
        print(f"deepinfer rank {args.rank}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
