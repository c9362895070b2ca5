"""The cloud is down for part of a direct-transport task (real `amc` processes).

A host on the direct transport (its own offline planner) runs a task; once its first decision
reached the cloud, the cloud process is SIGKILLed. The host goes on planning and acting, its
decisions and screenshots piling up in its outbox (its SQLite file, read here), and its result
waits in memory. The cloud is started again on the same database; the host reconnects, reports
its backlog and sends it.

Proves: afterwards every decision of the task is in the cloud's log exactly once, in the order
the host made them (the host's own timeline is the reference), each recorded as the direct
transport's, every step's before and after screenshot is in the cloud's artifact store, the
task ended as the host reported, and the host's outbox is empty.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from google.protobuf import duration_pb2

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    fleet_service_pb2,
    task_service_pb2,
    types_pb2,
)
from host.outbox import OutboxStore
from tests.support.figures import record
from tests.support.processes import (
    TERMINAL,
    Fleet,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)

WITHIN = 60.0


def _timeline(host_dir: Path, task_id: str) -> list[dict[str, Any]]:
    """The host's own record of the task's steps, in order."""
    with sqlite3.connect(host_dir / "task_progress.sqlite3") as db:
        rows = db.execute(
            "SELECT record FROM steps WHERE task_id = ? ORDER BY step_index, id", (task_id,)
        ).fetchall()
    return [json.loads(r[0]) for r in rows]


async def _until(condition: Any, what: str) -> Any:
    deadline = time.monotonic() + WITHIN
    while True:
        value = await condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not within {WITHIN}s"
        await asyncio.sleep(0.1)


async def test_decisions_made_while_the_cloud_was_down_arrive_once_in_order(
    tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(tmp_path, fault_pki)
    address = fleet.address
    cloud = fleet.cloud("cloud-1").start()
    # A slow settle keeps the task running across the outage (each step ~1 s).
    host = fleet.host(
        "a",
        settle_delay_s=1.0,
        transport="direct",  # it plans itself, so it goes on while the cloud is down
    )
    outbox_path = tmp_path / "host-a" / "outbox.sqlite3"
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        host.start()
        await wait_connected(ops, {"a"})
        submitted = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme",
                # Longer than the outage: the host keeps its lease and finishes the attempt.
                lease_duration=duration_pb2.Duration(seconds=120),
            )
        )
        task_id = submitted.task.task_id

        first_ops = ops

        async def first_shipped() -> bool:
            reply = await first_ops.decisions.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
            )
            return len(reply.decisions) >= 1

        await _until(first_shipped, "the first decision in the cloud")
        await ops.close()
        ops = None
        cloud.kill()
        killed = time.monotonic()

        # The host goes on: what it decides now waits in its outbox.
        async def backlog() -> bool:
            store = OutboxStore(outbox_path)
            try:
                return store.backlog().decisions >= 1
            finally:
                store.close()

        await _until(backlog, "a decision waiting in the host's outbox")
        cloud = fleet.cloud("cloud-2").start()
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        task = await wait_task(ops, task_id, lambda t: t.status in TERMINAL, within=WITHIN)
        assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task

        artifacts = artifact_service_pb2_grpc.ArtifactServiceStub(ops.channel)
        later_ops = ops

        async def drained() -> Any:
            hosts = await later_ops.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
            host_row = next(h for h in hosts.hosts if h.host_id == "a")
            if not host_row.HasField("outbox") or host_row.outbox.items:
                return None
            return host_row

        drained_host = await _until(drained, "the host's outbox emptied and reported")
        record(
            "outbox_cloud_down", "SIGKILL to the backlog in the cloud", time.monotonic() - killed
        )
        assert drained_host.outbox.refused == 0

        async def with_outcomes() -> Any:
            # A step's outcome is shipped after its decision, as a second item; the host's
            # outbox report can predate the last one, so wait for every outcome (bounded).
            listed = (
                await later_ops.decisions.ListDecisions(
                    decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
                )
            ).decisions
            done = listed and all(d.HasField("outcome") for d in listed)
            return listed if done else None

        decisions = await _until(with_outcomes, "every shipped decision with its outcome")
        steps = _timeline(tmp_path / "host-a", task_id)
        # Exactly once, in order: one decision per step the host took, the same actions.
        assert [d.step_index for d in decisions] == list(range(1, len(steps) + 1))
        assert [d.tool_name for d in decisions] == [s["tool_name"] for s in steps]
        assert [json.loads(d.arguments_json) for d in decisions] == [s["arguments"] for s in steps]
        assert {d.planner_transport for d in decisions} == {types_pb2.PLANNER_TRANSPORT_DIRECT}
        assert decisions[-1].tool_name == "complete"
        assert all(d.HasField("outcome") and d.outcome.executed for d in decisions)

        both = {
            artifact_service_pb2.SCREENSHOT_PHASE_BEFORE,
            artifact_service_pb2.SCREENSHOT_PHASE_AFTER,
        }
        wanted = {(d.step_index, p) for d in decisions for p in both}

        async def every_screenshot() -> Any:
            # Screenshots are items of their own, shipped after their step's decision: the
            # outbox report can predate the last one (as for the outcomes above).
            shots = (
                await artifacts.ListStepScreenshots(
                    artifact_service_pb2.ListStepScreenshotsRequest(task_id=task_id)
                )
            ).screenshots
            phases = {(s.step_index, s.phase) for s in shots}
            return phases if phases >= wanted else None

        phases = await _until(every_screenshot, "every step's screenshots")
        assert phases == wanted
        stored = tmp_path / "cloud-artifacts" / task_id / "1"
        assert len([p for p in stored.iterdir() if p.suffix == ".png"]) == 2 * len(decisions)
    finally:
        if ops is not None:
            await ops.close()
        host.stop()
        cloud.stop()
