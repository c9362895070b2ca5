"""ListDecisions' and ListStepScreenshots' `after_step`: a live view reads the steps it has not
shown, not the log."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import grpc
import pytest
from PIL import Image

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    types_pb2,
)
from cloud.server import CloudServer
from cloud.store import decisions
from planner.decision import Decision, Usage
from tests.cloud.cloud_harness import ScriptedHost, channel, submit, tasks_stub


def _step(n: int) -> Decision:
    action = types_pb2.Action(purpose=f"step {n}", expected_outcome="done")
    action.tap.element_id = "e1"
    return Decision(
        tool_name="tap",
        arguments={"element_id": "e1"},
        action=action,
        purpose=f"step {n}",
        expected_outcome="done",
        rationale="r",
        thinking=[],
        usage=Usage(),
        provider="offline",
        model="m",
        latency_s=0.0,
        forced_retry=False,
        system_prompt="s",
        user_prompt="u",
    )


async def test_list_decisions_after_a_step_answers_only_the_later_ones(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """The console's task page read the whole decision log again on every step of a running
    task (a page of 13 kB and growing); it now asks for the steps after the last it shows."""
    host = ScriptedHost(cloud.address, pki_dir, "a")
    try:
        await host.connect(["p"])
        async with channel(cloud.address, pki_dir, "operator-ops") as ch:
            task = (await submit(tasks_stub(ch), target=types_pb2.TaskTarget(host_id="a"))).task
            assignment = (await host.next("assignment")).assignment
            for n in range(1, 6):
                await decisions.append(cloud.store, "a", task.task_id, assignment.attempt, _step(n))
            log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ch)
            page = await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(
                    task_id=task.task_id, attempt=assignment.attempt, after_step=3
                )
            )
            assert [d.step_index for d in page.decisions] == [4, 5]
            page = await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(
                    task_id=task.task_id, attempt=assignment.attempt, after_step=5
                )
            )
            assert list(page.decisions) == []
            for bad in (
                decision_log_service_pb2.ListDecisionsRequest(task_id=task.task_id, after_step=2),
                decision_log_service_pb2.ListDecisionsRequest(
                    task_id=task.task_id, attempt=1, after_step=-1
                ),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await log.ListDecisions(bad)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert err.value.details() == "after_step: 0, or a step index with attempt set"
    finally:
        await host.close()


def _png() -> bytes:
    image = io.BytesIO()
    Image.new("RGB", (36, 80), "navy").save(image, format="PNG")
    return image.getvalue()


async def test_list_step_screenshots_after_a_step_answers_only_the_later_ones(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """The console's live fragment read the metadata of every screenshot of the attempt on each
    change of a running task; it now asks for the steps after the last it shows."""
    before, after = (
        artifact_service_pb2.SCREENSHOT_PHASE_BEFORE,
        artifact_service_pb2.SCREENSHOT_PHASE_AFTER,
    )
    host = ScriptedHost(cloud.address, pki_dir, "a")
    try:
        await host.connect(["p"])
        async with (
            channel(cloud.address, pki_dir, "operator-ops") as ch,
            channel(cloud.address, pki_dir, "host-a") as host_ch,
        ):
            task = (await submit(tasks_stub(ch), target=types_pb2.TaskTarget(host_id="a"))).task
            a = (await host.next("assignment")).assignment
            uploads: Any = artifact_service_pb2_grpc.ArtifactServiceStub(host_ch)
            for n in range(1, 5):
                row = await decisions.append(cloud.store, "a", task.task_id, a.attempt, _step(n))
                for phase in (before, after):
                    await uploads.UploadStepScreenshot(
                        artifact_service_pb2.UploadStepScreenshotRequest(
                            task_id=a.task_id,
                            attempt=a.attempt,
                            lease_id=a.lease_id,
                            decision_id=row.decision_id,
                            phase=phase,
                            content_type="image/png",
                            data=_png(),
                        )
                    )
            artifacts: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)

            async def listed(**request: Any) -> list[tuple[int, int]]:
                page = await artifacts.ListStepScreenshots(
                    artifact_service_pb2.ListStepScreenshotsRequest(task_id=task.task_id, **request)
                )
                return [(s.step_index, s.phase) for s in page.screenshots]

            assert await listed(attempt=a.attempt, after_step=2) == [
                (3, before),
                (3, after),
                (4, before),
                (4, after),
            ]
            assert await listed(attempt=a.attempt, after_step=4) == []
            assert len(await listed(attempt=a.attempt)) == 8
            for bad in ({"after_step": 2}, {"attempt": 1, "after_step": -1}):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await listed(**bad)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert err.value.details() == "after_step: 0, or a step index with attempt set"
    finally:
        await host.close()
