"""A host process whose refresh of its unhealthy marks (`TimelineStore.saw_unhealthy`) hangs
on the disk, for `test_kept_marks.py`: what `amc host run` does (`asyncio.run` of `run_host`,
which stops on SIGTERM), against the in-test fake cloud, with two virtual phones. Its last run
kept a mark of a phone adb still lists (dark, so its probe fails and leaves the mark); the
refresh's write, made under the timeline's lock as SQLite's would be, opens a FIFO nobody
reads: the `open()` blocks for good, as a write to a dead NFS mount or a dying disk does.
Prints "refreshing" once the write hangs; "stopped" when run_host returned and asyncio.run
has shut its loop down.

Usage: python -m tests.host.hung_marks_host TMP_DIR
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from host import runner
from host.timeline.store import TimelineStore
from tests.host.lease_fake import host_settings, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner

HOST_ID = "h1"
SERIAL = "emulator-5554"


async def main(tmp: Path) -> None:
    cloud = await start_fake_cloud(tmp / "pki", HOST_ID)
    settings = host_settings(tmp, cloud.port, cloud.pki_dir, HOST_ID).model_copy(
        update={"planner_transport": "direct", "device_poll_interval_s": 0.05}
    )
    last_run = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
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

        def saw_hung(
            serials: Sequence[str], unlisted_s: float = 0.0, now: datetime | None = None
        ) -> None:
            pruned.wait(30)
            with store._using():  # the timeline's lock, held as a hung SQLite write holds it
                print("refreshing", flush=True)
                with fifo.open("wb"):  # blocks: nobody reads
                    pass

        store.prune = prune_once  # type: ignore[method-assign]
        store.saw_unhealthy = saw_hung  # type: ignore[method-assign]
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


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
