"""`amc task watch` of the whole fleet (its own process) while the cloud restarts under it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import task_service_pb2, types_pb2
from cloud.pki import ensure_embedded_pki
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from console import exit_codes, watching
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


def _watched_by_one(cloud: CloudServer) -> bool:
    return cloud.bus.watchers() == 1


async def test_a_quiet_fleet_watch_rides_out_each_restart_not_only_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outage's start was cleared only by a message: on a quiet fleet (nothing to send)
    the first restart's outage never ended, and a second restart, however much later, was
    given up on at once. The watch is in-process here so that the give-up time can be short
    (5 minutes in `amc`); the cloud is real and restarted for real."""
    monkeypatch.setattr(watching, "GIVE_UP_S", 1.0)
    pki = ensure_embedded_pki(tmp_path, [], operator="admin")
    port = free_port()
    cloud = await _cloud(tmp_path, pki, port)
    ops = OperatorClient.over(
        secure_channel(
            cloud.address,
            ca=pki / "ca.pem",
            cert=pki / "operator-admin.pem",
            key=pki / "operator-admin.key",
        )
    )
    went: list[str] = []
    changes = watching.watch_through_restarts(ops, gone=went.append)
    first = asyncio.ensure_future(anext(changes))
    try:
        for _ in range(2):
            await until(partial(_watched_by_one, cloud), within=60, what="the watch's stream")
            await asyncio.sleep(1.5)  # longer than the give-up time since the last outage
            assert not first.done()
            await cloud.stop(0)
            cloud = await _cloud(tmp_path, pki, port)
        await until(lambda: cloud.bus.watchers() == 1, within=60, what="the watch's stream")
        submitted: task_service_pb2.SubmitTaskResponse = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Open Settings", target=types_pb2.TaskTarget(host_id="nobody")
            )
        )
        change = await asyncio.wait_for(first, 60)
        assert change.task.task_id == submitted.task.task_id
        assert len(went) == 2
    finally:
        first.cancel()
        await changes.aclose()
        await ops.close()
        await cloud.stop(0)


async def _submit(ops: OperatorClient, goal: str) -> str:
    submitted: task_service_pb2.SubmitTaskResponse = await ops.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(goal=goal, target=types_pb2.TaskTarget(host_id="nobody"))
    )
    return submitted.task.task_id


def _operator(cloud: CloudServer, pki: Path) -> OperatorClient:
    return OperatorClient.over(
        secure_channel(
            cloud.address,
            ca=pki / "ca.pem",
            cert=pki / "operator-admin.pem",
            key=pki / "operator-admin.key",
        )
    )


async def test_a_fleet_watch_reports_the_tasks_that_ended_while_the_cloud_was_away(
    tmp_path: Path,
) -> None:
    """A new stream's snapshot holds the unfinished tasks only: a task the watch showed queued
    that was cancelled while the cloud was away, and one made and cancelled then, were never
    shown, so the watch said the first was still queued. The changes are made by a cloud on
    another port over the same database while the watched one is down (the watch cannot reach
    it); the one left queued is not shown twice."""
    pki = ensure_embedded_pki(tmp_path, [], operator="admin")
    port = free_port()
    cloud = await _cloud(tmp_path, pki, port)
    ops = _operator(cloud, pki)
    ended = await _submit(ops, "Open Settings")
    kept = await _submit(ops, "Open Clock")
    watch = await asyncio.create_subprocess_exec(
        AMC,
        *("--cloud", f"127.0.0.1:{port}", "--pki-dir", str(pki), "task", "watch"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert watch.stdout is not None
    lines: list[str] = []
    try:
        while len(lines) < 2:
            lines.append((await asyncio.wait_for(watch.stdout.readline(), 60)).decode())
        assert sorted(line.split()[:2] for line in lines) == sorted(
            [[ended, "queued"], [kept, "queued"]]
        ), lines
        await ops.close()
        await cloud.stop(0)
        meanwhile = await _cloud(tmp_path, pki, free_port())
        ops = _operator(meanwhile, pki)
        await ops.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=ended))
        made = await _submit(ops, "Open Camera")
        await ops.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=made))
        await ops.close()
        await meanwhile.stop(0)
        cloud = await _cloud(tmp_path, pki, port)
        ops = _operator(cloud, pki)
        while len(lines) < 4:
            lines.append((await asyncio.wait_for(watch.stdout.readline(), 60)).decode())
        assert sorted(line.split()[:2] for line in lines[2:]) == sorted(
            [[ended, "cancelled"], [made, "cancelled"]]
        ), lines
        # Something after the catch-up: nothing else (the queued task) came before it.
        last = await _submit(ops, "Open Maps")
        line = (await asyncio.wait_for(watch.stdout.readline(), 60)).decode()
        assert line.split()[:2] == [last, "queued"], (lines, line)
        watch.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(watch.communicate(), 60)
        assert watch.returncode == exit_codes.INTERRUPTED, err.decode()
    finally:
        if watch.returncode is None:
            watch.kill()
            await watch.wait()
        await ops.close()
        await cloud.stop(0)


async def test_a_fleet_watch_back_from_an_outage_reads_an_older_task_that_ended_by_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task the watch showed unfinished, made longer before the newest it knew of than the
    listing of ended tasks reaches back (`CREATED_SLACK_S`, 0 here so that no test waits a
    minute), and that ended while the cloud was away, is read by its id and shown."""
    monkeypatch.setattr(watching, "CREATED_SLACK_S", 0)
    pki = ensure_embedded_pki(tmp_path, [], operator="admin")
    port = free_port()
    cloud = await _cloud(tmp_path, pki, port)
    ops = _operator(cloud, pki)
    older = await _submit(ops, "Open Settings")
    newer = await _submit(ops, "Open Clock")
    changes = watching.watch_through_restarts(ops)
    try:
        shown = [(await asyncio.wait_for(anext(changes), 60)).task.task_id for _ in range(2)]
        assert sorted(shown) == sorted([older, newer])
        await cloud.stop(0)
        meanwhile = await _cloud(tmp_path, pki, free_port())
        other = _operator(meanwhile, pki)
        await other.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=older))
        await other.close()
        await meanwhile.stop(0)
        cloud = await _cloud(tmp_path, pki, port)
        change = await asyncio.wait_for(anext(changes), 60)
        assert (change.task.task_id, change.task.status) == (
            older,
            types_pb2.TASK_STATUS_CANCELLED,
        )
        assert not change.task.attempts
    finally:
        await changes.aclose()
        await ops.close()
        await cloud.stop(0)


class _Calls(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """The unary methods a channel called, in order (what a watch asks the cloud)."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method
        self.methods.append(method.decode() if isinstance(method, bytes) else method)
        return await continuation(details, request)


async def test_a_fleet_watch_back_from_an_outage_lists_the_older_tasks_that_ended_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks the watch showed unfinished, made before the listing of ended tasks reaches back,
    that ended while the cloud was away, are read in one ListTasks call by their ids: it made
    one GetTask call per task, as many as a busy fleet ended during a deploy."""
    monkeypatch.setattr(watching, "CREATED_SLACK_S", 0)
    pki = ensure_embedded_pki(tmp_path, [], operator="admin")
    port = free_port()
    cloud = await _cloud(tmp_path, pki, port)
    calls = _Calls()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / "operator-admin.key").read_bytes(),
        certificate_chain=(pki / "operator-admin.pem").read_bytes(),
    )
    ops = OperatorClient.over(
        grpc.aio.secure_channel(cloud.address, credentials, interceptors=[calls])
    )
    older = [await _submit(ops, f"Open Settings {i}") for i in range(5)]
    newer = await _submit(ops, "Open Clock")
    changes = watching.watch_through_restarts(ops)
    try:
        shown = [(await asyncio.wait_for(anext(changes), 60)).task.task_id for _ in range(6)]
        assert sorted(shown) == sorted([*older, newer])
        await cloud.stop(0)
        meanwhile = await _cloud(tmp_path, pki, free_port())
        other = _operator(meanwhile, pki)
        for task_id in older:
            await other.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task_id))
        await other.close()
        await meanwhile.stop(0)
        cloud = await _cloud(tmp_path, pki, port)
        calls.methods.clear()
        ended = [await asyncio.wait_for(anext(changes), 60) for _ in older]
        assert sorted((c.task.task_id, c.task.status) for c in ended) == sorted(
            (task_id, types_pb2.TASK_STATUS_CANCELLED) for task_id in older
        )
        assert "/amc.v1.TaskService/GetTask" not in calls.methods, calls.methods
        assert calls.methods.count("/amc.v1.TaskService/ListTasks") == 3, calls.methods
    finally:
        await changes.aclose()
        await ops.close()
        await cloud.stop(0)
