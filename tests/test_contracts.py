"""The contracts in proto/amc/v1: documented for other languages, and lossless on the wire."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypedDict

import pytest
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from amc.v1 import lease_service_pb2, planner_service_pb2, task_service_pb2, types_pb2

PROTO_DIR = Path(__file__).resolve().parent.parent / "proto" / "amc" / "v1"
DECLARATION = re.compile(
    r"^\s*(message|enum|service|rpc|oneof)\s+\w+"  # named blocks
    r"|^\s*(repeated\s+|optional\s+)?[\w.]+\s+\w+\s*=\s*\d+\s*;"  # fields
    r"|^\s*[A-Z][A-Z0-9_]*\s*=\s*\d+\s*;"  # enum values
)


@pytest.mark.parametrize("path", sorted(PROTO_DIR.glob("*.proto")), ids=lambda p: p.name)
def test_every_declaration_is_documented(path: Path) -> None:
    """Polyglot clients read the .proto files: every message, field, enum value, service and
    rpc has a comment right above it."""
    undocumented = []
    declarations = 0
    previous = ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if DECLARATION.match(line):
            declarations += 1
            if not previous.startswith("//"):
                undocumented.append(f"{path.name}:{number}: {line.strip()}")
        if line.strip():
            previous = line.strip()
    assert declarations > 3
    assert not undocumented, "\n".join(undocumented)


class _Intent(TypedDict):
    purpose: str
    expected_outcome: str


def _actions() -> list[types_pb2.Action]:
    intent: _Intent = {
        "purpose": "open display settings",
        "expected_outcome": "Display page is open",
    }
    return [
        types_pb2.Action(tap=types_pb2.TapAction(element_id="e12"), **intent),
        types_pb2.Action(
            tap=types_pb2.TapAction(point=types_pb2.Point(x=10, y=20), long_press=True), **intent
        ),
        types_pb2.Action(
            swipe=types_pb2.SwipeAction(
                start=types_pb2.Point(x=500, y=1800),
                end=types_pb2.Point(x=500, y=400),
                duration_ms=300,
            ),
            **intent,
        ),
        types_pb2.Action(
            input_text=types_pb2.InputTextAction(text="hunter2", sensitive=True), **intent
        ),
        types_pb2.Action(press_key=types_pb2.PressKeyAction(key=types_pb2.KEY_BACK), **intent),
        types_pb2.Action(
            launch_app=types_pb2.LaunchAppAction(package_name="com.android.settings"), **intent
        ),
        types_pb2.Action(
            terminate_app=types_pb2.TerminateAppAction(package_name="com.android.settings"),
            **intent,
        ),
        types_pb2.Action(get_ui_tree=types_pb2.GetUiTreeAction()),
        types_pb2.Action(complete=types_pb2.CompleteAction(success=True, reason="done")),
    ]


def _messages() -> list[Message]:
    progress = types_pb2.Progress(
        step_index=4, step_status=types_pb2.STEP_STATUS_ACTING, summary="step 4: tap 'Display'"
    )
    decision = types_pb2.Decision(
        decision_id="d1", task_id="t1", attempt=2, step_index=3, tool_name="tap",
        arguments_json='{"element_id": "e12"}', action=_actions()[0],
        thinking=[types_pb2.ThinkingBlock(text="hmm"), types_pb2.ThinkingBlock(redacted=True)],
        usage=types_pb2.Usage(input_tokens=1200, output_tokens=80, cache_read_input_tokens=900),
        forced_retry=True,
    )  # fmt: skip
    return [
        *_actions(),
        lease_service_pb2.LeaseRequest(
            hello=lease_service_pb2.HostHello(
                devices=[
                    types_pb2.Device(serial="emulator-5554", state=types_pb2.DEVICE_STATE_ONLINE)
                ],
                planner_transport=types_pb2.PLANNER_TRANSPORT_CLOUD,
                held_assignments=[lease_service_pb2.HeldAssignment(task_id="t1", attempt=1)],
            )
        ),
        lease_service_pb2.LeaseRequest(
            renewal=lease_service_pb2.LeaseRenewal(
                task_id="t1", attempt=1, lease_id="l1", progress=progress
            )
        ),
        lease_service_pb2.LeaseResponse(
            revoked=lease_service_pb2.Revoked(
                task_id="t1", reason=lease_service_pb2.REVOKE_REASON_SUPERSEDED
            )
        ),
        task_service_pb2.GetTaskResponse(
            task=types_pb2.Task(
                task_id="t1", goal="Turn on dark theme", status=types_pb2.TASK_STATUS_RUNNING,
                progress=progress, attempts=[types_pb2.Attempt(attempt=1, progress=progress)],
            )
        ),
        planner_service_pb2.DecideResponse(decision=decision),
    ]  # fmt: skip


@pytest.mark.parametrize("message", _messages(), ids=lambda m: type(m).__name__)
def test_round_trips_binary_and_json(message: Message) -> None:
    again = type(message).FromString(message.SerializeToString())
    assert again == message
    assert json_format.Parse(json_format.MessageToJson(message), type(message)()) == message


def test_oneof_carries_exactly_one_kind() -> None:
    kinds = [a.WhichOneof("kind") for a in _actions()]
    assert kinds == [
        "tap", "tap", "swipe", "input_text", "press_key", "launch_app", "terminate_app",
        "get_ui_tree", "complete",
    ]  # fmt: skip


def test_malformed_bytes_are_refused() -> None:
    with pytest.raises(DecodeError):
        lease_service_pb2.LeaseRequest.FromString(b"\x0a\xff\xff\xff\xff\x0f")
