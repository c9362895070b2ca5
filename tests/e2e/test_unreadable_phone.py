"""A phone whose screen can never be read stops taking work, and takes it again once it can.

Every real part runs: the embedded stack (cloud over mTLS with SQLite, the Python host, a
virtual phone over the adb protocol driven by adbutils, the offline planner). The phone's
dumper crashes natively on every try ("Segmentation fault"), as a phone without a working
`uiautomator` does: each attempt on it ends retryable, "cannot show its screen".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amc.v1 import fleet_service_pb2, task_service_pb2, types_pb2
from console.embedded import HOST_ID, embedded_stack
from tests.support.migrated import seeded
from tests.support.waiting import until


@pytest.fixture(autouse=True)
def _host_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline planner; a phone is unhealthy after two unreadable attempts in a row and
    probed every half second."""
    for name in list(os.environ):
        if name.startswith(("AMC_PLANNER_", "ANTHROPIC_", "OPENAI_", "AI_PLANNER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AMC_HOST_UNHEALTHY_AFTER_ATTEMPTS", "2")
    monkeypatch.setenv("AMC_HOST_UNHEALTHY_PROBE_S", "0.5")


async def test_an_unreadable_phone_stops_taking_work_until_a_probe_reads_it(
    tmp_path: Path,
) -> None:
    """Every attempt sent to a phone that can never be read ended retryable, so the task used
    up all its attempts there. After two in a row the host now reports the phone OFFLINE (the
    cloud offers it nothing; an assignment already on its way is refused, saying why),
    probes it with one dump, and takes work again once a dump parses: the task's next attempt
    runs there and succeeds."""
    async with embedded_stack(seeded(tmp_path / "stack")) as stack:
        phone = next(iter(stack.adb.phones.values()))
        phone.glitch_every(1, "segfault")
        ops = stack.operator
        request = task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme", max_attempts=5)
        task_id = (await ops.tasks.SubmitTask(request)).task.task_id
        get = task_service_pb2.GetTaskRequest(task_id=task_id)

        async def listed() -> types_pb2.Device:
            hosts = await ops.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
            devices = [d for h in hosts.hosts if h.host_id == HOST_ID for d in h.devices]
            return devices[0] if devices else types_pb2.Device()

        async def phone_state() -> types_pb2.DeviceState.ValueType:
            return (await listed()).state

        async def kept_out() -> bool:
            """The phone reported OFFLINE and its second attempt's end recorded: the host
            marks the phone as that attempt ends, and the two reach the cloud in either order."""
            if await phone_state() != types_pb2.DEVICE_STATE_OFFLINE:
                return False
            task = (await ops.tasks.GetTask(get)).task
            return sum(not a.failure_reason for a in task.attempts) == 0

        await until(kept_out, within=60, what="the unreadable phone reported OFFLINE")
        task = (await ops.tasks.GetTask(get)).task
        ran = [a for a in task.attempts if "cannot show its screen" in a.failure_reason]
        assert len(ran) == 2, [a.failure_reason for a in task.attempts]
        assert task.status != types_pb2.TASK_STATUS_FAILED, task.result_summary
        # The operators read why (`Device.reason`), not only "offline".
        why = (await listed()).reason
        assert "is unhealthy" in why and "could not be read" in why, why

        phone.glitch_every(0)  # fixed: its dumps work again

        async def succeeded() -> bool:
            task: types_pb2.Task = (await ops.tasks.GetTask(get)).task
            return task.status == types_pb2.TASK_STATUS_SUCCEEDED

        await until(succeeded, within=90, what="the task run on the phone once it is read")
        assert await phone_state() == types_pb2.DEVICE_STATE_ONLINE
        assert (await listed()).reason == ""
        task = (await ops.tasks.GetTask(get)).task
    ran = [a for a in task.attempts if "cannot show its screen" in a.failure_reason]
    assert len(ran) == 2, [a.failure_reason for a in task.attempts]
