"""Revoked certificates: recorded in the database, cached by every replica, enforced per call.

`amc certs revoke` writes a row (`revoke`) — a certificate's serial, or a whole host id — and,
on PostgreSQL, NOTIFYs every replica in the same transaction. Each replica keeps the whole
deny-list in memory (`Revocations`), reloads it when told (the event), after its LISTEN
connection came back (events may have been missed), and on a timer (SQLite, where another
process's write cannot be announced, and any lost notification). The authorization
interceptor refuses a revoked caller on every RPC with UNAUTHENTICATED and drops its open
streams when the list changes; the lease manager releases a dropped host's leases.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from cloud import events, pki
from cloud.identity import Caller
from cloud.store import revocations
from cloud.store.database import Store
from cloud.store.revocations import Revoked

log = logging.getLogger(__name__)


def refusal(revoked: Revoked, who: Caller | None, serial: str | None) -> str | None:
    """Why a caller presenting this certificate is refused (None: it is not revoked)."""
    if serial is not None and serial in revoked.serials:
        return f"certificate revoked (serial {serial})"
    if who is not None and who.kind == "host" and who.name in revoked.host_ids:
        return f"host {who.name} revoked"
    return None


class Revocations:
    """This replica's copy of the deny-list; `refresh()` reloads it and tells the listeners."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.current = Revoked()
        self._listeners: list[Callable[[Revoked], object]] = []

    def add_listener(self, listener: Callable[[Revoked], object]) -> None:
        """Called with the new list whenever it changed (to drop what it refuses now)."""
        self._listeners.append(listener)

    def refusal(self, who: Caller | None, serial: str | None) -> str | None:
        """Why this caller is refused now (None: it is not revoked)."""
        return refusal(self.current, who, serial)

    async def refresh(self) -> None:
        """Reload from the database; listeners hear of a change."""
        loaded = await revocations.load(self._store)
        if loaded == self.current:
            return
        added = len(loaded.serials - self.current.serials) + len(
            loaded.host_ids - self.current.host_ids
        )
        self.current = loaded
        log.info(
            "deny-list reloaded: %d certificate(s), %d host id(s) revoked (%d new)",
            len(loaded.serials), len(loaded.host_ids), added,
        )  # fmt: skip
        for listener in self._listeners:
            listener(loaded)


def _target(serial: str | None, host_id: str | None) -> tuple[str | None, str | None]:
    if (serial is None) == (host_id is None):
        raise ValueError("name exactly one of a certificate serial and a host id")
    if serial is not None:
        return pki.normalize_serial(serial), None
    assert host_id is not None
    return None, pki.validate_name(host_id, "host id")


async def revoke(
    store: Store, *, serial: str | None = None, host_id: str | None = None, reason: str = ""
) -> bool:
    """Revoke a certificate (by serial) or every certificate of a host id; False when it
    already was. Replicas on PostgreSQL hear of it at once, others within their refresh."""
    serial, host_id = _target(serial, host_id)
    async with store.write() as session:
        added = await revocations.add(
            session, serial=serial, host_id=host_id, reason=reason, now=store.now()
        )
        if added and store.is_postgres:
            await events.announce(session, events.REVOCATIONS_CHANGED, _origin())
    return added


async def lift(store: Store, *, serial: str | None = None, host_id: str | None = None) -> bool:
    """Undo a revocation (a host id taken out of service by mistake); False when none."""
    serial, host_id = _target(serial, host_id)
    async with store.write() as session:
        removed = await revocations.remove(session, serial=serial, host_id=host_id)
        if removed and store.is_postgres:
            await events.announce(session, events.REVOCATIONS_CHANGED, _origin())
    return removed


def _origin() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"
