"""Fields the cloud does not know, sent by a client built from other protos: ignored, not kept.

Proto3 parsers keep the fields they do not know, and the cloud stores some messages a host sends
as serialized protos (a decision's action and observation). A host shipping a decision
(direct transport) or asking for one (cloud transport) with unknown fields in them — a newer
host's, or bytes a client adds on purpose, such as a screenshot — had them written into the
decision log and handed to every operator listing it: past every documented size limit, and a
screenshot in the cloud's database. Proves: such requests are answered as if the unknown fields
were absent, and neither the operator's listing nor any column of the database holds them.
"""

from __future__ import annotations

import io
import secrets
import sqlite3
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from PIL import Image
from sqlalchemy.engine import make_url

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    lease_service_pb2,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from planner.observation import observation_from_scene
from tests.abuse.conftest import AbuseCloud, assigned
from tests.cloud.cloud_harness import ScriptedHost, channel, result
from tests.planner import scenes


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, format="PNG")
    return buffer.getvalue()


#: What a client smuggles: a PNG behind a marker no other test writes.
MARK = b"unknown-field-" + secrets.token_hex(8).encode() + _png()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _with_unknown(message: Any, number: int) -> None:
    """Add field `number` (length-delimited, unknown to amc's protos) holding `MARK`."""
    message.MergeFromString(_varint(number << 3 | 2) + _varint(len(MARK)) + MARK)


def _observation() -> types_pb2.ScreenObservation:
    observation = observation_from_scene(scenes.settings_main())
    _with_unknown(observation, 900)
    _with_unknown(observation.elements[0], 901)
    return observation


async def _assignment(host: ScriptedHost, ops: Any, serial: str) -> lease_service_pb2.Assignment:
    """A task for `serial` of `host`, assigned (ending work other tests left queued)."""
    task = await ops.SubmitTask(
        task_service_pb2.SubmitTaskRequest(
            goal="Turn on dark theme",
            target=types_pb2.TaskTarget(host_id=host.host_id, device_serial=serial),
            lease_duration=Duration(seconds=600),
        )
    )
    return await assigned(host, task.task.task_id)


def _columns_holding(database: Path, needle: bytes) -> list[str]:
    """Every `table.column` of the SQLite database with a value that contains `needle`."""
    found = []
    with sqlite3.connect(database) as db:
        tables = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for column in [c[1] for c in db.execute(f'PRAGMA table_info("{table}")')]:
                (count,) = db.execute(
                    f'SELECT count(*) FROM "{table}" WHERE instr(CAST("{column}" AS BLOB), ?)',
                    (needle,),
                ).fetchone()
                if count:
                    found.append(f"{table}.{column}")
    return found


async def test_unknown_fields_in_decisions_are_neither_stored_nor_listed(
    abuse_cloud: AbuseCloud,
) -> None:
    address, pki_dir = abuse_cloud.address, abuse_cloud.pki_dir
    ops_channel = channel(address, pki_dir, "operator-ops")
    ops: Any = task_service_pb2_grpc.TaskServiceStub(ops_channel)
    log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_channel)
    shipper = ScriptedHost(address, pki_dir, "shipper")
    planner = ScriptedHost(address, pki_dir, "planner")
    try:
        # A host on the direct transport ships a decision it made.
        await shipper.connect(["ship-1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        shipped = await _assignment(shipper, ops, "ship-1")
        action = types_pb2.Action(purpose="open Display", expected_outcome="Display opens")
        action.tap.element_id = "e1"
        _with_unknown(action, 902)
        decision = types_pb2.Decision(
            tool_name="tap",
            action=action,
            provider="offline",
            model="m",
            rationale="Display is on screen",
            purpose="open Display",
            expected_outcome="Display opens",
            observation=_observation(),
        )
        _with_unknown(decision, 903)
        ship: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(shipper._channel)
        acks = await ship.ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(
                entries=[
                    decision_log_service_pb2.ShippedDecision(
                        host_decision_id="unknown-fields-1",
                        task_id=shipped.task_id,
                        attempt=shipped.attempt,
                        lease_id=shipped.lease_id,
                        decision=decision,
                    )
                ]
            ),
            timeout=10,
        )
        assert len(acks.acks) == 1
        await shipper.send(result(shipped))
        await shipper.next("result_ack")

        # A host on the cloud transport asks for one.
        await planner.connect(["plan-1"], transport=types_pb2.PLANNER_TRANSPORT_CLOUD)
        planned = await _assignment(planner, ops, "plan-1")
        request = planner_service_pb2.DecideRequest(
            task_id=planned.task_id,
            attempt=planned.attempt,
            lease_id=planned.lease_id,
            observation=_observation(),
            step_key="unknown-fields-1",
        )
        _with_unknown(request, 904)
        decide: Any = planner_service_pb2_grpc.PlannerServiceStub(planner._channel)
        answer = await decide.Decide(request, timeout=30)
        assert answer.decision.tool_name
        await planner.send(result(planned))
        await planner.next("result_ack")

        for task_id in (shipped.task_id, planned.task_id):
            listed = await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(
                    task_id=task_id, include_observation=True
                ),
                timeout=10,
            )
            assert len(listed.decisions) == 1, listed
            assert listed.decisions[0].observation.elements, "the observation was kept"
            assert MARK not in listed.SerializeToString(), f"task {task_id} lists unknown fields"
        database = Path(make_url(abuse_cloud.server.settings.database_url).database or "")
        assert _columns_holding(database, MARK) == []
    except grpc.aio.AioRpcError as exc:
        raise AssertionError(f"{exc.code()} {exc.details()}") from exc
    finally:
        await shipper.close()
        await planner.close()
        await ops_channel.close()
    abuse_cloud.assert_serving()
