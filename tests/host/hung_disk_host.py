"""A host process one of whose timeline writes hangs on the disk, for the tests of its exit
(`test_kept_marks.py`, `test_runner.py`): what `amc host run` does (`asyncio.run` of
`run_host`, which stops on SIGTERM), against the in-test fake cloud, with two virtual phones.
The hung write, made under the timeline's lock as SQLite's would be, opens a FIFO nobody
reads: the `open()` blocks for good, as a write to a dead NFS mount or a dying disk does.

- `marks`: its last run kept a mark of a phone adb still lists (dark, so its probe fails and
  leaves the mark); the refresh of the marks (`TimelineStore.saw_unhealthy`) hangs. Prints
  "refreshing" once it does.
- `retention`: the start's retention pass (`TimelineStore.prune`) hangs. Prints "pruning".

Prints "stopped" when run_host returned and asyncio.run has shut its loop down.

Usage: python -m tests.host.hung_disk_host TMP_DIR marks|retention; the tests call
`exits_on_sigterm`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from host import runner
from host.timeline.store import TimelineStore
from tests.host.lease_fake import host_settings, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner

HOST_ID = "h1"
SERIAL = "emulator-5554"


async def main(tmp: Path, hangs: str) -> None:
    cloud = await start_fake_cloud(tmp / "pki", HOST_ID)
    settings = host_settings(tmp, cloud.port, cloud.pki_dir, HOST_ID).model_copy(
        update={"planner_transport": "direct", "device_poll_interval_s": 0.05}
    )
    last_run = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
    if hangs == "marks":
        last_run.keep_unhealthy(SERIAL, 3, "the screen stayed dark", "look")
    last_run.close()
    fifo = tmp / "hung-disk"
    os.mkfifo(fifo)
    virtual, settings = runner.start_virtual_phones(settings)
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True  # its probe fails: the mark stays, nothing else writes it
    phone.sleep()
    build = runner.build_host
    pruned = threading.Event()

    def build_hung(*args: Any, **kwargs: Any) -> runner.HostApp:
        app = build(*args, **kwargs)
        store = app.store
        prune = store.prune

        def prune_once(*a: Any, **kw: Any) -> Any:  # the start's retention pass, let finish
            try:
                return prune(*a, **kw)
            finally:
                pruned.set()

        def prune_hung(*a: Any, **kw: Any) -> Any:
            with store._using():  # the timeline's lock, held as a hung SQLite delete holds it
                print("pruning", flush=True)
                with fifo.open("wb"):  # blocks: nobody reads
                    pass

        def saw_hung(
            serials: Sequence[str], unlisted_s: float = 0.0, now: datetime | None = None
        ) -> None:
            pruned.wait(30)
            with store._using():  # the timeline's lock, held as a hung SQLite write holds it
                print("refreshing", flush=True)
                with fifo.open("wb"):  # blocks: nobody reads
                    pass

        if hangs == "marks":
            store.prune = prune_once  # type: ignore[method-assign]
            store.saw_unhealthy = saw_hung  # type: ignore[method-assign]
        else:
            store.prune = prune_hung  # type: ignore[method-assign]
        return app

    runner.build_host = build_hung
    try:
        await runner.run_host(
            settings.model_copy(update={"device_source": "adb"}), planner=ScriptedPlanner([])
        )
    finally:
        await asyncio.to_thread(virtual.stop)
        await cloud.server.stop(grace=None)
    print("stopped", flush=True)


def exits_on_sigterm(tmp: Path, hangs: str, hung: str) -> None:
    """Run this host hanging `hangs`; once it printed `hung`, SIGTERM: it must exit, status 0,
    within 60 s (for ever, before the fixes: the bound only ends the test)."""
    fifo = tmp / "hung-disk"
    with subprocess.Popen(
        [sys.executable, "-m", "tests.host.hung_disk_host", str(tmp), hangs],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == hung
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the host's exit still waits on its hung write ({hangs})")
            assert proc.returncode == 0
            assert proc.stdout.read().split() == ["stopped"]
        finally:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(OSError):  # a reader lets the hung open go, if it waits
                fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
                os.close(fd)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
