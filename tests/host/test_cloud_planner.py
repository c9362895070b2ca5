"""The two planner transports against each other: `CloudPlanner` over the planner's real
`PlannerServicer` (mTLS, the cloud's code path) and `DirectPlanner` in-process.

The host sends only a typed observation and the outcome of its last action; the cloud builds
the prompts from the task's goal and its own log. Both transports go through `plan_step`, so
the same steps must give byte-identical prompts (compact) and conversations (session).

The lease gate and the decision log are small in-test ports (`tests/support/memory_log.py`;
the servicer takes them as ports, and the cloud's store-backed ones are tested on SQLite and
PostgreSQL in tests/cloud). Session mode talks to a local Anthropic-compatible server through
the real SDK (`tests/support/fakes/`), since no real API is reachable here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import planner_service_pb2_grpc
from cloud import pki
from cloud.identity import peer_caller
from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.agent.planning_wait import WaitPolicy
from host.agent.progress import ProgressHolder
from host.agent.redact import SecretRedactor
from host.cloud_channel import channel_options, credentials, open_channel
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.hierarchy import parse_scene
from host.perception.perceive import Perceiver
from host.planner_client import (
    WITHHELD,
    CloudPlanError,
    CloudPlanner,
    DirectPlanner,
    StepPlanner,
)
from host.settings import HostSettings
from host.timeline.store import TimelineStore
from planner.conversation.items import SessionItem, ToolResult, UserObservation
from planner.decision import Decision
from planner.history import WorldEvent
from planner.planner import make_planner
from planner.prompts import SYSTEM_PROMPT, build_user_prompt
from planner.scene import Scene
from planner.service import PlannerServicer
from planner.session.factory import SessionPlanners, open_session_planner
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from tests.planner.scenes import login_form, settings_main, toggle_page
from tests.support.fakes import (
    FakeModelServer,
    ScriptedTurn,
    text,
    thinking,
    tool_use,
)
from tests.support.memory_log import MemoryDecisionLog
from tests.support.mtls import start_mtls

HOST_ID = "h1"
GOAL = "Turn on dark theme"


@dataclass
class Gate:
    live: set[tuple[str, str, int, str]] = field(default_factory=set)

    async def is_live(self, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool:
        return (host_id, task_id, attempt, lease_id) in self.live


@dataclass
class Service:
    port: int
    gate: Gate
    log: MemoryDecisionLog
    settings: HostSettings


def _host_of(context: grpc.aio.ServicerContext) -> str:
    caller = peer_caller(context)
    return caller.name if caller and caller.kind == "host" else ""


async def _serve(tmp_path: Path, servicer: Callable[[Gate, MemoryDecisionLog], Any]) -> Any:
    pki_dir = pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    gate, log = Gate(), MemoryDecisionLog({"t1": GOAL, "t2": GOAL, "t3": GOAL})
    server = grpc.aio.server()
    planner_service_pb2_grpc.add_PlannerServiceServicer_to_server(servicer(gate, log), server)
    port = await start_mtls(server, pki_dir)
    settings = HostSettings(
        cloud_address=f"127.0.0.1:{port}",
        certs_dir=pki_dir,
        host_id=HOST_ID,
        data_dir=tmp_path / "host",
    )
    return server, Service(port, gate, log, settings)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    planner = make_planner(PlannerSettings(provider="offline"))
    server, svc = await _serve(
        tmp_path,
        lambda gate, log: PlannerServicer(
            caller_host_id=_host_of, lease_gate=gate, sink=log, planner=planner, attempts=log
        ),
    )
    yield svc
    await server.stop(grace=None)
    await planner.aclose()


def _scene(phone: VirtualPhone) -> Scene:
    return parse_scene(phone.dump_hierarchy(), (phone.width, phone.height))


async def test_decide_sends_an_observation_and_the_cloud_builds_the_prompts(
    service: Service,
) -> None:
    service.gate.live.add((HOST_ID, "t1", 1, "L1"))
    scene = _scene(VirtualPhone("emulator-5554"))
    channel = open_channel(service.settings)
    try:
        planner = CloudPlanner(channel, "t1", 1, "L1")
        # The goal argument is the host's copy; the cloud plans towards the task's own goal.
        decision = await planner.decide("ignored by the cloud", scene, [])
    finally:
        await channel.close()
    assert decision.system_prompt == SYSTEM_PROMPT
    assert decision.user_prompt == build_user_prompt(GOAL, scene, [])
    assert decision.provider == "offline"
    assert decision.step_index == 1
    assert decision.action.WhichOneof("kind")
    [(host, task, attempt, step, logged)] = service.log.rows
    assert (host, task, attempt, step) == (HOST_ID, "t1", 1, 1)
    assert logged.user_prompt == decision.user_prompt


async def test_stale_lease_is_refused_before_planning(service: Service) -> None:
    scene = _scene(VirtualPhone("emulator-5554"))
    channel = open_channel(service.settings)
    try:
        with pytest.raises(CloudPlanError) as err:
            await CloudPlanner(channel, "t1", 1, "stale").decide("g", scene, [])
    finally:
        await channel.close()
    assert err.value.lease_lost
    assert service.log.rows == []


async def _run_loop(planner: StepPlanner, task_id: str, tmp_path: Path) -> list[tuple[str, str]]:
    """Turn on dark theme on a fresh virtual phone; the prompts of every step, in order."""
    phone = VirtualPhone("emulator-5554")
    store = TimelineStore(tmp_path / f"{task_id}.sqlite3", tmp_path / f"{task_id}-arts")
    loop = AgentLoop(
        VirtualDriver(phone),
        planner,
        Perceiver(None),
        store,
        LoopSettings(max_steps=15, settle_delay_s=0, ocr=False),
    )
    try:
        outcome = await asyncio.wait_for(
            loop.run(TaskSpec(task_id, 1, GOAL, "emulator-5554", "L")), 120
        )
        assert outcome.status == "succeeded", outcome.summary
        assert phone.state.flag("dark_theme")
        return [(r.system_prompt or "", r.user_prompt or "") for r in store.steps(task_id, 1)]
    finally:
        store.close()


async def test_both_transports_send_byte_identical_compact_prompts(
    service: Service, tmp_path: Path
) -> None:
    """The same task on two identical phones: once planned by the cloud from typed
    observations, once in-process by `DirectPlanner`; every step's prompts are identical."""
    service.gate.live.add((HOST_ID, "t2", 1, "L"))
    channel = open_channel(service.settings)
    try:
        cloud = await _run_loop(CloudPlanner(channel, "t2", 1, "L"), "t2", tmp_path)
    finally:
        await channel.close()
    offline = make_planner(PlannerSettings(provider="offline"))
    try:
        direct = await _run_loop(DirectPlanner(offline), "t2", tmp_path / "direct")
    finally:
        await offline.aclose()
    assert len(cloud) >= 3
    assert cloud == direct
    # The later prompts carry the history the cloud rebuilt from its log.
    assert '"success":true' in cloud[-1][1]
    assert [row[4].user_prompt for row in service.log.rows] == [p[1] for p in cloud]


# --- session mode --------------------------------------------------------------------------

INTENT = {"purpose": "open display", "expected_outcome": "the Display page shows"}


def _script(server: FakeModelServer) -> None:
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("Need the tree."), tool_use("get_ui_tree", {})]),
            ScriptedTurn(
                [
                    thinking("Display is e16."),
                    text("Open it."),
                    tool_use("tap", {"element_id": "e16", **INTENT}),
                ]
            ),
            ScriptedTurn([thinking("A switch."), tool_use("tap", {"element_id": "e5", **INTENT})]),
            ScriptedTurn(
                [thinking("On."), tool_use("complete", {"success": True, "reason": "on"})]
            ),
        ]
    )


def _settings(server: FakeModelServer) -> PlannerSettings:
    return PlannerSettings(
        provider="anthropic",
        model="claude-test",
        thinking="budget",
        thinking_budget_tokens=1024,
        anthropic_api_key="test-key",
        anthropic_base_url=server.anthropic_base_url,
        max_retries=0,
        mode="session",
        session_stream=False,
    )


async def _drive(planner: StepPlanner) -> list[Decision]:
    """Four steps as the agent loop takes them (the tap on e5 fails on purpose)."""
    screens = [
        settings_main(),
        settings_main(),
        toggle_page("Display", [("Dark theme", False)]),
        toggle_page("Display", [("Dark theme", True)]),
    ]
    results = [(True, None), (True, None), (False, "the switch did not move")]
    history: list[WorldEvent] = []
    decisions = []
    for n, scene in enumerate(screens):
        decision = await planner.decide(GOAL, scene, history)
        decisions.append(decision)
        if n < len(results):
            ok, error = results[n]
            event = WorldEvent.from_decision(decision, page=scene.page, success=ok)
            event.error = error
            history.append(event)
    return decisions


def _user_side(items: list[SessionItem]) -> list[SessionItem]:
    return [i for i in items if isinstance(i, UserObservation | ToolResult)]


async def test_both_transports_build_the_same_session_conversation(tmp_path: Path) -> None:
    """Session mode: the cloud continues the conversation it keeps from typed inputs; the
    direct transport continues its own. What the user side added — observations and tool
    results — is identical item for item, and so are the requests' user turns."""
    with FakeModelServer() as cloud_model, FakeModelServer() as direct_model:
        _script(cloud_model)
        _script(direct_model)
        cloud_settings = _settings(cloud_model)
        sessions = SessionPlanners(cloud_settings)
        cloud_store = SqliteSessionStore(tmp_path / "cloud-sessions.sqlite3")
        offline = make_planner(PlannerSettings(provider="offline"))
        server, svc = await _serve(
            tmp_path,
            lambda gate, log: PlannerServicer(
                caller_host_id=_host_of,
                lease_gate=gate,
                sink=log,
                planner=offline,
                attempts=log,
                mode="session",
                sessions=sessions,
                session_store=lambda: cloud_store,
            ),
        )
        svc.gate.live.add((HOST_ID, "t3", 1, "L"))
        channel = open_channel(svc.settings)
        try:
            cloud_decisions = await _drive(CloudPlanner(channel, "t3", 1, "L"))
        finally:
            await channel.close()
            await server.stop(grace=None)
            await sessions.aclose()
            await offline.aclose()
        direct_store = SqliteSessionStore(tmp_path / "direct-sessions.sqlite3")
        engine = await open_session_planner(
            _settings(direct_model), store=direct_store, task_id="t3", attempt=1
        )
        direct = DirectPlanner(engine)
        try:
            direct_decisions = await _drive(direct)
        finally:
            await direct.aclose()
        assert cloud_model.rejections == [] and direct_model.rejections == []
        cloud_items = await cloud_store.load("t3", 1)
        direct_items = await direct_store.load("t3", 1)
        assert _user_side(cloud_items) == _user_side(direct_items)
        assert len(_user_side(cloud_items)) == 7  # four screens, three tool results
        failed = [i for i in cloud_items if isinstance(i, ToolResult) and i.is_error]
        assert len(failed) == 1 and "the switch did not move" in failed[0].output
        assert [d.user_prompt for d in cloud_decisions] == [d.user_prompt for d in direct_decisions]
        assert {d.planner_mode for d in cloud_decisions} == {"session"}
        cloud_users = [b["messages"] for b in cloud_model.bodies("/v1/messages")]
        direct_users = [b["messages"] for b in direct_model.bodies("/v1/messages")]
        assert [[m for m in r if m["role"] == "user"] for r in cloud_users] == [
            [m for m in r if m["role"] == "user"] for r in direct_users
        ]


# --- answers lost on the way back --------------------------------------------------------------


class LoseFirstAnswer(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Lets each step's first Decide reach the cloud (which plans and logs it), then drops the
    answer the way a reset stream, a restarting cloud or a passed deadline would: the host gets
    an error instead. Codes taken in turn from `codes`. A client interceptor stands in for the
    network here: a real link cannot be told to lose exactly one answer."""

    def __init__(self, codes: list[grpc.StatusCode]) -> None:
        self.codes = codes
        self.lost: list[str] = []

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        call = await continuation(client_call_details, request)
        response = await call
        if request.step_key not in self.lost:
            code = self.codes[len(self.lost) % len(self.codes)]
            self.lost.append(request.step_key)
            raise grpc.aio.AioRpcError(
                code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="answer lost"
            )
        return response


async def test_a_lost_answer_is_asked_again_and_the_step_planned_once(
    service: Service, tmp_path: Path
) -> None:
    service.gate.live.add((HOST_ID, "t1", 1, "L1"))
    lose = LoseFirstAnswer(
        [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED]
    )
    s = service.settings
    channel = grpc.aio.secure_channel(
        s.cloud_address, credentials(s), options=channel_options(s), interceptors=[lose]
    )
    phone = VirtualPhone("emulator-5554")
    waits: list[str] = []
    progress = ProgressHolder()
    progress.add_listener(
        lambda snap: waits.append(snap.summary) if "waiting" in snap.summary else None
    )
    loop = AgentLoop(
        VirtualDriver(phone),
        CloudPlanner(channel, "t1", 1, "L1"),
        Perceiver(None),
        None,
        LoopSettings(
            max_steps=15,
            settle_delay_s=0,
            ocr=False,
            planner_wait=WaitPolicy(initial_s=0.01, max_s=0.05),
        ),
    )
    try:
        outcome = await loop.run(TaskSpec("t1", 1, GOAL, "emulator-5554", "L1"), progress)
    finally:
        await channel.close()
    assert outcome.status == "succeeded", outcome.summary
    assert phone.state.flag("dark_theme")
    steps = [row[3] for row in service.log.rows]
    assert steps == list(range(1, outcome.steps + 1))  # one row per step: none planned twice
    assert lose.lost == [str(n) for n in steps]  # every step's first answer was lost
    assert waits and all("waiting for the cloud since" in w for w in waits)


async def test_a_replayed_sensitive_input_is_not_typed(service: Service) -> None:
    """The repeat of a logged decision cannot carry a sensitive value (it is never stored): the
    host does not type "•••", it reports the step as not executed and plans it again."""
    service.gate.live.add((HOST_ID, "t1", 1, "L1"))
    service.log.goals["t1"] = "Log in with the password hunter22"
    phone = VirtualPhone("emulator-5554")
    channel = open_channel(service.settings)
    try:
        planner = CloudPlanner(channel, "t1", 1, "L1")
        scene = login_form()
        first = await planner.decide(GOAL, scene, [])
        assert first.action.input_text.text == "hunter22" and "withheld" not in first.extra
        again = await planner.decide(GOAL, scene, [])  # the same step asked again
        assert again.extra["withheld"] == WITHHELD
        loop = AgentLoop(VirtualDriver(phone), planner, Perceiver(None), None, LoopSettings())
        result = await loop._act(
            again, TaskSpec("t1", 1, GOAL, phone.serial), scene, SecretRedactor()
        )
        assert (result.ok, result.error) == (False, WITHHELD)
    finally:
        await channel.close()
