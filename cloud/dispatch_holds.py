"""The dispatch holds every replica honours: the rows of `dispatch_holds`, mirrored in memory.

A replica that finds a reason to hold new tasks back (the model provider down, or refusing the
cloud's key) writes a row before it answers the call that showed it, and tells the other
replicas through the event bus (their dispatchers wake). Every replica reads the rows at start,
at the start of each dispatch pass, and before a host's own dispatch (after a hello or a
result) claims for an idle phone, so a task queued after the row was committed is handed out by
no replica, and a restart keeps the hold; on PostgreSQL that is one small query per such
dispatch, which a notification alone could not replace exactly (it may not have arrived yet).
On PostgreSQL each claim for a cloud-transport host also reads the provider's holds in its own
transaction (one statement more, `leases.claim`'s `unless_held`): a pass reads the rows once for
all its hosts and a host's dispatch once for all its phones, and a row another replica
committed in between held none of the claims that followed. A lone SQLite replica reads them
once, at start: it wrote every row since. The replica whose
probe or next model call succeeds deletes the row, and the others resume at their next pass
(the notification starts one at once).

A replica planning with the offline planner (no provider, no probe) never sets nor lifts a
provider hold: its own Decides say nothing of the provider. It honours one while a replica
that calls the provider is alive (a host's Decides travel on a connection of their own, which
may reach that replica and be refused), and not otherwise (a fleet switched to the offline
planner would hold for good: nothing would probe). See decision 0062.

Each replica was on its own before (decision 0062): with two replicas each handed out, and lost
to a failing first step, one task before it learned of a refused key; a restart lost another.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable

from cloud import metrics
from cloud.store import errors, holds, replicas
from cloud.store.database import Store
from cloud.store.holds import Hold

log = logging.getLogger(__name__)


class DispatchHolds:
    """The holds as this replica last read or wrote them."""

    def __init__(
        self, store: Store, replica_id: str, announce: Callable[[], None] | None = None
    ) -> None:
        self._store = store
        self.replica_id = replica_id
        self._announce = announce
        self._rows: dict[str, Hold] = {}
        #: Whether the rows have been read once (a lone SQLite replica needs no second read).
        self._loaded = False
        #: Called when a hold went away (the dispatcher wakes up).
        self.on_lifted: list[Callable[[], None]] = []
        #: Whether this replica's planner calls no model provider (the offline planner): the
        #: provider's holds are then honoured only while `provider_replicas_alive`.
        self.provider_free = False
        #: As last read, for a provider-free replica while a provider hold is set: whether a
        #: replica whose planner calls the provider is alive (its hosts' Decides may reach it).
        self.provider_replicas_alive = False

    def now(self) -> dt.datetime:
        return self._store.now()

    def get(self, reason: str) -> Hold | None:
        """The hold of this reason, as last read."""
        return self._rows.get(reason)

    async def refresh(self) -> None:
        """Read the rows again (another replica may have set or lifted one). SQLite has one
        replica at most, which wrote every row since it read them at start: no read then, so a
        host's dispatch costs no query on the hot path (decision 0072)."""
        if self._loaded and not self._store.is_postgres:
            return
        rows = await holds.load(self._store)
        alive = False
        if self.provider_free and set(rows) & set(holds.PROVIDER):
            alive = await replicas.provider_replicas_alive(self._store)
        self.provider_replicas_alive = alive
        self._replace(rows)
        self._loaded = True

    def honoured(self, reason: str) -> bool:
        """Whether a hold of this reason holds tasks back here. A provider hold does not on a
        replica planning offline while no replica calls the provider: nothing could lift it,
        and no Decide of its hosts' steps can meet the provider."""
        return (
            reason not in holds.PROVIDER or not self.provider_free or (self.provider_replicas_alive)
        )

    async def hold(
        self,
        reason: str,
        detail: str,
        *,
        next_probe_at: dt.datetime | None = None,
        replacing: Iterable[str] = (),
    ) -> None:
        """Hold new tasks back on every replica. When the database cannot take the row, this
        replica holds them back all the same (the others find out for themselves)."""
        replacing = tuple(replacing)
        new = Hold(reason, detail, self._store.now(), self.replica_id, next_probe_at)
        try:
            await holds.put(self._store, new, replacing=replacing)
            rows = await holds.load(self._store)
        except Exception as exc:
            errors.report(log, "the dispatch hold %s could not be stored", exc, reason)
            rows = {r: h for r, h in self._rows.items() if r not in replacing}
            rows.setdefault(reason, new)
        self._replace(rows)
        if self._announce is not None:
            self._announce()

    async def lift(self, reasons: Iterable[str]) -> None:
        """Lift these holds on every replica."""
        reasons = tuple(reasons)
        try:
            await holds.lift(self._store, reasons)
        except Exception as exc:  # the next refresh reads the row again; the next success retries
            errors.report(log, "the dispatch holds %s could not be lifted", exc, reasons)
        self._replace({r: h for r, h in self._rows.items() if r not in reasons})
        if self._announce is not None:
            self._announce()

    async def probed(self, reasons: Iterable[str], next_probe_at: dt.datetime) -> None:
        """A probe failed: record when the next one comes (for operators; best effort)."""
        reasons = tuple(r for r in reasons if r in self._rows)
        if not reasons:
            return
        try:
            await holds.probed(self._store, reasons, next_probe_at)
        except Exception as exc:
            errors.report(log, "the next probe time could not be stored", exc)
            return
        for r in reasons:
            old = self._rows[r]
            self._rows[r] = Hold(old.reason, old.detail, old.set_at, old.set_by, next_probe_at)

    def _replace(self, rows: dict[str, Hold]) -> None:
        lifted = set(self._rows) - set(rows)
        for reason in sorted(set(rows) - set(self._rows)):
            h = rows[reason]
            if self.honoured(reason):
                log.warning("dispatch held (%s, by replica %s): %s", reason, h.set_by, h.detail)
            else:
                log.info("a dispatch hold not held here (%s, by replica %s): no replica that "
                         "calls the model provider is alive: %s",
                         reason, h.set_by, h.detail)  # fmt: skip
        for reason in sorted(lifted):
            log.warning("dispatch hold lifted: %s", reason)
        self._rows = rows
        metrics.current().dispatch_paused.set(1 if any(map(self.honoured, rows)) else 0)
        if lifted:
            for callback in self.on_lifted:
                callback()
