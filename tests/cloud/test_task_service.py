"""TaskService and FleetService behaviour: idempotency, validation, filters, pages, hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc, task_service_pb2, types_pb2
from cloud.server import CloudServer
from tests.cloud.cloud_harness import ScriptedHost, channel, result, submit


async def test_submit_is_idempotent(ops: Any) -> None:
    first = await submit(ops, client_request_id="req-1")
    again = await submit(ops, goal="different text, same key", client_request_id="req-1")
    assert not first.deduplicated
    assert again.deduplicated
    assert again.task.task_id == first.task.task_id
    assert again.task.goal == first.task.goal
    other = await submit(ops, client_request_id="req-2")
    assert other.task.task_id != first.task.task_id


@pytest.mark.parametrize(
    ("request_kwargs", "field"),
    [
        ({"goal": ""}, "goal"),
        ({"goal": "x" * 2001}, "goal"),
        ({"goal": "ok", "max_attempts": 21}, "max_attempts"),
        ({"goal": "ok", "client_request_id": "k" * 129}, "client_request_id"),
    ],
)
async def test_submit_validation_names_the_field(
    ops: Any, request_kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ops.SubmitTask(task_service_pb2.SubmitTaskRequest(**request_kwargs))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field)


@pytest.mark.parametrize(
    ("field", "seconds", "nanos"),
    [
        ("lease_duration", 10, -500_000_000),  # read as 9.5 s
        ("lease_duration", 5, 1_500_000_000),  # read as 6.5 s
        ("timeout", 60, 1_000_000_000),
        ("timeout", -1, 500_000_000),  # a negative second plus half of one
    ],
)
async def test_an_invalid_duration_is_refused_naming_the_field(
    ops: Any, field: str, seconds: int, nanos: int
) -> None:
    """A Duration whose nanos have the other sign than its seconds, or make a whole second,
    is no Duration (google/protobuf/duration.proto); it was added up and queued."""
    request = task_service_pb2.SubmitTaskRequest(goal="ok")
    getattr(request, field).CopyFrom(duration_pb2.Duration(seconds=seconds, nanos=nanos))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ops.SubmitTask(request)
    assert (err.value.code(), err.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{field}: not a valid Duration (nanos -999,999,999 to 999,999,999, of the sign of"
        " seconds)",
    )


@pytest.mark.parametrize(
    ("field", "seconds", "nanos", "refusal"),
    [
        ("timeout", 315_360_000, 0, None),
        ("timeout", 315_360_001, 0, "timeout: at most 315360000 s"),
        ("timeout", 0, 1, None),
        ("timeout", 0, 0, "timeout: must be positive"),
        # The fixture's cloud allows leases from 0.2 s: the bounds are the cloud's settings,
        # and the refusal names them.
        ("lease_duration", 3600, 0, None),
        ("lease_duration", 3600, 1, "lease_duration: 0.2 s to 3600 s"),
        ("lease_duration", 0, 199_999_999, "lease_duration: 0.2 s to 3600 s"),
    ],
)
async def test_submit_durations_are_held_to_the_bounds_the_proto_gives(
    ops: Any, field: str, seconds: int, nanos: int, refusal: str | None
) -> None:
    """SubmitTaskRequest's comments gave no bound for `timeout`, and "5 s to 1 h" for
    `lease_duration` where the cloud's settings decide (a client written from the proto could
    not know either)."""
    request = task_service_pb2.SubmitTaskRequest(goal="ok", validate_only=True)
    getattr(request, field).CopyFrom(duration_pb2.Duration(seconds=seconds, nanos=nanos))
    if refusal is None:
        await ops.SubmitTask(request)
        return
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ops.SubmitTask(request)
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, refusal)


async def test_a_page_token_continued_with_another_filter_is_refused(ops: Any) -> None:
    """A ListTasks token held a position only: continued with another filter it gave a page
    of that filter's tasks older than a task of the first, silently skipping the newer ones.
    It names its filter now, as a token names its RPC and task."""
    for goal in ("alpha one", "alpha two", "beta one", "beta two"):
        await submit(ops, goal=goal)
    first = await ops.ListTasks(task_service_pb2.ListTasksRequest(query="alpha", page_size=1))
    token = first.next_page_token
    assert token
    same = await ops.ListTasks(
        task_service_pb2.ListTasksRequest(query="ALPHA", page_size=5, page_token=token)
    )
    assert [t.goal for t in same.tasks] == ["alpha one"]  # the same filter, case aside
    for other in (
        task_service_pb2.ListTasksRequest(query="beta"),
        task_service_pb2.ListTasksRequest(),
        task_service_pb2.ListTasksRequest(query="alpha", host_id="h1"),
        task_service_pb2.ListTasksRequest(query="alpha", statuses=[types_pb2.TASK_STATUS_QUEUED]),
        task_service_pb2.ListTasksRequest(query="alpha", task_id_prefix="a"),
    ):
        other.page_token = token
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ops.ListTasks(other)
        assert (err.value.code(), err.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token: a page token of another listing (another RPC, task, attempt or filter)",
        )


async def test_listing_by_task_ids_gives_those_tasks_in_one_call(ops: Any) -> None:
    """`task_ids` lists the tasks it names (unknown ids left out), paged like any listing, so a
    client after many known tasks (a fleet watch back from an outage) makes one call, not one
    GetTask each; a token of it continues that listing only, and too many or empty ids are
    refused naming the field."""
    ids = [(await submit(ops, goal=f"Goal {i}")).task.task_id for i in range(4)]
    asked = [ids[0], ids[2], ids[3], "f" * 32]
    first = await ops.ListTasks(task_service_pb2.ListTasksRequest(task_ids=asked, page_size=2))
    assert [t.task_id for t in first.tasks] == [ids[3], ids[2]]  # newest first
    rest = await ops.ListTasks(
        task_service_pb2.ListTasksRequest(
            task_ids=list(reversed(asked)), page_size=2, page_token=first.next_page_token
        )
    )
    assert ([t.task_id for t in rest.tasks], rest.next_page_token) == ([ids[0]], "")
    for other in (
        task_service_pb2.ListTasksRequest(),
        task_service_pb2.ListTasksRequest(task_ids=ids),
    ):
        other.page_token = first.next_page_token
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ops.ListTasks(other)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for bad, details in (
        (["a"] * 501, "task_ids: at most 500 ids"),
        ([ids[0], ""], "task_ids[1]: 1 to 128 characters"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ops.ListTasks(task_service_pb2.ListTasksRequest(task_ids=bad))
        assert (err.value.code(), err.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            details,
        )


async def test_get_unknown_task(ops: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ops.GetTask(task_service_pb2.GetTaskRequest(task_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_list_filters_and_pages(cloud: CloudServer, ops: Any, pki_dir: Path) -> None:
    ids = [(await submit(ops, goal=f"Goal number {i}")).task.task_id for i in range(7)]
    special = (await submit(ops, goal="Turn on DARK theme")).task.task_id

    seen: list[str] = []
    token = ""
    while True:
        page = await ops.ListTasks(task_service_pb2.ListTasksRequest(page_size=3, page_token=token))
        assert len(page.tasks) <= 3
        seen.extend(t.task_id for t in page.tasks)
        token = page.next_page_token
        if not token:
            break
    assert seen == [special, *reversed(ids)]  # newest first, no repeats

    found = await ops.ListTasks(task_service_pb2.ListTasksRequest(query="dark"))
    assert [t.task_id for t in found.tasks] == [special]

    host = ScriptedHost(cloud.address, pki_dir, "h12")
    try:
        await host.connect(["p"])
        a = (await host.next("assignment")).assignment
        await host.send(result(a))
        await host.next("result_ack")
    finally:
        await host.close()
    by_host = await ops.ListTasks(task_service_pb2.ListTasksRequest(host_id="h12"))
    assert a.task_id in [t.task_id for t in by_host.tasks]
    assert {t.host_id for t in by_host.tasks} == {"h12"}
    done = await ops.ListTasks(
        task_service_pb2.ListTasksRequest(statuses=[types_pb2.TASK_STATUS_SUCCEEDED])
    )
    assert [t.task_id for t in done.tasks] == [a.task_id]
    assert done.tasks[0].progress.step_index == 3

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ops.ListTasks(task_service_pb2.ListTasksRequest(page_token="garbage"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_list_hosts(cloud: CloudServer, pki_dir: Path) -> None:
    ch = channel(cloud.address, pki_dir, "operator-ops")
    fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
    online = ScriptedHost(cloud.address, pki_dir, "h13")
    gone = ScriptedHost(cloud.address, pki_dir, "h14")
    try:
        await online.connect(["p1", "p2"])
        await gone.connect(["q"])
        await gone.close()
        hosts = (await fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
        by_id = {h.host_id: h for h in hosts}
        assert by_id["h13"].connected
        assert [d.serial for d in by_id["h13"].devices] == ["p1", "p2"]
        assert by_id["h13"].planner_transport == types_pb2.PLANNER_TRANSPORT_CLOUD
        connected_only = await fleet.ListHosts(
            fleet_service_pb2.ListHostsRequest(connected_only=True)
        )
        ids = [h.host_id for h in connected_only.hosts]
        assert "h13" in ids
        # h14's stream end is recorded by the server asynchronously.
        if "h14" in by_id:
            assert hosts[0].connected
    finally:
        await online.close()
        await ch.close()
