"""`amc task retry`: an operator reruns a failed or cancelled task in an incident, each
command its own process against a real cloud over mTLS."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from amc.v1 import task_service_pb2, types_pb2
from cloud.pki import ensure_embedded_pki
from cloud.secret_box import new_key
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from console.client import OperatorClient, secure_channel
from tests.console.test_cli import AMC

#: No `amc up` context or AMC_ setting of the machine running the tests.
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("AMC_")},
    "AMC_CONTEXT_FILE": "/nonexistent/amc-context.json",
}


@dataclass
class Ran:
    code: int
    out: str
    err: str


@dataclass
class Stack:
    cloud: CloudServer
    pki: Path
    ops: OperatorClient

    async def amc(self, *args: str, env: dict[str, str] | None = None) -> Ran:
        process = await asyncio.create_subprocess_exec(
            AMC,
            *("--cloud", self.cloud.address, "--pki-dir", str(self.pki)),
            *args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**ENV, **(env or {})},
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
        return Ran(process.returncode or 0, out.decode(), err.decode())

    async def task(self, task_id: str) -> types_pb2.Task:
        got: task_service_pb2.GetTaskResponse = await self.ops.tasks.GetTask(
            task_service_pb2.GetTaskRequest(task_id=task_id)
        )
        return got.task

    async def cancelled(self, request: task_service_pb2.SubmitTaskRequest) -> types_pb2.Task:
        """Submitted for a host that never connects (it stays queued), then cancelled."""
        submitted: task_service_pb2.SubmitTaskResponse = await self.ops.tasks.SubmitTask(request)
        await self.ops.tasks.CancelTask(
            task_service_pb2.CancelTaskRequest(task_id=submitted.task.task_id, reason="wrong")
        )
        return await self.task(submitted.task.task_id)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    pki = ensure_embedded_pki(tmp_path, [], operator="admin")
    cloud = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address="127.0.0.1:0",
            pki_dir=pki,
            secrets_key=new_key(),
        )
    )
    await cloud.start()
    ops = OperatorClient.over(
        secure_channel(
            cloud.address,
            ca=pki / "ca.pem",
            cert=pki / "operator-admin.pem",
            key=pki / "operator-admin.key",
        )
    )
    try:
        yield Stack(cloud, pki, ops)
    finally:
        await ops.close()
        await cloud.stop(0.5)


async def test_a_cancelled_task_is_queued_again_as_it_was_submitted(stack: Stack) -> None:
    request = task_service_pb2.SubmitTaskRequest(
        goal="Turn on dark theme",
        target=types_pb2.TaskTarget(host_id="lab-9", device_serial="emulator-5556"),
        max_attempts=5,
        lease_duration=Duration(seconds=45),
        timeout=Duration(seconds=600),
        no_replay=True,
        budget=types_pb2.TaskBudget(max_tokens=5000, max_cost_usd=0.5),
    )
    old = await stack.cancelled(request)
    assert old.status == types_pb2.TASK_STATUS_CANCELLED
    ran = await stack.amc("task", "retry", old.task_id[:8])
    assert ran.code == 0, ran
    new_id = ran.out.strip()
    assert new_id and new_id != old.task_id, ran
    new = await stack.task(new_id)
    assert new.status == types_pb2.TASK_STATUS_QUEUED
    assert (new.goal, new.target, new.max_attempts, new.no_replay, new.budget) == (
        old.goal,
        old.target,
        old.max_attempts,
        old.no_replay,
        old.budget,
    )
    assert new.lease_duration == old.lease_duration
    timeout = new.deadline.ToDatetime() - new.created_at.ToDatetime()
    assert timeout.total_seconds() == pytest.approx(600, abs=1)
    # A second retry of the same task (another operator, a resent command) queues nothing new.
    again = await stack.amc("task", "retry", old.task_id, "--json")
    assert again.code == 0, again
    assert f'"task_id":"{new_id}"' in again.out.replace(" ", "")
    assert '"deduplicated":true' in again.out.replace(" ", "")


async def test_only_an_ended_task_that_did_not_succeed_is_retried(stack: Stack) -> None:
    submitted: task_service_pb2.SubmitTaskResponse = await stack.ops.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(
            goal="Open Settings", target=types_pb2.TaskTarget(host_id="lab-9")
        )
    )
    ran = await stack.amc("task", "retry", submitted.task.task_id)
    assert ran.code == 2, ran
    assert ran.err.startswith(f"amc task retry: task {submitted.task.task_id} is queued"), ran
    assert "Traceback" not in ran.err


async def test_a_retried_task_s_secrets_are_given_again(stack: Stack) -> None:
    """Secrets are deleted when a task ends: the retry asks for them as `task submit` does."""
    old = await stack.cancelled(
        task_service_pb2.SubmitTaskRequest(
            goal="Unlock with {{secret:pin}}",
            target=types_pb2.TaskTarget(host_id="lab-9"),
            secrets={"pin": "4711"},
        )
    )
    missing = await stack.amc("task", "retry", old.task_id)
    assert missing.code == 2, missing
    assert "the goal's {{secret:pin}}: set AMC_SECRET_PIN" in missing.err, missing
    ran = await stack.amc("task", "retry", old.task_id, env={"AMC_SECRET_PIN": "4711"})
    assert ran.code == 0, ran
    assert "4711" not in ran.out + ran.err
    assert (await stack.task(ran.out.strip())).goal == old.goal
