"""Secret parameters of tasks on the cloud, on both backends, over real mTLS gRPC.

Write-only: the values reach the lease holder's Assignment and nothing else (no RPC returns
them); at rest they are Fernet tokens (the plain value is in no row); they are deleted once the
task ends; a cloud without a key refuses them instead of storing plain text; bad submissions get
INVALID_ARGUMENT naming the field; a goal that looks like it holds a credential is queued with a
warning.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from amc.v1 import task_service_pb2
from cloud.secret_box import SecretBox, SecretUnreadable, from_settings, new_key
from cloud.server import CloudServer, build_server
from cloud.settings import SettingError
from cloud.store.models import TaskSecretRow
from tests.cloud.cloud_harness import ScriptedHost, channel, result, submit, tasks_stub

GOAL = "Join the Wi-Fi HomeNet with password {{secret:wifi_password}}"


@pytest.fixture
async def keyed_cloud(make_settings: Any) -> Any:
    server = await build_server(make_settings(secrets_key=new_key(), default_lease_seconds=30))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0.5)


async def _rows(cloud: CloudServer) -> list[TaskSecretRow]:
    async with cloud.store.read() as session:
        return list((await session.scalars(select(TaskSecretRow))).all())


async def test_secrets_reach_the_lease_holder_only_and_go_when_the_task_ends(
    keyed_cloud: CloudServer, pki_dir: Path
) -> None:
    cloud = keyed_cloud
    value = f"canary-{uuid.uuid4().hex}"
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    ops = tasks_stub(ops_ch)
    host = ScriptedHost(cloud.address, pki_dir, "h19")
    try:
        submitted = await submit(ops, GOAL, secrets={"wifi_password": value})
        assert not submitted.warnings
        task_id = submitted.task.task_id
        (row,) = await _rows(cloud)
        assert (row.task_id, row.name) == (task_id, "wifi_password")
        assert value not in row.value and value.encode() not in row.value.encode()
        # No read RPC returns the value.
        got = await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
        listed = await ops.ListTasks(task_service_pb2.ListTasksRequest())
        for reply in (submitted, got, listed):
            assert value.encode() not in reply.SerializeToString()

        await host.connect(["p1"])
        a = (await host.next("assignment")).assignment
        assert dict(a.secrets) == {"wifi_password": value}
        assert a.goal == GOAL  # the goal names the secret, never holds it

        await host.send(result(a))
        await host.next("result_ack")
        for _ in range(200):  # the sweeper's next pass deletes them
            if not await _rows(cloud):
                break
            await asyncio.sleep(0.05)
        assert not await _rows(cloud)
    finally:
        await host.close()
        await ops_ch.close()


async def test_a_cloud_without_a_key_refuses_secrets(cloud: CloudServer, ops: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(ops, GOAL, secrets={"wifi_password": "hunter22"})
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "AMC_CLOUD_SECRETS_KEY" in (err.value.details() or "")
    assert "hunter22" not in (err.value.details() or "")
    assert not await _rows(cloud)
    # Without secrets the same cloud takes tasks as ever.
    assert (await submit(ops, "Turn on dark theme")).task.task_id


@pytest.mark.parametrize(
    ("goal", "secrets", "named"),
    [
        (GOAL, {"Wifi": "x"}, "secrets: the name 'Wifi'"),
        (GOAL, {"wifi_password": ""}, "secrets[wifi_password]: the value is empty"),
        (GOAL, {"wifi_password": "a\x00b"}, "secrets[wifi_password]: the value holds a NUL"),
        (GOAL, {"wifi_password": "x" * 4097}, "secrets[wifi_password]: the value is longer"),
        (GOAL, {}, "goal: refers to {{secret:wifi_password}} but secrets has no"),
        (
            "Turn on dark theme",
            {"pin": "2580"},
            "secrets[pin]: the goal does not refer to it",
        ),
        (GOAL, {f"s{i}": "v" for i in range(17)}, "secrets: at most 16"),
    ],
)
async def test_bad_secrets_are_invalid_argument_naming_the_field(
    keyed_cloud: CloudServer, pki_dir: Path, goal: str, secrets: dict[str, str], named: str
) -> None:
    ch = channel(keyed_cloud.address, pki_dir, "operator-ops")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await submit(tasks_stub(ch), goal, secrets=secrets)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert named in (err.value.details() or "")
        for value in secrets.values():
            if len(value) > 3:
                assert value not in (err.value.details() or "")
    finally:
        await ch.close()
    assert not await _rows(keyed_cloud)


async def test_a_goal_that_holds_a_credential_is_queued_with_a_warning(ops: Any) -> None:
    warned = await submit(ops, "Join the Wi-Fi HomeNet with password hunter22")
    (warning,) = warned.warnings
    assert "looks like it holds a credential" in warning and "secret" in warning
    assert "hunter22" not in warning
    assert warned.task.task_id
    for goal in ("Turn on the PIN lock", "Set an alarm for 7:30", "Turn on dark theme"):
        assert not (await submit(ops, goal)).warnings, goal


def test_keys_rotate_and_a_bad_key_is_a_setting_error(tmp_path: Path) -> None:
    old, new = new_key(), new_key()
    token = SecretBox([old.encode()]).seal("2580")
    rotated = from_settings(f"{new},{old}", None)
    assert rotated is not None and rotated.open(token) == "2580"
    assert SecretBox([new.encode()]).open(rotated.seal("x")) == "x"  # the first key seals
    with pytest.raises(SecretUnreadable):
        SecretBox([Fernet.generate_key()]).open(token)
    key_file = tmp_path / "secrets.key"
    key_file.write_text(old + "\n")
    from_file = from_settings(None, key_file)
    assert from_file is not None and from_file.open(token) == "2580"
    assert from_settings(None, None) is None
    with pytest.raises(SettingError, match="AMC_CLOUD_SECRETS_KEY: not a list of Fernet keys"):
        from_settings("not-a-key", None)
    with pytest.raises(SettingError, match="AMC_CLOUD_SECRETS_KEY_FILE: cannot read"):
        from_settings(None, tmp_path / "missing")


async def test_a_secret_the_key_no_longer_opens_is_left_out_of_the_assignment(
    make_settings: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The key was replaced after the task was submitted: the assignment goes out without the
    secret (the host then refuses to type it, naming it) and the cloud logs which one."""
    first = await build_server(make_settings(secrets_key=new_key()))
    await first.start()
    ch = channel(first.address, pki_dir, "operator-ops")
    try:
        await submit(tasks_stub(ch), GOAL, secrets={"wifi_password": "hunter22"})
    finally:
        await ch.close()
        await first.stop(0.5)
    second = await build_server(make_settings(secrets_key=new_key()))
    await second.start()
    host = ScriptedHost(second.address, pki_dir, "h20")
    try:
        await host.connect(["p1"])
        a = (await host.next("assignment")).assignment
        assert not a.secrets
        assert "secret 'wifi_password' left out of its assignment" in caplog.text
        assert "hunter22" not in caplog.text
    finally:
        await host.close()
        await second.stop(0.5)
