"""A host process whose data-folder probe hangs, for `test_data_folder.py`: what `amc host run`
does (`asyncio.run` of `run_host`, which stops on SIGTERM), against the in-test fake cloud, with
two virtual phones. Once built, its data folder is marked unwritable and its probe file is a
FIFO nobody opens for reading: the probe's `open()` blocks for good, as a write to a dead NFS
mount or a dying disk does. Prints "probing" when the probe began; exits when run_host returns
and asyncio.run has shut its loop down.

Usage: python -m tests.host.hung_folder_host TMP_DIR
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from host import runner
from host.timeline.data_folder import PROBE_NAME, DataFolder
from tests.host.lease_fake import host_settings, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner

HOST_ID = "h1"


class _Hung(DataFolder):
    """The host's data folder, saying (on stdout) when a probe of it began."""

    def probe(self) -> bool:
        print("probing", flush=True)
        return super().probe()


async def main(tmp: Path) -> None:
    cloud = await start_fake_cloud(tmp / "pki", HOST_ID)
    settings = host_settings(tmp, cloud.port, cloud.pki_dir, HOST_ID).model_copy(
        update={"planner_transport": "direct", "data_dir_probe_s": 0.05}
    )
    build = runner.build_host

    def build_hung(*args: Any, **kwargs: Any) -> runner.HostApp:
        app = build(*args, **kwargs)
        folder = _Hung(settings.resolved_db_path.parent, settings.data_dir_probe_s)
        os.mkfifo(folder.folder / PROBE_NAME)
        folder.failed(HOST_ID, "Input/output error")
        app.lease.data_folder = folder
        return app

    runner.build_host = build_hung
    try:
        await runner.run_host(settings, planner=ScriptedPlanner([]))
    finally:
        await cloud.server.stop(grace=None)
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
