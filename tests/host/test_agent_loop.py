"""The agent loop on virtual phones: scripted and offline planners, timeline, progress, failures."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from amc.v1 import types_pb2
from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.agent.progress import ProgressHolder
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.suite import SUITE
from host.perception.ocr import OcrPool
from host.perception.perceive import Perceiver
from host.planner_client import StepPlanner
from host.timeline.store import TimelineStore
from planner.planner import make_planner
from planner.settings import PlannerSettings
from tests.host.scripted_planner import ScriptedPlanner, Step, by_text

SETTINGS_APP = "com.android.settings"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TimelineStore]:
    s = TimelineStore(tmp_path / "task_progress.sqlite3", tmp_path / "artifacts")
    yield s
    s.close()


@pytest.fixture(scope="module")
def ocr() -> Iterator[OcrPool]:
    pool = OcrPool()
    yield pool
    pool.close()


def _loop(
    phone: VirtualPhone,
    planner: StepPlanner,
    store: TimelineStore | None,
    ocr: OcrPool | None = None,
    max_steps: int = 10,
) -> AgentLoop:
    return AgentLoop(
        VirtualDriver(phone),
        planner,
        Perceiver(ocr, retries=2, retry_delay_s=0),
        store,
        LoopSettings(max_steps=max_steps, settle_delay_s=0, ocr=ocr is not None),
    )


DARK_THEME = [
    Step("launch_app", {"package_name": SETTINGS_APP}, "open Settings", "Settings list shows"),
    Step("tap", by_text("Display"), "open display settings", "Display page shows"),
    Step("tap", by_text("Dark theme"), "turn dark theme on", "the switch is on"),
    Step("complete", {"success": True, "reason": "dark theme is on"}),
]


async def test_scripted_task_succeeds_and_records_every_step(
    store: TimelineStore, ocr: OcrPool
) -> None:
    phone = VirtualPhone("emulator-5554")
    planner = ScriptedPlanner(list(DARK_THEME))
    progress = ProgressHolder()
    summaries: list[str] = []
    progress.add_listener(lambda s: summaries.append(s.summary))
    spec = TaskSpec("t1", 1, "Turn on dark theme", "emulator-5554", "L1")
    outcome = await _loop(phone, planner, store, ocr).run(spec, progress)

    assert outcome.status == "succeeded"
    assert outcome.summary == "dark theme is on"
    assert phone.state.flag("dark_theme")
    assert "step 2: tap 'Display' — open display settings" in summaries
    assert all(len(s) <= 200 for s in summaries)
    assert progress.snapshot().step_status == types_pb2.STEP_STATUS_SUCCEEDED

    records = store.steps("t1", 1)
    assert [r.tool_name for r in records] == ["launch_app", "tap", "tap", "complete"]
    tap = records[1]
    assert tap.system_prompt
    assert "Android phone" in tap.system_prompt
    assert tap.user_prompt
    assert "Turn on dark theme" in tap.user_prompt
    assert tap.rationale == "Step 2: open display settings."
    assert tap.thinking == [{"text": "considering the screen", "redacted": False}]
    assert tap.purpose == "open display settings"
    assert tap.expected_outcome == "Display page shows"
    assert "purpose" not in tap.action  # intent stripped from the executed action
    assert tap.action["tap"]["element_id"].startswith("e")
    assert tap.result["ok"] is True
    assert tap.before_screenshot_path != tap.after_screenshot_path
    assert tap.screenshot_path == tap.after_screenshot_path
    for path in (tap.before_screenshot_path, tap.after_screenshot_path):
        assert store.artifacts.read(path or "").startswith(b"\x89PNG")
    assert any("Display" in o["text"] for o in tap.ocr)
    assert tap.usage["input_tokens"] == 100
    assert {"plan_s", "act_s", "perceive_before_s", "perceive_after_s"} <= set(tap.timings)
    event = tap.event
    assert event.page
    assert event.page.startswith(SETTINGS_APP)
    assert event.action["target"] == "Display"
    assert event.success is True
    # The planner got the compact history of earlier steps.
    assert len(planner.histories[2]) == 2
    task = store.get_task("t1", 1)
    assert task is not None
    assert task.status == "succeeded"
    assert task.step_index == 4


async def test_sensitive_text_is_typed_but_never_stored(store: TimelineStore) -> None:
    phone = VirtualPhone("emulator-5554")
    secret = "hunter2-very-secret"
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.contacts"}),
            Step("tap", by_text("Create contact")),
            Step(
                "input_text",
                lambda scene: {
                    "text": secret,
                    "sensitive": True,
                    "element_id": next(
                        e.element_id for e in scene.elements if "EditText" in e.class_name
                    ),
                },
            ),
            Step("complete", {"success": True, "reason": "typed"}),
        ]
    )
    outcome = await _loop(phone, planner, store).run(TaskSpec("t2", 1, "type it", "s"))
    assert outcome.status == "succeeded"
    assert secret in phone.dump_hierarchy()  # it was typed
    record = store.steps("t2", 1)[2]
    assert record.arguments["text"] == "•••"
    assert record.action["input_text"]["text"] == "•••"
    assert record.world_event["action"]["text"] == "•••"
    store.close()
    for f in store.db_path.parent.iterdir():
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f.name


async def test_get_ui_tree_and_failed_actions_are_recorded(store: TimelineStore) -> None:
    phone = VirtualPhone("emulator-5554")
    planner = ScriptedPlanner(
        [
            Step("get_ui_tree"),
            Step("tap", {"element_id": "e999"}, "tap a ghost", "nothing"),
            Step("complete", {"success": False, "reason": "cannot find it"}),
        ]
    )
    outcome = await _loop(phone, planner, store).run(TaskSpec("t3", 1, "g", "s"))
    assert outcome.status == "failed"
    assert outcome.summary == "cannot find it"
    tree, ghost, _ = store.steps("t3", 1)
    nodes = tree.result["nodes"]
    assert nodes
    assert all({"id", "bounds", "center", "source"} <= set(n) for n in nodes)
    assert ghost.success is False
    assert "e999" in (ghost.error or "")
    assert ghost.after_screenshot_path  # taken also when the action failed
    assert ghost.world_event["success"] is False


async def test_unplugged_phone_fails_only_its_task(store: TimelineStore) -> None:
    gone = VirtualPhone("emulator-5554")
    other = VirtualPhone("emulator-5556")
    unplugging = [
        Step("launch_app", {"package_name": SETTINGS_APP}),
        Step("tap", by_text("Display"), before=gone.unplug),
        Step("complete", {"success": True, "reason": "?"}),
    ]
    first, second = await asyncio.gather(
        _loop(gone, ScriptedPlanner(unplugging), store).run(
            TaskSpec("t4", 1, "g", "emulator-5554")
        ),
        _loop(other, ScriptedPlanner(list(DARK_THEME)), store).run(
            TaskSpec("t5", 1, "Turn on dark theme", "emulator-5556")
        ),
    )
    assert first.status == "failed"
    assert first.summary == "phone emulator-5554 disconnected"
    assert first.device_gone
    assert first.retryable  # nothing the task did: the cloud queues its next attempt
    assert second.status == "succeeded"
    assert other.state.flag("dark_theme")


async def test_cancel_stops_within_a_step(store: TimelineStore) -> None:
    """A cancel that arrives while the step's planning call hangs ends the run at once: the
    loop does not wait for the step to finish, and the abandoned step is not recorded."""
    phone = VirtualPhone("emulator-5554")
    planner = ScriptedPlanner(
        [Step("swipe", {"start_x": 500, "start_y": 1500, "end_x": 500, "end_y": 600})]
    )
    planner.block = asyncio.Event()  # planning never returns on its own
    cancel = asyncio.Event()
    run = asyncio.create_task(
        _loop(phone, planner, store).run(TaskSpec("t6", 1, "g", "s"), ProgressHolder(), cancel)
    )
    await asyncio.wait_for(planner.planning.wait(), 10)  # the first step is planning now
    assert not run.done()
    cancel.set()
    outcome = await asyncio.wait_for(run, 10)
    assert outcome.status == "cancelled"
    assert planner.seen == []  # the planning call never got past its block: the step was cut
    assert store.steps("t6", 1) == []


async def test_step_limit(store: TimelineStore) -> None:
    phone = VirtualPhone("emulator-5554")
    planner = ScriptedPlanner([Step("press_key", {"key": "home"})])
    outcome = await _loop(phone, planner, store, max_steps=3).run(TaskSpec("t7", 1, "g", "s"))
    assert outcome.status == "failed"
    assert "step limit" in outcome.summary
    assert len(store.steps("t7", 1)) == 3


async def test_offline_planner_runs_the_suite(store: TimelineStore) -> None:
    planner = make_planner(PlannerSettings(provider="offline"))
    passed: list[str] = []
    for i, task in enumerate(SUITE):
        phone = VirtualPhone("emulator-5554")
        task.setup(phone)
        outcome = await _loop(phone, planner, store, max_steps=30).run(
            TaskSpec(f"suite-{i}", 1, task.goal, "emulator-5554")
        )
        if outcome.status == "succeeded" and task.check(phone):
            passed.append(task.name)
    rate = len(passed) / len(SUITE)
    print(f"offline planner on the virtual suite: {len(passed)}/{len(SUITE)} = {rate:.0%}")
    assert "dark_theme_on" in passed
    assert rate >= 0.5
