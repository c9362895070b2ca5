"""`CloudPlanner` against the planner's real `PlannerServicer` (offline provider) over mTLS.

The lease gate and decision sink are small in-test ports (the servicer takes them as ports; the
cloud's store-backed ones are exercised by the cloud's own tests).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from amc.v1 import planner_service_pb2_grpc
from cloud import pki
from cloud.identity import peer_caller
from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.cloud_channel import open_channel
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.hierarchy import parse_scene
from host.perception.perceive import Perceiver
from host.planner_client import CloudPlanError, CloudPlanner
from host.settings import HostSettings
from host.timeline.store import TimelineStore
from planner.decision import Decision
from planner.planner import make_planner
from planner.prompts import SYSTEM_PROMPT, build_user_prompt
from planner.service import PlannerServicer
from planner.settings import PlannerSettings

HOST_ID = "h1"


@dataclass
class Gate:
    live: set[tuple[str, str, int, str]] = field(default_factory=set)

    async def is_live(self, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool:
        return (host_id, task_id, attempt, lease_id) in self.live


@dataclass
class Sink:
    rows: list[tuple[str, str, int, Decision]] = field(default_factory=list)

    async def append(
        self, host_id: str, task_id: str, attempt: int, decision: Decision
    ) -> tuple[str, int]:
        self.rows.append((host_id, task_id, attempt, decision))
        n = sum(1 for r in self.rows if r[1] == task_id and r[2] == attempt)
        return f"d{len(self.rows)}", n


@dataclass
class Service:
    port: int
    gate: Gate
    sink: Sink
    settings: HostSettings


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    pki_dir = pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    gate, sink = Gate(), Sink()

    def host_of(context: grpc.aio.ServicerContext) -> str:
        caller = peer_caller(context)
        return caller.name if caller and caller.kind == "host" else ""

    planner = make_planner(PlannerSettings(provider="offline"))
    server = grpc.aio.server()
    planner_service_pb2_grpc.add_PlannerServiceServicer_to_server(
        PlannerServicer(caller_host_id=host_of, lease_gate=gate, sink=sink, planner=planner),
        server,
    )
    creds = grpc.ssl_server_credentials(
        [((pki_dir / "server.key").read_bytes(), (pki_dir / "server.pem").read_bytes())],
        root_certificates=(pki_dir / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    settings = HostSettings(
        cloud_address=f"127.0.0.1:{port}",
        certs_dir=pki_dir,
        host_id=HOST_ID,
        data_dir=tmp_path / "host",
    )
    yield Service(port, gate, sink, settings)
    await server.stop(grace=None)
    await planner.aclose()


async def test_decide_sends_the_same_prompts_and_maps_the_decision(service: Service) -> None:
    service.gate.live.add((HOST_ID, "t1", 1, "L1"))
    phone = VirtualPhone("emulator-5554")
    scene = parse_scene(phone.dump_hierarchy(), (phone.width, phone.height))
    channel = open_channel(service.settings)
    try:
        planner = CloudPlanner(channel, "t1", 1, "L1")
        decision = await planner.decide("Turn on dark theme", scene, [])
    finally:
        await channel.close()
    assert decision.system_prompt == SYSTEM_PROMPT
    assert decision.user_prompt == build_user_prompt("Turn on dark theme", scene, [])
    assert decision.provider == "offline"
    assert decision.step_index == 1
    assert decision.action.WhichOneof("kind")
    [(host, task, attempt, logged)] = service.sink.rows
    assert (host, task, attempt) == (HOST_ID, "t1", 1)
    assert logged.user_prompt == decision.user_prompt


async def test_stale_lease_is_refused_before_planning(service: Service) -> None:
    phone = VirtualPhone("emulator-5554")
    scene = parse_scene(phone.dump_hierarchy(), (phone.width, phone.height))
    channel = open_channel(service.settings)
    try:
        with pytest.raises(CloudPlanError) as err:
            await CloudPlanner(channel, "t1", 1, "stale").decide("g", scene, [])
    finally:
        await channel.close()
    assert err.value.lease_lost
    assert service.sink.rows == []


async def test_agent_loop_on_the_cloud_transport(service: Service, tmp_path: Path) -> None:
    service.gate.live.add((HOST_ID, "t2", 1, "L2"))
    phone = VirtualPhone("emulator-5554")
    store = TimelineStore(tmp_path / "tl.sqlite3", tmp_path / "arts")
    channel = open_channel(service.settings)
    try:
        loop = AgentLoop(
            VirtualDriver(phone),
            CloudPlanner(channel, "t2", 1, "L2"),
            Perceiver(None),
            store,
            LoopSettings(max_steps=15, settle_delay_s=0, ocr=False, planner_transport="cloud"),
        )
        outcome = await asyncio.wait_for(
            loop.run(TaskSpec("t2", 1, "Turn on dark theme", "emulator-5554", "L2")), 120
        )
    finally:
        await channel.close()
    assert outcome.status == "succeeded"
    assert phone.state.flag("dark_theme")
    records = store.steps("t2", 1)
    # Every step's decision went through the cloud and was logged there with the same prompt.
    assert len(service.sink.rows) == len(records)
    assert [r.decision_step_index for r in records] == list(range(1, len(records) + 1))
    assert all(
        r.user_prompt == row[3].user_prompt
        for r, row in zip(records, service.sink.rows, strict=True)
    )
    store.close()


def test_a_huge_tool_result_is_cut_to_fit_the_decide_request() -> None:
    from host.planner_client import TRUNCATED, _fit
    from planner.service import MAX_TOOL_OUTPUT

    small = '{"ok":true}'
    assert _fit(small, MAX_TOOL_OUTPUT) is small
    huge = "é" * MAX_TOOL_OUTPUT  # two bytes each: twice the limit
    cut = _fit(huge, MAX_TOOL_OUTPUT)
    assert len(cut.encode("utf-8")) <= MAX_TOOL_OUTPUT  # never cut inside a character
    assert cut.endswith(TRUNCATED) and cut.startswith("éé")
