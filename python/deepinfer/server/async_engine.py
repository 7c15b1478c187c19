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


class SampleNotStarted(RuntimeError):
    """A sample of add_samples that the engine refused when its leader's prompt was done."""


class AsyncEngine:
    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self._loop = loop
        self._lock = threading.Lock()
        self._queues: dict[int, asyncio.Queue] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        # add_samples: leader id -> (placeholder, prompt, params) of the samples that start once
        # the leader's prompt is computed; placeholder -> engine id once they have.
        self._followers: dict[int, list[tuple[int, list[int], Any]]] = {}
        self._aliases: dict[int, int] = {}
        self._next_placeholder = 0
        self._aborting = False
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
                if out.id in self._followers and (out.tokens or out.finish is not None):
                    self._add_followers(out.id)

    def _add_followers(self, leader: int) -> None:
        """The leader's prompt is computed (its first token is out, so its full blocks are in the
        prefix cache): its followers are added now and hit that cache. Called under the lock."""
        for placeholder, prompt, params in self._followers.pop(leader):
            q = self._queues.pop(placeholder, None)
            if q is None:  # the consumer gave up before its sample started
                continue
            try:
                rid = self.engine.add_request(prompt, params)
            except Exception as e:  # this sample alone fails; the engine and the rest go on
                self._loop.call_soon_threadsafe(q.put_nowait, SampleNotStarted(str(e)))
                continue
            self._queues[rid] = q
            self._aliases[placeholder] = rid
            if self._aborting:
                self.engine.abort(rid)

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

    def add_samples(
        self, prompt: list[int], params: list[deepinfer_core.SamplingParams]
    ) -> list[tuple[int, asyncio.Queue]]:
        """n samples of one prompt that share its KV through the prefix cache: the first is
        added now, the others once its prompt is computed (they then prefill only the tail past
        the last cached block). The others' ids are placeholders (negative) until then; abort,
        release and outputs accept them."""
        if self._error is not None:
            raise RuntimeError(f"the engine stopped: {self._error}")
        # One lock for the leader and its followers: the engine thread must not dispatch the
        # leader's first output before the followers wait for it.
        with self._lock:
            rid = self.engine.add_request(prompt, params[0])
            first: tuple[int, asyncio.Queue] = (rid, asyncio.Queue())
            self._queues[rid] = first[1]
            out = [first]
            for p in params[1:]:
                self._next_placeholder -= 1
                q: asyncio.Queue = asyncio.Queue()
                self._queues[self._next_placeholder] = q
                self._followers.setdefault(first[0], []).append((self._next_placeholder, prompt, p))
                out.append((self._next_placeholder, q))
        self._wake.set()
        return out

    def _resolve(self, rid: int) -> int | None:
        """The engine id of `rid` (a placeholder maps once its sample is added; None before)."""
        return rid if rid >= 0 else self._aliases.get(rid)

    def abort(self, rid: int) -> None:
        with self._lock:
            real = self._resolve(rid)
            if real is None:  # not added yet: it never will be
                self._queues.pop(rid, None)
                return
        self.engine.abort(real)
        self._wake.set()

    def abort_all(self) -> int:
        """Aborts every request still registered (the shutdown timeout ran out); each ends with
        its finish output (reason "abort"), samples still waiting for their leader too. Returns
        how many there were."""
        with self._lock:
            self._aborting = True
            rids = [rid for rid in self._queues if rid >= 0]
            waiting = sum(1 for rid in self._queues if rid < 0)
        for rid in rids:
            self.engine.abort(rid)
        self._wake.set()
        return len(rids) + waiting

    def release(self, rid: int) -> None:
        with self._lock:
            real = self._resolve(rid)
            self._aliases.pop(rid, None)
            self._queues.pop(rid, None)
            if real is not None:
                self._queues.pop(real, None)

    async def outputs(self, rid: int, q: asyncio.Queue) -> AsyncIterator[Any]:
        """The request's outputs until its finish output; aborts it if the consumer stops early
        (a client that disconnects, a stop sequence the parser found)."""
        finished = False
        try:
            while True:
                out = await q.get()
                if isinstance(out, SampleNotStarted):
                    raise out
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
