"""SQLite store of the host's tasks and their timelines, with bounded retention.

The store is the local system of record for what ran on this host (the cloud keeps only the
latest progress and, on the cloud transport, the decisions). It is synchronous sqlite3 behind a
lock: writes are one small row per step, and the agent loop calls it from a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from host.timeline.artifacts import PRIVATE_DIR, ArtifactStore, remove_tree
from host.timeline.record import TimelineRecord
from host.timeline.storage_faults import refused_path, storage_fault
from planner.decision import Billed, Usage

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    lease_id TEXT NOT NULL DEFAULT '',
    device_serial TEXT NOT NULL DEFAULT '',
    goal TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'running',
    summary TEXT NOT NULL DEFAULT '',
    step_index INTEGER NOT NULL DEFAULT 0,
    step_status TEXT NOT NULL DEFAULT '',
    progress_summary TEXT NOT NULL DEFAULT '',
    planner_transport TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    finished_at TEXT,
    PRIMARY KEY (task_id, attempt)
);
CREATE TABLE IF NOT EXISTS steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    step_index INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_steps_task ON steps (task_id, attempt, step_index);
CREATE TABLE IF NOT EXISTS failed_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    error TEXT NOT NULL,
    usage TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_failed_calls_task ON failed_calls (task_id, attempt);
CREATE INDEX IF NOT EXISTS ix_tasks_updated ON tasks (updated_at);
CREATE TABLE IF NOT EXISTS unsettled_calls (
    call_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    at_most TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_unsettled_calls_task ON unsettled_calls (task_id, attempt);
CREATE TABLE IF NOT EXISTS unhealthy_phones (
    serial TEXT PRIMARY KEY,
    attempts INTEGER NOT NULL,
    last TEXT NOT NULL,
    part TEXT NOT NULL,
    marked_at TEXT NOT NULL,
    seen_at TEXT,
    absent_s REAL
);
"""
#: Columns added to a table after a host shipped it: (table, column, declaration), added to a
#: file an older host wrote when it is opened.
_ADDED_COLUMNS = (
    ("unhealthy_phones", "seen_at", "TEXT"),
    ("unhealthy_phones", "absent_s", "REAL"),
)
#: How long adb has not listed a marked phone (seconds): `absent_s`, what running hosts saw
#: (`saw_unhealthy`), or, for a mark an older host wrote (until a host looks, which starts
#: its count there), the wall clock since its phone was last listed, as it was.
_ABSENT_S = "COALESCE(absent_s, (julianday(?) - julianday(COALESCE(seen_at, marked_at))) * 86400.0)"
#: Seconds from a mark's setting to a time (its one `?`).
_SINCE_MARKED = "(julianday(?) - julianday(marked_at)) * 86400.0"

#: An attempt that was still "running" when the host process that ran it ended without
#: finishing it (a crash, SIGKILL, power loss): set when the host starts again.
INTERRUPTED = "interrupted"
TERMINAL = ("succeeded", "failed", "cancelled", INTERRUPTED)
INTERRUPTED_SUMMARY = "interrupted: the host process ended while this attempt ran (crash or kill)"


def _record_of(row: sqlite3.Row) -> TimelineRecord:
    """A stored step as a record, whichever host wrote it."""
    data = json.loads(row["record"]) if row["record"] else {}
    if not isinstance(data, dict):
        data = {"legacy_value": data}
    data.setdefault("task_id", row["task_id"])
    data.setdefault("attempt", row["attempt"])
    data.setdefault("step_index", row["step_index"])
    return TimelineRecord.from_dict(data)


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat()


@dataclass(frozen=True, slots=True)
class UnsettledCall:
    """A model call of an attempt whose cost this host never learned (decision 0080), with
    the most it can have cost (`planner.unsettled.at_most`)."""

    call_id: str
    task_id: str
    attempt: int
    provider: str
    model: str
    at_most: Usage


@dataclass(slots=True)
class TaskRow:
    """One attempt of a task as this host ran it."""

    task_id: str
    attempt: int
    lease_id: str
    device_serial: str
    goal: str
    status: str
    summary: str
    step_index: int
    step_status: str
    progress_summary: str
    planner_transport: str
    created_at: str
    updated_at: str
    finished_at: str | None

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


class TimelineStore:
    """Tasks + steps in SQLite, screenshots in an `ArtifactStore`, deleted together."""

    def __init__(self, db_path: Path, artifact_dir: Path) -> None:
        # Owner-only when made here (`PRIVATE_DIR`); a folder that exists keeps its mode.
        db_path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        self.db_path = db_path
        self.artifacts = ArtifactStore(artifact_dir)
        self._lock = threading.Lock()
        self._disk_listeners: list[Callable[[str, Path], None]] = []
        self._db = sqlite3.connect(str(db_path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        #: The file is older than this schema and its disk refused the change (`upgrade`).
        self._schema_owed = False
        with self._using():
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                self._bring_up_to_date()
            except sqlite3.Error as exc:
                if storage_fault(exc) is None:
                    raise
                # An older host's file on a full (read-only, failing) disk: raised here, before
                # any listener could pause the host, `amc host run` exited 2 and a supervisor
                # restarted it in a loop. The start owes the change instead (`upgrade`).
                self._schema_owed = True

    def _bring_up_to_date(self) -> None:
        """The tables and columns this host writes, added to a file that lacks them (the
        lock held)."""
        self._db.executescript(_SCHEMA)
        for table, column, declaration in _ADDED_COLUMNS:
            have = {str(r[1]) for r in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        self._schema_owed = False

    def upgrade(self) -> None:
        """Bring an older host's file up to this schema when opening it could not (its disk
        refused the change): a write the start owes (`host.start_disk.settle_last_run`) before the
        host takes work; until then the reads of tables it lacks answer as for empty ones
        (`_lacks`). A disk fault is told."""
        if self._schema_owed:
            with self._using():
                self._bring_up_to_date()

    def close(self, wait_s: float | None = None) -> None:
        """Close the database; with `wait_s`, wait at most that long for a use under way: one
        hung on the disk is left with the connection open (the process is ending; SQLite's
        journal recovers what it had not written), instead of holding the exit for good."""
        if not self._lock.acquire(timeout=-1 if wait_s is None else wait_s):
            log.warning("the timeline %s is still being written: left open", self.db_path)
            return
        try:
            self._db.close()
        finally:
            self._lock.release()

    def on_disk_fault(self, listener: Callable[[str, Path], None]) -> None:
        """Called (from the thread that wrote) with what the disk said and the file it refused
        (else the database) when a use of the timeline or a screenshot write failed because of
        it (`storage_fault`): the host keeps its phones out of work until a write works again
        (`host.timeline.data_folder`), probing the folder that refused."""
        self._disk_listeners.append(listener)

    @contextlib.contextmanager
    def _told(self, where: Path) -> Iterator[None]:
        """A disk fault inside is told (`on_disk_fault`), then raised as it was."""
        try:
            yield
        except Exception as exc:
            reason = storage_fault(exc)
            if reason:
                for listener in self._disk_listeners:
                    listener(reason, refused_path(exc) or where)
            raise

    @contextlib.contextmanager
    def _using(self) -> Iterator[None]:
        """The lock, for one use of the database; a disk fault is told."""
        with self._told(self.db_path), self._lock:
            yield

    def _rollback(self) -> None:
        """Undo the transaction a failure left, if SQLite has not already: on a full disk it
        rolls back itself, and a ROLLBACK then raised "no transaction is active" over the
        disk's own error (as in the outbox, `host.outbox.store`)."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    # --- phones kept out of work (`host.devices.health`) ---
    def keep_unhealthy(
        self, serial: str, attempts: int, last: str, part: str, now: datetime | None = None
    ) -> None:
        """Remember a phone's unhealthy mark across restarts: kept in memory only, a restart
        put a sick phone back to work at once, to burn more attempts."""
        ts = iso(now or utcnow())
        self.upgrade()
        with self._using():
            self._db.execute(
                "INSERT INTO unhealthy_phones"
                " (serial, attempts, last, part, marked_at, seen_at, absent_s)"
                " VALUES (?,?,?,?,?,?,0) ON CONFLICT (serial) DO UPDATE SET"
                " attempts=excluded.attempts, last=excluded.last, part=excluded.part,"
                " marked_at=excluded.marked_at, seen_at=excluded.seen_at, absent_s=0",
                (serial, attempts, last, part, ts, ts),
            )

    def saw_unhealthy(
        self, serials: Sequence[str], unlisted_s: float = 0.0, now: datetime | None = None
    ) -> None:
        """The running host looked: adb lists these marked phones; the others it has not
        listed for `unlisted_s` more, the time since this process last looked (0 at its first
        look: a host that was down saw nothing; for a mark set since that look, at most the
        time since it was set: one set and unplugged a minute before a look counted up to an
        hour absent). `unhealthy_phones` ages a mark by that sum:
        by its age, a phone that never stopped being plugged in, still sick, kept its mark
        only for `device_forget_after_s` after it was set; by the wall clock since it was
        last listed, a host down that long dropped the marks of phones it had listed a moment
        before it stopped. Either restart put the phone back to work, to burn more attempts."""
        ts = iso(now or utcnow())
        marks = ",".join("?" * len(serials))
        self.upgrade()
        with self._using():
            self._db.execute(
                f"UPDATE unhealthy_phones SET absent_s=CASE WHEN serial IN ({marks}) THEN 0"
                f" ELSE {_ABSENT_S} + MIN(?, MAX(0.0, {_SINCE_MARKED})) END,"
                f" seen_at=CASE WHEN serial IN ({marks}) THEN ? ELSE seen_at END",
                (*serials, ts, unlisted_s, ts, *serials, ts),
            )

    def drop_unhealthy(self, serial: str) -> None:
        """The phone's mark cleared (a probe read it) or the phone was forgotten. A file from
        before marks were kept, its upgrade owed (`upgrade`), has none to drop."""
        with self._using():
            if self._lacks("unhealthy_phones"):
                return
            self._db.execute("DELETE FROM unhealthy_phones WHERE serial=?", (serial,))

    def _lacks(self, table: str) -> bool:
        """Whether the file has no `table` yet: an older host's file whose upgrade its disk
        refused (`upgrade`; the lock held). The reads and deletes of a table added since
        answer as for an empty one until the change is made: they failed with "no such
        table" (the local console's pages among them) while the host was paused on it."""
        if not self._schema_owed:
            return False
        found = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)
        ).fetchone()
        return found is None

    def unhealthy_phones(
        self, absent_under: timedelta, now: datetime | None = None
    ) -> list[tuple[str, int, str, str]]:
        """(serial, attempts, last, part) of each kept mark whose phone running hosts saw
        unlisted by adb for less than `absent_under` (`saw_unhealthy`): the time no host ran
        does not count. Only reads: a start on a full disk still restores its marks
        (`drop_old_marks` is the write, which the start owes and retries), and so does one of
        a file an older host wrote whose upgrade the disk refused (`upgrade`): by what its
        marks have (without `absent_s`, by the clock since they were last listed or set)."""
        absent = _ABSENT_S
        with self._using():
            if self._schema_owed:
                have = {str(r[1]) for r in self._db.execute("PRAGMA table_info(unhealthy_phones)")}
                if not have:
                    return []  # a file from before marks were kept
                if "absent_s" not in have:
                    since = "COALESCE(seen_at, marked_at)" if "seen_at" in have else "marked_at"
                    absent = f"((julianday(?) - julianday({since})) * 86400.0)"
            rows = self._db.execute(
                "SELECT serial, attempts, last, part FROM unhealthy_phones"
                f" WHERE {absent} < ? ORDER BY serial",
                (iso(now or utcnow()), absent_under.total_seconds()),
            ).fetchall()
        return [(r["serial"], int(r["attempts"]), r["last"], r["part"]) for r in rows]

    def drop_old_marks(self, absent_for: timedelta, now: datetime | None = None) -> None:
        """Delete the marks `unhealthy_phones(absent_for)` leaves out: their phone would have
        been forgotten meanwhile (`HostSettings.device_forget_after_s`), and a mark of a phone
        never seen again stayed for ever."""
        with self._using():
            self._db.execute(
                f"DELETE FROM unhealthy_phones WHERE {_ABSENT_S} >= ?",
                (iso(now or utcnow()), absent_for.total_seconds()),
            )

    # --- tasks ---
    def start_task(
        self,
        task_id: str,
        attempt: int,
        goal: str,
        device_serial: str,
        lease_id: str = "",
        planner_transport: str = "",
        now: datetime | None = None,
    ) -> None:
        ts = iso(now or utcnow())
        with self._using():
            self._db.execute(
                "INSERT INTO tasks (task_id, attempt, lease_id, device_serial, goal, status,"
                " planner_transport, created_at, updated_at) VALUES (?,?,?,?,?,'running',?,?,?)"
                " ON CONFLICT (task_id, attempt) DO UPDATE SET lease_id=excluded.lease_id,"
                " status='running', updated_at=excluded.updated_at",
                (task_id, attempt, lease_id, device_serial, goal, planner_transport, ts, ts),
            )

    def mark_interrupted(self, now: datetime | None = None) -> list[tuple[str, int]]:
        """At start: every attempt still "running" belongs to a process that is gone (this
        store has one writer, the host process), so it is marked interrupted. Returns them."""
        ts = iso(now or utcnow())
        with self._using():
            rows = self._db.execute(
                "UPDATE tasks SET status=?, summary=?, finished_at=?, updated_at=?"
                " WHERE status='running' RETURNING task_id, attempt",
                (INTERRUPTED, INTERRUPTED_SUMMARY, ts, ts),
            ).fetchall()
        return sorted((r["task_id"], int(r["attempt"])) for r in rows)

    def update_progress(
        self, task_id: str, attempt: int, step_index: int, step_status: str, summary: str
    ) -> None:
        with self._using():
            self._db.execute(
                "UPDATE tasks SET step_index=?, step_status=?, progress_summary=?, updated_at=?"
                " WHERE task_id=? AND attempt=?",
                (step_index, step_status, summary, iso(utcnow()), task_id, attempt),
            )

    def finish_task(
        self, task_id: str, attempt: int, status: str, summary: str, now: datetime | None = None
    ) -> None:
        ts = iso(now or utcnow())
        with self._using():
            self._db.execute(
                "UPDATE tasks SET status=?, summary=?, finished_at=?, updated_at=?"
                " WHERE task_id=? AND attempt=?",
                (status, summary[:2000], ts, ts, task_id, attempt),
            )

    def get_task(self, task_id: str, attempt: int | None = None) -> TaskRow | None:
        with self._using():
            if attempt is None:
                row = self._db.execute(
                    "SELECT * FROM tasks WHERE task_id=? ORDER BY attempt DESC LIMIT 1", (task_id,)
                ).fetchone()
            else:
                row = self._db.execute(
                    "SELECT * FROM tasks WHERE task_id=? AND attempt=?", (task_id, attempt)
                ).fetchone()
        return TaskRow(**dict(row)) if row else None

    def task_ids_starting(self, prefix: str, limit: int) -> list[str]:
        """Up to `limit` ids of the tasks held here that start with `prefix`, in order (for
        an id typed short in the console)."""
        with self._using():
            rows = self._db.execute(
                "SELECT DISTINCT task_id FROM tasks WHERE substr(task_id, 1, ?) = ?"
                " ORDER BY task_id LIMIT ?",
                (len(prefix), prefix, limit),
            ).fetchall()
        return [str(r["task_id"]) for r in rows]

    def list_tasks(self, limit: int = 100, offset: int = 0) -> list[TaskRow]:
        with self._using():
            rows = self._db.execute(
                "SELECT * FROM tasks ORDER BY created_at DESC, task_id LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
        return [TaskRow(**dict(r)) for r in rows]

    # --- steps ---
    def save_screenshot(self, task_id: str, attempt: int, name: str, png: bytes) -> str:
        with self._told(self.artifacts.root):
            return self.artifacts.write(task_id, attempt, name, png)

    def append_step(self, record: TimelineRecord) -> None:
        data = json.dumps(record.to_dict(), ensure_ascii=False, default=str)
        with self._using():
            self._db.execute(
                "INSERT INTO steps (task_id, attempt, step_index, created_at, record)"
                " VALUES (?,?,?,?,?)",
                (record.task_id, record.attempt, record.step_index, iso(utcnow()), data),
            )

    def append_raw_step(
        self, task_id: str, attempt: int, step_index: int, raw: dict[str, Any]
    ) -> None:
        """Store a record as given (used to import records written by older hosts)."""
        with self._using():
            self._db.execute(
                "INSERT INTO steps (task_id, attempt, step_index, created_at, record)"
                " VALUES (?,?,?,?,?)",
                (task_id, attempt, step_index, iso(utcnow()), json.dumps(raw, default=str)),
            )

    def add_failed_calls(self, task_id: str, attempt: int, billed: Billed, error: str) -> None:
        """What the answered model calls of a decision that failed cost (`error`: the planner
        error's class): no step is recorded for it, yet the provider billed them, and this
        host's export and console count them (the outbox ships them to the cloud and forgets
        them once sent). A call among them kept as of unknown cost (its answer came late) is
        settled in the same write, as the cloud settles it."""
        usage = json.dumps(asdict(billed.usage))
        with self._using():
            self._db.execute("BEGIN")
            try:
                self._db.execute(
                    "INSERT INTO failed_calls (task_id, attempt, provider, model, error, usage,"
                    " created_at) VALUES (?,?,?,?,?,?,?)",
                    (task_id, attempt, billed.provider, billed.model, error, usage, iso(utcnow())),
                )
                self._db.executemany(
                    "DELETE FROM unsettled_calls WHERE call_id = ?",
                    [(c,) for c in billed.usage.calls],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise

    def add_unsettled_calls(self, calls: Sequence[UnsettledCall]) -> None:
        """Model calls shipped to the cloud as of unknown cost (decision 0080: the host never
        learned what the provider billed), kept for this host's console and export: the outbox
        forgets them once the cloud has them. In an attempt, written after the outbox's release
        (another file): a host killed in between ships the call, and only its own record
        misses it. At start, before it (`host.start_disk.settle_last_run`): a call kept twice is
        kept once (its id is the key), so a start retried after a disk fault loses none.

        A call whose late answer is already recorded (`add_failed_calls` lists its id) is
        skipped: that answer may land between the release and this write, when there was no
        row yet for it to delete, and the row added after it stayed for good, the call then
        counted in the cost and as of unknown cost at once. Whichever of the two writes comes
        second settles the call."""
        now = iso(utcnow())
        with self._using():
            self._db.executemany(
                "INSERT OR IGNORE INTO unsettled_calls (call_id, task_id, attempt, provider,"
                " model, at_most, created_at) SELECT ?1,?2,?3,?4,?5,?6,?7 WHERE NOT EXISTS"
                " (SELECT 1 FROM failed_calls f, json_each(f.usage, '$.calls') j"
                " WHERE f.task_id = ?2 AND f.attempt = ?3 AND j.value = ?1)",
                [
                    (
                        c.call_id,
                        c.task_id,
                        c.attempt,
                        c.provider,
                        c.model,
                        json.dumps(asdict(c.at_most)),
                        now,
                    )
                    for c in calls
                ],
            )

    def unsettled_calls(self, task_id: str, attempt: int) -> tuple[int, Usage]:
        """How many of the attempt's model calls are of unknown cost, and the most they can
        have cost together (not in the attempt's cost, which counts what was reported)."""
        with self._using():
            if self._lacks("unsettled_calls"):
                return 0, Usage()
            rows = self._db.execute(
                "SELECT at_most FROM unsettled_calls WHERE task_id=? AND attempt=?",
                (task_id, attempt),
            ).fetchall()
        total = Usage()
        for r in rows:
            total.add(Usage(**json.loads(r["at_most"])))
        return len(rows), total

    def failed_calls(self, task_id: str, attempt: int) -> tuple[int, Usage]:
        """How many of the attempt's decisions failed after billed calls, and what the calls
        cost together."""
        with self._using():
            if self._lacks("failed_calls"):
                return 0, Usage()
            rows = self._db.execute(
                "SELECT usage FROM failed_calls WHERE task_id=? AND attempt=?", (task_id, attempt)
            ).fetchall()
        total = Usage()
        for r in rows:
            total.add(Usage(**json.loads(r["usage"])))
        return len(rows), total

    def steps(
        self,
        task_id: str,
        attempt: int,
        *,
        after_step: int | None = None,
        offset: int = 0,
        limit: int = -1,
    ) -> list[TimelineRecord]:
        """The attempt's steps in order; with `after_step` only those past that step index,
        skipping the first `offset` of them, at most `limit` (-1: all). The console reads only
        the steps a page shows: a long attempt's every record made its page take seconds."""
        with self._using():
            rows = self._step_rows(task_id, attempt, after_step, offset, limit)
        return [_record_of(r) for r in rows]

    def steps_since(
        self, task_id: str, attempt: int, offset: int
    ) -> tuple[int, list[TimelineRecord]]:
        """How many steps the attempt has, and those past the first `offset`, read together:
        the live view asks for the steps after those it shows, and a count read apart from
        them could take in a step appended in between (shown twice, or never)."""
        with self._using():
            count = self._db.execute(
                "SELECT COUNT(*) FROM steps WHERE task_id=? AND attempt=?", (task_id, attempt)
            ).fetchone()[0]
            rows = self._step_rows(task_id, attempt, None, offset, -1)
        return int(count), [_record_of(r) for r in rows]

    def step_outlines(self, task_id: str, attempt: int) -> list[TimelineRecord]:
        """Every step of the attempt with only what its totals need (tool, action, the
        checker's verdict, usage; an older record's call): the task page counts the whole
        attempt and shows only its newest steps, whose records are the large ones."""
        with self._using():
            rows = self._db.execute(
                "SELECT task_id, attempt, step_index, CASE WHEN json_valid(record) THEN"
                " json_extract(record, '$.tool_name', '$.action', '$.verdict', '$.usage',"
                " '$.tool_call') END AS parts FROM steps WHERE task_id=? AND attempt=?"
                " ORDER BY step_index, id",
                (task_id, attempt),
            ).fetchall()
        names = ("tool_name", "action", "verdict", "usage", "tool_call")
        out: list[TimelineRecord] = []
        for r in rows:
            parts = json.loads(r["parts"]) if r["parts"] else [None] * len(names)
            data = {k: v for k, v in zip(names, parts, strict=True) if v is not None}
            data.update(task_id=r["task_id"], attempt=r["attempt"], step_index=r["step_index"])
            out.append(TimelineRecord.from_dict(data))
        return out

    def _step_rows(
        self, task_id: str, attempt: int, after_step: int | None, offset: int, limit: int
    ) -> list[sqlite3.Row]:
        """The rows of `steps` (the lock held)."""
        past = "" if after_step is None else " AND step_index > ?"
        return self._db.execute(
            "SELECT task_id, attempt, step_index, record FROM steps"
            f" WHERE task_id=? AND attempt=?{past} ORDER BY step_index, id LIMIT ? OFFSET ?",
            (task_id, attempt, *(() if after_step is None else (after_step,)), limit, offset),
        ).fetchall()

    # --- retention ---
    def prune(
        self,
        max_tasks: int,
        max_age_days: float,
        now: datetime | None = None,
        stop: threading.Event | None = None,
    ) -> list[tuple[str, int]]:
        """Delete tasks beyond the newest `max_tasks` or older than `max_age_days`, rows and files.

        Running attempts are never pruned (their files are still being written). Once `stop` is
        set (the host stops) the pass ends where it is: the next one finds the rest (a task's
        folder whose row went already is an orphan folder then).
        """
        cutoff = iso((now or utcnow()) - timedelta(days=max_age_days))
        with self._using():
            rows = self._db.execute(
                "SELECT task_id, attempt, status, updated_at FROM tasks"
                " ORDER BY updated_at DESC, created_at DESC"
            ).fetchall()
        victims: list[tuple[str, int]] = []
        for i, r in enumerate(rows):
            if r["status"] == "running":
                continue
            if i >= max_tasks or r["updated_at"] < cutoff:
                victims.append((r["task_id"], int(r["attempt"])))
        done: list[tuple[str, int]] = []
        for task_id, attempt in victims:
            if stop is not None and stop.is_set():
                return done
            with self._using():
                self._db.execute("BEGIN")
                try:
                    for table in ("steps", "failed_calls", "unsettled_calls", "tasks"):
                        self._db.execute(
                            f"DELETE FROM {table} WHERE task_id=? AND attempt=?",
                            (task_id, attempt),
                        )
                    self._db.execute("COMMIT")
                except BaseException:
                    # Left open, the transaction took the next write of any kind on this
                    # shared connection with it (committed or failed together).
                    self._rollback()
                    raise
            done.append((task_id, attempt))
            self.artifacts.delete_task(task_id, attempt, stop)
        self._drop_orphan_dirs(stop)
        return done

    def _drop_orphan_dirs(self, stop: threading.Event | None = None) -> None:
        """Artifact folders with no task row (a crash between write and insert) go too.

        The folders are listed before the rows are read: an attempt writes its row before its
        first file, so a folder listed then has its row by the read, while the other order
        deleted the folder of an attempt that started in between (the pass at start runs beside
        the lease stream)."""
        names = self.artifacts.task_dirs()
        with self._using():
            rows = self._db.execute("SELECT task_id, attempt FROM tasks").fetchall()
        live = {self.artifacts.task_dir_name(r["task_id"], r["attempt"]) for r in rows}
        for name in names:
            if stop is not None and stop.is_set():
                return
            if name not in live:
                remove_tree(self.artifacts.resolve(name), stop)
