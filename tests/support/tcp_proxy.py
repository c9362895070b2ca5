"""A loopback TCP proxy for fault tests: a failover load balancer, and a cable that goes dead.

It runs its own asyncio loop in a daemon thread, so a test that blocks its own loop (waiting for a
process to die, say) does not stall the traffic it is watching.

- `backends` is an ordered list; each new connection goes to the first one that accepts, so two
  proxies with the backends in opposite orders split hosts across two replicas and move them to
  the survivor when one dies (what a gRPC-aware load balancer does for the real deployment).
- `blackhole()` makes every connection open at that moment *half-open*: the proxy keeps both
  sockets open and keeps reading from them, but forwards nothing and sends nothing back, exactly
  like a peer behind a dead NAT entry. New connections are forwarded normally. The proxy records
  the moment each side of a blackholed connection gives up (EOF or reset), which is how a test
  measures how long each side took to notice.
- `hold()` keeps what clients send in the proxy (the backend hears nothing new) until
  `release()`; `held` is set once something waits: a request is on its way and not yet there.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field

from tests.support.loop_thread import LoopThread


@dataclass
class Link:
    """One client connection through the proxy."""

    number: int
    backend: tuple[str, int]
    opened_at: float
    blackholed_at: float | None = None
    #: When the connecting side (the host) closed or reset its end.
    client_gone_at: float | None = None
    #: When the backend side (the cloud) closed or reset its end.
    server_gone_at: float | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list, repr=False)


class TcpProxy:
    """Listen on 127.0.0.1:`port` (0 = any) and forward to the first live backend."""

    def __init__(self, backends: list[tuple[str, int]], port: int = 0) -> None:
        self.backends = list(backends)
        self._port = port
        self.links: list[Link] = []
        self._loop: LoopThread | None = None
        self._server: asyncio.Server | None = None
        self._black = False
        self._black_links: set[int] = set()
        self._lock = threading.Lock()
        self._flowing: asyncio.Event | None = None
        #: Set when something a client sent waits in the proxy (see `hold`).
        self.held = threading.Event()

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        self._loop = LoopThread("tcp-proxy")
        self._loop.run(self._start(), 10)
        return self

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._port)
        self._port = self._server.sockets[0].getsockname()[1]

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for link in self.links:
                for w in link._writers:
                    w.close()

        if self._loop is None:
            return
        with contextlib.suppress(Exception):
            self._loop.run(close(), 5)
        # Then the pumps see their sockets close and finish before the loop goes.
        self._loop.stop(5)
        self._loop = None  # stopped: a second stop (a test's `finally`) has nothing to do

    # --- faults -------------------------------------------------------------------------------
    def blackhole(self) -> list[Link]:
        """Freeze every open connection (half-open from both ends); returns the frozen links."""
        now = time.monotonic()
        frozen = []
        with self._lock:
            for link in self.links:
                if link.client_gone_at is None and link.server_gone_at is None:
                    link.blackholed_at = now
                    self._black_links.add(link.number)
                    frozen.append(link)
        return frozen

    def cut(self, links: list[Link]) -> None:
        """Close `links` at both ends (a dead NAT entry finally dropped, a cable plugged back
        in to a reset): each side sees its connection end, and a client connects again."""

        async def close() -> None:
            for link in links:
                for w in link._writers:
                    w.close()

        assert self._loop is not None, "start the proxy first"
        self._loop.run(close(), 5)

    def hold(self) -> None:
        """Keep what clients send from now on in the proxy until `release`."""
        self._switch(False)

    def release(self) -> None:
        """Let what `hold` kept go on to the backend, and what follows it."""
        self._switch(True)

    def _switch(self, flowing: bool) -> None:
        async def switch() -> None:
            assert self._flowing is not None
            if flowing:
                self._flowing.set()
            else:
                self.held.clear()
                self._flowing.clear()

        assert self._loop is not None, "start the proxy first"
        self._loop.run(switch(), 5)

    def links_since(self, moment: float) -> list[Link]:
        with self._lock:
            return [link for link in self.links if link.opened_at >= moment]

    # --- forwarding ---------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        chosen: tuple[str, int] | None = None
        for backend in self.backends:
            try:
                upstream = await asyncio.wait_for(asyncio.open_connection(*backend), 2)
                chosen = backend
                break
            except (OSError, TimeoutError):
                continue
        if upstream is None or chosen is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        with self._lock:
            link = Link(len(self.links), chosen, time.monotonic())
            link._writers = [writer, up_writer]
            self.links.append(link)
        await asyncio.gather(
            self._pump(link, reader, up_writer, client_side=True),
            self._pump(link, up_reader, writer, client_side=False),
        )

    async def _pump(
        self,
        link: Link,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        *,
        client_side: bool,
    ) -> None:
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if link.number in self._black_links:
                    continue  # swallowed: the other side never hears of it
                assert self._flowing is not None
                if client_side and not self._flowing.is_set():
                    self.held.set()
                    await self._flowing.wait()
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            now = time.monotonic()
            with self._lock:
                if client_side and link.client_gone_at is None:
                    link.client_gone_at = now
                if not client_side and link.server_gone_at is None:
                    link.server_gone_at = now
            if link.number not in self._black_links:
                # A normal close travels on: close the other end too.
                with contextlib.suppress(Exception):
                    dst.close()
