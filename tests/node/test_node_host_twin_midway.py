"""A phone with the serial of the one an attempt drives is plugged in midway (cheap phones ship
with one serial): adb then refuses the serial ("more than one device"), so the attempt, which
reaches its phone by serial, can reach neither. The Node example host must say why, as the
Python host says it (tests/host/test_serial_twin_midway.py), and touch neither phone.

Real parts: host.js as its own process against the in-test LeaseService of
tests/host/lease_fake.py over mTLS, and virtual phones served over the adb protocol; the
planner is the test's own (it holds step 1's tap until the twin is plugged in).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc, types_pb2
from host.devices.virtual.phone import VirtualPhone
from tests.host.lease_fake import FakeCloud
from tests.node.rig import assigned_host
from tests.node.test_node_host import HOST_ID, node

__all__ = ["node"]

SERIAL = "emulator-5554"


class _HeldTap(planner_service_pb2_grpc.PlannerServiceServicer):
    """Answers each step with a tap at (5, 5), step 1's once `release` is set."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.release = asyncio.Event()

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        self.asked.append(request.step_key)
        await self.release.wait()
        tap = types_pb2.TapAction(point=types_pb2.Point(x=5, y=5))
        return planner_service_pb2.DecideResponse(
            decision=types_pb2.Decision(
                step_index=int(request.step_key),
                tool_name="tap",
                arguments_json='{"x": 5, "y": 5}',
                purpose="tap",
                action=types_pb2.Action(tap=tap, purpose="tap"),
            )
        )


async def test_a_twin_plugged_in_midway_is_named_not_taken_for_a_disconnect(
    node: str, tmp_path: Path
) -> None:
    """Before, the attempt ended "phone … disconnected (… more than one device …)", sending
    the operator to a cable that was fine. Now it names the shared serial and what to do
    (retryable); nothing reached either phone."""
    mine, twin = VirtualPhone(SERIAL), VirtualPhone(SERIAL)
    cloud = FakeCloud(lease_s=30.0, renew_s=1.0)
    planner = _HeldTap()
    async with assigned_host(
        node,
        tmp_path,
        HOST_ID,
        cloud,
        planner,
        [mine],
        AMC_TASKS="1",
        AMC_HOST_DEVICE_POLL_INTERVAL_S="0.1",
    ) as host:
        await cloud.wait_for(lambda: "1" in planner.asked, 60)
        host.adb.add_phone(twin, share_serial=True)
        planner.release.set()
        await cloud.wait_for(lambda: cloud.results, 30)
    result = cloud.results[0]
    assert result.status == types_pb2.TASK_STATUS_FAILED, host.said
    assert result.retryable, host.said
    assert "disconnected" not in result.summary, result.summary
    assert result.summary.startswith(
        f"phone {SERIAL} is no longer the only phone with its serial in adb: "
        "another phone with the same serial was plugged in"
    ), result.summary
    assert (mine.taps, twin.taps) == ([], []), host.said
