"""Property-based fuzzing of every unary and server-streaming RPC's request message.

Each example sends one hostile request (see `tests/support/proto_strategies.py`) with the right
kind of certificate. Proves: the server never answers INTERNAL or UNKNOWN (nor UNAVAILABLE or
UNIMPLEMENTED: it did not fall over and the method exists), every refusal carries details that
name the problem (for INVALID_ARGUMENT: a field of the request), and the replica still passes its
health check afterwards.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings

from amc.v1 import (
    artifact_service_pb2,
    decision_log_service_pb2,
    fleet_service_pb2,
    flow_service_pb2,
    planner_service_pb2,
    progress_service_pb2,
    task_service_pb2,
)
from cloud.authz import ACCESS, HOSTS
from tests.abuse.conftest import AbuseCloud, first_said
from tests.support.proto_strategies import field_names, messages

pytestmark = pytest.mark.filterwarnings(
    # Hypothesis warns (an error here) when it prints a failing 100 KB example; the failure
    # itself is what matters, so let the report through.
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)

FORBIDDEN = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED,
}

# (method, identity that may call it)
METHODS: list[tuple[MethodDescriptor, str]] = []
for module in (
    task_service_pb2,
    progress_service_pb2,
    fleet_service_pb2,
    decision_log_service_pb2,
    planner_service_pb2,
    artifact_service_pb2,
    flow_service_pb2,
):
    for service in module.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            if not method.client_streaming:
                # Called as whom the authorization table lets call it (a host for hosts' RPCs).
                rule = ACCESS[f"/{service.full_name}/{method.name}"]
                METHODS.append((method, "host-fuzz" if rule is HOSTS else "operator-ops"))


#: A live stream's wait for its first message: a stream with nothing to say yet (no task to
#: show) is fine once this passes.
LIVE_WAIT_S = 1.0


def _call(
    ch: grpc.Channel, method: MethodDescriptor, request: Message, live: list[tuple[Any, Message]]
) -> grpc.RpcError | None:
    """The request's refusal, or None. A server-streaming request the server accepted (its
    headers came, the call goes on) joins `live`, to be read once every example was sent:
    each stream waits out its deadline alongside the others, not one after another (a
    WatchProgress with no task to show waited its whole second, ~15 s per run of examples).
    One the server refused has ended by then and is checked here, in its example."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    serialize = type(request).SerializeToString
    if method.server_streaming:
        call: Any = ch.unary_stream(path, request_serializer=serialize)(
            request, timeout=LIVE_WAIT_S
        )
        call.initial_metadata()  # the headers of an accepted stream, or the call's end
        if not call.done():
            live.append((call, request))
            return None
        return first_said(call)
    try:
        ch.unary_unary(path, request_serializer=serialize)(request, timeout=10)
    except grpc.RpcError as err:
        return err
    return None


def check_refusal(err: grpc.RpcError | None, names: set[str], request: Message) -> None:
    if err is None:
        return
    code, details = err.code(), err.details() or ""
    assert code not in FORBIDDEN, f"{code} {details!r} for {str(request)[:300]!r}"
    assert len(details.strip()) >= 5, f"{code} without a reason for {str(request)[:300]!r}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert any(n in details for n in names), f"{details!r} names no field"


@pytest.mark.parametrize(
    ("method", "identity"),
    METHODS,
    ids=[f"{m.containing_service.name}.{m.name}" for m, _ in METHODS],
)
def test_fuzzed_requests_are_refused_cleanly(
    any_abuse_cloud: AbuseCloud, method: MethodDescriptor, identity: str
) -> None:
    abuse_cloud = any_abuse_cloud
    names = field_names(method.input_type)
    live: list[tuple[Any, Message]] = []
    with abuse_cloud.channel(identity) as ch:

        @settings(
            max_examples=100,
            deadline=None,
            suppress_health_check=[
                HealthCheck.function_scoped_fixture,
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
            ],
        )
        @given(request=messages(method.input_type))
        def one(request: Message) -> None:
            check_refusal(_call(ch, method, request, live), names, request)

        try:
            one()
            for call, request in live:  # what each accepted stream said first, or its refusal
                check_refusal(first_said(call), names, request)
        finally:
            for call, _ in live:
                call.cancel()
    abuse_cloud.assert_serving()
