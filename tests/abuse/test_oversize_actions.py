"""A shipped decision whose action holds more text than the decision log keeps: cut, naming it.

ShipDecisions held a decision's rationale, purpose and prompts to their limits, but not the
text inside its action (what to type, a completion's reason, an element id, a package, the
action's own purpose). A direct host shipping a 5 MB one had it stored whole, and the operator's
ListDecisions of that task answered RESOURCE_EXHAUSTED from then on: the task's decision log
could no longer be read. Refusing it (INVALID_ARGUMENT) lost the step and its cost for good, on a
host from before hosts cut it themselves. Proves: each such field over 64 KiB is logged cut to
the limit with the marker naming it, a 64 KiB one whole, and the task's log still lists. The
text typed is the exception: what the phone got is logged whole up to `MAX_TYPED_TEXT`, and
an entry over it refused, not cut by the cloud (tests/cloud/test_shipping.py); the Python host
cuts one over it before shipping (host/outbox/shipments.py).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.duration_pb2 import Duration

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from cloud.wire import text_fields
from planner.decision import CUT_MARK, MAX_MODEL_TEXT
from tests.abuse.conftest import AbuseCloud, assigned
from tests.cloud.cloud_harness import ScriptedHost, channel

OVER = "y" * (MAX_MODEL_TEXT + 1)
AT_LIMIT = "y" * MAX_MODEL_TEXT


def _texts(action: types_pb2.Action) -> list[str]:
    return [
        getattr(owner, f.name) if i is None else getattr(owner, f.name)[i]
        for _, owner, f, i in text_fields(action, "")
    ]


def _actions(text: str) -> dict[str, types_pb2.Action]:
    """One action per text field an action has, that field holding `text`."""
    actions = {
        "input_text.text": types_pb2.Action(input_text=types_pb2.InputTextAction(text=text)),
        "input_text.element_id": types_pb2.Action(
            input_text=types_pb2.InputTextAction(text="hi", element_id=text)
        ),
        "tap.element_id": types_pb2.Action(tap=types_pb2.TapAction(element_id=text)),
        "launch_app.package_name": types_pb2.Action(
            launch_app=types_pb2.LaunchAppAction(package_name=text)
        ),
        "terminate_app.package_name": types_pb2.Action(
            terminate_app=types_pb2.TerminateAppAction(package_name=text)
        ),
        "complete.reason": types_pb2.Action(complete=types_pb2.CompleteAction(reason=text)),
        "purpose": types_pb2.Action(tap=types_pb2.TapAction(element_id="e1"), purpose=text),
        "expected_outcome": types_pb2.Action(
            tap=types_pb2.TapAction(element_id="e1"), expected_outcome=text
        ),
    }
    for action in actions.values():
        action.purpose = action.purpose or "p"
        action.expected_outcome = action.expected_outcome or "e"
    return actions


async def test_an_action_text_over_the_limit_is_logged_cut_naming_it(
    abuse_cloud: AbuseCloud,
) -> None:
    address, pki_dir = abuse_cloud.address, abuse_cloud.pki_dir
    ops_channel = channel(address, pki_dir, "operator-ops")
    ops: Any = task_service_pb2_grpc.TaskServiceStub(ops_channel)
    log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_channel)
    host = ScriptedHost(address, pki_dir, "shipper")
    try:
        await host.connect(["oversize-1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        task = await ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme",
                target=types_pb2.TaskTarget(host_id="shipper", device_serial="oversize-1"),
                lease_duration=Duration(seconds=600),
            )
        )
        a = await assigned(host, task.task.task_id)
        ship: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(host._channel)

        def request(key: str, action: types_pb2.Action) -> Any:
            kind = action.WhichOneof("kind") or ""
            return decision_log_service_pb2.ShipDecisionsRequest(
                entries=[
                    decision_log_service_pb2.ShippedDecision(
                        host_decision_id=key,
                        task_id=a.task_id,
                        attempt=a.attempt,
                        lease_id=a.lease_id,
                        decision=types_pb2.Decision(
                            tool_name=kind, action=action, provider="offline", model="m"
                        ),
                    )
                ]
            )

        for i, action in enumerate(_actions(OVER).values()):
            await ship.ShipDecisions(request(f"over-{i}", action), timeout=10)
        for i, action in enumerate(_actions(AT_LIMIT).values()):
            await ship.ShipDecisions(request(f"at-limit-{i}", action), timeout=10)
        listed = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id), timeout=10
        )
        names = list(_actions(OVER))
        assert len(listed.decisions) == 2 * len(names)
        for d in listed.decisions:
            texts = [t for t in _texts(d.action) if len(t) > 100]
            assert len(texts) == 1, d.action
            (text,) = texts
            if text == AT_LIMIT or d.action.input_text.text == OVER:  # what was typed: whole
                assert text in (AT_LIMIT, OVER)
                continue
            assert len(text.encode()) <= MAX_MODEL_TEXT
            head, marker = text.rsplit("\n\n", 1)
            assert OVER.startswith(head)
            assert marker.startswith("[… cut here: this action.")
            assert f"is {MAX_MODEL_TEXT + 1:,} bytes" in marker
        cut = [d for d in listed.decisions if CUT_MARK in "".join(_texts(d.action))]
        assert len(cut) == len(names) - 1  # all but input_text.text
    finally:
        await host.close()
        await ops_channel.close()
    abuse_cloud.assert_serving()
