"""The Node example host makes every text it sends sendable, as the Python host's `clip` makes
it (planner/observation.py): the cloud refuses a text field holding a NUL.

Real parts: host.js as its own process against the in-test LeaseService of
tests/host/lease_fake.py and a planner beside it that refuses a NUL as the cloud does, over
mTLS, and a virtual phone served over the adb protocol whose `monkey` prints a NUL (a real
phone's shell output can hold one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc, types_pb2
from host.devices.virtual import shell
from host.devices.virtual.commands import Output, Session
from tests.host.lease_fake import FakeCloud
from tests.node.rig import assigned_host
from tests.node.test_node_host import HOST_ID, node

__all__ = ["node"]

PACKAGE = "com.android.settings"


class _Planner(planner_service_pb2_grpc.PlannerServiceServicer):
    """Launches the settings app at step 1 and completes at step 2, noting each step's
    `previous_outcome.driver_output`; refuses a request holding a NUL in that text with
    INVALID_ARGUMENT, as the cloud refuses any text field holding one."""

    def __init__(self) -> None:
        self.outputs: list[str] = []

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        output = request.previous_outcome.driver_output
        self.outputs.append(output)
        if "\x00" in output:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a text field holds a NUL")
        if request.step_key == "1":
            action = types_pb2.Action(
                launch_app=types_pb2.LaunchAppAction(package_name=PACKAGE), purpose="open it"
            )
            name, arguments = "launch_app", f'{{"package_name": "{PACKAGE}"}}'
        else:
            action = types_pb2.Action(complete=types_pb2.CompleteAction(success=True, reason="ok"))
            name, arguments = "complete", '{"success": true, "reason": "ok"}'
        return planner_service_pb2.DecideResponse(
            decision=types_pb2.Decision(
                step_index=int(request.step_key),
                tool_name=name,
                arguments_json=arguments,
                purpose="open it",
                action=action,
            )
        )


async def test_a_shell_output_holding_a_nul_is_sent_with_u_fffd_in_its_place(
    node: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The phone's `monkey` prints a NUL in what it says of the launch. Before, host.js sent
    that output as the next step's `previous_outcome.driver_output` as it was: the cloud
    refused the Decide (INVALID_ARGUMENT) and the attempt failed. Now the NUL goes as U+FFFD,
    as the Python host sends it, and the task succeeds."""
    monkey = shell.TOOLS["monkey"]

    def printing_a_nul(sh: Session, args: list[str], stdin: bytes) -> Output:
        return monkey(sh, args, stdin).out(b"// monkey\x00done\n")

    monkeypatch.setitem(shell.TOOLS, "monkey", printing_a_nul)
    planner = _Planner()
    cloud = FakeCloud()
    async with assigned_host(node, tmp_path, HOST_ID, cloud, planner, AMC_TASKS="1") as host:
        await cloud.wait_for(lambda: cloud.results, 60)
    said = host.said
    assert len(planner.outputs) >= 2, said
    assert "// monkey\ufffddone" in planner.outputs[1], (planner.outputs, said)
    result = cloud.results[0]
    assert (result.status, result.summary) == (types_pb2.TASK_STATUS_SUCCEEDED, "ok"), said
