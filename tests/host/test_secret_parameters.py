"""Secret parameters on the host: typed where the decision says `{{secret:NAME}}`, nowhere else.

The real agent loop on a virtual phone with the offline planner (through `DirectPlanner`, the
typed contract both transports use) and the host's timeline store. The contacts editor's Phone
field does not mask, so after typing the phone shows the value: the host scrubs it from every
later scene (the field then reads "•••"), and the planner must take that field as filled (the
rule that ended the offline planner's 28 retypes of a sensitive value).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.agent.progress import ProgressHolder
from host.devices.base import DeviceError
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.perceive import Perceiver
from host.planner_client import DirectPlanner
from host.timeline.store import TimelineStore
from planner.planner import Planner, make_planner
from planner.settings import PlannerSettings
from tests.planner import scenes

GOAL = "Create a contact named Ada Lovelace with phone {{secret:phone_number}}"


def _loop(phone: VirtualPhone, store: TimelineStore, planner: Planner) -> AgentLoop:
    return AgentLoop(
        VirtualDriver(phone),
        DirectPlanner(planner),
        Perceiver(None, retry_delay_s=0),
        store,
        LoopSettings(max_steps=12, settle_delay_s=0, ocr=False),
    )


def _files(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


async def test_the_secret_is_typed_once_and_recorded_nowhere(tmp_path: Path) -> None:
    value = f"555 {uuid.uuid4().int % 10**7:07d}"
    phone = VirtualPhone("emulator-5554")
    store = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    planner = make_planner(PlannerSettings(provider="offline"))
    try:
        outcome = await _loop(phone, store, planner).run(
            TaskSpec("t1", 1, GOAL, phone.serial, secrets={"phone_number": value})
        )
        steps = store.steps("t1", 1)
    finally:
        store.close()
        await planner.aclose()
    assert outcome.status == "succeeded", outcome.summary
    assert [(c.name, c.phone) for c in phone.state.contacts] == [("Ada Lovelace", value)]
    typed = [s.arguments.get("text") for s in steps if s.tool_name == "input_text"]
    assert typed.count("{{secret:phone_number}}") == 1  # once: the masked field counts as filled
    assert value.encode() not in _files(tmp_path)  # timeline rows, prompts, screenshots' paths


async def test_a_reference_to_a_secret_the_task_lacks_types_nothing(tmp_path: Path) -> None:
    phone = VirtualPhone("emulator-5554")
    store = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    planner = make_planner(PlannerSettings(provider="offline"))
    try:
        loop = _loop(phone, store, planner)
        loop.settings.max_steps = 6
        await loop.run(TaskSpec("t2", 1, GOAL, phone.serial))
        steps = store.steps("t2", 1)
    finally:
        store.close()
        await planner.aclose()
    refused = [s for s in steps if s.arguments.get("text") == "{{secret:phone_number}}"]
    assert refused and not refused[0].success
    assert "secret 'phone_number'" in (refused[0].error or "")
    assert all(c.phone != "{{secret:phone_number}}" for c in phone.state.contacts)
    assert "{{secret" not in "".join(phone.current_page().fields.values())


async def test_the_offline_planner_takes_a_masked_field_as_filled() -> None:
    """Whatever masked it (the phone's password dots or the host's scrub), a field showing only
    mask characters holds its secret: the next step saves instead of typing again."""
    planner = make_planner(PlannerSettings(provider="offline"))
    try:
        for shown in ("•••", "••••••••", "********"):
            scene = scenes.contact_editor(name="Ada Lovelace", phone=shown)
            decision = await DirectPlanner(planner).decide(GOAL, scene, [])
            assert decision.tool_name == "tap", (shown, decision.rationale)
            assert decision.action.tap.element_id == "e3"  # Save
        empty = await DirectPlanner(planner).decide(
            GOAL, scenes.contact_editor(name="Ada Lovelace"), []
        )
        assert empty.tool_name == "input_text"
        assert empty.action.input_text.text == "{{secret:phone_number}}"
        assert not empty.action.input_text.sensitive  # a name, not a value: it may be logged
        pin = await DirectPlanner(planner).decide(
            "Sign in with password {{secret:app_password}}", scenes.login_form("••••"), []
        )
        assert pin.tool_name == "tap" and pin.action.tap.element_id == "e3"
    finally:
        await planner.aclose()


class EchoingDriver(VirtualDriver):
    """A phone whose typing fails with a message quoting what it was asked to type (a ROM's
    exception echoing its input; the virtual phone's own typing never fails so)."""

    def input_text(self, text: str) -> None:
        if not any(c.isdigit() for c in text):  # the name goes in; the phone number fails
            return super().input_text(text)
        raise DeviceError(f"setText({text!r}) failed: IllegalStateException")


async def test_a_failed_typing_that_quotes_the_secret_shows_it_nowhere(tmp_path: Path) -> None:
    """Before, the step's progress line (live on both consoles, sent to the cloud in the
    renewal's Progress and written to the timeline) carried the error as the driver said it,
    the secret with it; only the log line below it was masked."""
    value = f"555 {uuid.uuid4().int % 10**7:07d}"
    phone = VirtualPhone("emulator-5554")
    store = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    planner = make_planner(PlannerSettings(provider="offline"))
    progress = ProgressHolder()
    lines: list[str] = []
    progress.add_listener(lambda snap: lines.append(snap.summary))
    loop = AgentLoop(
        EchoingDriver(phone),
        DirectPlanner(planner),
        Perceiver(None, retry_delay_s=0),
        store,
        LoopSettings(max_steps=6, settle_delay_s=0, ocr=False),
    )
    try:
        await loop.run(
            TaskSpec("t1", 1, GOAL, phone.serial, secrets={"phone_number": value}), progress
        )
    finally:
        store.close()
        await planner.aclose()
    failed = [line for line in lines if "setText(" in line]
    assert failed, lines  # the typing was tried, and failed
    assert not [line for line in lines if value in line], failed
    assert value.encode() not in _files(tmp_path)
