"""Whether the replica's database answers, told to the health service.

A replica whose database is unreachable cannot do anything useful, so a load balancer (and
`grpc.health.v1` clients) should see NOT_SERVING until the database is back, not SERVING over
calls that all fail. The probe runs as a supervised loop (`cloud.supervised`): a `SELECT 1`
every `interval`, at once when a call just failed on the database (`wake`), and it tells
`on_change` only when the answer changes, logging each change in one scrubbed line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlalchemy import text

from cloud.store import errors
from cloud.store.database import Store

log = logging.getLogger(__name__)

#: A probe that has not answered within this long counts as a failure.
PROBE_TIMEOUT_S = 5.0


class DatabaseProbe:
    """`step()` checks the database once; `wake` asks for a check now."""

    def __init__(self, store: Store, on_change: Callable[[bool], Awaitable[None]]) -> None:
        self._store = store
        self._on_change = on_change
        self.wake = asyncio.Event()
        #: What the last probe found (True until one fails).
        self.available = True

    async def step(self) -> None:
        """One probe. Never raises: a database that is down is the answer, not a failure."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                async with self._store.engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
        except Exception as exc:
            if self.available:
                if isinstance(exc, TimeoutError):
                    log.warning(
                        "database probe: no answer within %.0f s; health NOT_SERVING",
                        PROBE_TIMEOUT_S,
                    )
                else:
                    errors.report(log, "database probe failed; health NOT_SERVING", exc)
                self.available = False
                await self._on_change(False)
            return
        if not self.available:
            log.info("database reachable again; health SERVING")
            self.available = True
            await self._on_change(True)
