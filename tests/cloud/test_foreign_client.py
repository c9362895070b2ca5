"""What a client written from proto/ alone gets from the services besides Lease: the generated
stubs only, over real mTLS, against a real cloud (SQLite and PostgreSQL, the offline planner),
probing as an outside checker would (unset fields, oversize values, other hosts' ids).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    flow_service_pb2,
    flow_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    progress_service_pb2,
    progress_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from cloud.server import CloudServer
from cloud.services.fleet_service import _listing as _host_listing
from cloud.store import flows, hosts, paging, tasks
from cloud.store.paging import ELSEWHERE
from tests.cloud.cloud_harness import ScriptedHost, assigned, channel
from tests.cloud.test_contract_defects import _described
from tests.support.fakes import FakeModelServer
from tests.support.flows import store_flow

#: Far longer than any id the cloud issues, far shorter than a request may be (4 MiB).
OVERSIZE = "x" * 100_000


def _settings_screen() -> types_pb2.ScreenObservation:
    """A screen with one element to tap (Settings), enough for the offline planner to act on."""
    observation = types_pb2.ScreenObservation(screen_width=1080, screen_height=2400)
    observation.elements.add(
        element_id="e1", text="Settings", clickable=True, enabled=True
    ).bounds.CopyFrom(types_pb2.Rect(left=0, top=0, right=100, bottom=100))
    return observation


async def _refusal(call: Any, request: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(request, timeout=10)
    return refused.value


async def test_an_oversize_id_is_answered_with_its_status_not_a_metadata_overflow(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """Every NOT_FOUND and lease refusal echoed the id it was given in its details, whole: an
    id of 100 KB made trailers over gRPC's 16 KiB limit, and the client saw RESOURCE_EXHAUSTED
    ("received metadata size exceeds hard limit") instead of the status the proto promises."""
    async with (
        channel(offline_cloud.address, pki_dir, "operator-ops") as ops,
        ScriptedHost(offline_cloud.address, pki_dir, "a") as host,
    ):
        assignment = await assigned(ops, host)
        tasks = task_service_pb2_grpc.TaskServiceStub(ops)
        log = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        progress = progress_service_pb2_grpc.ProgressServiceStub(ops)
        not_found = [
            (tasks.GetTask, task_service_pb2.GetTaskRequest(task_id=OVERSIZE)),
            (tasks.CancelTask, task_service_pb2.CancelTaskRequest(task_id=OVERSIZE)),
            (tasks.ListTaskEvents, task_service_pb2.ListTaskEventsRequest(task_id=OVERSIZE)),
            (log.GetDecision, decision_log_service_pb2.GetDecisionRequest(decision_id=OVERSIZE)),
            (log.ListDecisions, decision_log_service_pb2.ListDecisionsRequest(task_id=OVERSIZE)),
            (
                log.GetConversation,
                decision_log_service_pb2.GetConversationRequest(task_id=OVERSIZE, attempt=1),
            ),
        ]
        for call, request in not_found:
            refused = await _refusal(call, request)
            assert refused.code() == grpc.StatusCode.NOT_FOUND, (call, refused.details())
            assert (refused.details() or "").startswith(("task xxx", "decision xxx"))
        with pytest.raises(grpc.aio.AioRpcError) as refused_watch:
            async for _ in progress.WatchProgress(
                progress_service_pb2.WatchProgressRequest(task_id=OVERSIZE), timeout=10
            ):
                pass
        assert refused_watch.value.code() == grpc.StatusCode.NOT_FOUND, refused_watch.value

        decide = planner_service_pb2_grpc.PlannerServiceStub(host._channel).Decide
        observation = types_pb2.ScreenObservation(screen_width=1080, screen_height=2400)
        for request in (
            planner_service_pb2.DecideRequest(
                task_id=assignment.task_id,
                attempt=assignment.attempt,
                lease_id=OVERSIZE,
                observation=observation,
            ),
            planner_service_pb2.DecideRequest(
                task_id=OVERSIZE,
                attempt=assignment.attempt,
                lease_id=assignment.lease_id,
                observation=observation,
            ),
        ):
            refused = await _refusal(decide, request)
            assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.details()
            assert "is not a live lease of host 'a'" in (refused.details() or "")


async def test_a_status_filter_repeating_a_status_lists_as_if_named_once(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """ListTasks and ListFlows put every status of their filter in the query, repeats too: a
    filter naming QUEUED 70,000 times (140 KB, well inside a request) passed PostgreSQL's
    65,535 parameters, and the operator got UNAVAILABLE ("the cloud's database is unavailable;
    retry"), forever, while the database was fine. An unknown status was refused as
    "unspecified"."""
    async with channel(offline_cloud.address, pki_dir, "operator-ops") as ops:
        tasks = task_service_pb2_grpc.TaskServiceStub(ops)
        flows = flow_service_pb2_grpc.FlowServiceStub(ops)
        queued = await tasks.SubmitTask(task_service_pb2.SubmitTaskRequest(goal="open settings"))
        listed = await tasks.ListTasks(
            task_service_pb2.ListTasksRequest(statuses=[types_pb2.TASK_STATUS_QUEUED] * 70_000)
        )
        assert [t.task_id for t in listed.tasks] == [queued.task.task_id]
        none = await flows.ListFlows(
            flow_service_pb2.ListFlowsRequest(statuses=[types_pb2.FLOW_STATUS_ACTIVE] * 70_000)
        )
        assert list(none.flows) == []
        for value, details in (
            (types_pb2.TaskStatus.ValueType(99), "statuses: unknown value 99"),
            (types_pb2.TASK_STATUS_UNSPECIFIED, "statuses: unknown value 0"),
        ):
            refused = await _refusal(
                tasks.ListTasks, task_service_pb2.ListTasksRequest(statuses=[value])
            )
            assert (refused.code(), refused.details()) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                details,
            )


async def test_a_page_token_continues_only_the_listing_it_came_from(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """Page tokens carried only a position: ListTasks' and ListFlows' had the same shape, and a
    task's ListTaskEvents or ListDecisions token was read as a position in another task's list.
    A client that mixed them up got OK and a page silently missing rows, where the proto
    promises INVALID_ARGUMENT for a foreign token; GetConversation took any number."""
    async with (
        channel(offline_cloud.address, pki_dir, "operator-ops") as ops,
        ScriptedHost(offline_cloud.address, pki_dir, "a") as host,
    ):
        a = await assigned(ops, host)
        tasks = task_service_pb2_grpc.TaskServiceStub(ops)
        log = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        flows = flow_service_pb2_grpc.FlowServiceStub(ops)
        decide = planner_service_pb2_grpc.PlannerServiceStub(host._channel).Decide
        observation = _settings_screen()
        for key in ("1", "2"):
            await decide(
                planner_service_pb2.DecideRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    observation=observation,
                    step_key=key,
                )
            )
        await tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=a.task_id))
        other = await tasks.SubmitTask(task_service_pb2.SubmitTaskRequest(goal="open wifi"))
        other_id = other.task.task_id

        first = await tasks.ListTasks(task_service_pb2.ListTasksRequest(page_size=1))
        events = await tasks.ListTaskEvents(
            task_service_pb2.ListTaskEventsRequest(task_id=a.task_id, page_size=1)
        )
        steps = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id, page_size=1)
        )
        # Each token goes on with its own listing...
        rest = await tasks.ListTasks(
            task_service_pb2.ListTasksRequest(page_size=1, page_token=first.next_page_token)
        )
        assert [t.task_id for t in rest.tasks] == [a.task_id]
        more = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(
                task_id=a.task_id, page_token=steps.next_page_token
            )
        )
        assert [d.step_index for d in more.decisions] == [2]
        # ...and is refused by every other.
        foreign = [
            (
                flows.ListFlows,
                flow_service_pb2.ListFlowsRequest(page_token=first.next_page_token),
            ),
            (
                tasks.ListTaskEvents,
                task_service_pb2.ListTaskEventsRequest(
                    task_id=other_id, page_token=events.next_page_token
                ),
            ),
            (
                log.ListDecisions,
                decision_log_service_pb2.ListDecisionsRequest(
                    task_id=other_id, page_token=steps.next_page_token
                ),
            ),
            (
                log.GetConversation,
                decision_log_service_pb2.GetConversationRequest(
                    task_id=a.task_id, attempt=1, page_token="5"
                ),
            ),
        ]
        for call, request in foreign:
            refused = await _refusal(call, request)
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, (call, refused.details())
            assert (refused.details() or "").startswith("page_token: "), refused.details()


async def _answer(call: Any, request: Any) -> grpc.StatusCode:
    """The status a unary or server-streaming call ends with (its first message for a stream)."""
    try:
        answer = call(request, timeout=10)
        if hasattr(answer, "read"):
            await answer.read()
            answer.cancel()
        else:
            await answer
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


async def test_each_refusal_an_rpc_answers_is_named_in_its_comment(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """A client written from proto/ learns an RPC's refusals from its comment, as reflection
    serves it. Some were not there: WatchProgress answered NOT_FOUND for a task that does not
    exist yet (a watch opened before its submission), GetTask, GetDecision and CancelTask
    INVALID_ARGUMENT for a missing id, CancelTask NOT_FOUND, SubmitTask INVALID_ARGUMENT."""
    async with channel(offline_cloud.address, pki_dir, "operator-ops") as ops:
        tasks = task_service_pb2_grpc.TaskServiceStub(ops)
        log = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        progress = progress_service_pb2_grpc.ProgressServiceStub(ops)
        probes = [
            ("TaskService", "SubmitTask", tasks.SubmitTask, task_service_pb2.SubmitTaskRequest()),
            ("TaskService", "GetTask", tasks.GetTask, task_service_pb2.GetTaskRequest()),
            (
                "TaskService",
                "GetTask",
                tasks.GetTask,
                task_service_pb2.GetTaskRequest(task_id="nope"),
            ),
            ("TaskService", "CancelTask", tasks.CancelTask, task_service_pb2.CancelTaskRequest()),
            (
                "TaskService",
                "CancelTask",
                tasks.CancelTask,
                task_service_pb2.CancelTaskRequest(task_id="nope"),
            ),
            (
                "DecisionLogService",
                "GetDecision",
                log.GetDecision,
                decision_log_service_pb2.GetDecisionRequest(),
            ),
            (
                "DecisionLogService",
                "GetDecision",
                log.GetDecision,
                decision_log_service_pb2.GetDecisionRequest(decision_id="nope"),
            ),
            (
                "ProgressService",
                "WatchProgress",
                progress.WatchProgress,
                progress_service_pb2.WatchProgressRequest(task_id="not-submitted-yet"),
            ),
        ]
        unnamed = []
        for service, method, call, request in probes:
            code = await _answer(call, request)
            assert code != grpc.StatusCode.OK, (method, request)
            symbol = f"amc.v1.{service}.{method}"
            described = await _described(offline_cloud.address, pki_dir, symbol)
            (s,) = [i for i, x in enumerate(described.service) if x.name == service]
            (m,) = [i for i, x in enumerate(described.service[s].method) if x.name == method]
            (comment,) = [
                loc.leading_comments
                for loc in described.source_code_info.location
                if list(loc.path) == [6, s, 2, m]
            ]
            if code.name not in comment:
                unnamed.append(f"{method} answers {code.name}")
        assert unnamed == []


@pytest.fixture
def anthropic_env() -> dict[str, str]:
    """`anthropic_cloud` shows the model the host's screenshot."""
    return {"AMC_PLANNER_SEND_SCREENSHOT": "true"}


async def test_a_screenshot_that_is_not_png_or_jpeg_is_refused_before_the_model_call(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    """Decide takes "a PNG or JPEG of the screen" and passed whatever bytes came to the model:
    a host that sent a GIF had it labelled image/png, Anthropic refused the request (400 "Image
    does not match the provided media type"), and the step failed UNKNOWN as if the model had
    given no usable decision. It is INVALID_ARGUMENT naming the field, and no model call."""
    async with (
        channel(anthropic_cloud.address, pki_dir, "operator-ops") as ops,
        ScriptedHost(anthropic_cloud.address, pki_dir, "a") as host,
    ):
        a = await assigned(ops, host)
        decide = planner_service_pb2_grpc.PlannerServiceStub(host._channel).Decide
        observation = types_pb2.ScreenObservation(screen_width=1080, screen_height=2400)
        for screenshot in (b"GIF89a" + bytes(64), b"not an image at all"):
            refused = await _refusal(
                decide,
                planner_service_pb2.DecideRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    observation=observation,
                    screenshot=screenshot,
                ),
            )
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
            assert (refused.details() or "").startswith("screenshot: "), refused.details()
        assert model.requests == []


async def test_spend_of_the_last_day_a_date_can_name_is_an_empty_answer(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """GetSpend takes any YYYY-MM-DD day, and read up to the day after `until_day`: 9999-12-31
    has none, and the operator got INTERNAL ("internal error; retry later") for a well-formed
    request. It answers what was spent in that range: nothing."""
    async with channel(offline_cloud.address, pki_dir, "operator-ops") as ops:
        fleet = fleet_service_pb2_grpc.FleetServiceStub(ops)
        answer = await fleet.GetSpend(
            fleet_service_pb2.GetSpendRequest(since_day="9999-12-31", until_day="9999-12-31")
        )
        assert list(answer.rows) == []


async def test_an_attempt_the_task_never_had_is_not_found(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """GetConversation and ListDecisions(attempt=N) answered an empty page for an attempt the
    task never had, which reads as a record (compact mode, the direct transport, pruned); the
    console checked it itself. The cloud answers NOT_FOUND saying how many the task has, and
    ListTaskEvents and ListStepScreenshots (which answered OK and empty) with the same words."""
    async with (
        channel(offline_cloud.address, pki_dir, "operator-ops") as ops,
        ScriptedHost(offline_cloud.address, pki_dir, "a") as host,
    ):
        ran = await assigned(ops, host)
        tasks = task_service_pb2_grpc.TaskServiceStub(ops)
        log = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        shots = artifact_service_pb2_grpc.ArtifactServiceStub(ops)
        queued = await tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="open wifi", target=types_pb2.TaskTarget(host_id="nobody")
            )
        )
        ran_id, queued_id = ran.task_id, queued.task.task_id
        # The attempt it had, and every attempt, answer (nothing logged yet).
        had = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=ran_id, attempt=1)
        )
        every = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=queued_id)
        )
        talk = await log.GetConversation(
            decision_log_service_pb2.GetConversationRequest(task_id=ran_id, attempt=1)
        )
        assert (list(had.decisions), list(every.decisions), list(talk.items)) == ([], [], [])
        events = await tasks.ListTaskEvents(
            task_service_pb2.ListTaskEventsRequest(task_id=ran_id, attempt=1)
        )
        pictures = await shots.ListStepScreenshots(
            artifact_service_pb2.ListStepScreenshotsRequest(task_id=ran_id, attempt=1)
        )
        queued_events = await tasks.ListTaskEvents(
            task_service_pb2.ListTaskEventsRequest(task_id=queued_id)
        )
        assert len(events.events) >= 1  # its assignment
        assert list(pictures.screenshots) == []
        assert len(queued_events.events) == 0
        for task_id, attempt, message in (
            (ran_id, 2, f"task {ran_id} has no attempt 2 (it has 1)"),
            (queued_id, 1, f"task {queued_id} has no attempt 1 (it has none yet)"),
        ):
            for call, request in (
                (
                    log.ListDecisions,
                    decision_log_service_pb2.ListDecisionsRequest(task_id=task_id, attempt=attempt),
                ),
                (
                    log.GetConversation,
                    decision_log_service_pb2.GetConversationRequest(
                        task_id=task_id, attempt=attempt
                    ),
                ),
                (
                    tasks.ListTaskEvents,
                    task_service_pb2.ListTaskEventsRequest(task_id=task_id, attempt=attempt),
                ),
                (
                    shots.ListStepScreenshots,
                    artifact_service_pb2.ListStepScreenshotsRequest(
                        task_id=task_id, attempt=attempt
                    ),
                ),
            ):
                refused = await _refusal(call, request)
                assert (refused.code(), refused.details()) == (grpc.StatusCode.NOT_FOUND, message)


async def test_an_unknown_overlay_is_shown_to_no_model_and_logged_as_sent(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """proto3 enums are open: a newer host's overlay kind is not refused, by Decide or by
    ShipDecisions. The model is not shown it (the keyboard beside it is), and the decision
    log keeps the observation as the host sent it, as the proto's comments say."""
    async with (
        channel(offline_cloud.address, pki_dir, "operator-ops") as ops,
        ScriptedHost(offline_cloud.address, pki_dir, "a") as host,
        ScriptedHost(offline_cloud.address, pki_dir, "b") as direct,
    ):
        a = await assigned(ops, host)
        log = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        observation = _settings_screen()
        observation.overlays.extend([99, types_pb2.OVERLAY_KEYBOARD])  # type: ignore[list-item]  # a newer host's value
        decided = await planner_service_pb2_grpc.PlannerServiceStub(host._channel).Decide(
            planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation,
                step_key="1",
            )
        )
        assert '"overlays":["keyboard"]' in decided.decision.user_prompt
        # A host on the direct transport ships its own (a cloud-planned attempt takes none).
        b = await assigned(ops, direct, transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        shipped = types_pb2.Decision(
            tool_name="tap", provider="offline", model="m", system_prompt="s", user_prompt="u"
        )
        shipped.action.tap.element_id = "e1"
        shipped.observation.CopyFrom(observation)
        await decision_log_service_pb2_grpc.DecisionLogServiceStub(direct._channel).ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(
                entries=[
                    decision_log_service_pb2.ShippedDecision(
                        host_decision_id="d1",
                        task_id=b.task_id,
                        attempt=b.attempt,
                        lease_id=b.lease_id,
                        decision=shipped,
                    )
                ]
            )
        )
        for task_id in (a.task_id, b.task_id):
            listed = await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(
                    task_id=task_id, include_observation=True
                )
            )
            assert [list(d.observation.overlays) for d in listed.decisions] == [
                [99, types_pb2.OVERLAY_KEYBOARD]
            ]


async def test_a_flows_page_token_continues_only_the_status_filter_it_came_from(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """ListFlows' token held a position only: one from a listing of active flows went on under
    another status filter (or none) and answered OK with a page that began after the other
    listing's last flow, silently missing the newer flows of the filter asked for. ListTasks
    and ListHosts refuse a token of another filter; ListFlows now does too."""
    for n in range(3):
        await store_flow(offline_cloud.store, f"Turn on dark theme {n}", task_id=f"t-pages-{n}")
    active = [types_pb2.FLOW_STATUS_ACTIVE]
    async with channel(offline_cloud.address, pki_dir, "operator-ops") as ops:
        flows = flow_service_pb2_grpc.FlowServiceStub(ops)
        first = await flows.ListFlows(
            flow_service_pb2.ListFlowsRequest(page_size=1, statuses=active)
        )
        assert first.next_page_token
        rest = await flows.ListFlows(
            flow_service_pb2.ListFlowsRequest(
                page_size=500, statuses=active, page_token=first.next_page_token
            )
        )
        whole = await flows.ListFlows(flow_service_pb2.ListFlowsRequest(statuses=active))
        assert [f.flow_id for f in [*first.flows, *rest.flows]] == [f.flow_id for f in whole.flows]
        for other in (
            [],
            [types_pb2.FLOW_STATUS_DISABLED],
            [*active, types_pb2.FLOW_STATUS_DISABLED],
        ):
            refused = await _refusal(
                flows.ListFlows,
                flow_service_pb2.ListFlowsRequest(statuses=other, page_token=first.next_page_token),
            )
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
            assert refused.details() == f"page_token: {ELSEWHERE}"
        # The same statuses in another order or repeated are the same listing.
        again = await flows.ListFlows(
            flow_service_pb2.ListFlowsRequest(
                page_size=500, statuses=active * 2, page_token=first.next_page_token
            )
        )
        assert [f.flow_id for f in again.flows] == [f.flow_id for f in rest.flows]


#: Ids a page token may hold once its listing name is rebuilt (an unkeyed hash of the filter),
#: none of which any listing holds: a lone surrogate (UTF-8 cannot encode it: SQLite's driver
#: raised UnicodeEncodeError binding it), a NUL (PostgreSQL refuses it in text), none, and one
#: longer than any id.
_FORGED_IDS = ["\ud800", "fleet\x00a", "", "x" * 129]


async def test_a_forged_page_token_is_invalid_argument_not_internal(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """A token's listing name is a hash anyone can compute, so a client can build a token of
    the right listing whose id no statement can bind: ListHosts, ListTasks and ListFlows
    answered INTERNAL. They refuse it as a token this server never made; so are times
    without a zone (the store's times are UTC)."""
    created, naive = "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00"
    task_listing, flow_listing = tasks.TaskFilter().listing(), flows.listing(())
    calls: list[tuple[str, Any]] = []
    for bad in _FORGED_IDS:
        host_token = paging.page_token(_host_listing(hosts.HostFilter()), bad)
        calls += [
            ("ListHosts", fleet_service_pb2.ListHostsRequest(page_token=host_token)),
            (
                "ListTasks",
                task_service_pb2.ListTasksRequest(
                    page_token=paging.page_token(task_listing, created, bad)
                ),
            ),
            (
                "ListFlows",
                flow_service_pb2.ListFlowsRequest(
                    page_token=paging.page_token(flow_listing, created, bad)
                ),
            ),
        ]
    calls += [
        (
            "ListTasks",
            task_service_pb2.ListTasksRequest(
                page_token=paging.page_token(task_listing, naive, "t")
            ),
        ),
        (
            "ListFlows",
            flow_service_pb2.ListFlowsRequest(
                page_token=paging.page_token(flow_listing, naive, "f")
            ),
        ),
    ]
    async with channel(cloud.address, pki_dir, "operator-ops") as ops:
        stubs = {
            "ListHosts": fleet_service_pb2_grpc.FleetServiceStub(ops).ListHosts,
            "ListTasks": task_service_pb2_grpc.TaskServiceStub(ops).ListTasks,
            "ListFlows": flow_service_pb2_grpc.FlowServiceStub(ops).ListFlows,
        }
        answers = []
        for name, request in calls:
            try:
                await stubs[name](request, timeout=10)
                answers.append((name, request.page_token, "OK", ""))
            except grpc.aio.AioRpcError as err:
                answers.append((name, request.page_token, err.code().name, err.details()))
    wanted = "page_token: not a page token from this server"
    assert [a for a in answers if a[2:] != ("INVALID_ARGUMENT", wanted)] == []
