"""Which cloud replicas and host runners are running now: the registry behind the autouse check
in tests/conftest.py that fails a test which leaves one running.

A replica nobody stops keeps its jobs, pool and grpc server until the process ends, and what
it holds is freed later by the cycle collector on whatever event loop then runs (a CI run
crashed once in SQLAlchemy's compiler that way). An instance registry, not a gc scan: a
replica is running from its `start` until its `stop`, a host runner while `serve_host` runs
(also through `run_host`).
"""

from __future__ import annotations

import asyncio
import functools
import weakref

from cloud.server import CloudServer
from host import runner

_running: weakref.WeakSet[object] = weakref.WeakSet()
_for_the_session: weakref.WeakSet[object] = weakref.WeakSet()


def install() -> None:
    """Track every replica's start and stop and every host runner from now on (before the
    test modules import `serve_host`)."""
    start, stop, serve_host = CloudServer.start, CloudServer.stop, runner.serve_host

    @functools.wraps(start)
    async def tracked_start(self: CloudServer) -> None:
        _running.add(self)  # a start that fails stops the replica itself
        await start(self)

    @functools.wraps(stop)
    async def tracked_stop(self: CloudServer, grace: float | None = None) -> None:
        try:
            await stop(self, grace)
        finally:
            _running.discard(self)

    @functools.wraps(serve_host)
    async def tracked_serve_host(app: runner.HostApp, stop: asyncio.Event) -> None:
        _running.add(app)
        try:
            await serve_host(app, stop)
        finally:
            _running.discard(app)

    CloudServer.start = tracked_start  # type: ignore[method-assign]  # a test-only wrapper
    CloudServer.stop = tracked_stop  # type: ignore[method-assign]  # a test-only wrapper
    runner.serve_host = tracked_serve_host


def keep_for_the_session(server: object) -> None:
    """`server` is meant to run for the whole session (the console's and the abuse tests'
    shared replicas): the check leaves it out."""
    _for_the_session.add(server)


def running() -> weakref.WeakSet[object]:
    """The replicas and host runners running now, but those kept for the session."""
    return weakref.WeakSet(s for s in _running if s not in _for_the_session)


def describe(server: object) -> str:
    if isinstance(server, CloudServer):
        return f"cloud replica at {server.address}"
    if isinstance(server, runner.HostApp):
        return f"host runner {server.settings.host_id or ''} ({server.settings.data_dir})"
    return repr(server)
