"""A learned flow for tests, made the way the cloud makes one (`synthesize` over decision-log
steps), plus helpers to store it."""

from __future__ import annotations

from amc.v1 import types_pb2
from cloud.store import flows
from cloud.store.database import Store
from cloud.store.models import FlowRow
from planner.flows.synthesis import SourceStep, synthesize

LAUNCHER = "com.android.launcher3: "
SETTINGS = "com.android.settings: Settings"
DISPLAY = "com.android.settings: Display"


def _target(
    text: str = "", row_label: str = "", checkable: bool = False
) -> types_pb2.ElementTarget:
    return types_pb2.ElementTarget(
        resource_id="android:id/title" if text else "",
        text=text,
        class_name="android.widget.TextView" if text else "android.widget.LinearLayout",
        row_label=row_label,
        alike_count=1,
        checkable=checkable,
        bounds=types_pb2.Rect(left=0, top=100, right=1080, bottom=200),
    )


def _tap(
    index: int, page: str, target: types_pb2.ElementTarget, purpose: str, expected: str
) -> SourceStep:
    action = types_pb2.Action(purpose=purpose, expected_outcome=expected)
    action.tap.element_id = f"e{index}"
    return SourceStep(
        step_index=index,
        tool_name="tap",
        arguments={"element_id": f"e{index}"},
        action=action,
        target=target,
        purpose=purpose,
        expected_outcome=expected,
        page=page,
        verdict="met",
        executed=True,
    )


def _complete(index: int, page: str, reason: str) -> SourceStep:
    action = types_pb2.Action()
    action.complete.success = True
    action.complete.reason = reason
    return SourceStep(
        index, "complete", {"success": True, "reason": reason}, action, None, "", "", page
    )


def dark_theme_steps() -> list[SourceStep]:
    """Home → Settings → Display → the Dark theme switch on → complete."""
    return [
        _tap(1, LAUNCHER, _target("Settings"), "open 'Settings'", "the 'Settings' page is open"),
        _tap(2, SETTINGS, _target("Display"), "open 'Display'", "the 'Display' page is open"),
        _tap(
            3,
            DISPLAY,
            _target(row_label="Dark theme", checkable=True),
            "turn 'Dark theme' on",
            "the 'Dark theme' switch is on",
        ),
        _complete(4, DISPLAY, "'Dark theme' is on"),
    ]


def contact_steps() -> list[SourceStep]:
    """A contact typed from the goal (two parameters) and a secret (never stored)."""
    steps = [
        _tap(1, "com.android.contacts: Contacts", _target("Create contact"), "create", "an editor")
    ]
    for i, (text, hint, sensitive) in enumerate(
        [("Ada Lovelace", "Name", False), ("555 0100", "Phone", False), ("hunter2", "PIN", True)],
        start=2,
    ):
        action = types_pb2.Action(purpose=f"fill in '{hint}'", expected_outcome="filled")
        action.input_text.text = "•••" if sensitive else text
        action.input_text.sensitive = sensitive
        action.input_text.element_id = f"e{i}"
        steps.append(
            SourceStep(
                i,
                "input_text",
                {
                    "text": "•••" if sensitive else text,
                    "sensitive": sensitive,
                    "element_id": f"e{i}",
                },
                action,
                types_pb2.ElementTarget(
                    hint=hint, class_name="android.widget.EditText", alike_count=3
                ),
                f"fill in '{hint}'",
                f"the '{hint}' field shows '{text}'"
                if not sensitive
                else "the field is filled (masked)",
                "com.android.contacts: Create contact",
                "met",
                True,
            )
        )
    steps.append(_complete(5, "com.android.contacts: Ada Lovelace", "saved"))
    return steps


def dark_theme_flow(goal: str = "Turn on dark theme") -> types_pb2.Flow:
    made = synthesize(goal, dark_theme_steps())
    assert made.flow is not None, made.why
    return made.flow


async def store_flow(
    store: Store, goal: str = "Turn on dark theme", task_id: str = "t-src"
) -> FlowRow:
    made = synthesize(goal, dark_theme_steps())
    assert made.flow is not None
    row, _ = await flows.add(store, made.flow, made.fingerprint, task_id, 1)
    return row
