"""PostgreSQL stopped (immediate mode, like a crash) and started again while tasks run.

Proves: the cloud process survives its database going away (same process, no restart), serves
again once the database is back, every task finishes, and no result it had accepted is lost.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from amc.v1 import task_service_pb2, types_pb2
from tests.support.figures import record
from tests.support.processes import (
    AmcProcess,
    cloud_process,
    free_port,
    host_process,
    operator,
    wait_connected,
    wait_serving,
)
from tests.support.restartable_postgres import restartable_postgres
from tests.support.task_batch import (
    GOALS,
    accepted,
    check_finished_once,
    mid_run,
    submit,
    wait_finished,
    wait_tasks,
)

pytestmark = pytest.mark.postgres

LEASE_S = 12
#: What the cloud logs when it refuses a host's report because the database is away (the
#: message ends the line, or is followed by its bound fields: telemetry/logs.py's text format).
REFUSED = re.compile(
    r": (handling a message from \S+ failed|renewal batch of \d+ failed)( \[[^]]*\])?$", re.M
)


async def _until_refused(cloud: AmcProcess, since: int, within: float) -> None:
    """Until the cloud's log (past offset `since`) shows a host's report refused: the hosts
    reported into the outage, so the recovery below is a recovery from refused reports."""
    deadline = time.monotonic() + within
    while not REFUSED.search(cloud.output()[since:]):
        assert time.monotonic() < deadline, "no host report reached the cloud during the outage"
        await asyncio.sleep(0.05)


async def test_postgres_restart_under_load(tmp_path: Path, fault_pki: Path) -> None:
    if os.environ.get("AMC_TEST_SKIP_POSTGRES") == "1":
        pytest.skip("AMC_TEST_SKIP_POSTGRES=1")
    with restartable_postgres() as pg:
        db = pg.server.create_database("amc_fault")
        port = free_port()
        address = f"127.0.0.1:{port}"
        cloud = cloud_process(tmp_path, "cloud", database_url=db, pki_dir=fault_pki, port=port)
        hosts = [
            host_process(
                tmp_path, h, cloud_address=address, pki_dir=fault_pki, phones=2, settle_delay_s=0.2
            )
            for h in ("a", "b", "c")
        ]
        ops = None
        try:
            cloud.start()
            await wait_serving(address, fault_pki)
            pid = cloud.pid
            ops = operator(address, fault_pki)
            for h in hosts:
                h.start()
            await wait_connected(ops, {"a", "b", "c"})
            ids = await submit(ops, GOALS, lease_duration=Duration(seconds=LEASE_S))
            before = accepted(await wait_tasks(ops, ids, mid_run))

            down_at = time.monotonic()
            logged = len(cloud.output())
            await asyncio.to_thread(pg.stop)
            await _until_refused(cloud, logged, within=LEASE_S)  # hosts report into the outage
            await asyncio.to_thread(pg.start)
            up_at = time.monotonic()
            record("postgres_restart", "database down (stop + start)", up_at - down_at)

            final = await wait_finished(ops, ids)
            record(
                "postgres_restart", "database back to every task finished", time.monotonic() - up_at
            )
            assert cloud.alive()
            assert cloud.pid == pid  # recovered without a restart
            retried = check_finished_once("postgres_restart", final, before)
            # An outage well inside a lease costs no lease: renewals and results the cloud
            # refused with UNAVAILABLE while the database was away are sent again. (On a machine
            # so busy that the restart itself outlasts half a lease, this cannot be promised.)
            if up_at - down_at < LEASE_S / 2:
                assert retried == 0, [
                    (t.goal, [a.failure_reason for a in t.attempts]) for t in final
                ]
            # Still serving new work on the same process.
            await wait_serving(address, fault_pki)
            fresh = await ops.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme")
            )
            [after] = await wait_finished(ops, [fresh.task.task_id])
            assert after.status == types_pb2.TASK_STATUS_SUCCEEDED, after
        finally:
            if ops is not None:
                await ops.close()
            for h in hosts:
                h.stop()
            cloud.stop()
