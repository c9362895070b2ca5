"""The 1-hour part of a decision's cache writes is kept with its record and sent with it.

Anthropic reports the cache writes by lifetime (`usage.cache_creation.ephemeral_1h_input_tokens`)
and a 1-hour write costs 2x input, a 5-minute one 1.25x: the cost was priced from the split, yet
the split itself was dropped as the decision was recorded, so an auditor reading the decision
log could not see why a step cost what it did. Real clouds over mTLS on SQLite and PostgreSQL:
the cloud transport plans with the real Anthropic SDK against the fake Messages server; a
direct-transport host ships its decision (ShipDecisions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from alembic.script import ScriptDirectory
from google.protobuf.duration_pb2 import Duration

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    types_pb2,
)
from cloud.server import CloudServer
from cloud.store.engine import alembic_config
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import (
    ScriptedHost,
    channel,
    columns_added,
    renewal,
    submit,
    tasks_stub,
)
from tests.cloud.test_shipping import shipped
from tests.planner import scenes
from tests.support.fakes import FakeModelServer, ScriptedTurn, tool_use

LAUNCH = {
    "package_name": "com.android.settings",
    "purpose": "open Settings",
    "expected_outcome": "Settings opens",
}


async def _logged(ch: Any, a: Any) -> types_pb2.Usage:
    """The usage of the attempt's one decision, as the decision log lists it."""
    log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ch)
    listed = await log.ListDecisions(
        decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id, attempt=a.attempt)
    )
    assert len(listed.decisions) == 1
    usage: types_pb2.Usage = listed.decisions[0].usage
    return usage


async def test_a_planned_decision_keeps_its_one_hour_cache_writes(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    """Cloud transport: the Decide reply and the decision log say how many of the 3000 cache
    writes were the 1-hour ones (2000), beside the total."""
    model.script_anthropic(
        ScriptedTurn(
            [tool_use("launch_app", LAUNCH)],
            usage={
                "input_tokens": 100,
                "output_tokens": 50,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 3000,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 1000,
                    "ephemeral_1h_input_tokens": 2000,
                },
            },
        )
    )
    ops_ch = channel(anthropic_cloud.address, pki_dir, "operator-ops")
    host_ch = channel(anthropic_cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(anthropic_cloud.address, pki_dir, "h1")
    try:
        await host.connect(["p"])
        await submit(tasks_stub(ops_ch))
        a = (await host.next("assignment")).assignment
        await host.send(renewal(a, 1, "looking"))
        await host.next("renewed")
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        reply = await planner.Decide(
            planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation_from_scene(scenes.launcher()),
            )
        )
        logged = await _logged(ops_ch, a)
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()
    for usage in (reply.decision.usage, logged):
        assert (usage.cache_creation_input_tokens, usage.cache_creation_1h_input_tokens) == (
            3000,
            2000,
        )


async def test_a_shipped_decision_keeps_its_one_hour_cache_writes(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """Direct transport: the split a host ships is logged as sent; one larger than the cache
    writes it is part of is refused, naming the field."""
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        await submit(tasks_stub(ops_ch), lease_duration=Duration(seconds=120))
        a = (await host.next("assignment")).assignment
        await host.send(renewal(a, 1, "looking"))
        await host.next("renewed")
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        bad = shipped(a, "d0")
        bad.decision.usage.CopyFrom(
            types_pb2.Usage(cache_creation_input_tokens=90, cache_creation_1h_input_tokens=91)
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await log.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(entries=[bad]))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cache_creation_1h_input_tokens" in str(refused.value.details())
        entry = shipped(a, "d1")
        entry.decision.usage.CopyFrom(
            types_pb2.Usage(
                input_tokens=700,
                cache_creation_input_tokens=90,
                cache_creation_1h_input_tokens=60,
                cost_usd=0.02,
            )
        )
        await log.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(entries=[entry]))
        logged = await _logged(ops_ch, a)
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()
    assert (logged.cache_creation_input_tokens, logged.cache_creation_1h_input_tokens) == (90, 60)


async def test_migration_0039_adds_the_one_hour_cache_writes_and_back(db_url: str) -> None:
    """Both backends: 0039 adds `decisions.cache_creation_1h_input_tokens`, its downgrade drops
    it, and the schema matches the models again after the upgrade."""
    script = ScriptDirectory.from_config(alembic_config()).get_revision("0039")
    assert script is not None and isinstance(script.down_revision, str)
    assert await columns_added(db_url, "decisions", script.down_revision, "0039") == {
        "cache_creation_1h_input_tokens"
    }
