"""Revoked certificates (by serial) and revoked host ids, as the cloud database keeps them.

Rows are written by `amc certs revoke` (through `cloud.revocations`) and read whole by every
replica into its deny-list; the list stays small (a revocation is an incident, not traffic).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store.database import Store
from cloud.store.models import RevocationRow


@dataclass(frozen=True, slots=True)
class Revoked:
    """Everything revoked: certificate serials (lowercase hex) and host ids."""

    serials: frozenset[str] = frozenset()
    host_ids: frozenset[str] = frozenset()


async def load(store: Store) -> Revoked:
    """The whole deny-list."""
    async with store.read() as session:
        rows = (await session.execute(select(RevocationRow.serial, RevocationRow.host_id))).all()
    return Revoked(
        frozenset(serial for serial, _ in rows if serial),
        frozenset(host for _, host in rows if host),
    )


async def add(
    session: AsyncSession,
    *,
    serial: str | None,
    host_id: str | None,
    reason: str,
    now: dt.datetime,
) -> bool:
    """Record one revocation (exactly one of `serial`, `host_id`); False when it already was."""
    column = RevocationRow.serial if serial else RevocationRow.host_id
    value = serial or host_id
    if await session.scalar(select(RevocationRow.id).where(column == value)) is not None:
        return False
    session.add(RevocationRow(serial=serial, host_id=host_id, reason=reason, revoked_at=now))
    return True


async def remove(session: AsyncSession, *, serial: str | None, host_id: str | None) -> bool:
    """Lift one revocation; False when there was none."""
    column = RevocationRow.serial if serial else RevocationRow.host_id
    gone = await session.execute(
        delete(RevocationRow).where(column == (serial or host_id)).returning(RevocationRow.id)
    )
    return gone.first() is not None
