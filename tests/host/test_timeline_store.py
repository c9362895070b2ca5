"""Timeline store: records round-trip, legacy records load, retention deletes rows and files."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from host.timeline.artifacts import ArtifactPathError, ArtifactStore
from host.timeline.record import TimelineRecord
from host.timeline.store import _SCHEMA, INTERRUPTED, TimelineStore, UnsettledCall
from planner.decision import Billed, Usage
from tests.support.tmpfs import fill, tmpfs


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TimelineStore]:
    s = TimelineStore(tmp_path / "db" / "task_progress.sqlite3", tmp_path / "artifacts")
    yield s
    s.close()


def _task(store: TimelineStore, task_id: str, when: datetime, status: str = "succeeded") -> None:
    store.start_task(task_id, 1, f"goal {task_id}", "emulator-5554", now=when)
    rel = store.save_screenshot(task_id, 1, "step001-before.png", b"\x89PNG fake")
    store.append_step(TimelineRecord(task_id, 1, 1, before_screenshot_path=rel))
    if status != "running":
        store.finish_task(task_id, 1, status, "done", now=when)


def test_record_round_trip_with_every_field(store: TimelineStore) -> None:
    store.start_task("t1", 2, "turn on dark theme", "emulator-5554", lease_id="L1")
    before = store.save_screenshot("t1", 2, "step001-before.png", b"before")
    after = store.save_screenshot("t1", 2, "step001-after.png", b"after")
    rec = TimelineRecord(
        "t1",
        2,
        1,
        system_prompt="sys",
        user_prompt="user",
        rationale="The list is open; open Display.",
        thinking=[{"text": "hmm", "redacted": False}],
        tool_name="tap",
        arguments={"element_id": "e3"},
        purpose="open display settings",
        expected_outcome="Display page shows",
        action={"tap": {"element_id": "e3"}},
        result={"ok": True, "nodes": [{"id": "e1", "bounds": [0, 0, 1, 1]}]},
        success=True,
        before_screenshot_path=before,
        after_screenshot_path=after,
        ocr=[{"text": "Display", "bounds": [1, 2, 3, 4], "confidence": 91.0}],
        usage={"input_tokens": 10, "output_tokens": 5},
        timings={"plan_s": 0.1},
        world_event={"action": {"tool": "tap"}, "page": "settings: Settings", "success": True},
    )
    store.append_step(rec)
    [loaded] = store.steps("t1", 2)
    assert loaded.to_dict() == rec.to_dict()
    assert loaded.screenshot_path == after
    assert store.artifacts.read(loaded.before_screenshot_path or "") == b"before"
    assert loaded.event.page == "settings: Settings"
    row = store.get_task("t1")
    assert row is not None
    assert row.status == "running"
    assert row.lease_id == "L1"


def test_legacy_records_load(store: TimelineStore) -> None:
    # The seed's old shape: the task goal as `prompt`, a parsed `tool_call`, one screenshot.
    store.start_task("old", 1, "g", "s")
    legacy = {
        "prompt": "turn on wifi",
        "tool_call": {"action": "tap", "description": "open wifi", "args": {"element_id": "e2"}},
        "screenshot_path": "old-a1/shot.png",
        "step": 3,
    }
    store.append_raw_step("old", 1, 3, legacy)
    store.append_raw_step("old", 1, 4, {"world_event": {"action": {"tool": "tap"}}})
    first, second = store.steps("old", 1)
    assert first.step_index == 3
    assert first.tool_name == "tap"
    assert first.arguments == {"element_id": "e2"}
    assert first.purpose == "open wifi"
    assert first.after_screenshot_path == first.screenshot_path == "old-a1/shot.png"
    assert first.legacy["prompt"] == "turn on wifi"
    assert first.before_screenshot_path is None
    assert first.ocr == []
    assert second.event.rationale is None  # WorldEvent without newer fields loads


def test_legacy_json_in_sqlite_from_another_writer(tmp_path: Path) -> None:
    s = TimelineStore(tmp_path / "t.sqlite3", tmp_path / "a")
    s.start_task("x", 1, "g", "s")
    s.append_raw_step("x", 1, 1, {"task_id": "x", "attempt": 1, "unknown_future_field": 7})
    [rec] = s.steps("x", 1)
    assert rec.legacy == {"unknown_future_field": 7}
    assert json.loads(json.dumps(rec.to_dict()))["screenshot_path"] is None
    s.close()


def test_retention_by_count_deletes_rows_and_files(store: TimelineStore) -> None:
    now = datetime.now(UTC)
    for i in range(5):
        _task(store, f"t{i}", now - timedelta(minutes=10 - i))
    dirs_before = store.artifacts.task_dirs()
    assert len(dirs_before) == 5
    deleted = store.prune(max_tasks=3, max_age_days=7, now=now)
    assert sorted(deleted) == [("t0", 1), ("t1", 1)]
    assert [t.task_id for t in store.list_tasks()] == ["t4", "t3", "t2"]
    assert store.steps("t0", 1) == []
    assert store.artifacts.task_dirs() == ["t2-a1", "t3-a1", "t4-a1"]


def test_retention_by_age_and_running_tasks_survive(store: TimelineStore) -> None:
    now = datetime.now(UTC)
    _task(store, "old", now - timedelta(days=8))
    _task(store, "old-running", now - timedelta(days=8), status="running")
    _task(store, "new", now - timedelta(days=1))
    deleted = store.prune(max_tasks=50, max_age_days=7, now=now)
    assert deleted == [("old", 1)]
    assert {t.task_id for t in store.list_tasks()} == {"old-running", "new"}
    assert "old-a1" not in store.artifacts.task_dirs()


def test_failed_calls_are_kept_per_attempt_and_pruned_with_it(store: TimelineStore) -> None:
    """What a failed decision's billed calls cost is kept beside the steps (the outbox forgets
    it once shipped): summed per attempt, deleted with the attempt."""
    now = datetime.now(UTC)
    _task(store, "old", now - timedelta(days=8))
    _task(store, "new", now - timedelta(days=1))
    for task_id, used in (("old", Usage(5)), ("new", Usage(500, 100, cost_usd=0.25))):
        store.add_failed_calls(task_id, 1, Billed("anthropic", "m", used), "PlannerError")
    store.add_failed_calls("new", 1, Billed("anthropic", "m", Usage(7, thinking_tokens=3)), "E")
    assert store.failed_calls("new", 1) == (2, Usage(507, 100, thinking_tokens=3, cost_usd=0.25))
    assert store.failed_calls("new", 2) == (0, Usage())
    assert store.prune(max_tasks=50, max_age_days=7, now=now) == [("old", 1)]
    assert store.failed_calls("old", 1) == (0, Usage())
    assert store.failed_calls("new", 1)[0] == 2


def test_orphan_artifact_folders_are_removed(store: TimelineStore) -> None:
    store.artifacts.write("ghost", 1, "x.png", b"x")
    store.prune(max_tasks=50, max_age_days=7)
    assert store.artifacts.task_dirs() == []


@pytest.mark.parametrize("bad", ["../escape.png", "/etc/passwd", "a/../../b", "", "x\x00.png"])
def test_artifact_paths_cannot_escape(tmp_path: Path, bad: str) -> None:
    arts = ArtifactStore(tmp_path / "arts")
    with pytest.raises(ArtifactPathError):
        arts.resolve(bad)
    assert arts.find(bad) is None


def test_find_answers_none_for_what_no_file_system_holds(tmp_path: Path) -> None:
    arts = ArtifactStore(tmp_path / "arts")
    rel = arts.write("t", 1, "x.png", b"png")
    assert arts.find(rel) == arts.resolve(rel)
    assert arts.find("a" * 5000 + ".png") is None  # a name too long for the file system
    assert arts.find("/".join(["d" * 250] * 40)) is None  # a path too long
    assert arts.find("t-a1") is None  # a folder is not a file


def test_hostile_task_ids_stay_inside(tmp_path: Path) -> None:
    arts = ArtifactStore(tmp_path / "arts")
    rel = arts.write("../../etc", 1, "../passwd", b"x")
    assert arts.resolve(rel).is_relative_to(arts.root)
    assert ".." not in rel
    arts.delete_task("../..", 1)
    assert arts.root.is_dir()


def test_attempts_left_running_by_a_dead_process_are_marked_interrupted(tmp_path: Path) -> None:
    first = TimelineStore(tmp_path / "t.sqlite3", tmp_path / "a")
    first.start_task("t1", 1, "g", "phone-1")
    first.start_task("t2", 1, "g", "phone-2")
    first.finish_task("t2", 1, "succeeded", "done")
    first.start_task("t3", 2, "g", "phone-3")
    first.close()  # the process dies here: t1 and t3 never finish

    again = TimelineStore(tmp_path / "t.sqlite3", tmp_path / "a")
    try:
        assert again.mark_interrupted() == [("t1", 1), ("t3", 2)]
        t1 = again.get_task("t1", 1)
        assert t1 is not None and t1.status == INTERRUPTED and t1.finished_at
        assert "interrupted" in t1.summary
        t2 = again.get_task("t2", 1)
        assert t2 is not None and t2.status == "succeeded"
        assert again.mark_interrupted() == []  # nothing left running
        # Interrupted attempts are pruned like finished ones (running ones never are).
        assert set(again.prune(max_tasks=0, max_age_days=7)) == {("t1", 1), ("t2", 1), ("t3", 2)}
    finally:
        again.close()


class _AttemptStartsWhileListed(ArtifactStore):
    """The folder as the retention pass lists it, with a new attempt starting on the phone's
    thread just then (its row, then its first screenshot): the order a real host can meet when
    an assignment arrives during the pass at start. Only the moment is forced; every part is
    the real one."""

    store: TimelineStore

    def task_dirs(self) -> list[str]:
        self.store.start_task("new", 1, "a new goal", "emulator-5554")
        self.store.save_screenshot("new", 1, "step001-before.png", b"png")
        return super().task_dirs()


def test_the_orphan_folder_sweep_keeps_an_attempt_started_while_it_runs(tmp_path: Path) -> None:
    """The sweep read the task rows before it listed the folders: an attempt that started in
    between had its folder (with its first screenshot) deleted as an orphan, and its steps
    pointed at nothing."""
    store = TimelineStore(tmp_path / "t.sqlite3", tmp_path / "artifacts")
    racing = _AttemptStartsWhileListed(tmp_path / "artifacts")
    racing.store = store
    store.artifacts = racing
    try:
        store.artifacts.write("ghost", 1, "x.png", b"x")  # a real orphan: no row
        store.prune(max_tasks=50, max_age_days=7)
        assert ArtifactStore(tmp_path / "artifacts").task_dirs() == ["new-a1"]
        assert store.artifacts.find("new-a1/step001-before.png") is not None
    finally:
        store.close()


def test_a_call_whose_late_answer_came_first_is_not_kept_as_of_unknown_cost(
    store: TimelineStore,
) -> None:
    """A call in flight when its decision was cancelled has its marker released and is then
    written to the timeline as of unknown cost, in a later thread hop (`AgentLoop._decide`);
    its late answer (`add_failed_calls`) may land in between, when there is no row yet for it
    to delete. The row written after it stayed for good: the host's console and export
    counted the call in the cost and as of unknown cost. Either order now ends the same."""
    late = Usage(input_tokens=500, output_tokens=100, cost_usd=0.003)
    late.calls.append("c1")
    bound = UnsettledCall("c1", "t1", 1, "anthropic", "m", Usage(output_tokens=8))
    other = UnsettledCall("c2", "t1", 1, "anthropic", "m", Usage(output_tokens=9))
    store.add_failed_calls("t1", 1, Billed("anthropic", "m", late), "CancelledError")
    store.add_unsettled_calls([bound, other])
    assert store.unsettled_calls("t1", 1) == (1, Usage(output_tokens=9))
    # The same call id of another attempt is not settled by it.
    store.add_unsettled_calls([UnsettledCall("c1", "t1", 2, "anthropic", "m", Usage())])
    assert store.unsettled_calls("t1", 2)[0] == 1


def test_a_screenshot_write_the_full_disk_refuses_leaves_no_partial_file(tmp_path: Path) -> None:
    """A real 1 MiB tmpfs: a 2 MiB screenshot fails with ENOSPC. Before, its partial `.tmp`
    stayed, holding the space a probe write (`host.timeline.data_folder`) needs; now the
    folder holds nothing of it, and the next write that fits works."""
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        arts = ArtifactStore(disk / "arts")
        with pytest.raises(OSError, match="No space left"):
            arts.write("t1", 1, "step-1.png", b"\0" * (2 * 1024 * 1024))
        assert list((disk / "arts" / "t1-a1").iterdir()) == []
        rel = arts.write("t1", 1, "step-1.png", b"\0" * (256 * 1024))
        assert arts.read(rel) == b"\0" * (256 * 1024)


def test_a_mark_is_aged_by_how_long_running_hosts_saw_its_phone_unlisted(tmp_path: Path) -> None:
    """A kept unhealthy mark was aged out at start by when it was set, never refreshed: a
    phone still plugged in and still sick lost its mark at the first restart a day later.
    It is aged by how long running hosts saw adb not list its phone (`saw_unhealthy`); a file
    an older host wrote (no `seen_at`, no `absent_s`) gets the columns, and its marks, until
    a host looks, are aged by the wall clock since they were set."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    old = sqlite3.connect(tmp_path / "timeline.sqlite3")
    old.execute(
        "CREATE TABLE unhealthy_phones (serial TEXT PRIMARY KEY, attempts INTEGER NOT NULL,"
        " last TEXT NOT NULL, part TEXT NOT NULL, marked_at TEXT NOT NULL)"
    )
    old.execute(
        "INSERT INTO unhealthy_phones VALUES ('legacy', 3, 'dark', 'look', ?)", (t0.isoformat(),)
    )
    old.commit()
    old.close()
    s = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    try:
        s.keep_unhealthy("listed", 3, "dark", "look", now=t0)
        s.keep_unhealthy("unplugged", 3, "dark", "look", now=t0)
        later = t0 + timedelta(days=2)
        s.saw_unhealthy(["listed"], now=later)  # a new process's first look: nothing unlisted
        assert [m[0] for m in s.unhealthy_phones(timedelta(hours=1), now=later)] == [
            "listed",
            "unplugged",
        ]  # the legacy mark, by the wall clock until that look: two days
        s.saw_unhealthy(["listed"], unlisted_s=86400.0, now=later)
        # Seen unlisted a day more: the legacy mark three days, the unplugged phone's one.
        assert [m[0] for m in s.unhealthy_phones(timedelta(days=2), now=later)] == [
            "listed",
            "unplugged",
        ]
        assert [m[0] for m in s.unhealthy_phones(timedelta(days=4), now=later)] == [
            "legacy",
            "listed",
            "unplugged",
        ]
        s.drop_old_marks(timedelta(hours=1), now=later)
        assert s.unhealthy_phones(timedelta(days=4), now=later) == [("listed", 3, "dark", "look")]
    finally:
        s.close()


def test_a_mark_set_since_the_last_look_ages_only_from_its_setting(
    store: TimelineStore,
) -> None:
    """A phone marked (and unplugged) a minute before a look that came an hour after the last
    one was absent at most that minute. Before, the look added the whole hour to the new mark:
    a restart with `device_forget_after_s` under an hour forgot it and put the phone back to
    work. A mark set before the last look still gets the whole time since."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    store.keep_unhealthy("old", 3, "dark", "look", now=t0)
    store.saw_unhealthy([], now=t0)  # the last look
    look = t0 + timedelta(hours=1)
    store.keep_unhealthy("new", 3, "dark", "look", now=look - timedelta(minutes=1))
    store.saw_unhealthy([], unlisted_s=3600.0, now=look)
    assert [m[0] for m in store.unhealthy_phones(timedelta(minutes=30), now=look)] == ["new"]
    assert [m[0] for m in store.unhealthy_phones(timedelta(minutes=2), now=look)] == ["new"]
    assert [m[0] for m in store.unhealthy_phones(timedelta(seconds=59), now=look)] == []
    assert [m[0] for m in store.unhealthy_phones(timedelta(hours=2), now=look)] == ["new", "old"]


def test_a_write_the_full_disk_refuses_raises_the_disks_words(tmp_path: Path) -> None:
    """A real 2 MiB tmpfs holding the timeline, filled: a failed decision's calls (one
    transaction) cannot be written. SQLite has rolled the transaction back itself, and the
    store's own ROLLBACK raised "cannot rollback - no transaction is active" over the disk's
    error (the traceback the host logs ended in it). Now the disk's error is the one raised,
    and once the disk has room the store writes again."""
    with tmpfs(tmp_path / "disk", "size=2m") as disk:
        store = TimelineStore(disk / "task_progress.sqlite3", disk / "artifacts")
        try:
            store.start_task("t1", 1, "goal", "emulator-5554")
            filler = fill(disk)
            billed = Billed("anthropic", "m", Usage(5))
            with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
                store.add_failed_calls("t1", 1, billed, "PlannerError" * 2000)
            filler.unlink()
            store.add_failed_calls("t1", 1, billed, "PlannerError")
            assert store.failed_calls("t1", 1) == (1, Usage(5))
        finally:
            store.close()


def test_a_refused_prune_leaves_no_transaction_open_for_the_next_write(
    store: TimelineStore,
) -> None:
    """A prune the file refuses mid-attempt rolls back what it deleted: left open, its
    transaction took the host's next write with it (never committed, lost at close)."""
    now = datetime.now(UTC)
    _task(store, "old", now - timedelta(days=8))
    other = sqlite3.connect(store.db_path)
    other.execute(
        "CREATE TRIGGER refuse_delete BEFORE DELETE ON tasks"
        " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    )
    other.commit()
    with pytest.raises(sqlite3.IntegrityError, match="refused by the test"):
        store.prune(max_tasks=50, max_age_days=7, now=now)
    store.start_task("next", 1, "goal next", "emulator-5554", now=now)
    # Another connection sees what was committed: the next write, and the attempt whole.
    assert other.execute("SELECT task_id FROM tasks ORDER BY task_id").fetchall() == [
        ("next",),
        ("old",),
    ]
    assert other.execute("SELECT COUNT(*) FROM steps WHERE task_id='old'").fetchone() == (1,)
    other.close()
    assert [r.step_index for r in store.steps("old", 1)] == [1]


def test_a_file_whose_upgrade_is_owed_reads_as_empty_where_its_tables_are_missing(
    tmp_path: Path,
) -> None:
    """An older host's timeline (tasks and steps only: from before failed, unknown-cost calls
    and kept marks), its process dead with the file open; then its disk (a 2 MiB tmpfs)
    filled, so opening it cannot add the tables and the change is owed (`upgrade`) while the
    host is paused. The console's page of an attempt reads its failed and unknown-cost calls,
    and a forgotten phone's mark is dropped: before, each raised "no such table"; now they
    answer as for empty tables, and once the disk has room the upgrade makes the tables."""
    with tmpfs(tmp_path / "disk", "size=2m") as disk:
        db = disk / "task_progress.sqlite3"
        older = sqlite3.connect(db, isolation_level=None)
        try:
            older.execute("PRAGMA journal_mode=WAL")
            older.executescript(_SCHEMA.split("CREATE TABLE IF NOT EXISTS failed_calls")[0])
            older.execute(
                "INSERT INTO tasks (task_id, attempt, created_at, updated_at) VALUES (?,?,?,?)",
                ("t1", 1, "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00"),
            )
            filler = fill(disk)
            store = TimelineStore(db, disk / "artifacts")
            try:
                assert store._schema_owed
                assert store.unsettled_calls("t1", 1) == (0, Usage())
                assert store.failed_calls("t1", 1) == (0, Usage())
                store.drop_unhealthy("emulator-5554")
                filler.unlink()
                store.upgrade()
                tables = {r[0] for r in older.execute("SELECT name FROM sqlite_master")}
                assert {"failed_calls", "unsettled_calls", "unhealthy_phones"} <= tables
                assert store.unsettled_calls("t1", 1) == (0, Usage())
            finally:
                store.close()
        finally:
            older.close()
