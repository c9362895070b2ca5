"""A stream's writes of its host's row that another transaction holds: retried in the background.

On PostgreSQL a `hosts` row held elsewhere (an operator's `SELECT ... FOR UPDATE` left open in
psql, a stuck migration) is waited for `SWEEP_LOCK_TIMEOUT_MS` at most by the writes a host's
stream makes (`hosts.update_devices`, `hosts.disconnected`). What could not be written then is
kept here and written again with growing pauses while it still matters: waited for, a phone
list held up the stream's reader, and every renewal behind it, until the host's leases ran
out while it ran them; dropped, the row kept a phone list submit targeting still reads, or
named a stream that had ended as connected for as long as this replica's heartbeat vouched.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from cloud.lease.session import HostSession
from cloud.store import errors, hosts
from cloud.store.database import Store
from cloud.store.lock_waits import SWEEP_LOCK_TIMEOUT_MS, lock_timed_out

log = logging.getLogger(__name__)

#: The first pause before a held row's write is tried again; each next one doubles, up to
#: `RETRY_MAX_S`: a row held for an hour costs a try (of 250 ms at most) every 15 s.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 15.0

T = TypeVar("T")


async def held_then_retried(
    write: Callable[[], Awaitable[T]],
    wanted: Callable[[], bool],
    what: str,
    first_try: bool = True,
    on_held: Callable[[], None] | None = None,
) -> tuple[bool, T | None]:
    """`write()`, and again after each lock timeout or each failure that may pass (the
    database restarting, a connection cut: `errors.unavailable`), pausing `RETRY_FIRST_S`,
    doubling up to `RETRY_MAX_S`, while `wanted()`. (True, its result) once written; (False,
    None) once no longer wanted, or on a failure no retry can mend (logged at ERROR naming
    `what`, the row and its write: it is lost). `first_try=False`: pause before the first try
    (the caller's own timed out). `on_held()` is called at the first lock timeout (the
    caller's warning naming the row); the first passing failure is warned about once. Before,
    any failure but a lock timeout ended the retries, and a write waiting out a held row was
    lost, with no word of which, when the database restarted meanwhile."""
    pause = RETRY_FIRST_S
    if not first_try:
        await asyncio.sleep(pause)
    unavailable_said = False
    while wanted():
        try:
            return True, await write()
        except Exception as exc:
            if lock_timed_out(exc):
                if on_held is not None:
                    on_held()
                    on_held = None
            elif errors.unavailable(exc):
                if not unavailable_said:
                    log.warning(
                        "%s: not written yet: the database is unavailable (%s); tried again"
                        " while it is still wanted",
                        what,
                        errors.describe(exc),
                    )
                    unavailable_said = True
            else:
                _gave_up(what, exc)
                return False, None
        await asyncio.sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)
    return False, None


def _gave_up(what: str, exc: BaseException) -> None:
    """Say at ERROR that `what` is lost: a database error by its kind only (its text names
    the database's host and the SQL), anything else with its traceback."""
    if errors.database_error(exc) is not None:
        log.error(
            "%s: not written, and not tried again (retrying cannot mend it): %s",
            what,
            errors.describe(exc),
        )
    else:
        log.error("%s: not written, and not tried again", what, exc_info=exc)


def _not_written(host_id: str, why: hosts.ListWrite) -> None:
    """Say why a stream's phone list was not written: the host's row names a newer stream (its
    hello came meanwhile, here or on another replica), whose own phones stand; or the row is
    gone (deleted while the stream was open). Nothing changed for the host's watchers to be
    told either way."""
    if why is hosts.ListWrite.NO_ROW:
        log.warning(
            "host %s: its phone list is not written: the host has no row in the database (deleted"
            " while its stream was open); its next hello records it anew",
            host_id,
        )
        return
    log.info(
        "host %s: a phone list of an earlier stream is not written: a newer stream of the host"
        " is recorded, its phones stand",
        host_id,
    )


class PhoneLists:
    """Each host's phone list its row held elsewhere kept from being written: the latest one,
    written in the background while its stream is the host's, so the stream's reader goes on
    answering renewals. A newer list for the same stream replaces the kept one (latest wins)."""

    def __init__(
        self,
        store: Store,
        on_written: Callable[[str], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._store = store
        self._on_written = on_written
        # Weakly: `spawn` is the owning manager's bound method, and a strong one made a
        # reference cycle (manager -> this -> manager) that kept a stopped replica, its event
        # bus and its database engine alive until the cycle collector ran.
        self._spawn = weakref.WeakMethod(spawn)
        #: Host id -> the stream the kept list came on, and that list.
        self._kept: dict[str, tuple[HostSession, list[dict[str, Any]]]] = {}

    def kept(self, host_id: str) -> list[dict[str, Any]] | None:
        """The list kept for `host_id`, if any (tests read it)."""
        kept = self._kept.get(host_id)
        return None if kept is None else kept[1]

    async def write(self, session: HostSession, devices: list[dict[str, Any]]) -> bool:
        """Record the stream's new phone list: True when written now, False when kept for the
        background (the row is held, or an earlier list of this stream still waits for it) or
        not written at all (a newer stream of the host is recorded: its own phones stand; or
        the host's row is gone)."""
        host_id = session.host_id
        kept = self._kept.get(host_id)
        if kept is not None and kept[0] is session:
            self._kept[host_id] = (session, devices)  # the retry under way writes this one
            return False
        try:
            done = await hosts.update_devices(
                self._store, host_id, devices, stream_id=session.stream_id
            )
            if done is hosts.ListWrite.WRITTEN:
                return True
            _not_written(host_id, done)
            return False
        except Exception as exc:
            if not self._kept_for_later(host_id, devices, exc):
                return False
        self._kept[host_id] = (session, devices)
        spawn = self._spawn()
        retry = self._retry(session)
        if spawn is None:  # the manager is gone: nothing retries any more
            retry.close()
            return False
        spawn(retry)
        return False

    @staticmethod
    def _kept_for_later(host_id: str, devices: list[dict[str, Any]], exc: Exception) -> bool:
        """Whether the first try's failure `exc` may pass (its row held, the database cut off
        or restarting), said in a warning: the list is then kept and retried, as the other
        writes of a held row are (`held_then_retried`). Any other failure is said at ERROR
        naming the row, and the list is dropped: raised, it was answered UNAVAILABLE (or
        INTERNAL), and a host does not send a phone list again until it changes, so a passing
        failure lost the list with no word of it on the cloud."""
        if lock_timed_out(exc):
            log.warning(
                "host %s: its new phone list (%d phone(s)) waits: its row is locked by another"
                " transaction for longer than %d ms (an open psql session? see pg_locks); it is"
                " written once the row is free, while this stream lasts (submit targeting reads"
                " the previous list until then)",
                host_id,
                len(devices),
                SWEEP_LOCK_TIMEOUT_MS,
            )
            return True
        what = f"host {host_id}'s row: its new phone list"
        if errors.unavailable(exc):
            log.warning(
                "%s: not written yet: the database is unavailable (%s); tried again while this"
                " stream lasts",
                what,
                errors.describe(exc),
            )
            return True
        _gave_up(what, exc)
        return False

    def _ours(self, session: HostSession) -> tuple[HostSession, list[dict[str, Any]]] | None:
        kept = self._kept.get(session.host_id)
        return kept if kept is not None and kept[0] is session else None

    async def _retry(self, session: HostSession) -> None:
        """Write the stream's kept list once its row is free, the latest one if another came
        meanwhile; until the stream ends (its next hello records the phones then). A failure
        that may pass (the database restarting) is tried again too (`held_then_retried`)."""
        host_id = session.host_id
        written: tuple[HostSession, list[dict[str, Any]]] | None = None

        async def write_latest() -> hosts.ListWrite:
            """Why nothing was written, when it was not (a newer stream, no row)."""
            nonlocal written
            kept = self._ours(session)
            if kept is None:  # ended meanwhile: nothing of this stream to write
                return hosts.ListWrite.WRITTEN
            done = await hosts.update_devices(
                self._store, host_id, kept[1], stream_id=session.stream_id
            )
            if done is hosts.ListWrite.WRITTEN:
                written = kept
            return done

        first_try = False  # the caller's own try timed out
        try:
            while True:
                done, ours = await held_then_retried(
                    write_latest,
                    lambda: self._ours(session) is not None and not session.closed,
                    f"host {host_id}'s row: its new phone list",
                    first_try=first_try,
                )
                if not done or ours is None:
                    return
                if ours is not hosts.ListWrite.WRITTEN:
                    _not_written(host_id, ours)
                    return
                if written is not None and self._ours(session) is written:
                    # No newer list came during the write.
                    log.info("host %s: its phone list is recorded (its row is free again)",
                             host_id)  # fmt: skip
                    self._on_written(host_id)
                    return
                first_try = True  # a newer list came: write it now
        finally:
            if self._ours(session) is not None:
                del self._kept[host_id]
