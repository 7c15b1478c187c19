"""A real server process (python -m deepinfer serve) on a free loopback port, for the tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
MODEL = "deepseek-v4-tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server_process(*args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """Starts the server on the tiny model with extra CLI args; yields (process, base URL)."""
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "deepinfer", "serve", "--config", str(ROOT / "configs/tiny.yaml")]
        + ["--port", str(port), "--log-level", "warning", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("server did not start")
        time.sleep(0.2)
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def engine_idle(url: str, timeout: float = 10.0, headers: dict | None = None) -> dict:
    """Waits until no request runs and every KV block is free again (needs
    --enable-debug-endpoints); returns the engine counters."""
    deadline = time.time() + timeout
    while True:
        s = httpx.get(url + "/debug/engine", headers=headers).json()
        idle = s["num_running"] == 0 and s["num_waiting"] == 0
        if idle and s["num_blocks_free"] == s["num_blocks_total"]:
            return s
        if time.time() > deadline:
            raise AssertionError(f"engine not idle / blocks not freed: {s}")
        time.sleep(0.05)
