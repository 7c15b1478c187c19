"""A uvicorn server that drains on SIGTERM/SIGINT instead of closing its socket at once.

On the first signal new requests get 503 (a load balancer sees /health fail and moves on) while
the ones in flight get the shutdown timeout to finish; then the engine aborts the rest, their
responses end with a finish, and uvicorn shuts down as usual. A second signal skips the wait.
"""

from __future__ import annotations

import asyncio
import socket
from types import FrameType

import uvicorn

from deepinfer.server.safeguards import Drainer


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drainer: Drainer, abort_all) -> None:
        super().__init__(config)
        self.drainer = drainer
        self.abort_all = abort_all
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drainer.draining or self._loop is None or self.drainer.timeout <= 0:
            super().handle_exit(sig, frame)
            return
        self.drainer.draining = True  # at once: the signal may land between two requests
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        async def drain() -> None:
            try:
                await self.drainer.drain(self.abort_all)
            finally:
                self.should_exit = True

        self._drain_task = asyncio.ensure_future(drain())
