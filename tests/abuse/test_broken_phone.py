"""A phone that returns garbage: the agent loop fails that task with a clear reason, and carries on.

`BrokenPhoneDriver` is the virtual phone's own driver with one output replaced by what a broken
phone or a hostile dumper sends (random bytes for a screenshot, a truncated dump every time),
because no working phone can be made to do that on demand. Proves: the fuzz findings of
`test_perception_fuzz.py` reach the host as a failed task whose summary names the problem, never
as an exception out of the loop, and the same loop then runs a task on a healthy phone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import pytest

from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.agent.progress import ProgressHolder
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.ocr import OcrPool
from host.perception.perceive import Perceiver
from host.timeline.store import TimelineStore
from planner.planner import make_planner
from planner.settings import PlannerSettings


class Broken(TypedDict, total=False):
    """What a BrokenPhoneDriver returns instead of the phone's own."""

    png: bytes
    dump: str


class BrokenPhoneDriver(VirtualDriver):
    """A virtual phone whose screenshots or dumps are garbage (see the module docstring)."""

    def __init__(self, phone: VirtualPhone, *, png: bytes | None = None, dump: str | None = None):
        super().__init__(phone)
        self._png, self._dump = png, dump

    def screenshot_png(self) -> bytes:
        return self._png if self._png is not None else super().screenshot_png()

    def dump_hierarchy(self) -> str:
        return self._dump if self._dump is not None else super().dump_hierarchy()


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


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        ({"png": b"\x89PNG\r\n\x1a\n garbage"}, "unreadable screenshot"),
        ({"png": b""}, "unreadable screenshot"),
        # A dump truncated every time is a window that gives no tree: the task goes on from
        # the screenshot (test_a_window_that_gives_no_ui_tree_is_planned_from_its_screenshot),
        # and here ends on the planner's own reason.
        (
            {"dump": '<?xml version="1.0"?><hierarchy rotation="0"><node bounds='},
            "nothing on screen",
        ),
    ],
)
async def test_a_broken_phone_fails_its_task_clearly_and_the_host_carries_on(
    store: TimelineStore, ocr: OcrPool, broken: Broken, reason: str
) -> None:
    planner = make_planner(PlannerSettings(provider="offline"))
    perceiver = Perceiver(ocr, retries=2, retry_delay_s=0)
    settings = LoopSettings(max_steps=10, settle_delay_s=0, ocr=True)

    bad = AgentLoop(
        BrokenPhoneDriver(VirtualPhone("emulator-5554"), **broken),
        planner,
        perceiver,
        store,
        settings,
    )
    spec = TaskSpec("t-broken", 1, "Turn on dark theme", "emulator-5554", "L1")
    outcome = await bad.run(spec, ProgressHolder())
    assert outcome.status == "failed"
    assert reason in outcome.summary.lower(), outcome.summary

    healthy_phone = VirtualPhone("emulator-5556")
    good = AgentLoop(VirtualDriver(healthy_phone), planner, perceiver, store, settings)
    spec = TaskSpec("t-healthy", 1, "Turn on dark theme", "emulator-5556", "L2")
    outcome = await good.run(spec, ProgressHolder())
    assert outcome.status == "succeeded", outcome.summary
    assert healthy_phone.state.flag("dark_theme")
