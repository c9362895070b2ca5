"""The outbox table: items in the order they were written, each with the id that makes a
resend harmless, kept until the cloud took them (or refused them for good).

A SQLite file of the host's own (`outbox.sqlite3` beside its timeline, WAL), so a host that
restarts, crashes or was offline still has its backlog. Writes are one small row (a screenshot
is one blob) in the step's path from a worker thread; the sender reads the head and deletes what
the cloud took.
Items the cloud refused for good stay, marked refused, for whoever looks at the host (the
timeline keeps the same data anyway), and are pruned after `keep_refused` of them.

Beside them, in a table of their own, the markers of the model calls this host's planner is
making or made without learning their cost (direct transport, decision 0080): written before
each call, deleted in the write that puts what the provider reported of it in the outbox (its
decision, its failed decision's calls), and moved into the outbox as an item of their own when
the call ended unknown, or at start for those a process that died left (`release_calls`).

Beside them, in their own table, the results of attempts the cloud has not acknowledged yet
(they go on the lease stream, not through the sender: `host.lease_client`): a host restarted
before the cloud heard a result still has it, and the cloud does not run the task again.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from host.outbox.kinds import UNSETTLED
from host.timeline.artifacts import PRIVATE_DIR
from host.timeline.storage_faults import storage_fault

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    item_id TEXT NOT NULL,
    body BLOB NOT NULL,
    created_at TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    tries INTEGER NOT NULL DEFAULT 0,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS ix_outbox_state_seq ON outbox (state, seq);
CREATE TABLE IF NOT EXISTS results (
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    device_serial TEXT NOT NULL,
    body BLOB NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (task_id, attempt)
);
CREATE TABLE IF NOT EXISTS calls (
    call_id TEXT PRIMARY KEY,
    body BLOB NOT NULL,
    created_at TEXT NOT NULL
);
"""
#: Columns of the outbox table added after its first release, each with a default: a file an
#: older host wrote gets them when opened (and an older host ignores them in a newer file).
_ADDED_COLUMNS = {
    # How often the cloud failed on the item in a way that may be its bug on the item
    # (`sender.SUSPECT`), and when it first did: the sender gives up on both, across restarts.
    "suspect": "INTEGER NOT NULL DEFAULT 0",
    "suspect_since": "TEXT",
}


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """One record waiting for the cloud: its kind ("decision", "screenshot"), its id (the
    cloud dedupes by it), the serialized request part, when it was written."""

    seq: int
    kind: str
    item_id: str
    body: bytes
    created_at: datetime
    tries: int = 0
    #: Failures that may be the cloud's bug on this item (`sender.SUSPECT`), and the first's time.
    suspect: int = 0
    suspect_since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits: items, how many of them are (distinct) decisions, the oldest's time, and how
    many the cloud refused for good."""

    items: int = 0
    decisions: int = 0
    oldest_at: datetime | None = None
    refused: int = 0


class OutboxStore:
    """The outbox table behind a lock (the loop writes from worker threads)."""

    def __init__(self, path: Path, keep_refused: int = 1000) -> None:
        path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        self.path = path
        self._keep_refused = keep_refused
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._listeners: list[Callable[[], None]] = []
        self._disk_listeners: list[Callable[[str], None]] = []
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL under WAL: an item survives a crash of the process (the case that matters:
            # a host restarted or killed); a power cut may lose the last items, as it may the
            # timeline's last rows. FULL measured ~4x the cost per step (bench/host_overhead).
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._add_columns()

    def _add_columns(self) -> None:
        """Bring a file an older host wrote up to this schema (`_ADDED_COLUMNS`)."""
        have = {str(row[1]) for row in self._db.execute("PRAGMA table_info(outbox)")}
        for name, declaration in _ADDED_COLUMNS.items():
            if name in have:
                continue
            try:
                self._db.execute(f"ALTER TABLE outbox ADD COLUMN {name} {declaration}")
            except sqlite3.OperationalError:
                # Another connection to the file (a second reader) added it first.
                have = {str(row[1]) for row in self._db.execute("PRAGMA table_info(outbox)")}
                if name not in have:
                    raise

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Called (from the writing thread) after each put: the sender wakes."""
        self._listeners.append(listener)

    def on_disk_fault(self, listener: Callable[[str], None]) -> None:
        """Called (from the thread that used the file) with what the disk said when a use of
        the outbox failed because of it (full, read-only, failing: `storage_fault`): the host
        keeps its phones out of work until a write to its data folder works again
        (`host.timeline.data_folder`), as for its timeline. The writers (a step's shipments,
        the sender) carry on without the write; without this, a full disk went unnoticed
        while every step's records were lost."""
        self._disk_listeners.append(listener)

    @contextlib.contextmanager
    def _using(self) -> Iterator[None]:
        """The lock, for one use of the file; a disk fault is told (`on_disk_fault`), then
        raised as it was."""
        try:
            with self._lock:
                yield
        except Exception as exc:
            reason = storage_fault(exc)
            if reason:
                for listener in self._disk_listeners:
                    listener(reason)
            raise

    def _rollback(self) -> None:
        """Undo the transaction a failure left, if SQLite has not already: on a full disk it
        rolls back itself, and a ROLLBACK then raised "no transaction is active" over the
        disk's own error."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def close(self, wait_s: float | None = None) -> None:
        """Close the file; with `wait_s`, wait at most that long for a use under way, as
        `TimelineStore.close`: one hung on the disk (a dead NFS mount, a dying disk) is left
        with the connection open (the process is ending; what was committed is in the WAL),
        instead of holding the host's exit for as long as it hangs."""
        if not self._lock.acquire(timeout=-1 if wait_s is None else wait_s):
            log.warning("the outbox %s is still being written: left open", self.path)
            return
        try:
            self._db.close()
        finally:
            self._lock.release()

    def put(
        self,
        kind: str,
        item_id: str,
        body: bytes,
        now: datetime | None = None,
        settles: Sequence[str] = (),
    ) -> int:
        """Write one item; returns its position. Durable when this returns. `settles`: the
        calls whose cost the item says: their markers, and their unknown-cost records still
        waiting to ship, are deleted in the same transaction."""
        ts = (now or datetime.now(UTC)).isoformat()
        with self._using():
            self._db.execute("BEGIN")
            try:
                cursor = self._db.execute(
                    "INSERT INTO outbox (kind, item_id, body, created_at) VALUES (?,?,?,?)",
                    (kind, item_id, body, ts),
                )
                seq = int(cursor.lastrowid or 0)
                self._db.executemany("DELETE FROM calls WHERE call_id = ?", [(c,) for c in settles])
                # The same calls' "unknown cost" records not shipped yet (set aside for an older
                # cloud, say, which would ignore the settling): the cost is known now.
                self._db.executemany(
                    "DELETE FROM outbox WHERE kind = ? AND item_id = ?",
                    [(UNSETTLED, c) for c in settles],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        for listener in self._listeners:
            listener()
        return seq

    def open_call(self, call_id: str, body: bytes) -> None:
        """Write a call's marker (its record as it would be shipped) before the call is made;
        durable when this returns."""
        with self._using():
            self._db.execute(
                "INSERT INTO calls (call_id, body, created_at) VALUES (?,?,?)",
                (call_id, body, datetime.now(UTC).isoformat()),
            )

    def settle_calls(self, call_ids: Sequence[str]) -> None:
        """Delete the markers of calls that ended unbilled."""
        with self._using():
            self._db.executemany("DELETE FROM calls WHERE call_id = ?", [(c,) for c in call_ids])

    def open_calls(self) -> list[str]:
        """The ids of the markers still here, oldest first."""
        return [call_id for call_id, _ in self.held_calls()]

    def held_calls(self) -> list[tuple[str, bytes]]:
        """The markers still here (id, body), oldest first: read without moving them, so the
        timeline can keep their calls before `release_calls` takes them away."""
        with self._using():
            rows = self._db.execute(
                "SELECT call_id, body FROM calls ORDER BY created_at"
            ).fetchall()
        return [(str(c), bytes(b)) for c, b in rows]

    def release_calls(self, kind: str, call_ids: Sequence[str] | None = None) -> list[bytes]:
        """Move markers (`call_ids`, else every one) into the outbox as items of `kind`, in one
        transaction: their calls ended, or their process died, without a cost. Their bodies
        (the timeline keeps them for this host's console and export once they are shipped)."""
        ts = datetime.now(UTC).isoformat()
        with self._using():
            self._db.execute("BEGIN")
            try:
                if call_ids is None:
                    rows = self._db.execute(
                        "SELECT call_id, body FROM calls ORDER BY created_at"
                    ).fetchall()
                else:
                    rows = []
                    for call_id in call_ids:
                        rows += self._db.execute(
                            "SELECT call_id, body FROM calls WHERE call_id = ?", (call_id,)
                        ).fetchall()
                self._db.executemany(
                    "INSERT INTO outbox (kind, item_id, body, created_at) VALUES (?,?,?,?)",
                    [(kind, str(c), bytes(b), ts) for c, b in rows],
                )
                self._db.executemany(
                    "DELETE FROM calls WHERE call_id = ?", [(str(c),) for c, _ in rows]
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        if rows:
            for listener in self._listeners:
                listener()
        return [bytes(b) for _, b in rows]

    def head(self, limit: int) -> list[OutboxItem]:
        """The oldest pending items, in order."""
        with self._using():
            rows = self._db.execute(
                "SELECT seq, kind, item_id, body, created_at, tries, suspect, suspect_since"
                " FROM outbox WHERE state = 'pending' ORDER BY seq LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            OutboxItem(
                int(s),
                str(k),
                str(i),
                bytes(b),
                datetime.fromisoformat(c),
                int(t),
                int(n),
                datetime.fromisoformat(since) if since else None,
            )
            for s, k, i, b, c, t, n, since in rows
        ]

    def sent(self, seqs: Sequence[int]) -> None:
        """The cloud took these: they go."""
        with self._using():
            self._db.executemany("DELETE FROM outbox WHERE seq = ?", [(s,) for s in seqs])

    def failed(self, seqs: Sequence[int], error: str, suspect_at: datetime | None = None) -> None:
        """A try that may work later: counted, the error kept; `suspect_at`: the failure may be
        the cloud's bug on the items (`sender.SUSPECT`), counted apart, the first one's time
        kept."""
        since = suspect_at.isoformat() if suspect_at is not None else None
        with self._using():
            self._db.executemany(
                "UPDATE outbox SET tries = tries + 1, last_error = ?, suspect = suspect + ?,"
                " suspect_since = COALESCE(suspect_since, ?) WHERE seq = ?",
                [(error[:2000], int(since is not None), since, s) for s in seqs],
            )

    def forgive(self, seqs: Sequence[int]) -> None:
        """Forget the items' suspect failures: each gets a chance of its own again (a batch
        given up on is tried item by item)."""
        with self._using():
            self._db.executemany(
                "UPDATE outbox SET suspect = 0, suspect_since = NULL WHERE seq = ?",
                [(s,) for s in seqs],
            )

    def set_aside(self, seqs: Sequence[int], error: str) -> None:
        """The cloud cannot take these yet (it predates their kind): kept whole, out of the
        way of the items after them, until `bring_back`."""
        with self._using():
            self._db.executemany(
                "UPDATE outbox SET state = 'later', tries = tries + 1, last_error = ?"
                " WHERE seq = ?",
                [(error[:2000], s) for s in seqs],
            )

    def bring_back(self) -> int:
        """Items set aside go back in line (in their order), to be tried again: how many."""
        with self._using():
            cursor = self._db.execute("UPDATE outbox SET state = 'pending' WHERE state = 'later'")
            return int(cursor.rowcount)

    def refused(self, seq: int, error: str) -> None:
        """The cloud refused this item for good: kept, marked, never sent again."""
        with self._using():
            self._db.execute(
                "UPDATE outbox SET state = 'refused', tries = tries + 1, last_error = ?,"
                " body = x'' WHERE seq = ?",
                (error[:2000], seq),
            )
            self._db.execute(
                "DELETE FROM outbox WHERE state = 'refused' AND seq NOT IN (SELECT seq FROM"
                " outbox WHERE state = 'refused' ORDER BY seq DESC LIMIT ?)",
                (self._keep_refused,),
            )

    def keep_result(self, task_id: str, attempt: int, device_serial: str, body: bytes) -> None:
        """Hold an attempt's result (a serialized `TaskResult`) until `drop_result`; durable
        when this returns. The attempt's phone goes with it: the next process of the host
        names the lease it still answers for (`HostHello.held_assignments`)."""
        with self._using():
            self._db.execute(
                "INSERT OR REPLACE INTO results (task_id, attempt, device_serial, body,"
                " created_at) VALUES (?,?,?,?,?)",
                (task_id, attempt, device_serial, body, datetime.now(UTC).isoformat()),
            )

    def drop_result(self, task_id: str, attempt: int) -> None:
        """The cloud took the result, or refused it for good: it goes."""
        with self._using():
            self._db.execute(
                "DELETE FROM results WHERE task_id = ? AND attempt = ?", (task_id, attempt)
            )

    def held_results(self) -> list[tuple[str, bytes]]:
        """Every result held, oldest first: (the attempt's phone, the serialized result)."""
        with self._using():
            rows = self._db.execute(
                "SELECT device_serial, body FROM results ORDER BY created_at"
            ).fetchall()
        return [(str(serial), bytes(body)) for serial, body in rows]

    def backlog(self) -> Backlog:
        with self._using():
            items, decisions, oldest = self._db.execute(
                "SELECT COUNT(*), COUNT(DISTINCT CASE WHEN kind = 'decision' THEN item_id END),"
                " MIN(created_at) FROM outbox WHERE state IN ('pending', 'later')"
            ).fetchone()
            (refused,) = self._db.execute(
                "SELECT COUNT(*) FROM outbox WHERE state = 'refused'"
            ).fetchone()
        return Backlog(
            int(items),
            int(decisions),
            datetime.fromisoformat(oldest) if oldest else None,
            int(refused),
        )

    def refusals(self, limit: int = 20) -> list[tuple[str, str, str]]:
        """The latest refused items: (kind, item id, the cloud's reason)."""
        with self._using():
            rows = self._db.execute(
                "SELECT kind, item_id, last_error FROM outbox WHERE state = 'refused'"
                " ORDER BY seq DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [(str(k), str(i), str(e or "")) for k, i, e in rows]
