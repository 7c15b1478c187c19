"""AsyncEngine: the C++ engine driven by one background thread, with per-request asyncio queues.

The engine thread loops on Engine.step() (which releases the GIL) while there is work, and sleeps
on an event otherwise. Requests are added and aborted from the asyncio side (both thread-safe in
the core); every RequestOutput is handed to its request's queue on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import deepinfer_core


class AsyncEngine:
    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self._loop = loop
        self._lock = threading.Lock()
        self._queues: dict[int, asyncio.Queue] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.stats: dict = engine.stats()  # snapshot refreshed by the engine thread
        self.stats_time = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="deepinfer-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    @property
    def healthy(self) -> bool:
        return self._error is None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.engine.has_unfinished():
                    outputs = self.engine.step()
                    self.stats = self.engine.stats()
                    self.stats_time = time.monotonic()
                    self._dispatch(outputs)
                else:
                    self.stats = self.engine.stats()
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
        except BaseException as e:  # the engine broke: fail every waiting request loudly
            self._error = e
            with self._lock:
                for q in self._queues.values():
                    self._loop.call_soon_threadsafe(q.put_nowait, e)

    def _dispatch(self, outputs: list) -> None:
        with self._lock:
            for out in outputs:
                q = self._queues.get(out.id)
                if q is not None:
                    self._loop.call_soon_threadsafe(q.put_nowait, out)

    def add(
        self, prompt: list[int], params: deepinfer_core.SamplingParams
    ) -> tuple[int, asyncio.Queue]:
        """Queues a request; raises ValueError (naming the field) for invalid input."""
        if self._error is not None:
            raise RuntimeError(f"the engine stopped: {self._error}")
        with self._lock:  # registered before the engine thread can dispatch its outputs
            rid = self.engine.add_request(prompt, params)
            q: asyncio.Queue = asyncio.Queue()
            self._queues[rid] = q
        self._wake.set()
        return rid, q

    def abort(self, rid: int) -> None:
        self.engine.abort(rid)
        self._wake.set()

    def abort_all(self) -> int:
        """Aborts every request still registered (the shutdown timeout ran out); each ends with
        its finish output (reason "abort"). Returns how many there were."""
        with self._lock:
            rids = list(self._queues)
        for rid in rids:
            self.engine.abort(rid)
        self._wake.set()
        return len(rids)

    def release(self, rid: int) -> None:
        with self._lock:
            self._queues.pop(rid, None)

    async def outputs(self, rid: int, q: asyncio.Queue) -> AsyncIterator[Any]:
        """The request's outputs until its finish output; aborts it if the consumer stops early
        (a client that disconnects, a stop sequence the parser found)."""
        finished = False
        try:
            while True:
                out = await q.get()
                if isinstance(out, BaseException):
                    raise RuntimeError(f"the engine stopped: {out}") from out
                yield out
                if out.finish is not None:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(rid)
            self.release(rid)
