"""Load and fault test: 64 concurrent streaming requests (Chat Completions and Completions) on a
real server process, a quarter of them dropped by the client mid-stream, with 10 MB bodies
mixed in. Asserts that nothing leaks (every KV block and state slot free again), that every
request that stayed connected ends with a finish reason, that each oversized body gets 413, and
that /health answers within 100 ms while the 10 MB bodies are being rejected.

Run with -s to see the summary line.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import httpx
from server_process import MODEL, engine_idle, server_process

STREAMS = 64
BIG = 10 * 1000 * 1000  # the oversized body (the default limit is 8 MiB)

# GET /health every 10 ms from a process of its own (a thread here would wait for this
# process's GIL behind the 64 client streams); prints one "wall-clock-start latency-s" a line.
PROBE = """
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
request = f"GET /health HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n".encode()
with socket.create_connection((host, port)) as s:
    while True:
        start, t = time.time(), time.perf_counter()
        s.sendall(request)
        data = b""
        while not data.endswith(b"}"):
            data += s.recv(4096)
        print(start, time.perf_counter() - t if b" 200 " in data[:16] else 1e9, flush=True)
        time.sleep(0.01)
"""


async def one_stream(client: httpx.AsyncClient, i: int, rng: random.Random) -> dict:
    body: dict = {"model": MODEL, "max_tokens": rng.randint(8, 24), "stream": True}
    if i % 2:
        path = "/v1/completions"
        body["prompt"] = f"request {i} " * rng.randint(1, 30)
    else:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": f"request {i} " * rng.randint(1, 30)}]
        body["thinking"] = {"type": "disabled"}
    drop_after = rng.randint(1, 4) if rng.random() < 0.25 else None
    started = time.perf_counter()
    finish, events = None, 0
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return {"error": f"{path} {r.status_code}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events += 1
            for c in json.loads(line[6:]).get("choices", []):
                finish = c.get("finish_reason") or finish
            if drop_after is not None and events >= drop_after:
                break  # leaving the block closes the connection mid-stream
    return {
        "latency": time.perf_counter() - started,
        "finish": finish,
        "dropped": drop_after is not None and finish is None,
    }


def oversized(url: str, chunked: bool) -> int:
    """Sends a 10 MB body on a raw socket (announced by Content-Length, or chunked and counted
    by the server as it arrives); returns the HTTP status the server answered with."""
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}\r\n"
        head += "Content-Type: application/json\r\n"
        head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {BIG}\r\n"
        s.sendall((head + "\r\n").encode())
        piece = b"x" * (256 << 10)
        try:
            for _ in range(BIG // len(piece) + 1):
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed before the whole body was sent
        response = b""
        try:
            while b"\r\n" not in response:
                data = s.recv(65536)
                if not data:
                    break
                response += data
        except OSError:
            pass
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1") else 0


def test_server_load_64_streams_disconnects_and_oversized_bodies(tiny_checkpoint) -> None:
    with server_process("--enable-debug-endpoints") as (_, url):
        baseline = engine_idle(url)
        rng = random.Random(1234)
        u = urlparse(url)
        prober = subprocess.Popen(
            [sys.executable, "-c", PROBE, u.hostname, str(u.port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        statuses: list[int] = []
        window: list[float] = []

        def reject_bodies() -> None:
            time.sleep(0.2)  # while the streams are running
            window.append(time.time())
            for chunked in (False, True, False, True):
                statuses.append(oversized(url, chunked))
            window.append(time.time())

        async def streams() -> list[dict]:
            limits = httpx.Limits(max_connections=STREAMS + 8)
            async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
                return await asyncio.gather(
                    *(one_stream(client, i, rng) for i in range(STREAMS)), return_exceptions=True
                )

        rejecter = threading.Thread(target=reject_bodies)
        rejecter.start()
        t0 = time.perf_counter()
        results = asyncio.run(streams())
        elapsed = time.perf_counter() - t0
        rejecter.join(timeout=60)
        prober.terminate()
        probes = [tuple(map(float, line.split())) for line in prober.communicate()[0].splitlines()]
        # Probes that overlap the rejection window (one that started just before it included).
        health_ms = [1000 * lat for start, lat in probes if window[0] - lat <= start <= window[1]]

        after = engine_idle(url, timeout=20)
        errors = [r for r in results if isinstance(r, BaseException) or "error" in r]
        done = [r for r in results if isinstance(r, dict) and "latency" in r and not r["dropped"]]
        dropped = sum(1 for r in results if isinstance(r, dict) and r.get("dropped"))
        latencies = sorted(1000 * r["latency"] for r in done)
        leaked_blocks = after["num_blocks_total"] - after["num_blocks_free"]
        leaked_slots = baseline["num_state_slots_free"] - after["num_state_slots_free"]
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(
            f"\nload: {STREAMS} streams in {elapsed:.2f} s ({len(done)} finished, {dropped} "
            f"dropped by the client), latency p50 {statistics.median(latencies):.0f} ms "
            f"p99 {p99:.0f} ms, errors {len(errors)}, 10 MB bodies {statuses}, "
            f"/health during rejection max {max(health_ms, default=0):.1f} ms "
            f"({len(health_ms)} probes), leaked KV blocks {leaked_blocks}, "
            f"leaked state slots {leaked_slots}"
        )
        assert not errors, errors[:3]
        assert all(r["finish"] in ("length", "stop") for r in done)
        assert dropped > 0 and len(done) + dropped == STREAMS
        assert statuses == [413] * 4
        assert health_ms and max(health_ms) < 100
        assert leaked_blocks == 0 and leaked_slots == 0
        assert after["num_running"] == after["num_waiting"] == 0
