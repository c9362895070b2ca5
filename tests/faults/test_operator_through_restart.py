"""What an operator's `amc` sees while the cloud restarts under it (a deploy, a crash).

Real `amc cloud serve`, `amc host run` (virtual phone, cloud transport) and `amc task watch`
processes: the watch was started before the cloud went down and must see its task through.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import (
    AMC,
    OPERATOR,
    Fleet,
    dark_theme_running,
    operator,
    wait_connected,
    wait_serving,
)

#: Longer than the test: the restart must not cost the task its attempt.
LONG_LEASE = {"AMC_CLOUD_DEFAULT_LEASE_SECONDS": "120"}
#: No `amc up` context or AMC_ setting of the machine running the tests.
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("AMC_")},
    "AMC_CONTEXT_FILE": "/nonexistent/amc-context.json",
}


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
async def test_a_task_watch_sees_its_task_through_a_cloud_restart(
    tmp_path: Path, fault_pki: Path, how: str
) -> None:
    fleet = Fleet(tmp_path, fault_pki, cloud_env=LONG_LEASE)
    cloud = fleet.cloud().start()
    # Slow steps: the task is still under way when the cloud is back.
    host = fleet.host("a", settle_delay_s=2.0)
    ops = None
    watch = None
    try:
        await wait_serving(fleet.address, fault_pki)
        ops = operator(fleet.address, fault_pki)
        host.start()
        await wait_connected(ops, {"a"})
        task_id = await dark_theme_running(ops, "a")
        watch = await asyncio.create_subprocess_exec(
            AMC,
            *("--cloud", fleet.address, "--pki-dir", str(fault_pki), "--operator", OPERATOR),
            *("task", "watch", task_id),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=ENV,
        )
        assert watch.stdout is not None
        first = await asyncio.wait_for(watch.stdout.readline(), 60)
        assert task_id in first.decode(), first
        if how == "SIGKILL":
            cloud.kill()
        else:
            cloud.stop()
        cloud = fleet.cloud("cloud-2").start()
        out, err = await asyncio.wait_for(watch.communicate(), 180)
        assert watch.returncode == 0, (out.decode(), err.decode())
        assert out.decode().splitlines()[-1].startswith(f"{task_id} succeeded"), out.decode()
        assert "the cloud went away" in err.decode(), err.decode()
    finally:
        if watch is not None and watch.returncode is None:
            watch.kill()
            await watch.wait()
        if ops is not None:
            await ops.close()
        host.stop()
        cloud.stop()
