"""Two cloud replicas on one PostgreSQL, hosts on both, the database restarted under them.

Hosts a and b reach replica 1, c and d replica 2, all planning through the cloud (every step a
Decide that needs the database). Mid-run, PostgreSQL is restarted in immediate mode (every
connection of both replicas dropped, their LISTEN connections too). Proves: both replicas serve
on in the same processes, no task fails for the outage, every task reports exactly one result,
results accepted before the restart are unchanged, and from the hosts' own timelines no task
runs again after a host finished it. The single-replica restart suite (`test_restarts.py`) never
had the shared parts in play: the replicas' event bus, their presence rows, each one's sweep of
the other's hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from amc.v1 import types_pb2
from tests.support.figures import record
from tests.support.processes import (
    cloud_process,
    free_port,
    host_process,
    operator,
    stop_all,
    wait_connected,
    wait_serving,
)
from tests.support.restartable_postgres import restartable_postgres
from tests.support.task_batch import (
    GOALS,
    accepted,
    check_finished_once,
    host_runs,
    submit,
    wait_finished,
    wait_tasks,
)

pytestmark = pytest.mark.postgres

HOSTS = ("a", "b", "c", "d")
LEASE_S = 10


def _busy_on_both(tasks: list[types_pb2.Task]) -> bool:
    """Each replica has a host running a task: the restart hits steps on both."""
    running = {t.host_id for t in tasks if t.status == types_pb2.TASK_STATUS_RUNNING}
    return bool(running & {"a", "b"}) and bool(running & {"c", "d"})


async def test_a_database_restart_under_two_replicas_fails_no_task(
    tmp_path: Path, fault_pki: Path
) -> None:
    if os.environ.get("AMC_TEST_SKIP_POSTGRES") == "1":
        pytest.skip("AMC_TEST_SKIP_POSTGRES=1")
    name = "replicas_database_restart"
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(restartable_postgres())
        db = pg.server.create_database("amc_replicas_restart")
        ports = [free_port(), free_port()]
        replicas = [
            cloud_process(tmp_path, f"replica-{i + 1}", database_url=db, pki_dir=fault_pki, port=p)
            for i, p in enumerate(ports)
        ]
        hosts = {
            h: host_process(
                tmp_path,
                h,
                cloud_address=f"127.0.0.1:{ports[0 if h in 'ab' else 1]}",
                pki_dir=fault_pki,
                phones=2,
                settle_delay_s=0.3,
            )
            for h in HOSTS
        }
        ops = None
        try:
            replicas[0].start()  # migrates the fresh database; then the second one starts
            await wait_serving(f"127.0.0.1:{ports[0]}", fault_pki)
            replicas[1].start()
            await wait_serving(f"127.0.0.1:{ports[1]}", fault_pki)
            pids = [r.pid for r in replicas]
            ops = operator(f"127.0.0.1:{ports[1]}", fault_pki)
            for h in hosts.values():
                h.start()
            await wait_connected(ops, set(HOSTS))
            ids = await submit(ops, GOALS, lease_duration=Duration(seconds=LEASE_S))
            before = accepted(await wait_tasks(ops, ids, _busy_on_both))
            await ops.close()
            ops = None
            restarted_at = time.monotonic()
            await asyncio.to_thread(pg.restart)
            ops = operator(f"127.0.0.1:{ports[0]}", fault_pki)
            final = await wait_finished(ops, ids, within=120)
            record(name, "restart to every task finished", time.monotonic() - restarted_at)
            assert [r.pid for r in replicas if r.alive()] == pids
        finally:
            if ops is not None:
                await ops.close()
            stop_all(list(hosts.values()))
            stop_all(replicas)

    failed = [t for t in final if t.status != types_pb2.TASK_STATUS_SUCCEEDED]
    record(name, "tasks failed", len(failed), f"of {len(final)}")
    assert not failed, [(t.goal, t.result_summary) for t in failed]
    runs = host_runs(tmp_path, HOSTS)
    rerun = sorted({r.task_id for r in runs for e in runs if e.finished_before(r)})
    assert set(ids) <= {r.task_id for r in runs}
    assert not rerun, rerun
    check_finished_once(name, final, before)
