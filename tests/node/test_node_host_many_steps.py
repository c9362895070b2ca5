"""The Node example host runs an attempt of many steps as it runs one of a few.

Real parts: `amc cloud serve` (SQLite, mTLS) with the real Anthropic SDK against the fake
Messages server (scripted: eleven presses of BACK, then complete), a virtual phone served over
the adb protocol, and host.js as its own process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from amc.v1 import task_service_pb2, types_pb2
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import cloud_and_phone, start_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.fakes import ANTHROPIC_KEY, FakeModelServer, anthropic_message, tool_use
from tests.support.processes import wait_task

__all__ = ["node"]

#: More Decide calls in one attempt than Node's default of 10 listeners on one AbortSignal.
STEPS = 11


async def test_an_attempt_of_many_steps_leaks_no_listener_on_its_stop(
    node: str, tmp_path: Path
) -> None:
    """Each Decide added a listener to its attempt's stop signal and never removed it: from the
    tenth step on (or ten asks of one step while the cloud was away) Node printed
    "MaxListenersExceededWarning: Possible EventTarget memory leak detected", and each finished
    call stayed referenced until the attempt ended. Now a call's listener goes with the call."""
    back = {"key": "back", "purpose": "go back", "expected_outcome": "the previous screen"}
    answers = [anthropic_message(tool_use("press_key", back)) for _ in range(STEPS)]
    answers.append(anthropic_message(tool_use("complete", {"success": True, "reason": "done"})))
    planner = {
        "AMC_PLANNER_PROVIDER": "anthropic",
        "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
        "AMC_PLANNER_ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "AMC_PLANNER_MAX_RETRIES": "0",
    }
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as provider:
        provider.script_anthropic(*answers)
        planner["AMC_PLANNER_ANTHROPIC_BASE_URL"] = provider.anthropic_base_url
        async with cloud_and_phone(
            tmp_path, VirtualPhone("emulator-5554"), HOST_ID, planner
        ) as rig:
            request = task_service_pb2.SubmitTaskRequest(goal="Go back a lot", max_attempts=1)
            task = (await rig.client.tasks.SubmitTask(request, timeout=10)).task
            host = await start_host(node, rig, HOST_ID, tmp_path / "host-data")
            try:
                _, err = await asyncio.wait_for(host.communicate(), 240)
            finally:
                if host.returncode is None:
                    host.kill()
                    await host.wait()
            said = err.decode()
            final = await wait_task(
                rig.client, task.task_id, lambda t: t.status != types_pb2.TASK_STATUS_RUNNING, 10
            )
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, (final, said)
    assert said.count(": press_key ") == STEPS, said
    assert "MaxListenersExceededWarning" not in said, said
