"""Session mode through the whole host: a host stops mid-task, a restarted host takes the next
attempt, and its first model request carries the earlier turns' signed thinking exactly — checked
by a local Anthropic-compatible server that rejects altered, reordered or missing reasoning.

Both planner transports: `direct` keeps the conversation in the host's local store, `cloud`
in the cloud's database (the host sends only its step; nothing of the conversation stays on
the host).

Real parts: the cloud gRPC server (mTLS, SQLite), the host agent (lease stream, session store on
disk), the virtual phone over the adb protocol, the official `anthropic` SDK; only the model is a
local fake (`tests/support/fakes/`), since no real API is reachable here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from amc.v1 import decision_log_service_pb2, task_service_pb2, types_pb2
from cloud.pki import ensure_embedded_pki
from cloud.server import build_server
from cloud.settings import CloudSettings
from cloud.store import sessions
from console.client import OperatorClient, secure_channel
from host.devices.adb_driver import AdbDriver
from host.devices.base import Driver
from host.devices.virtual.adb_server import VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.runner import run_host
from host.settings import HostSettings
from host.timeline.store import TimelineStore
from planner.conversation.items import Reasoning, loads_item
from tests.support.fakes import (
    FakeModelServer,
    ScriptedTurn,
    text,
    thinking,
    tool_use,
)

INTENT = {"purpose": "make progress", "expected_outcome": "the next screen shows"}
#: Longer than the test: the restarted host's hello releases attempt 1 at once, and a 5 s lease
#: once lapsed under attempt 2 on a loaded machine (attempt 3 ran, not 2).
LEASE_S = 300


class StopAfterTaps:
    """A real adbutils driver that stops its host right after the n-th tap (a host shutdown
    at a known point of the task, so the test is deterministic)."""

    def __init__(self, inner: AdbDriver, taps: int, stop: asyncio.Event, loop: Any) -> None:
        self._inner = inner
        self._left = taps
        self._stop = stop
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def tap(self, x: int, y: int) -> None:
        self._inner.tap(x, y)
        self._left -= 1
        if self._left == 0:
            self._loop.call_soon_threadsafe(self._stop.set)


@pytest.mark.parametrize("transport", ["direct", "cloud"])
async def test_restarted_host_continues_the_conversation_with_signed_thinking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    with FakeModelServer() as model:
        model.anthropic_script.extend(
            [
                ScriptedTurn(
                    [
                        thinking("Home screen; Settings is where the theme lives."),
                        text("Start: open Settings."),
                        tool_use("launch_app", {"package_name": "com.android.settings", **INTENT}),
                    ]
                ),
                ScriptedTurn(
                    [
                        thinking("Settings list is open; Display holds the theme."),
                        text("Settings opened. Open Display."),
                        tool_use("tap", {"element_id": "e25", **INTENT}),
                    ]
                ),
                ScriptedTurn(
                    [
                        thinking("Back after a restart: Display is open, toggle Dark theme."),
                        text("Display is open. Turn Dark theme on."),
                        tool_use("tap", {"element_id": "e14", **INTENT}),
                    ]
                ),
                ScriptedTurn(
                    [
                        thinking("The switch shows on."),
                        text("Dark theme is on."),
                        tool_use("complete", {"success": True, "reason": "Dark theme is on"}),
                    ]
                ),
            ]
        )
        monkeypatch.setenv("AMC_PLANNER_MODE", "session")
        monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", "sk-ant-test")
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", model.anthropic_base_url)
        monkeypatch.setenv("AMC_PLANNER_THINKING", "budget")
        monkeypatch.setenv("AMC_PLANNER_THINKING_BUDGET_TOKENS", "2048")

        pki = ensure_embedded_pki(tmp_path, ["h1"], operator="op")
        phone = VirtualPhone("virtual-1")
        adb = VirtualAdbServer([phone])
        adb_port = await adb.start()
        cloud = await build_server(
            CloudSettings(
                database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
                listen_address="127.0.0.1:0",
                pki_dir=pki,
            )
        )
        await cloud.start()
        operator = OperatorClient.over(
            secure_channel(
                cloud.address,
                ca=pki / "ca.pem",
                cert=pki / "operator-op.pem",
                key=pki / "operator-op.key",
            )
        )
        settings = HostSettings(
            data_dir=tmp_path / "host",
            adb_port=adb_port,
            cloud_address=cloud.address,
            certs_dir=pki,
            host_id="h1",
            tls_server_name="localhost",
            ocr_enabled=False,
            settle_delay_s=0.0,
            planner_transport=transport,
        )
        try:
            submitted = await operator.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal="Turn on dark theme", lease_duration=Duration(seconds=LEASE_S)
                )
            )
            task_id = submitted.task.task_id
            loop = asyncio.get_running_loop()

            first_stop = asyncio.Event()

            def stopping_driver(serial: str) -> Driver:
                return StopAfterTaps(AdbDriver(serial, "127.0.0.1", adb_port), 1, first_stop, loop)

            await asyncio.wait_for(run_host(settings, first_stop, make_driver=stopping_driver), 60)
            assert len(model.bodies("/v1/messages")) == 2, "the first host made two decisions"

            second_stop = asyncio.Event()
            second = asyncio.create_task(run_host(settings, second_stop))
            try:
                for _ in range(600):
                    task = (
                        await operator.tasks.GetTask(
                            task_service_pb2.GetTaskRequest(task_id=task_id)
                        )
                    ).task
                    if task.status in (
                        types_pb2.TASK_STATUS_SUCCEEDED,
                        types_pb2.TASK_STATUS_FAILED,
                    ):
                        break
                    await asyncio.sleep(0.1)
            finally:
                second_stop.set()
                await asyncio.wait_for(second, 30)
            stored = await sessions.load(cloud.store, task_id, 2)
            logged = await operator.decisions.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
            )
        finally:
            await operator.close()
            await cloud.stop(grace=0)
            await adb.stop()

        assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.result_summary
        assert task.attempt == 2
        assert phone.state.settings["dark_theme"] is True
        assert model.rejections == []
        bodies = model.bodies("/v1/messages")
        assert len(bodies) == 4
        # The restarted host's first request replays both earlier turns, each as ONE assistant
        # message that starts with its signed thinking block, exactly as the server sent it.
        resumed = bodies[2]["messages"]
        assistants = [m for m in resumed if m["role"] == "assistant"]
        assert len(assistants) == 2
        for turn, expected in zip(
            assistants,
            [
                "Home screen; Settings is where the theme lives.",
                "Settings list is open; Display holds the theme.",
            ],
            strict=True,
        ):
            assert [b["type"] for b in turn["content"]] == ["thinking", "text", "tool_use"]
            assert turn["content"][0]["thinking"] == expected
            assert turn["content"][0]["signature"]

        if transport == "cloud":
            # The conversation lives in the cloud database, signatures byte for byte; the host
            # kept none of it.
            assert not (tmp_path / "host" / "sessions.sqlite3").exists()
            items = [loads_item(body) for body in stored]
            signed = [i for i in items if isinstance(i, Reasoning)]
            assert len(signed) == 4
            assert [r.signature for r in signed[:3]] == [
                b["signature"]
                for m in bodies[3]["messages"]
                if m["role"] == "assistant"
                for b in m["content"]
                if b["type"] == "thinking"
            ]
            # Each decision is in the cloud's decision log, with the observation as its prompt.
            assert [(d.attempt, d.step_index) for d in logged.decisions] == [
                (1, 1),
                (1, 2),
                (2, 1),
                (2, 2),
            ]
            assert [d.thinking[0].text for d in logged.decisions][2] == (
                "Back after a restart: Display is open, toggle Dark theme."
            )
            assert "Current screen:" in logged.decisions[2].user_prompt
            assert {d.planner_mode for d in logged.decisions} == {"session"}
        else:
            assert stored == []
        # The host's timeline marks each step's logged prompt as a session observation.
        timeline = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
        try:
            steps = timeline.steps(task_id, 2)
        finally:
            timeline.close()
        assert steps and {r.planner_mode for r in steps if r.tool_name} == {"session"}
