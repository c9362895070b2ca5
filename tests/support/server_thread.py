"""A real cloud replica on its own event loop in a background thread, for synchronous tests.

Hypothesis drives plain (synchronous) test functions, so the abuse suite cannot lean on
pytest-asyncio's per-test loop for a server that lives across many examples. This runs the
ordinary `build_server(...)` / `start()` / `stop()` on a private loop in a daemon thread; tests
talk to it over real mTLS with synchronous gRPC channels (`tests.support.mtls.sync_channel`).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from tests.support.loop_thread import LoopThread

T = TypeVar("T")


class ServerThread:
    """`start()` gives a serving replica; `run(coro)` runs a coroutine on its loop."""

    def __init__(self, settings: CloudSettings) -> None:
        self.settings = settings
        self._loop: LoopThread | None = None
        self.server: CloudServer | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        assert self._loop is not None, "start() first"
        return self._loop.run(coro, timeout)

    def start(self) -> ServerThread:
        self._loop = LoopThread("replica")

        async def go() -> CloudServer:
            server = await build_server(self.settings)
            await server.start()
            return server

        self.server = self.run(go())
        return self

    @property
    def address(self) -> str:
        assert self.server is not None
        return self.server.address

    def stop(self) -> None:
        if self.server is not None:
            self.run(self.server.stop(0.5))
        if self._loop is not None:
            self._loop.stop(10)
