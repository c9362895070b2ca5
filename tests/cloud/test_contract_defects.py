"""Contract defects an integrator found from outside (issue 12), each against a real cloud.

Real parts: the cloud gRPC server (mTLS) on SQLite and PostgreSQL, scripted host streams that
speak the Lease protocol, and the offline planner. The documentation checks read the proto
comments the way an integrator does: through the server's reflection service.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc_tools
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from amc.v1 import lease_service_pb2 as lease_pb
from cloud.server import CloudServer
from host.devices.virtual.phone import VirtualPhone
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import ScriptedHost, channel, renewal, result, submit, tasks_stub
from tests.planner import scenes

PROTO = Path(__file__).resolve().parents[2] / "proto"


@pytest.fixture
async def host(cloud: CloudServer, pki_dir: Path) -> AsyncIterator[ScriptedHost]:
    h = ScriptedHost(cloud.address, pki_dir, "h20")
    try:
        yield h
    finally:
        await h.close()


async def _described(
    address: str, pki_dir: Path, symbol: str
) -> descriptor_pb2.FileDescriptorProto:
    """The file defining `symbol`, as reflection serves it (with its source comments)."""
    async with channel(address, pki_dir, "operator-ops") as ch:
        stub: Any = reflection_pb2_grpc.ServerReflectionStub(ch)
        call = stub.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol))
        response = await call.read()
        await call.done_writing()
    # The first file of the answer is the one asked for; its imports follow.
    raw = response.file_descriptor_response.file_descriptor_proto[0]
    return descriptor_pb2.FileDescriptorProto.FromString(raw)


async def _comments(address: str, pki_dir: Path, symbol: str) -> dict[tuple[int, ...], str]:
    """Leading comments of the file defining `symbol`, by source path."""
    described = await _described(address, pki_dir, symbol)
    return {tuple(loc.path): loc.leading_comments for loc in described.source_code_info.location}


async def test_cancelling_a_running_task_records_the_operators_reason(
    cloud: CloudServer, ops: Any, host: ScriptedHost
) -> None:
    await host.connect(["p"])
    task = (await submit(ops)).task
    a = (await host.next("assignment")).assignment
    await host.send(renewal(a))
    await host.next("renewed")
    await ops.CancelTask(
        task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="wrong phone, resubmit")
    )
    revoked = (await host.next("revoked")).revoked
    assert revoked.reason == lease_pb.REVOKE_REASON_CANCELLED
    assert revoked.message == "wrong phone, resubmit"  # the host is told why
    # A host that acknowledges with its own words (as hosts did: "stopped on revoke").
    await host.send(result(a, status=types_pb2.TASK_STATUS_CANCELLED, summary="stopped on revoke"))
    assert (await host.next("result_ack")).result_ack.task_status == (
        types_pb2.TASK_STATUS_CANCELLED
    )
    got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
    assert got.status == types_pb2.TASK_STATUS_CANCELLED
    assert got.result_summary == "wrong phone, resubmit"
    assert got.attempts[-1].failure_reason == "wrong phone, resubmit"


async def test_each_assignment_says_its_own_renew_interval(
    cloud: CloudServer, ops: Any, host: ScriptedHost
) -> None:
    """A task submitted with a 5 s lease must not be renewed at a third of the *default*
    lease: the assignment carries a third of its own lease."""
    welcome = await host.connect(["p", "q"])
    default = dt.timedelta(seconds=cloud.settings.default_lease_seconds / 3)
    assert welcome.renew_interval.ToTimedelta() == default  # deprecated, kept for old hosts
    short = (
        await submit(
            ops, lease_duration=_seconds(5), target=types_pb2.TaskTarget(device_serial="p")
        )
    ).task
    long = (
        await submit(
            ops, lease_duration=_seconds(60), target=types_pb2.TaskTarget(device_serial="q")
        )
    ).task
    got = {}
    for _ in range(2):
        a = (await host.next("assignment")).assignment
        got[a.task_id] = a
    assert got[short.task_id].renew_interval.ToTimedelta() == dt.timedelta(seconds=5 / 3)
    assert got[long.task_id].renew_interval.ToTimedelta() == dt.timedelta(seconds=20)
    comments = await _comments(cloud.address, _pki(cloud), "amc.v1.Assignment")
    assert any("a third of `lease_duration`" in c for c in comments.values())


def _seconds(n: float) -> Any:
    from google.protobuf.duration_pb2 import Duration

    d = Duration()
    d.FromTimedelta(dt.timedelta(seconds=n))
    return d


def _pki(cloud: CloudServer) -> Path:
    assert cloud.settings.pki_dir is not None
    return cloud.settings.pki_dir


async def test_decide_documents_the_codes_it_answers(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """Decide answers PERMISSION_DENIED for another host's lease and FAILED_PRECONDITION for a
    lease that is not live — and its comment (read through reflection) says exactly that."""
    cloud = offline_cloud
    h = ScriptedHost(cloud.address, pki_dir, "h21")
    try:
        await h.connect(["p"])
        await submit(tasks_stub(ops_ch := channel(cloud.address, pki_dir, "operator-ops")))
        a = (await h.next("assignment")).assignment
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=observation_from_scene(scenes.launcher()),
        )
        codes = {}
        for identity, lease_id in (("host-h22", a.lease_id), ("host-h21", "not-live")):
            async with channel(cloud.address, pki_dir, identity) as ch:
                stub: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
                probe = planner_service_pb2.DecideRequest()
                probe.CopyFrom(request)
                probe.lease_id = lease_id
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Decide(probe)
                codes[identity] = err.value.code()
        assert codes == {
            "host-h22": grpc.StatusCode.PERMISSION_DENIED,
            "host-h21": grpc.StatusCode.FAILED_PRECONDITION,
        }
        await ops_ch.close()
    finally:
        await h.close()
    comments = await _comments(cloud.address, pki_dir, "amc.v1.PlannerService.Decide")
    decide_doc = comments[(6, 0, 2, 0)]  # service 0 (PlannerService), method 0 (Decide)
    flat = " ".join(decide_doc.split())
    assert "PERMISSION_DENIED when the lease is another host's" in flat
    assert "FAILED_PRECONDITION when (task, attempt, lease id) is not a live lease" in flat


async def test_revoke_reasons_unknown_and_permission_denied_are_told_apart(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A lease id the cloud never issued is UNKNOWN; another host's real lease is
    PERMISSION_DENIED — and the two comments say so without overlapping."""
    owner = ScriptedHost(cloud.address, pki_dir, "h23")
    other = ScriptedHost(cloud.address, pki_dir, "h24")
    try:
        await owner.connect(["p"])
        await other.connect([])
        await submit(ops)
        a = (await owner.next("assignment")).assignment
        forged = lease_pb.Assignment()
        forged.CopyFrom(a)
        forged.lease_id = "never-issued"
        await owner.send(renewal(forged))
        assert (await owner.next("revoked")).revoked.reason == lease_pb.REVOKE_REASON_UNKNOWN
        await other.send(renewal(a))
        assert (await other.next("revoked")).revoked.reason == (
            lease_pb.REVOKE_REASON_PERMISSION_DENIED
        )
    finally:
        await owner.close()
        await other.close()
    enum = lease_pb.DESCRIPTOR.enum_types_by_name["RevokeReason"]
    comments = await _comments(cloud.address, pki_dir, "amc.v1.Revoked")
    index = list(lease_pb.DESCRIPTOR.enum_types_by_name).index("RevokeReason")
    # path (5 enum_type, index, 2 value, number)
    unknown, denied = (
        " ".join(comments[(5, index, 2, enum.values_by_name[name].index)].split())
        for name in ("REVOKE_REASON_UNKNOWN", "REVOKE_REASON_PERMISSION_DENIED")
    )
    assert "never issued" in unknown
    assert "REVOKE_REASON_PERMISSION_DENIED" in unknown  # points there instead of overlapping
    assert "another host" in denied


async def test_progress_says_step_n_of_at_most_m_and_the_cloud_stamps_updated_at(
    cloud: CloudServer, ops: Any, host: ScriptedHost
) -> None:
    await host.connect(["p"])
    task = (await submit(ops)).task
    a = (await host.next("assignment")).assignment
    message = renewal(a, step=3, summary="step 3: tap 'Display'")
    message.renewal.progress.max_steps = 30
    message.renewal.progress.updated_at.FromDatetime(dt.datetime(2001, 1, 1, tzinfo=dt.UTC))
    await host.send(message)
    await host.next("renewed")
    got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
    assert (got.progress.step_index, got.progress.max_steps) == (3, 30)
    assert got.progress.updated_at.ToDatetime().year > 2001  # the host's value is ignored
    # A limit out of range is stored within it, never a reason to refuse the renewal (its
    # lease would run out): 10,000 at most.
    odd = renewal(a, step=4)
    odd.renewal.progress.max_steps = 20_000
    await host.send(odd)
    await host.next("renewed")
    got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
    assert (got.progress.step_index, got.progress.max_steps) == (4, 10_000)
    comments = await _comments(cloud.address, _pki(cloud), "amc.v1.Progress")
    flat = [" ".join(c.split()) for c in comments.values()]
    assert any(c.startswith("When the cloud stored this snapshot. Set by the cloud") for c in flat)
    assert any("step 3 of at most 30" in c for c in flat)


async def test_list_hosts_is_paged(cloud: CloudServer, pki_dir: Path) -> None:
    hosts = [ScriptedHost(cloud.address, pki_dir, f"h2{i}") for i in range(5)]
    try:
        for h in hosts[:3]:
            await h.connect(["p"])
        for h in hosts[3:]:  # known but disconnected
            await h.connect(["p"])
            await h.close()
        async with channel(cloud.address, pki_dir, "operator-ops") as ch:
            fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)

            # A host that disconnects between pages may be listed twice (documented): page only
            # once the cloud has recorded both closed streams.
            async def settled() -> bool:
                page = await fleet.ListHosts(fleet_service_pb2.ListHostsRequest(page_size=500))
                return sum(h.connected for h in page.hosts) == 3 and len(page.hosts) == 5

            for _ in range(200):
                if await settled():
                    break
                await asyncio.sleep(0.05)
            seen, token, pages = [], "", 0
            while True:
                page = await fleet.ListHosts(
                    fleet_service_pb2.ListHostsRequest(page_size=2, page_token=token)
                )
                pages += 1
                seen += [(h.host_id, h.connected) for h in page.hosts]
                token = page.next_page_token
                if not token:
                    break
            for bad in (
                fleet_service_pb2.ListHostsRequest(page_size=501),
                fleet_service_pb2.ListHostsRequest(page_token="garbage!"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await fleet.ListHosts(bad)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        for h in hosts[:3]:
            await h.close()
    assert pages == 3
    ids = [host_id for host_id, _ in seen]
    assert sorted(ids) == ["h20", "h21", "h22", "h23", "h24"]
    assert len(set(ids)) == 5
    assert ids == sorted(ids)  # by id, whichever are connected


async def test_typed_decisions_carry_enums_and_the_reported_outcome(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """Provider and mode as enums beside the strings; the outcome the next call reported is on
    the decision it answers, in the log operators read."""
    cloud = offline_cloud
    h = ScriptedHost(cloud.address, pki_dir, "h25")
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        await h.connect(["p"])
        await submit(tasks_stub(ops_ch))
        a = (await h.next("assignment")).assignment
        async with channel(cloud.address, pki_dir, "host-h25") as ch:
            stub: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
            base = planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation_from_scene(scenes.launcher()),
            )
            first = (await stub.Decide(base)).decision
            base.previous_outcome.CopyFrom(
                types_pb2.ActionOutcome(
                    step_index=1, executed=True, driver_output='{"point":[756,1908]}'
                )
            )
            second = (await stub.Decide(base)).decision
        assert '"success":true' in second.user_prompt
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_ch)
        listed = (
            await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id)
            )
        ).decisions
    finally:
        await h.close()
        await ops_ch.close()
    assert first.model_provider == types_pb2.MODEL_PROVIDER_OFFLINE
    assert first.mode == types_pb2.PLANNER_MODE_COMPACT
    assert [(d.provider, d.model_provider, d.mode) for d in listed] == [
        ("offline", types_pb2.MODEL_PROVIDER_OFFLINE, types_pb2.PLANNER_MODE_COMPACT)
    ] * 2
    assert listed[0].outcome == types_pb2.ActionOutcome(
        step_index=1, executed=True, driver_output='{"point":[756,1908]}'
    )
    assert not listed[1].HasField("outcome")


async def test_a_certificate_of_the_wrong_kind_is_told_so_in_plain_english(
    cloud: CloudServer, pki_dir: Path
) -> None:
    async with channel(cloud.address, pki_dir, "host-h26") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks_stub(ch).GetTask(task_service_pb2.GetTaskRequest(task_id="x"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.details() == "this RPC needs an operator certificate, not a host one"
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        stub: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Decide(planner_service_pb2.DecideRequest())
    assert err.value.details() == "this RPC needs a host certificate, not an operator one"


def _compile_protos(out: Path) -> Path:
    """proto/ compiled by grpcio-tools into `out`, as any Python integrator would."""
    out.mkdir()
    protos = sorted(str(p.relative_to(PROTO)) for p in PROTO.rglob("*.proto"))
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc",
            f"-I{PROTO}", f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
            f"--python_out={out}", f"--grpc_python_out={out}", *protos,
        ],
        check=True,
    )  # fmt: skip
    for package in (out / "amc", out / "amc" / "v1"):  # regular packages: found before gen/'s
        (package / "__init__.py").write_text("")
    return out


async def test_a_python_client_built_only_from_the_protos_plans_a_step(
    offline_cloud: CloudServer, pki_dir: Path, tmp_path: Path
) -> None:
    """Compile proto/ with grpcio-tools into a folder of its own, and run a host that imports
    only those modules (no gen/, no amc code): it parses a uiautomator dump itself, sends the
    typed observation, and gets a planned step whose prompt the cloud built."""
    out = await asyncio.to_thread(_compile_protos, tmp_path / "compiled")
    phone = VirtualPhone("emulator-5554")
    dump = tmp_path / "window_dump.xml"
    dump.write_text(phone.dump_hierarchy())
    ops_ch = channel(offline_cloud.address, pki_dir, "operator-ops")
    try:
        task = (await submit(tasks_stub(ops_ch))).task
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__).with_name("proto_only_client.py")),
            offline_cloud.address, str(pki_dir), "h27", "emulator-5554", str(dump),
            env={"PYTHONPATH": str(out), "PATH": os.environ.get("PATH", "")},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    finally:
        await ops_ch.close()
    assert process.returncode == 0, stderr.decode()
    said = json.loads(stdout)
    assert Path(said["amc_from"]).is_relative_to(out)
    assert said["imported"] == []
    decision = said["decision"]
    assert decision["task_id"] == task.task_id
    assert decision["step_index"] == 1
    assert decision["tool_name"] == "tap"
    assert decision["action"]["tap"]["element_id"].startswith("n")  # one of the client's ids
    assert '"Turn on dark theme"' in decision["user_prompt"]  # the goal: the cloud's
    assert '"desc":"Settings"' in decision["user_prompt"]  # the scene: from the client's dump
