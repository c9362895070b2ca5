"""What a host does on its data folder before it takes work: its stores opened, the last run's
unhealthy marks read, what that run left settled (`settle_last_run`).

Each of those waits on the disk. `build_host` made them on the event loop, and on a disk that
hangs (a dead NFS mount, a dying SSD) the loop stopped before the host ran: the SIGTERM handler
`run_host` had installed never ran, and only SIGKILL stopped the host. `run_host` now opens
the stores in a daemon thread of its own (`open_data`) and stops cleanly when told to while
that waits; it settles in another, waited for at most `START_READ_S`: a settling that hangs
starts the host paused, as the start's reads do (`host.timeline.start_reads`), and so does a
settling the disk refuses (full, read-only) (`host.runner`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from google.protobuf.message import DecodeError

from amc.v1 import lease_service_pb2, types_pb2
from cloud.cert_validity import Validity
from host.cloud_channel import certificate_name
from host.outbox import OutboxStore
from host.outbox.calls import unsettled_calls
from host.outbox.kinds import UNSETTLED
from host.settings import HostSettings
from host.timeline.storage_faults import storage_fault
from host.timeline.store import TimelineStore, UnsettledCall
from planner.session.store import SqliteSessionStore

log = logging.getLogger(__name__)


class DiskFaults:
    """What the stores told of their disk before the lease client existed (while they opened
    and settled the last run), kept until `forward` names who hears them from then on: the
    stores tell from their own threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[tuple[str, Path | None]] = []
        self._tell: Callable[[str | None, Path | None], None] | None = None

    def __call__(self, reason: str, where: Path | None = None) -> None:
        with self._lock:
            tell = self._tell
            if tell is None:
                self._kept.append((reason, where))
                return
        tell(reason, where)

    def forward(self, tell: Callable[[str | None, Path | None], None]) -> None:
        """Tell `tell` what was kept, and each fault from now on."""
        with self._lock:
            self._tell, kept, self._kept = tell, self._kept, []
        for reason, where in kept:
            tell(reason, where)


@dataclass(slots=True)
class OpenedData:
    """The host's stores, opened, and what the last run left, read and (unless `unsettled`)
    settled."""

    store: TimelineStore
    outbox: OutboxStore
    #: (serial, attempts, last, part) of the last run's unhealthy marks to restore
    #: (`TimelineStore.unhealthy_phones`).
    marks: list[tuple[str, int, str, str]]
    #: Who this host is until the cloud's welcome says (`DataFolder.name`).
    name: str
    #: The direct transport's session conversations (session mode), else None.
    session_store: SqliteSessionStore | None = None
    #: What the disk said when settling the last run failed ("" when it was settled): the
    #: host starts paused and owes the settling (`DataFolder.owe`).
    unsettled: str = ""
    faults: DiskFaults = field(default_factory=DiskFaults)
    #: The host certificate's validity as the start read it (`host.runner._open_data`, off the
    #: event loop), for the banner's "valid until"; None when not read.
    certificate: Validity | None = None


def open_data(settings: HostSettings, *, sessions: bool = False, settle: bool = True) -> OpenedData:
    """Open the stores, read the last run's marks and settle what it left (blocking: on the
    disk). `sessions`: open the session store too. A refused settling is kept in
    `unsettled`; any other error is raised. `settle=False` leaves the settling to the caller
    (`host.runner`, bounded in time: a disk that hangs there starts the host paused)."""
    faults = DiskFaults()
    store = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
    outbox = OutboxStore(settings.resolved_outbox_path)
    store.on_disk_fault(faults)
    outbox_path = outbox.path
    outbox.on_disk_fault(lambda reason: faults(reason, outbox_path))
    session_store: SqliteSessionStore | None = None
    if sessions:
        session_store = SqliteSessionStore(settings.resolved_db_path.parent / "sessions.sqlite3")
        session_store.on_failure(lambda exc, path: _told(faults, exc, path))
    forget = timedelta(seconds=settings.device_forget_after_s)
    marks = store.unhealthy_phones(forget)
    opened = OpenedData(
        store,
        outbox,
        marks,
        settings.host_id or certificate_name(settings.client_cert),
        session_store,
        faults=faults,
    )
    if not settle:
        return opened
    try:
        settle_last_run(store, outbox, forget)
    except Exception as exc:
        reason = storage_fault(exc)
        if reason is None:
            raise
        # The disk filled after the stores opened: the host starts paused, its phones OFFLINE
        # with why, and settles once a probe write works. Exit 2 here (as for a folder it
        # cannot open) made a supervisor restart it in a loop.
        log.error("could not settle what the last run left: %s", reason)
        opened.unsettled = reason
    return opened


def _told(faults: DiskFaults, exc: BaseException, path: Path | None) -> None:
    reason = storage_fault(exc)
    if reason:
        faults(reason, path)


def _finish_kept(store: TimelineStore, outbox: OutboxStore) -> None:
    """An attempt whose result the previous process kept but whose end it did not write (killed
    in between) ends in the timeline as its result says, not as interrupted: the result goes to
    the cloud, and both records tell the same end."""
    for _, body in outbox.held_results():
        try:
            result = lease_service_pb2.TaskResult.FromString(body)
        except DecodeError:
            continue  # the lease client says so when it reads them
        row = store.get_task(result.task_id, result.attempt)
        if row is not None and row.status == "running":
            status = types_pb2.TaskStatus.Name(result.status).removeprefix("TASK_STATUS_").lower()
            store.finish_task(result.task_id, result.attempt, status, result.summary)


def settle_last_run(store: TimelineStore, outbox: OutboxStore, forget: timedelta) -> None:
    """The writes a start owes the last run: the attempts it kept results of, or left
    running, ended in the timeline; the model calls it was making released as of unknown
    cost; the unhealthy marks `open_data` did not read deleted. Before the host takes work:
    a new attempt's row would be marked interrupted. First, the timeline's file brought up to
    this schema, if opening it could not (`TimelineStore.upgrade`)."""
    store.upgrade()
    store.drop_old_marks(forget)
    _finish_kept(store, outbox)
    interrupted = store.mark_interrupted()
    if interrupted:
        log.warning(
            "marked %d attempt(s) interrupted: the previous host process ended while they ran",
            len(interrupted),
        )
    # Model calls a process that died was making (direct transport): their cost is unknown.
    # The timeline keeps them first (a call already there is skipped), then the outbox ships
    # them: released first, a timeline write the disk refused lost them on the retry this
    # function is owed, the markers gone. A marker whose body cannot be read is skipped (its
    # call's bound is lost) and released with the others (the sender sets aside what it
    # cannot read): raised, it failed every start, and the host restart-looped on it.
    held = outbox.held_calls()
    left: list[UnsettledCall] = []
    for call_id, body in held:
        try:
            left += unsettled_calls([body])
        except (DecodeError, ValueError) as exc:
            log.warning("the marker of model call %s cannot be read (%s): released without its "
                        "cost bound", call_id, type(exc).__name__)  # fmt: skip
    if left:
        store.add_unsettled_calls(left)
    if held:
        outbox.release_calls(UNSETTLED, [call_id for call_id, _ in held])
        log.warning(
            "%d model call(s) an earlier run was making are shipped as of unknown cost",
            len(held),
        )
