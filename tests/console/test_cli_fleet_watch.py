"""`amc task watch` of the whole fleet (its own process) while the cloud restarts under it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

from amc.v1 import task_service_pb2, types_pb2
from cloud.pki import ensure_embedded_pki
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from console import exit_codes
from console.client import OperatorClient, secure_channel
from tests.console.test_cli import AMC
from tests.support.processes import free_port
from tests.support.waiting import until

ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("AMC_")},
    "AMC_CONTEXT_FILE": "/nonexistent/amc-context.json",
}


async def _cloud(tmp_path: Path, pki: Path, port: int) -> CloudServer:
    cloud = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address=f"127.0.0.1:{port}",
            pki_dir=pki,
        )
    )
    await cloud.start()
    return cloud


async def test_a_fleet_watch_with_nothing_to_show_yet_rides_out_a_restart(
    tmp_path: Path,
) -> None:
    """A fleet watch is reconnected once it reached the cloud, not only once it was sent
    something: one opened on a quiet fleet exited 4 at the cloud's first restart."""
    pki = ensure_embedded_pki(tmp_path, [], operator="admin")
    port = free_port()
    cloud = await _cloud(tmp_path, pki, port)
    watch = await asyncio.create_subprocess_exec(
        AMC,
        *("--cloud", f"127.0.0.1:{port}", "--pki-dir", str(pki), "task", "watch"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    ops = None
    try:
        await until(lambda: cloud.bus.watchers() == 1, within=60, what="the watch's stream")
        await cloud.stop(0)
        cloud = await _cloud(tmp_path, pki, port)
        ops = OperatorClient.over(
            secure_channel(
                cloud.address,
                ca=pki / "ca.pem",
                cert=pki / "operator-admin.pem",
                key=pki / "operator-admin.key",
            )
        )
        submitted: task_service_pb2.SubmitTaskResponse = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Open Settings", target=types_pb2.TaskTarget(host_id="nobody")
            )
        )
        assert watch.stdout is not None
        line = await asyncio.wait_for(watch.stdout.readline(), 60)
        assert line.decode().startswith(f"{submitted.task.task_id} queued"), line
        watch.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(watch.communicate(), 60)
        assert watch.returncode == exit_codes.INTERRUPTED, err.decode()
        assert "the cloud went away" in err.decode(), err.decode()
    finally:
        if watch.returncode is None:
            watch.kill()
            await watch.wait()
        if ops is not None:
            await ops.close()
        await cloud.stop(0)
