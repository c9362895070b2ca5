"""A host timeline filled by the real agent loop (virtual phones, real perception and OCR, a
scripted planner that builds the real prompts): the tasks the host console tests use (taps on
named elements, a UI-tree read, redacted thinking, a sensitive input, an older host's records)
and one more with a swipe and key presses, so every kind of drawn action is exported."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from host.agent.loop import TaskSpec
from host.devices.virtual.phone import VirtualPhone
from host.perception.ocr import OcrPool
from host.timeline.store import TimelineStore
from tests.host.console.host_console_support import (
    T_DARK,
    T_LEGACY,
    T_SECRET,
    _loop,
    fill_timeline,
)
from tests.host.scripted_planner import ScriptedPlanner, Step

T_GESTURES = "task-gestures"
HOST = "export-h1"
GESTURES = [
    Step("launch_app", {"package_name": "com.android.settings"}, "open Settings", "the list"),
    Step(
        "swipe",
        {"start_x": 540, "start_y": 1800, "end_x": 540, "end_y": 700, "duration_ms": 300},
        "scroll the list",
        "lower rows show",
    ),
    Step("press_key", {"key": "back"}, "leave Settings", "the launcher shows"),
    Step("press_key", {"key": "home"}, "go home", "the launcher shows"),
    Step("complete", {"success": False, "reason": "nothing more to do"}),
]


@dataclass
class Timeline:
    store: TimelineStore
    tasks: tuple[str, ...] = (T_DARK, T_SECRET, T_LEGACY, T_GESTURES)


@pytest.fixture(scope="session")
def timeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Timeline]:
    data = tmp_path_factory.mktemp("export-timeline")
    store = TimelineStore(data / "task_progress.sqlite3", data / "artifacts")
    pool = OcrPool()
    try:
        fill_timeline(store, pool)
        outcome = asyncio.run(
            _loop(VirtualPhone("emulator-5558"), ScriptedPlanner(list(GESTURES)), store, pool).run(
                TaskSpec(T_GESTURES, 1, "Scroll Settings and go home", "emulator-5558", "L3")
            )
        )
        assert outcome.status == "failed", outcome.summary  # "gave up", as scripted
    finally:
        pool.close()
    try:
        yield Timeline(store)
    finally:
        store.close()
