"""Helpers for the host console tests: fill a store with the real agent loop, log in, serve.

Kept apart from conftest so tests can import the ids and helpers by name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.agent.progress import ProgressHolder
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.ocr import OcrPool
from host.perception.perceive import Perceiver
from host.planner_client import StepPlanner
from host.settings import HostSettings
from host.timeline.record import TimelineRecord
from host.timeline.store import TimelineStore
from planner.decision import Decision, ThinkingBlock, Usage
from planner.history import WorldEvent
from planner.scene import Scene
from tests.host import lease_fake
from tests.host.scripted_planner import ScriptedPlanner, Step, by_text

SETTINGS_APP = "com.android.settings"
T_DARK = "task-dark"
T_SECRET = "task-secret"
T_LEGACY = "task-legacy"
SECRET = "hunter2-very-secret"
LEGACY_GOAL = "Open the calculator (recorded by an older host)"

DARK_THEME = [
    Step("launch_app", {"package_name": SETTINGS_APP}, "open Settings", "Settings list shows"),
    Step("get_ui_tree"),
    Step("tap", by_text("Display"), "open display settings", "Display page shows"),
    Step("tap", by_text("Dark theme"), "turn dark theme on", "the switch is on"),
    Step("complete", {"success": True, "reason": "dark theme is on"}),
]


@dataclass
class StoreOnly:
    """A host reduced to its store (no lease client, no phones): what the timeline pages need."""

    store: TimelineStore
    lease: None = None
    registry: None = None


class RedactingPlanner:
    """A scripted planner whose thinking on step 3 came back redacted (as Anthropic can)."""

    def __init__(self, steps: list[Step]) -> None:
        self.inner = ScriptedPlanner(steps)
        self.calls = 0

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        self.calls += 1
        decision = await self.inner.decide(goal, scene, history, screenshot)
        if self.calls == 3:
            decision = dataclasses.replace(
                decision,
                thinking=[
                    ThinkingBlock("", redacted=True),
                    ThinkingBlock("the row is there"),
                    ThinkingBlock(""),  # a signature-only block: omitted, not redacted
                ],
                thinking_kind="summarized",
                # A priced step: the page shows its cost and the attempt's total.
                usage=Usage(input_tokens=100, output_tokens=20, cost_usd=0.125),
            )
        return decision


@dataclass
class Filled:
    """The session's store, filled by the agent loop, and the host view over it."""

    store: TimelineStore
    state: StoreOnly


def _loop(
    phone: VirtualPhone, planner: StepPlanner, store: TimelineStore, ocr: OcrPool
) -> AgentLoop:
    return AgentLoop(
        VirtualDriver(phone),
        planner,
        Perceiver(ocr, retries=2, retry_delay_s=0),
        store,
        LoopSettings(max_steps=10, settle_delay_s=0, ocr=True),
    )


def _secret_steps() -> list[Step]:
    return [
        Step("launch_app", {"package_name": "com.android.contacts"}, "open Contacts"),
        Step("tap", by_text("Create contact"), "start a new contact"),
        Step(
            "input_text",
            lambda scene: {
                "text": SECRET,
                "sensitive": True,
                "element_id": next(
                    e.element_id for e in scene.elements if "EditText" in e.class_name
                ),
            },
            "type the password",
            "the field holds it",
        ),
        Step("complete", {"success": True, "reason": "typed"}),
    ]


def _legacy_record(store: TimelineStore) -> None:
    """A task as an older host stored it: `prompt` = the goal, `tool_call`, one screenshot."""
    store.start_task(T_LEGACY, 1, LEGACY_GOAL, "emulator-5554", "L0")
    store.finish_task(T_LEGACY, 1, "succeeded", "calculator open")
    shot = store.artifacts.read(store.steps(T_DARK, 1)[0].after_screenshot_path or "")
    rel = store.save_screenshot(T_LEGACY, 1, "step1.png", shot)
    store.append_raw_step(
        T_LEGACY,
        1,
        1,
        {
            "task_id": T_LEGACY,
            "step": 1,
            "prompt": LEGACY_GOAL,
            "tool_call": {
                "action": "launch_app",
                "description": "open the calculator",
                "args": {"package_name": "com.android.calculator2"},
            },
            "screenshot_path": rel,
            "result": {"ok": True},
        },
    )
    store.append_raw_step(T_LEGACY, 1, 2, {"step": 2, "note": "nothing else was kept"})


def fill_timeline(store: TimelineStore, ocr: OcrPool) -> None:
    """Run two tasks with the real agent loop on virtual phones, then import a legacy one."""

    async def run() -> None:
        dark = await _loop(
            VirtualPhone("emulator-5554"), RedactingPlanner(DARK_THEME), store, ocr
        ).run(TaskSpec(T_DARK, 1, "Turn on dark theme", "emulator-5554", "L1"), ProgressHolder())
        assert dark.status == "succeeded", dark.summary
        secret = await _loop(
            VirtualPhone("emulator-5556"), ScriptedPlanner(_secret_steps()), store, ocr
        ).run(TaskSpec(T_SECRET, 1, "Type the password", "emulator-5556", "L2"))
        assert secret.status == "succeeded", secret.summary

    asyncio.run(run())
    _legacy_record(store)


T_LONG = "task-long"
#: Steps of the long attempt: more than the task page shows (`routes.SHOWN_STEPS`, 50).
LONG_STEPS = 62


def long_step(index: int, task_id: str = T_LONG) -> TimelineRecord:
    """Step `index` of the long attempt: a tap with prompts of its own ("user prompt of step
    N"), the checker's verdict (every third not met), the model's judgement of the step before
    it, 12 billed tokens at $0.001."""
    return TimelineRecord(
        task_id,
        1,
        index,
        tool_name="tap",
        arguments={"element_id": f"e{index}"},
        system_prompt=f"system prompt of step {index}",
        user_prompt=f"user prompt of step {index}",
        verdict={"verdict": "not_met" if index % 3 == 0 else "met", "evidence": "looked"},
        previous_step={"verdict": "met", "note": f"step {index - 1} looked right"},
        usage={"input_tokens": 10, "output_tokens": 2, "cost_usd": 0.001},
    )


def fill_long_attempt(store: TimelineStore, task_id: str = T_LONG) -> None:
    """A running attempt of LONG_STEPS steps, stored through the store's own API."""
    store.start_task(task_id, 1, "Tap through a long list", "emulator-5554", "L9")
    for index in range(1, LONG_STEPS + 1):
        store.append_step(long_step(index, task_id))


HOST_ID = "console-h1"
#: Upper bound for something to appear (a bound, not a timing assertion).
WITHIN_S = 30.0


class Gate:
    """A scripted planner that holds step 2's decision until opened, so a task stays running."""

    def __init__(self, steps: list[Step]) -> None:
        self.inner = ScriptedPlanner(steps)
        self.opened = asyncio.Event()
        self.calls = 0

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        self.calls += 1
        if self.calls == 2:
            await self.opened.wait()
        return await self.inner.decide(goal, scene, history, screenshot)


DARK = [
    Step("launch_app", {"package_name": "com.android.settings"}, "open Settings"),
    Step("tap", by_text("Display"), "open display settings"),
    Step("tap", by_text("Dark theme"), "turn dark theme on"),
    Step("complete", {"success": True, "reason": "dark theme is on"}),
]


def host_settings(tmp_path: Path, port: int, pki_dir: Path) -> HostSettings:
    return lease_fake.host_settings(tmp_path, port, pki_dir, HOST_ID)


CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    match = CSRF_RE.search(html)
    assert match, "no CSRF token on the page"
    return match.group(1)


class Reply(Protocol):
    """What the tests read of a response (httpx's and the TestClient's both fit)."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...


def log_in(client: TestClient | httpx.Client, token: str) -> Reply:
    """Log in through the form, as a person would: GET the form, POST token + CSRF."""
    page = client.get("/login")
    return client.post(
        "/login", data={"token": token, "csrf_token": csrf_of(page.text), "next": "/now"}
    )


class UvicornThread:
    """A real uvicorn server on 127.0.0.1 port 0 in a thread (for the browser)."""

    def __init__(self, app: FastAPI) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="host-console", daemon=True)

    def start(self) -> str:
        self._thread.start()
        while not self.server.started and self._thread.is_alive():
            time.sleep(0.02)
        if not self.server.started:
            raise RuntimeError("uvicorn did not start")
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)
