"""The checker's verdict on a step whose effect shows a moment late (an app that loads first):
the host looks again before it calls the outcome not met."""

from __future__ import annotations

import asyncio
from pathlib import Path

from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.agent.progress import ProgressHolder
from host.devices.base import DeviceError
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


class FailingLookDriver(VirtualDriver):
    """The virtual phone, its first tap held: the first look after it still shows the page
    before; the second look's screenshot fails (a screencap error), the tap showing from then
    on, so a screenshot taken after that failure shows the page the tap opened."""

    def __init__(self, phone: VirtualPhone) -> None:
        super().__init__(phone)
        self.held: tuple[int, int] | None = None
        self.late = True
        self.shots: list[bytes] = []  # the screenshots read after the held tap

    def tap(self, x: int, y: int) -> None:
        if self.late:
            self.late, self.held = False, (x, y)
            return
        super().tap(x, y)

    def screenshot_png(self) -> bytes:
        if self.held is not None and self.shots:
            held, self.held = self.held, None
            super().tap(*held)
            raise DeviceError("screencap failed")
        png = super().screenshot_png()
        if self.held is not None:
            self.shots.append(png)
        return png


async def test_a_look_again_that_fails_leaves_the_step_as_the_look_before_saw_it(
    tmp_path: Path,
) -> None:
    """A look again that fails ends the looking: the step stays judged, recorded and shipped
    as the look before saw it. Before, the failed look's error was recorded as the step's
    after ("after_error": its screen could not be read) and the screenshot taken after the
    failure became the step's after image (here the 'Display' page), beside a verdict that
    says the screen shows 'Settings'."""
    store = TimelineStore(tmp_path / "t.sqlite3", tmp_path / "artifacts")
    phone = VirtualPhone("v")
    driver = FailingLookDriver(phone)
    planner = ScriptedPlanner(
        [
            Step(
                "launch_app",
                {"package_name": "com.android.settings"},
                "open Settings",
                "the 'Settings' page is open",
            ),
            Step("tap", by_text("Display"), "open 'Display'", "the 'Display' page is open"),
            Step("complete", {"success": True, "reason": "the 'Display' page is open"}),
        ]
    )
    loop = AgentLoop(
        driver,
        planner,
        Perceiver(None, retries=2, retry_delay_s=0),
        store,
        LoopSettings(max_steps=5, settle_delay_s=0, ocr=False),
    )
    try:
        await loop.run(TaskSpec("t1", 1, "Open Display", "v", "L1"), ProgressHolder())
        display = store.steps("t1", 1)[1]
        assert display.verdict is not None and display.verdict["verdict"] == "not_met"
        assert "Settings" in display.verdict["evidence"], display.verdict
        assert "after_error" not in display.result, display.result
        assert display.after_screenshot_path is not None
        (seen,) = driver.shots  # the one look after the tap that read the screen
        assert store.artifacts.read(display.after_screenshot_path) == seen
    finally:
        store.close()


class CancelledLookDriver(VirtualDriver):
    """The virtual phone, whose first tap never shows; the attempt is cancelled (`cancel` set)
    while the first look after that tap reads the screen. Counts the screen reads from then."""

    def __init__(self, phone: VirtualPhone, cancel: asyncio.Event) -> None:
        super().__init__(phone)
        self.cancel = cancel
        self.loop = asyncio.get_running_loop()
        self.tapped = self.asked = False
        self.reads_after_cancel = 0

    def tap(self, x: int, y: int) -> None:
        self.tapped = True  # never shown: every look after it finds the outcome not met

    def dump_hierarchy(self) -> str:
        if self.cancel.is_set():
            self.reads_after_cancel += 1
        elif self.tapped and not self.asked:
            self.asked = True
            # On the loop (an asyncio.Event is not for other threads), before this look's
            # answer reaches it.
            self.loop.call_soon_threadsafe(self.cancel.set)
        return super().dump_hierarchy()


async def test_a_cancel_stops_the_looking_again(tmp_path: Path) -> None:
    """The looks again checked no cancel: an attempt cancelled (revoked, out of time, the host
    stopping) while its step was found not met still read the phone twice more, each a
    screenshot, a dump and OCR, before it stopped. Now a cancel ends the looking."""
    store = TimelineStore(tmp_path / "t.sqlite3", tmp_path / "artifacts")
    phone = VirtualPhone("v")
    cancel = asyncio.Event()
    driver = CancelledLookDriver(phone, cancel)
    planner = ScriptedPlanner(
        [
            Step("tap", by_text("Settings"), "open Settings", "the 'Settings' page is open"),
            Step("complete", {"success": True, "reason": "Settings is open"}),
        ]
    )
    loop = AgentLoop(
        driver,
        planner,
        Perceiver(None, retries=2, retry_delay_s=0),
        store,
        LoopSettings(max_steps=5, settle_delay_s=0, ocr=False),
    )
    try:
        outcome = await loop.run(
            TaskSpec("t1", 1, "Open Settings", "v", "L1"), ProgressHolder(), cancel
        )
        assert outcome.status == "cancelled", outcome
        assert driver.reads_after_cancel == 0
    finally:
        store.close()
