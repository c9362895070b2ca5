"""A page token of one attempt's listing sent with another `attempt`. ListDecisions,
ListTaskEvents and ListStepScreenshots filter by attempt, and a token is a position in the
listing it came from: one of attempt 2 read as a position in attempt 1's listing answered OK
with an empty last page (the client was told attempt 1 had nothing more), and in the listing
of every attempt it skipped attempt 1, where the contracts promise INVALID_ARGUMENT for a
token not from that listing."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import grpc
import pytest
from PIL import Image

from amc.v1 import artifact_service_pb2 as art_pb
from amc.v1 import artifact_service_pb2_grpc, decision_log_service_pb2_grpc, types_pb2
from amc.v1 import decision_log_service_pb2 as log_pb
from amc.v1 import task_service_pb2 as task_pb
from cloud.server import CloudServer
from cloud.store import decisions
from cloud.store.paging import ELSEWHERE
from tests.cloud.cloud_harness import ScriptedHost, channel, result, submit, tasks_stub
from tests.cloud.test_decisions_after_step import _step


def _png() -> bytes:
    image = io.BytesIO()
    Image.new("RGB", (36, 80), "navy").save(image, format="PNG")
    return image.getvalue()


async def test_a_page_token_of_one_attempt_is_refused_for_another(
    cloud: CloudServer, pki_dir: Path
) -> None:
    host = ScriptedHost(cloud.address, pki_dir, "a")
    try:
        await host.connect(["p"])
        async with (
            channel(cloud.address, pki_dir, "operator-ops") as ch,
            channel(cloud.address, pki_dir, "host-a") as host_ch,
        ):
            ops = tasks_stub(ch)
            uploads: Any = artifact_service_pb2_grpc.ArtifactServiceStub(host_ch)
            task = (await submit(ops, target=types_pb2.TaskTarget(host_id="a"))).task
            for attempt in (1, 2):
                a = (await host.next("assignment")).assignment
                assert a.attempt == attempt
                for n in range(1, 4):
                    row = await decisions.append(cloud.store, "a", task.task_id, attempt, _step(n))
                    await uploads.UploadStepScreenshot(
                        art_pb.UploadStepScreenshotRequest(
                            task_id=a.task_id,
                            attempt=a.attempt,
                            lease_id=a.lease_id,
                            decision_id=row.decision_id,
                            phase=art_pb.SCREENSHOT_PHASE_BEFORE,
                            content_type="image/png",
                            data=_png(),
                        )
                    )
                if attempt == 1:  # a retryable failure: the task runs again, as attempt 2
                    failed = result(a, types_pb2.TASK_STATUS_FAILED, "stopped")
                    failed.result.retryable = True
                    await host.send(failed)
                else:  # its result: attempt 2 has events after its assignment
                    await host.send(result(a))
                await host.next("result_ack")
            log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ch)
            shots: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
            calls = {
                "ListDecisions": (log.ListDecisions, log_pb.ListDecisionsRequest),
                "ListTaskEvents": (ops.ListTaskEvents, task_pb.ListTaskEventsRequest),
                "ListStepScreenshots": (
                    shots.ListStepScreenshots,
                    art_pb.ListStepScreenshotsRequest,
                ),
            }
            for name, (call, request) in calls.items():
                first = await call(request(task_id=task.task_id, attempt=2, page_size=1))
                token = first.next_page_token
                assert token, name
                # The token goes on with its own listing...
                rest = await call(request(task_id=task.task_id, attempt=2, page_token=token))
                rows = [*getattr(rest, "decisions", []), *getattr(rest, "screenshots", [])]
                rows += getattr(rest, "events", [])
                assert rows and {r.attempt for r in rows} == {2}, (name, rest)
                # ...and is refused by attempt 1's, which read it as "nothing more", and by
                # every attempt's, which read it as "attempt 1 is done".
                for other in (1, 0):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await call(
                            request(task_id=task.task_id, attempt=other, page_token=token),
                            timeout=10,
                        )
                    assert (refused.value.code(), refused.value.details()) == (
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"page_token: {ELSEWHERE}",
                    ), (name, other)
    finally:
        await host.close()
