"""Property-based fuzzing of the Lease stream: hostile message sequences from a real host cert.

Sequences mix fully fuzzed `LeaseRequest`s with well-formed messages in the wrong order: no hello
or a second hello, renewals and results for unknown tasks, for a queued task of another host and
for a task really assigned to this host but with made-up attempts and lease ids, the same result
several times, results before renewals, empty messages, 100 KB fields. Proves: the stream is
never ended with INTERNAL/UNKNOWN/UNAVAILABLE, no in-stream refusal is an internal error in
disguise, every refusal says what was wrong, a valid hello is always welcomed, and the replica
still serves afterwards.
"""

from __future__ import annotations

from typing import Any, cast

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import lease_service_pb2_grpc, task_service_pb2, task_service_pb2_grpc, types_pb2
from tests.abuse.conftest import AbuseCloud
from tests.support.proto_strategies import STRINGS, messages

pytestmark = pytest.mark.filterwarnings(
    # Hypothesis warns (an error here) when it prints a failing 100 KB example.
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)

SERIAL = "fz-1"
ALLOWED_END = {grpc.StatusCode.OK, grpc.StatusCode.FAILED_PRECONDITION}
INTERNALISH = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE}


def _hello() -> lease_pb.LeaseRequest:
    return lease_pb.LeaseRequest(
        hello=lease_pb.HostHello(
            devices=[
                types_pb2.Device(serial=SERIAL, model="fuzz", state=types_pb2.DEVICE_STATE_ONLINE)
            ],
            agent_version="fuzz/1",
            planner_transport=types_pb2.PLANNER_TRANSPORT_DIRECT,
        )
    )


def _sequences(task_ids: list[str]) -> st.SearchStrategy[list[lease_pb.LeaseRequest]]:
    ids = st.one_of(st.sampled_from(task_ids), STRINGS)
    attempts = st.one_of(st.integers(-1, 4), st.sampled_from([2**31 - 1, -(2**31)]))
    progress = messages(types_pb2.Progress.DESCRIPTOR)
    renewal = st.builds(
        lambda t, a, lid, p: lease_pb.LeaseRequest(
            renewal=lease_pb.LeaseRenewal(task_id=t, attempt=a, lease_id=lid, progress=p)
        ),
        ids,
        attempts,
        STRINGS,
        progress,
    )
    result = st.builds(
        lambda t, a, lid, s, summary: lease_pb.LeaseRequest(
            result=lease_pb.TaskResult(
                task_id=t, attempt=a, lease_id=lid, status=s, summary=summary
            )
        ),
        ids,
        attempts,
        STRINGS,
        st.integers(-1, 9),
        STRINGS,
    )
    one = st.one_of(
        renewal,
        result,
        st.just(_hello()),
        st.just(lease_pb.LeaseRequest()),
        # messages() draws instances of the descriptor's class: LeaseRequest here.
        cast(
            "st.SearchStrategy[lease_pb.LeaseRequest]", messages(lease_pb.LeaseRequest.DESCRIPTOR)
        ),
    )
    body = st.lists(one, max_size=8).flatmap(
        # Repeat some messages verbatim: duplicates must be as harmless as the originals.
        lambda xs: (
            st.lists(st.sampled_from(xs), max_size=3).map(lambda extra: xs + extra)
            if xs
            else st.just(xs)
        )
    )
    start = st.sampled_from(["hello", "hello", "hello", "fuzzed-hello", "none"])
    fuzzed_hello = messages(lease_pb.HostHello.DESCRIPTOR).map(
        # messages() draws instances of the descriptor's class: HostHello here.
        lambda h: lease_pb.LeaseRequest(hello=cast(lease_pb.HostHello, h))
    )
    return st.tuples(start, fuzzed_hello, body).map(
        lambda t: (
            ([_hello()] if t[0] == "hello" else [t[1]] if t[0] == "fuzzed-hello" else []) + t[2]
        )
    )


def _check_stream(stub: Any, seq: list[lease_pb.LeaseRequest]) -> None:
    responses: list[lease_pb.LeaseResponse] = []
    code = grpc.StatusCode.OK
    details = ""
    call = stub.Lease(iter(seq), timeout=15)
    try:
        for response in call:
            responses.append(response)
    except grpc.RpcError as err:
        code, details = err.code(), err.details() or ""
    shown = [m.WhichOneof("kind") for m in seq]
    assert code not in INTERNALISH, f"{code} {details!r} after {shown}"
    assert code in ALLOWED_END, f"{code} {details!r} after {shown}"
    if code != grpc.StatusCode.OK:
        assert len(details) >= 5, f"{code} without a reason after {shown}"
    for r in responses:
        if r.WhichOneof("kind") == "rejected":
            assert r.rejected.code not in {c.value[0] for c in INTERNALISH}, (r, shown)
            assert len(r.rejected.message) >= 5, (r, shown)
    if seq and seq[0] == _hello():
        assert responses, f"valid hello got no answer: {code} {details}"
        # The contract: Welcome before anything else on the stream.
        assert responses[0].WhichOneof("kind") == "welcome", responses[0]


def test_fuzzed_lease_streams_are_refused_cleanly(any_abuse_cloud: AbuseCloud) -> None:
    abuse_cloud = any_abuse_cloud
    with abuse_cloud.channel("operator-ops") as ops_ch:
        ops: Any = task_service_pb2_grpc.TaskServiceStub(ops_ch)
        # Queued for another host (never connected) and one for this host's phone.
        others = [
            ops.SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal=f"other {i}", target=types_pb2.TaskTarget(host_id="other")
                )
            ).task.task_id
            for i in range(2)
        ]
        mine = ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="fuzz me",
                target=types_pb2.TaskTarget(host_id="fuzz", device_serial=SERIAL),
                lease_duration=Duration(seconds=1),
                max_attempts=20,
            )
        ).task.task_id
    task_ids = [*others, mine]

    with abuse_cloud.channel("host-fuzz") as ch:
        stub = lease_service_pb2_grpc.LeaseServiceStub(ch)

        @settings(
            max_examples=80,
            deadline=None,
            suppress_health_check=[
                HealthCheck.function_scoped_fixture,
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
            ],
        )
        @given(seq=_sequences(task_ids))
        def one(seq: list[lease_pb.LeaseRequest]) -> None:
            _check_stream(stub, seq)

        one()
    abuse_cloud.assert_serving()


def test_a_message_over_the_size_limit_is_refused_and_the_replica_serves_on(
    abuse_cloud: AbuseCloud,
) -> None:
    """17 MB in one message (the limit is 16 MB): RESOURCE_EXHAUSTED, never INTERNAL."""
    huge = "x" * (17 * 1024 * 1024)
    with abuse_cloud.channel("host-fuzz") as ch:
        stub = lease_service_pb2_grpc.LeaseServiceStub(ch)
        oversize = lease_pb.LeaseRequest(
            renewal=lease_pb.LeaseRenewal(
                task_id="t", attempt=1, lease_id="l", progress=types_pb2.Progress(summary=huge)
            )
        )
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Lease(iter([_hello(), oversize]), timeout=30))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
    with abuse_cloud.channel("operator-ops") as ch:
        submit = ch.unary_unary(
            "/amc.v1.TaskService/SubmitTask",
            request_serializer=task_service_pb2.SubmitTaskRequest.SerializeToString,
        )
        with pytest.raises(grpc.RpcError) as err:
            submit(task_service_pb2.SubmitTaskRequest(goal=huge), timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
    abuse_cloud.assert_serving()
