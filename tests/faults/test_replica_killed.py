"""Two cloud replicas on one PostgreSQL, hosts split across them, one replica SIGKILLed, or
stopped with SIGTERM (a rolling deploy: it ends its hosts' streams and hands back what it never
sent, and each host resumes the leases it holds on the other replica).

Each host reaches the cloud through a loopback TCP proxy standing in for the load balancer: hosts
a and b prefer replica 1, hosts c and d replica 2, and a proxy sends a new connection to the other
replica when its first choice refuses. Both replicas start at the same moment on a fresh database
(they migrate one after the other). Proves: replica 1's hosts move to replica 2 by themselves,
every task finishes with exactly one reported result, and no task ever ran on two phones at once
(checked on the hosts' own timelines, the ground truth of what ran where and when).
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import time
from datetime import datetime
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from amc.v1 import types_pb2
from tests.support.figures import record
from tests.support.postgres import PostgresServer
from tests.support.processes import (
    cloud_process,
    free_port,
    host_process,
    operator,
    stop_all,
    wait_connected,
    wait_serving,
)
from tests.support.task_batch import (
    GOALS,
    accepted,
    check_finished_once,
    submit,
    wait_finished,
    wait_tasks,
)
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.postgres

LEASE_S = 10


def _busy_on_a_or_b(tasks: list[types_pb2.Task]) -> bool:
    """Host a or b is running a task: killing their replica now interrupts work."""
    return any(t.status == types_pb2.TASK_STATUS_RUNNING and t.host_id in ("a", "b") for t in tasks)


def _runs(db: Path, host_id: str) -> list[tuple[str, int, str, datetime, datetime]]:
    """(task, attempt, host, first moment, last moment) of every attempt a host's timeline holds."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT t.task_id, t.attempt, t.created_at,"
            " MAX(COALESCE(t.finished_at, t.updated_at), COALESCE(MAX(s.created_at), ''))"
            " FROM tasks t LEFT JOIN steps s ON s.task_id = t.task_id AND s.attempt = t.attempt"
            " GROUP BY t.task_id, t.attempt"
        ).fetchall()
    finally:
        conn.close()
    return [
        (task, attempt, host_id, datetime.fromisoformat(start), datetime.fromisoformat(end))
        for task, attempt, start, end in rows
    ]


@pytest.mark.parametrize(
    ("how", "transport"), [("kill", "cloud"), ("terminate", "cloud"), ("kill", "direct")]
)
async def test_killed_replica_hosts_move_and_nothing_runs_twice(
    how: str,
    transport: str,
    tmp_path: Path,
    fault_pki: Path,
    postgres_server: PostgresServer,
    migrated_postgres: str,
) -> None:
    db = postgres_server.create_database("amc_fault_replicas", template=migrated_postgres)
    ports = [free_port(), free_port()]
    replicas = [
        cloud_process(tmp_path, f"replica-{i + 1}", database_url=db, pki_dir=fault_pki, port=p)
        for i, p in enumerate(ports)
    ]
    backends = [("127.0.0.1", p) for p in ports]
    lb = [TcpProxy(backends).start(), TcpProxy(list(reversed(backends))).start()]
    hosts = {
        h: host_process(
            tmp_path,
            h,
            cloud_address=lb[0 if h in "ab" else 1].address,
            pki_dir=fault_pki,
            phones=2,
            settle_delay_s=0.3,
            transport=transport,
        )
        for h in ("a", "b", "c", "d")
    }
    survivor = f"127.0.0.1:{ports[1]}"
    ops = None
    try:
        replicas[0].start()
        replicas[1].start()
        await wait_serving(f"127.0.0.1:{ports[0]}", fault_pki)
        await wait_serving(survivor, fault_pki)
        ops = operator(survivor, fault_pki)
        for h in hosts.values():
            h.start()
        await wait_connected(ops, set(hosts))
        assert {link.backend[1] for link in lb[0].links} == {ports[0]}
        assert {link.backend[1] for link in lb[1].links} == {ports[1]}
        # 10 s leases, as the restart tests': the fault suite's 2.5 s default lapsed three
        # times over on a loaded machine and failed a task ("lease expired"), which is not what
        # this test is about (a lapse is still allowed: requeued, never run twice at once).
        ids = await submit(ops, GOALS, lease_duration=Duration(seconds=LEASE_S))
        # Kill replica 1 while its hosts are busy.
        before = accepted(await wait_tasks(ops, ids, _busy_on_a_or_b))
        getattr(replicas[0], how)()  # SIGKILL, or SIGTERM without waiting for its exit
        killed_at = time.monotonic()

        def moved() -> int:
            return sum(link.backend[1] == ports[1] for link in lb[0].links_since(killed_at))

        while moved() < 2:  # hosts a and b, one lease stream each
            assert time.monotonic() - killed_at < 30, "hosts a, b never reached replica 2"
            await asyncio.sleep(0.05)
        signal = "SIGKILL" if how == "kill" else "SIGTERM"
        record(
            "replica_killed",
            f"{signal} to hosts a, b on the survivor",
            time.monotonic() - killed_at,
        )
        await wait_connected(ops, set(hosts))
        final = await wait_finished(ops, ids, within=90)
        record("replica_killed", f"{signal} to every task finished", time.monotonic() - killed_at)
        check_finished_once("replica_killed", final, before)
    finally:
        if ops is not None:
            await ops.close()
        stop_all(list(hosts.values()))  # side by side, then the replicas they hand back to
        stop_all(replicas)
        for p in lb:
            p.stop()

    # Ground truth from the phones' side: no two runs of one task overlap in time.
    runs = [r for h in hosts for r in _runs(tmp_path / f"host-{h}" / "task_progress.sqlite3", h)]
    by_task: dict[str, list[tuple[str, int, str, datetime, datetime]]] = {}
    for run in runs:
        by_task.setdefault(run[0], []).append(run)
    assert set(by_task) == set(ids)
    for task_id, task_runs in by_task.items():
        task_runs.sort(key=lambda r: r[3])
        for earlier, later in itertools.pairwise(task_runs):
            assert earlier[4] <= later[3], f"task {task_id} ran twice at once: {earlier} {later}"
    postgres_server.drop_database(db)
