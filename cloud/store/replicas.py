"""Which replicas are alive, told exactly: each holds a PostgreSQL advisory lock on a
connection of its own for as long as it runs.

A replica that starts while no other is alive starts after an outage of the whole cloud and
gives live leases a new term (`leases.extend_after_outage`). The host rows a replica vouched
for cannot say whether it is alive: they look alive for three heartbeats after it died, so a
lone replica killed and restarted within that time gave no new term, and most of its hosts'
leases ran out during the reconnect storm (bench/replica_restart.py, decision 0075). The server
ends a session's advisory locks when its connection ends, which for a killed process is at once
(its kernel closes the socket). A machine that vanishes leaves its connection open until TCP
keepalives give up (`KEEPALIVE`, ~25 s): until then it still counts as alive, the safe answer
(no new term; leases run out on their old schedule, as before).

A replica of a version without this lock does not count as alive; a replica started beside one
gives live leases a term they would have had anyway at their next renewal.

SQLite has one replica at most: it is always alone.

A replica whose planner calls a model provider holds a second lock (`PROVIDER_NAMESPACE`) on
the same connection: a replica planning offline honours the provider's dispatch holds only while
one of those is alive (cloud/dispatch_holds.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from cloud.store.database import Store, libpq_dsn

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

#: First key of every replica's lock (`pg_advisory_lock(int4, int4)`): "amcr".
NAMESPACE = 0x616D6372
#: The lock connection's server-side keepalives: a replica whose machine vanished stops
#: counting as alive after idle + interval × count seconds.
KEEPALIVE = "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"

#: First key of the second lock of a replica whose planner calls a model provider: "amcp".
PROVIDER_NAMESPACE = 0x616D6370

_OTHERS = """
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2
  AND classid = %(ns)s::oid AND objid <> %(key)s::oid
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


_PROVIDERS = text("""
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = CAST(:ns AS oid)
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
""")


async def provider_replicas_alive(store: Store) -> bool:
    """Whether a replica whose planner calls a model provider is alive now (never on SQLite:
    its one replica is the one asking)."""
    if not store.is_postgres:
        return False
    async with store.read() as session:
        found = await session.scalar(_PROVIDERS, {"ns": PROVIDER_NAMESPACE})
    return bool(found)


def replica_key(replica_id: str) -> int:
    """The second key of `replica_id`'s lock (31 bits: two replicas may share one by chance,
    and then each counts the other as alive while either lives: the safe answer)."""
    digest = hashlib.blake2b(replica_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


class Presence:
    """This replica's lock: `others_alive()` before `hold()` at start, `keep()` every heartbeat
    (it takes the lock again after the database or the connection went away), `release()` at
    the end."""

    def __init__(self, store: Store, replica_id: str) -> None:
        self._dsn = libpq_dsn(store.engine) if store.is_postgres else None
        self.key = replica_key(replica_id)
        self._conn: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        #: Whether this replica's planner calls a model provider (it then holds the second
        #: lock, `PROVIDER_NAMESPACE`, too).
        self.calls_provider = False

    async def others_alive(self) -> bool:
        """Whether another replica of this database holds its lock now (never on SQLite; advisory
        locks are the whole server's, so those of other databases' replicas do not count). Ask
        before `hold()`:
        two replicas started together after an outage then both see none and both give the
        new term (it never shortens a lease, so twice is once)."""
        if self._dsn is None:
            return False
        import psycopg  # PostgreSQL only: a cloud on SQLite never loads it (`pg_driver`)

        async with await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=5
        ) as conn:
            cursor = await conn.execute(_OTHERS, {"ns": NAMESPACE, "key": self.key})
            row = await cursor.fetchone()
        return bool(row and row[0])

    @property
    def held(self) -> bool:
        """Whether the lock's connection is open (on SQLite: always)."""
        return self._dsn is None or (self._conn is not None and not self._conn.closed)

    async def hold(self) -> None:
        """Take the lock on a connection of its own (it waits for nobody: the key is ours)."""
        if self._dsn is None or self.held:
            return
        import psycopg  # PostgreSQL only: a cloud on SQLite never loads it (`pg_driver`)

        conn = await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=5, options=KEEPALIVE
        )
        try:
            await conn.execute("SELECT pg_advisory_lock(%s, %s)", (NAMESPACE, self.key))
            if self.calls_provider:
                await conn.execute(
                    "SELECT pg_advisory_lock(%s, %s)", (PROVIDER_NAMESPACE, self.key)
                )
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def keep(self) -> None:
        """Check the lock's connection; should it have ended (the database restarted, the
        network broke), take the lock again on a new one. A failure is the caller's to retry."""
        if self._conn is not None and not self._conn.closed:
            import psycopg  # loaded already: the connection is one of its

            try:
                await self._conn.execute("SELECT 1")
                return
            except psycopg.Error:
                await self._close()
                log.warning("replica presence lock lost with its connection; taking it again")
        await self.hold()

    async def release(self) -> None:
        """End the lock (closing its connection ends it)."""
        await self._close()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
