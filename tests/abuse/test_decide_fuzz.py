"""Decide fuzzed under a live lease: malformed input is INVALID_ARGUMENT, never UNKNOWN.

The fuzzer of every RPC (test_rpc_fuzz.py) reaches Decide without a lease, so the lease check
answers first. Here a host really holds a lease (a task assigned over its Lease stream, its
lease long enough to outlive the run), and every request names that lease: the fuzzed
observation, previous outcome, step key, screenshot and deprecated fields reach the checks and
the planner behind them. Proves: Decide answers a decision or a refusal with a reason (an
INVALID_ARGUMENT names a field), never UNKNOWN, INTERNAL, UNAVAILABLE or UNIMPLEMENTED (but for
the deprecated SessionStep on a cloud that plans offline, as documented); the lease stays live
(never FAILED_PRECONDITION), and the replica keeps serving.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any, cast

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import (
    lease_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from planner.observation import observation_from_scene
from tests.abuse.conftest import AbuseCloud
from tests.planner import scenes
from tests.support.proto_strategies import STRINGS, field_names, messages

pytestmark = pytest.mark.filterwarnings(
    # Hypothesis warns (an error here) when it prints a failing 100 KB example.
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)

SERIAL = "decide-1"
FORBIDDEN = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.FAILED_PRECONDITION,  # the lease is live throughout
    grpc.StatusCode.PERMISSION_DENIED,  # and it is the caller's
}
NAMES = field_names(planner_service_pb2.DecideRequest.DESCRIPTOR)


class HeldLease:
    """A host stream (certificate `host-decider`) holding one assignment until closed."""

    def __init__(self, cloud: AbuseCloud) -> None:
        self._channel = cloud.channel("host-decider")
        self._requests: queue.Queue[lease_pb.LeaseRequest | None] = queue.Queue()
        hello = lease_pb.LeaseRequest(
            hello=lease_pb.HostHello(
                devices=[
                    types_pb2.Device(
                        serial=SERIAL, model="fuzz", state=types_pb2.DEVICE_STATE_ONLINE
                    )
                ],
                agent_version="fuzz/1",
                planner_transport=types_pb2.PLANNER_TRANSPORT_CLOUD,
            )
        )
        self._requests.put(hello)
        self._call: Any = lease_service_pb2_grpc.LeaseServiceStub(self._channel).Lease(
            self._outgoing()
        )

    def _outgoing(self) -> Iterator[lease_pb.LeaseRequest]:
        while (item := self._requests.get()) is not None:
            yield item

    def assignment(self) -> lease_pb.Assignment:
        for response in self._call:
            if response.WhichOneof("kind") == "assignment":
                return cast(lease_pb.Assignment, response.assignment)
        raise AssertionError("the stream ended without an assignment")

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._channel.close()


def _requests(a: lease_pb.Assignment) -> st.SearchStrategy[planner_service_pb2.DecideRequest]:
    def on_the_lease(m: Any) -> planner_service_pb2.DecideRequest:
        request = cast(planner_service_pb2.DecideRequest, m)
        request.task_id, request.attempt, request.lease_id = a.task_id, a.attempt, a.lease_id
        return request

    fuzzed = messages(planner_service_pb2.DecideRequest.DESCRIPTOR).map(on_the_lease)
    real = observation_from_scene(scenes.settings_main())

    def near_valid(
        outcome: types_pb2.ActionOutcome | None, key: str, element: types_pb2.UiElement | None
    ) -> planner_service_pb2.DecideRequest:
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, step_key=key
        )
        request.observation.CopyFrom(real)
        if element is not None:
            request.observation.elements.append(element)
        if outcome is not None:
            request.previous_outcome.CopyFrom(outcome)
        return request

    hostile_observation = messages(types_pb2.ScreenObservation.DESCRIPTOR).map(
        lambda o: planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=cast(types_pb2.ScreenObservation, o),
        )
    )
    valid_ish = st.builds(
        near_valid,
        st.none()
        | messages(types_pb2.ActionOutcome.DESCRIPTOR).map(
            lambda m: cast(types_pb2.ActionOutcome, m)
        ),
        STRINGS,
        st.none()
        | messages(types_pb2.UiElement.DESCRIPTOR).map(lambda m: cast(types_pb2.UiElement, m)),
    )
    return st.one_of(
        fuzzed,
        hostile_observation,
        valid_ish,
    )


def test_decide_under_a_live_lease_never_answers_unknown(abuse_cloud: AbuseCloud) -> None:
    with abuse_cloud.channel("operator-ops") as ops_ch:
        ops: Any = task_service_pb2_grpc.TaskServiceStub(ops_ch)
        ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme",
                target=types_pb2.TaskTarget(host_id="decider", device_serial=SERIAL),
                lease_duration=Duration(seconds=3600),
            )
        )
    held = HeldLease(abuse_cloud)
    try:
        a = held.assignment()
        with abuse_cloud.channel("host-decider") as ch:
            stub: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
            answered: list[str] = []

            @settings(
                max_examples=150,
                deadline=None,
                suppress_health_check=[
                    HealthCheck.function_scoped_fixture,
                    HealthCheck.too_slow,
                    HealthCheck.data_too_large,
                ],
            )
            @given(request=_requests(a))
            def one(request: planner_service_pb2.DecideRequest) -> None:
                try:
                    stub.Decide(request, timeout=30)
                except grpc.RpcError as err:
                    code, details = err.code(), err.details() or ""
                    shown = str(request)[:300]
                    # Documented: a deprecated SessionStep on a cloud that plans offline.
                    session = code == grpc.StatusCode.UNIMPLEMENTED and request.HasField("session")
                    assert code not in FORBIDDEN or session, f"{code} {details!r} for {shown!r}"
                    assert len(details.strip()) >= 5, f"{code} without a reason for {shown!r}"
                    if code == grpc.StatusCode.INVALID_ARGUMENT:
                        assert any(n in details for n in NAMES), f"{details!r} names no field"
                    answered.append(code.name)
                else:
                    answered.append("decision")

            one()
            # The run reached the planner, not only the checks in front of it.
            assert "decision" in answered
    finally:
        held.close()
    abuse_cloud.assert_serving()
