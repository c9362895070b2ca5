"""PlannerService on the cloud: lease checked first, one decision row per call, read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
)
from cloud.server import CloudServer
from planner.prompts import SYSTEM_PROMPT, build_user_prompt
from tests.cloud.cloud_harness import ScriptedHost, channel, submit, tasks_stub


async def test_decide_logs_decisions_with_cloud_step_index(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    cloud = offline_cloud
    async with (
        channel(cloud.address, pki_dir, "operator-ops") as ops_ch,
        channel(cloud.address, pki_dir, "host-h15") as host_ch,
        channel(cloud.address, pki_dir, "host-h16") as other_ch,
        ScriptedHost(cloud.address, pki_dir, "h15") as host,
    ):
        await host.connect(["p"])
        task = (await submit(tasks_stub(ops_ch))).task
        a = (await host.next("assignment")).assignment
        scene = {"package": "com.android.launcher", "elements": []}
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            system_prompt=SYSTEM_PROMPT,
            user_prompt=build_user_prompt(task.goal, scene),
            screenshot=b"\x89PNG not stored",
        )
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        first = (await planner.Decide(request)).decision
        second = (await planner.Decide(request)).decision
        assert (first.step_index, second.step_index) == (1, 2)
        assert first.host_id == "h15"

        # Another host's certificate on this lease: refused before any tokens are spent
        # (issue 3: a host touching another host's lease gets PERMISSION_DENIED).
        thief: Any = planner_service_pb2_grpc.PlannerServiceStub(other_ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await thief.Decide(request)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

        # The caller's own task with a lease id that is not live: FAILED_PRECONDITION.
        stale = planner_service_pb2.DecideRequest()
        stale.CopyFrom(request)
        stale.lease_id = "not-the-live-lease"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await planner.Decide(stale)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_ch)
        listed = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id)
        )
        assert [d.step_index for d in listed.decisions] == [1, 2]
        assert {d.planner_mode for d in listed.decisions} == {"compact"}
        got = await log.GetDecision(
            decision_log_service_pb2.GetDecisionRequest(decision_id=first.decision_id)
        )
        assert got.decision.user_prompt == request.user_prompt
        assert got.decision.tool_name == first.tool_name
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await log.GetDecision(decision_log_service_pb2.GetDecisionRequest(decision_id="x"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
