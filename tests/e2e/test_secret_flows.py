"""A learned flow whose step types a secret parameter: the model types `{{secret:pin}}` marked
sensitive, the decision log keeps the reference (it is no secret: the goal carries it), the flow
keeps it in its step, and a replay on a task carrying another value for `pin` has the host type
that value — through the real cloud, host, virtual phone over adb and the real Anthropic SDK
against the local fake model server (which a replay must not call)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from amc.v1 import decision_log_service_pb2, task_service_pb2, types_pb2
from console.embedded import EmbeddedStack, Transport, embedded_stack, follow_tasks
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.hierarchy import parse_scene
from host.perception.perceive import Perceiver
from tests.e2e.test_flows import _flows_when
from tests.support.fakes import FakeModelServer, anthropic_message, text, tool_use
from tests.support.migrated import seeded

KEY = f"sk-ant-test-{secrets.token_hex(8)}"
REFERENCE = "{{secret:pin}}"
GOAL = f"Create a contact with the phone {REFERENCE}"
FIRST = f"Pa{secrets.randbelow(10**6):06d}"
SECOND = f"Qb{secrets.randbelow(10**6):06d}"


@pytest.fixture
def fake_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    with FakeModelServer(anthropic_key=KEY) as fake:
        for name in list(os.environ):
            if name.startswith(("AMC_PLANNER_", "ANTHROPIC_", "OPENAI_", "AI_PLANNER_")):
                monkeypatch.delenv(name)
        monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", fake.anthropic_base_url)
        monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
        yield fake


def _ids() -> tuple[str, str]:
    """Ids of "Create contact" and the Phone field as the host numbers them, read off a probe
    phone in the same state."""
    phone = VirtualPhone("probe")
    perceiver = Perceiver(None, retry_delay_s=0)
    phone.launch("com.android.contacts")
    scene = perceiver.perceive(VirtualDriver(phone), with_ocr=False).scene
    create = next(e for e in scene.elements if e.content_desc == "Create contact")
    phone.tap(*create.bounds.center)
    form = perceiver.perceive(VirtualDriver(phone), with_ocr=False).scene
    number = next(e for e in form.elements if e.resource_id.endswith("/phone"))
    return create.element_id, number.element_id


def _script(fake: FakeModelServer) -> None:
    create, phone_field = _ids()
    fake.script_anthropic(
        anthropic_message(
            text("Open Contacts."),
            tool_use(
                "launch_app",
                {
                    "package_name": "com.android.contacts",
                    "purpose": "open Contacts",
                    "expected_outcome": "the contacts list is shown",
                },
            ),
        ),
        anthropic_message(
            text("Create one."),
            tool_use(
                "tap",
                {
                    "element_id": create,
                    "purpose": "create a contact",
                    "expected_outcome": "the contact editor is open",
                },
            ),
        ),
        anthropic_message(
            text("Type the phone the task carries as a secret."),
            tool_use(
                "input_text",
                {
                    "text": REFERENCE,
                    "sensitive": True,
                    "element_id": phone_field,
                    "purpose": "fill in the phone",
                    "expected_outcome": "the 'Phone' field is filled (masked)",
                },
            ),
        ),
        anthropic_message(
            text("Typed."), tool_use("complete", {"success": True, "reason": "the phone is typed"})
        ),
    )


async def _run(stack: EmbeddedStack, value: str) -> types_pb2.Task:
    submitted = await stack.operator.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(goal=GOAL, secrets={"pin": value})
    )
    task_id = submitted.task.task_id
    await follow_tasks(stack.operator, [task_id], Console(quiet=True), 30)
    reply: task_service_pb2.GetTaskResponse = await stack.operator.tasks.GetTask(
        task_service_pb2.GetTaskRequest(task_id=task_id)
    )
    return reply.task


def _typed(stack: EmbeddedStack) -> list[str]:
    phone = next(iter(stack.adb.phones.values()))
    return [e.text for e in parse_scene(phone.dump_hierarchy(), None, None).elements]


@pytest.mark.parametrize("transport", ["cloud", "direct"])
async def test_a_flow_that_types_a_secret_reference_replays_it_with_the_new_tasks_value(
    fake_model: FakeModelServer, tmp_path: Path, transport: Transport
) -> None:
    """On the direct transport the host plans and ships its decisions itself: the one it
    ships must keep the reference too (its redactor scrubbed it to "•••")."""
    _script(fake_model)
    async with embedded_stack(seeded(tmp_path), transport=transport) as stack:
        first = await _run(stack, FIRST)
        assert first.status == types_pb2.TASK_STATUS_SUCCEEDED, first.result_summary
        assert FIRST in _typed(stack)
        (flow,) = await _flows_when(stack, 1)  # learned once the log ends in `complete`
        logged = await stack.operator.decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=first.task_id)
        )
        typing = next(d for d in logged.decisions if d.tool_name == "input_text")
        assert typing.action.input_text.text == REFERENCE  # the reference, not "•••"
        assert REFERENCE in typing.arguments_json
        step = next(s for s in flow.steps if s.tool_name == "input_text")
        assert step.action.input_text.text == REFERENCE and not step.text_parameter

        next(iter(stack.adb.phones.values())).reset()
        calls = len(fake_model.requests)
        again = await _run(stack, SECOND)
        assert again.status == types_pb2.TASK_STATUS_SUCCEEDED, again.result_summary
        assert again.attempts[0].flow.flow_id == flow.flow_id
        assert len(fake_model.requests) == calls  # no model call: the flow typed it
        shown = _typed(stack)
        assert SECOND in shown and FIRST not in shown
