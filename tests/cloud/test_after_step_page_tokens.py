"""A ListDecisions (or ListStepScreenshots) page token sent with another `after_step` than the
query it came from.

A token held only the task, attempt and order, so one of the steps after 2 was taken by the
steps after 0 (or after 4) as a position of theirs: a client got OK and pages no query of its
own would give (a newest-first token of the steps after 3 went on below step 4, into steps
that query never held), where the contract promises INVALID_ARGUMENT for a token not from the
listing it is sent to. Each `after_step` is now a listing of its own, the page a 3 MiB cut
ends (`fitting`) as well as one `page_size` ends. ListStepScreenshots, which a live view asks
after the same step, had the same token and keeps the same rule.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import artifact_service_pb2 as art_pb
from amc.v1 import artifact_service_pb2_grpc, decision_log_service_pb2_grpc, types_pb2
from amc.v1 import decision_log_service_pb2 as log_pb
from cloud.server import CloudServer
from cloud.store import decisions
from cloud.store.paging import ELSEWHERE
from tests.cloud.cloud_harness import ScriptedHost, channel, submit, tasks_stub
from tests.cloud.test_attempt_page_tokens import _png
from tests.cloud.test_decisions_after_step import _step

#: A prompt over a third of a page's 3 MiB: three such decisions end a page after two.
LARGE = "u" * (1100 * 1024)


async def test_a_page_token_of_one_after_step_is_refused_for_another(
    cloud: CloudServer, pki_dir: Path
) -> None:
    host = ScriptedHost(cloud.address, pki_dir, "a")
    try:
        await host.connect(["p"])
        async with channel(cloud.address, pki_dir, "operator-ops") as ch:
            task = (await submit(tasks_stub(ch), target=types_pb2.TaskTarget(host_id="a"))).task
            a = (await host.next("assignment")).assignment
            for n in range(1, 7):
                await decisions.append(cloud.store, "a", task.task_id, a.attempt, _step(n))
            log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ch)

            async def page(**fields: Any) -> log_pb.ListDecisionsResponse:
                request = log_pb.ListDecisionsRequest(task_id=task.task_id, **fields)
                answer: log_pb.ListDecisionsResponse = await log.ListDecisions(request, timeout=10)
                return answer

            async def refused(**fields: Any) -> None:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await page(**fields)
                assert (err.value.code(), err.value.details()) == (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"page_token: {ELSEWHERE}",
                ), fields

            # Followed with its own query, a token gives the rest of it, once each.
            first = await page(attempt=a.attempt, after_step=2, page_size=1)
            assert [d.step_index for d in first.decisions] == [3]
            steps, token = [3], first.next_page_token
            while token:
                later = await page(attempt=a.attempt, after_step=2, page_size=1, page_token=token)
                steps += [d.step_index for d in later.decisions]
                token = later.next_page_token
            assert steps == [3, 4, 5, 6]
            # With another after_step (none, or a later one) it is refused.
            for other in (0, 4):
                await refused(attempt=a.attempt, after_step=other, page_token=first.next_page_token)
            # So is a token of every step, sent with an after_step.
            whole = await page(attempt=a.attempt, page_size=1)
            await refused(attempt=a.attempt, after_step=2, page_token=whole.next_page_token)
            # Newest first: the token of the steps after 3 is not a way below step 4.
            newest = await page(attempt=a.attempt, after_step=3, page_size=1, newest_first=True)
            assert [d.step_index for d in newest.decisions] == [6]
            await refused(attempt=a.attempt, newest_first=True, page_token=newest.next_page_token)
    finally:
        await host.close()


async def test_a_page_cut_at_3_mib_gives_a_token_of_its_own_after_step(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """The service makes the token of a page it cut short for size itself (not the store):
    that token names the `after_step` too."""
    host = ScriptedHost(cloud.address, pki_dir, "a")
    try:
        await host.connect(["p"])
        async with channel(cloud.address, pki_dir, "operator-ops") as ch:
            task = (await submit(tasks_stub(ch), target=types_pb2.TaskTarget(host_id="a"))).task
            a = (await host.next("assignment")).assignment
            for n in range(1, 7):
                step = _step(n) if n < 3 else dataclasses.replace(_step(n), user_prompt=LARGE)
                await decisions.append(cloud.store, "a", task.task_id, a.attempt, step)
            log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ch)
            first = await log.ListDecisions(
                log_pb.ListDecisionsRequest(task_id=task.task_id, attempt=a.attempt, after_step=2),
                timeout=10,
            )
            assert [d.step_index for d in first.decisions] == [3, 4]
            token = first.next_page_token
            rest = await log.ListDecisions(
                log_pb.ListDecisionsRequest(
                    task_id=task.task_id, attempt=a.attempt, after_step=2, page_token=token
                ),
                timeout=10,
            )
            assert [d.step_index for d in rest.decisions] == [5, 6]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await log.ListDecisions(
                    log_pb.ListDecisionsRequest(
                        task_id=task.task_id, attempt=a.attempt, page_token=token
                    ),
                    timeout=10,
                )
            assert (err.value.code(), err.value.details()) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"page_token: {ELSEWHERE}",
            )
    finally:
        await host.close()


async def test_a_screenshot_page_token_of_one_after_step_is_refused_for_another(
    cloud: CloudServer, pki_dir: Path
) -> None:
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
            for n in range(1, 6):
                row = await decisions.append(cloud.store, "a", task.task_id, a.attempt, _step(n))
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
            shots: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)

            async def page(**fields: Any) -> art_pb.ListStepScreenshotsResponse:
                request = art_pb.ListStepScreenshotsRequest(task_id=task.task_id, **fields)
                answer: art_pb.ListStepScreenshotsResponse = await shots.ListStepScreenshots(
                    request, timeout=10
                )
                return answer

            first = await page(attempt=a.attempt, after_step=2, page_size=1)
            assert [s.step_index for s in first.screenshots] == [3]
            later = await page(
                attempt=a.attempt, after_step=2, page_size=2, page_token=first.next_page_token
            )
            assert [s.step_index for s in later.screenshots] == [4, 5]
            whole = await page(attempt=a.attempt, page_size=1)
            for fields in (
                {"after_step": 0, "page_token": first.next_page_token},
                {"after_step": 3, "page_token": first.next_page_token},
                {"after_step": 2, "page_token": whole.next_page_token},
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await page(attempt=a.attempt, **fields)
                assert (err.value.code(), err.value.details()) == (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"page_token: {ELSEWHERE}",
                ), fields
    finally:
        await host.close()
