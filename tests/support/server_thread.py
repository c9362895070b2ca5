"""A real cloud replica on its own event loop in a background thread, for synchronous tests.

Hypothesis drives plain (synchronous) test functions, so the abuse suite cannot lean on
pytest-asyncio's per-test loop for a server that lives across many examples. This runs the
ordinary `build_server(...)` / `start()` / `stop()` on a private loop in a daemon thread; tests
talk to it over real mTLS with synchronous gRPC channels.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc

from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings

T = TypeVar("T")


class ServerThread:
    """`start()` gives a serving replica; `run(coro)` runs a coroutine on its loop."""

    def __init__(self, settings: CloudSettings) -> None:
        self.settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.server: CloudServer | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> ServerThread:
        self._thread.start()

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

        async def drain() -> None:
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self.run(drain())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


def sync_channel(address: str, pki_dir: Path, identity: str | None) -> grpc.Channel:
    """A synchronous mTLS channel presenting `identity` ("host-a", "operator-ops") or none."""
    ca = (pki_dir / "ca.pem").read_bytes()
    if identity is None:
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(pki_dir / f"{identity}.key").read_bytes(),
            certificate_chain=(pki_dir / f"{identity}.pem").read_bytes(),
        )
    return grpc.secure_channel(address, creds)
