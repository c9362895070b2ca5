"""The cloud's SQLite file on a disk that fills up, then gets its space back.

Real `amc cloud serve` (SQLite on a 4 MiB tmpfs of its own) and `amc host run` (cloud planner
transport). The disk is filled to the last byte while a task is queued. Proves: a client is told
UNAVAILABLE ("the cloud's database is unavailable; retry"), the cloud's log says the disk is full
in plain words (before, only "OperationalError (sqlite3.OperationalError)", nothing an operator
could act on), and once space is back the same process takes work again and every task it had
accepted ends succeeded, each once. Mounting a tmpfs needs root (the suite's CI runs as root);
elsewhere the test is skipped.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from amc.v1 import task_service_pb2, types_pb2
from tests.support.processes import (
    TERMINAL,
    Fleet,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.tmpfs import fill, tmpfs
from tests.support.waiting import until


async def test_a_full_disk_is_named_and_the_cloud_recovers_when_space_returns(
    tmp_path: Path, fault_pki: Path
) -> None:
    with tmpfs(tmp_path / "disk", "size=4m") as disk:
        # A long lease: while the disk is full no renewal is written, and a host whose lease
        # runs out unrenewed stops its attempt (its task then runs twice). The disk stays full
        # until the test has read the refusal and the log: on a loaded machine longer than the
        # suite's 2.5 s lease, and the test failed so.
        fleet = Fleet(
            tmp_path,
            fault_pki,
            database_url=f"sqlite+aiosqlite:///{disk / 'c.db'}",
            cloud_env={"AMC_CLOUD_DEFAULT_LEASE_SECONDS": "120"},
        )
        cloud, host = fleet.cloud().start(), fleet.host("a")
        ops = None
        try:
            await wait_serving(fleet.address, fault_pki)
            ops = operator(fleet.address, fault_pki)
            host.start()
            await wait_connected(ops, {"a"})
            filler = fill(disk)
            refused: list[grpc.aio.AioRpcError] = []

            async def submit() -> str | None:
                request = task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme")
                try:
                    reply = await ops.tasks.SubmitTask(request, timeout=10)
                except grpc.aio.AioRpcError as e:
                    refused.append(e)
                    return None
                return str(reply.task.task_id)

            accepted: list[str] = []
            while not refused and len(accepted) < 20:  # a WAL with room may take a few
                task_id = await submit()
                if task_id:
                    accepted.append(task_id)
            assert refused, "every write went through on a full disk"
            assert {(e.code(), e.details()) for e in refused} == {
                (grpc.StatusCode.UNAVAILABLE, "the cloud's database is unavailable; retry")
            }
            await until(lambda: "the disk is full" in cloud.output(), what="the log names it")
            filler.unlink()
            after: list[str] = []

            async def submitted() -> bool:
                task_id = await submit()
                after.extend([task_id] if task_id else [])
                return bool(after)

            await until(submitted, what="a task submitted once space is back")
            for task_id in [*accepted, *after]:
                task = await wait_task(ops, task_id, lambda t: t.status in TERMINAL, what="ended")
                assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task
                assert len(task.attempts) == 1, task
            assert cloud.alive()
        finally:
            if ops is not None:
                await ops.close()
            host.stop()
            cloud.stop()
