"""A host stopped with SIGTERM while its retention pass deletes an old task's many files.

A real `amc host run` (no cloud needed: the pass runs at every start) whose timeline holds one
task older than the retention age, its folder full of files. The stop ends the pass where it is
and the process exits at once, leaving the rest of the folder; the next start deletes it (a
folder with no task row goes with the next pass). Before, the stop waited for the whole pass:
with many files that is minutes, past a supervisor's patience (SIGKILL).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from host.timeline.store import TimelineStore
from tests.support.many_files import MANY, fill_with_links
from tests.support.processes import Fleet
from tests.support.waiting import until


def _old_task_with_many_files(host_dir: Path) -> Path:
    """A task finished 30 days ago (past the default 7-day retention); its folder."""
    store = TimelineStore(host_dir / "task_progress.sqlite3", host_dir / "artifacts")
    try:
        long_ago = datetime.now(UTC) - timedelta(days=30)
        store.start_task("old-task", 1, "an old goal", "emulator-5554", now=long_ago)
        store.finish_task("old-task", 1, "succeeded", "done long ago", now=long_ago)
        folder = store.artifacts.resolve(store.artifacts.task_dir_name("old-task", 1))
        folder.mkdir(parents=True)
        fill_with_links(folder)  # so many that deleting them takes far longer than the stop
        return folder
    finally:
        store.close()


def _files(folder: Path) -> int:
    try:
        return len(os.listdir(folder))
    except FileNotFoundError:
        return 0


async def test_a_host_stopped_in_a_long_retention_pass_exits_without_finishing_it(
    tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(tmp_path, fault_pki)  # its cloud is never started
    folder = _old_task_with_many_files(tmp_path / "host-a")
    host = fleet.host("a").start()
    again = None
    try:
        await until(lambda: _files(folder) < MANY, what="the retention pass deleting")
        assert host.stop() == 0, host.output()
        assert _files(folder) > 0, "the stop waited for the whole retention pass"
        again = fleet.host("a").start()
        await until(lambda: not folder.exists(), within=120, what="the next start's pass")
        assert again.stop() == 0, again.output()
    finally:
        host.kill()
        if again is not None:
            again.kill()
