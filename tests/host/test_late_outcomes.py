"""The checker's verdict on a step whose effect shows a moment late (an app that loads first):
the host looks again before it calls the outcome not met."""

from __future__ import annotations

from pathlib import Path

from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.agent.progress import ProgressHolder
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.perceive import Perceiver
from host.timeline.store import TimelineStore
from planner.history import WorldEvent
from tests.host.scripted_planner import ScriptedPlanner, Step, by_text


class LateDriver(VirtualDriver):
    """The virtual phone, its first tap shown only from the second screen read after it on
    (the first read after the tap still shows the page before)."""

    def __init__(self, phone: VirtualPhone) -> None:
        super().__init__(phone)
        self.held: tuple[int, int] | None = None
        self.late = True
        self.reads = 0

    def tap(self, x: int, y: int) -> None:
        if self.late:
            self.late, self.held, self.reads = False, (x, y), 0
            return
        super().tap(x, y)

    def dump_hierarchy(self) -> str:
        if self.held is not None:
            self.reads += 1
            if self.reads > 1:
                held, self.held = self.held, None
                super().tap(*held)
        return super().dump_hierarchy()


async def test_an_outcome_that_shows_a_moment_late_is_found_met(tmp_path: Path) -> None:
    """The host judged a step on the one screen it read after the settle delay: a page that
    opened a moment later was "not met" in the record, in the next prompt and in a learned
    flow (a run whose last step reads so teaches none; a replay hands over there)."""
    store = TimelineStore(tmp_path / "t.sqlite3", tmp_path / "artifacts")
    phone = VirtualPhone("v")
    planner = ScriptedPlanner(
        [
            Step(
                "launch_app",
                {"package_name": "com.android.settings"},
                "open Settings",
                "the 'Settings' page is open",
            ),
            Step("tap", by_text("Display"), "open 'Display'", "the 'Display' page is open"),
            Step(
                "tap",
                by_text("Dark theme"),
                "turn 'Dark theme' on",
                "the 'Dark theme' switch is on",
            ),
            Step("complete", {"success": True, "reason": "dark theme is on"}),
        ]
    )
    loop = AgentLoop(
        LateDriver(phone),
        planner,
        Perceiver(None, retries=2, retry_delay_s=0),
        store,
        LoopSettings(max_steps=8, settle_delay_s=0, ocr=False),
    )
    try:
        outcome = await loop.run(
            TaskSpec("t1", 1, "Turn on dark theme", "v", "L1"), ProgressHolder()
        )
        assert outcome.status == "succeeded" and phone.state.flag("dark_theme")
        records = store.steps("t1", 1)
        display = records[1]
        assert display.verdict is not None
        assert display.verdict["verdict"] == "met", display.verdict
        told = planner.histories[2][-1]  # what the next prompt says of the step
        assert isinstance(told, WorldEvent) and told.verdict == "met"
        assert [r.verdict["verdict"] for r in records[:3] if r.verdict] == ["met"] * 3
    finally:
        store.close()
