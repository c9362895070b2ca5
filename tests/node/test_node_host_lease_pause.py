"""The Node example host pauses an attempt whose lease ran out while the cloud was unreachable,
as the Python host does (docs/reliability.md, "A cloud away for longer than a lease").

Real parts: `amc cloud serve` (SQLite, mTLS) stopped with SIGTERM and started again on the same
database and port, the cloud's real Anthropic SDK against the fake Messages server, a virtual
phone served over the adb protocol, and host.js as its own process. The refusal cases run
host.js against the in-test LeaseService of tests/host/lease_fake.py, which refuses the lease
at the reconnect's hello as a cloud does once it swept the lease or another host holds it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import (
    decision_log_service_pb2,
    lease_service_pb2,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from host.agent.lease_pause import PAUSED_SUMMARY, PausedPastDeadline
from host.devices.virtual.phone import VirtualPhone
from host.lease_client import UNREACHABLE_SUMMARY
from tests.host.lease_fake import FakeCloud, Lease
from tests.node.rig import assigned_host, cloud_and_phone, start_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.fakes import FakeModelServer, ScriptedTurn, text, tool_use
from tests.support.processes import TERMINAL, wait_serving, wait_task
from tests.support.waiting import until

__all__ = ["node"]

INTENT = {"purpose": "make progress", "expected_outcome": "the next screen shows"}
LAUNCH = [tool_use("launch_app", {"package_name": "com.android.settings", **INTENT})]
DONE = [text("Nothing to do."), tool_use("complete", {"success": True, "reason": "ok"})]
#: The lease the cloud grants; the outage outlasts it (it lasts until the lease ran out by the
#: host's clock). Not much shorter: the started cloud gives the lease a new term this long,
#: which a loaded machine could let run out before the host's hello is read.
LEASE_S = "10"
#: What host.js says when the lease ran out by its clock, and when the cloud confirmed it.
RAN_OUT = "ran out with no renewal answered: the attempt pauses until the cloud confirms it"
CONFIRMED = "confirmed by the cloud: the attempt continues"


async def _said(stderr: asyncio.StreamReader, lines: list[str]) -> None:
    """Collects what host.js says, line by line, until it exits."""
    while line := (await stderr.readline()).decode():
        lines.append(line)


async def test_the_node_host_pauses_past_its_lease_and_finishes_in_attempt_1(
    node: str, tmp_path: Path
) -> None:
    """The cloud stops (SIGTERM) while step 2 waits for the model and stays down past the
    lease. Before, host.js stopped the attempt when the lease ran out by its clock, and
    attempt 2 started from scratch, asking the model again for every step. Now the attempt
    pauses, its hello names it, the started cloud resumes it with a new term and it continues
    at step 2: attempt 1 succeeds, step 1 is not asked again."""
    held = threading.Event()
    planner = {
        "AMC_PLANNER_PROVIDER": "anthropic",
        "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
        "AMC_PLANNER_ANTHROPIC_API_KEY": "sk-ant-test",
        "AMC_PLANNER_MAX_RETRIES": "0",
        "AMC_CLOUD_DEFAULT_LEASE_SECONDS": LEASE_S,
        "AMC_CLOUD_SHUTDOWN_GRACE_SECONDS": "1",
    }
    lines: list[str] = []
    with FakeModelServer(anthropic_key="sk-ant-test") as provider:
        provider.script_anthropic(
            ScriptedTurn(list(LAUNCH)),
            ScriptedTurn(list(DONE), hold=held),  # step 2: asked as the cloud stops
            ScriptedTurn(list(DONE)),  # step 2 asked again on the started cloud
            # What a second attempt would ask (step 1 again, then step 2): the script lets it
            # run to its end, so a regression fails on the attempt, not on a timeout.
            ScriptedTurn(list(LAUNCH)),
            ScriptedTurn(list(DONE)),
        )
        planner["AMC_PLANNER_ANTHROPIC_BASE_URL"] = provider.anthropic_base_url
        phone = VirtualPhone("emulator-5554")
        async with cloud_and_phone(tmp_path, phone, HOST_ID, planner, own_process=True) as rig:
            assert rig.cloud is not None
            request = task_service_pb2.SubmitTaskRequest(goal="Open the settings", max_attempts=3)
            task = (await rig.client.tasks.SubmitTask(request, timeout=10)).task
            host = await start_host(
                node,
                rig,
                HOST_ID,
                tmp_path / "host-data",
                tasks=None,  # a second attempt, if any, runs here too
                AMC_HOST_RECONNECT_MAX_S="1",
            )
            assert host.stderr is not None
            reader = asyncio.create_task(_said(host.stderr, lines))
            try:
                await until(
                    lambda: len(provider.bodies("/v1/messages")) == 2,
                    within=60,
                    what="step 2 at the model",
                )
                await asyncio.to_thread(rig.cloud.stop)
                held.set()  # its answer goes nowhere: the call was cut off with the cloud
                # Paused (or, before, stopped) by its lease running out by the host's clock.
                await until(
                    lambda: any(said in "".join(lines) for said in (RAN_OUT, UNREACHABLE_SUMMARY)),
                    within=60,
                    what="the lease ran out",
                )
                assert host.returncode is None, "".join(lines)
                rig.cloud.start()
                await wait_serving(rig.address, rig.pki)
                final = await wait_task(
                    rig.client, task.task_id, lambda t: t.status in TERMINAL, 120, "ended"
                )
                host.send_signal(signal.SIGTERM)
                await asyncio.wait_for(host.wait(), 60)
                await reader
            finally:
                held.set()
                if host.returncode is None:
                    host.kill()
                    await host.wait()
                reader.cancel()
            said = "".join(lines)
            assert host.returncode == 0, said
            listing = decision_log_service_pb2.ListDecisionsRequest(task_id=task.task_id)
            decisions = (await rig.client.decisions.ListDecisions(listing)).decisions
        asked = len(provider.bodies("/v1/messages"))
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, (final, said)
    assert [a.attempt for a in final.attempts] == [1], said
    steps = [(d.attempt, d.step_index, d.tool_name) for d in decisions]
    assert steps == [(1, 1, "launch_app"), (1, 2, "complete")], said
    assert asked == 3, said  # step 1 once; step 2 cut off with the cloud, then asked again
    assert f"step 2: {PAUSED_SUMMARY}" in said or "step 2 paused" in said, said
    assert CONFIRMED in said, said


class _Planner(planner_service_pb2_grpc.PlannerServiceServicer):
    """Answers step 1 with a press of the home key and never answers step 2 (the cloud went
    silent meanwhile); notes every Decide's step key."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        self.asked.append(request.step_key)
        if request.step_key != "1":
            await asyncio.Event().wait()  # until the host cancels the call
        home = types_pb2.PressKeyAction(key=types_pb2.KEY_HOME)
        return planner_service_pb2.DecideResponse(
            decision=types_pb2.Decision(
                step_index=1,
                tool_name="press_key",
                arguments_json='{"key": "home"}',
                purpose="go home",
                action=types_pb2.Action(press_key=home, purpose="go home"),
            )
        )


class _SilentCloud(FakeCloud):
    """The fake LeaseService renewing leases a term at a time (`lease_remaining`, as the cloud
    says it) until `silent`, then answering no renewal (a link gone quiet, a cloud whose
    database hangs), and refusing a lease it took back, at the hello too, with `reason`."""

    def __init__(self, reason: lease_service_pb2.RevokeReason.ValueType) -> None:
        super().__init__(lease_s=4.0)
        self.silent = False
        self.reason = reason

    def _revoked(self, lease: Lease, _: int) -> lease_service_pb2.LeaseResponse:  # type: ignore[override]
        return lease_service_pb2.LeaseResponse(
            revoked=lease_service_pb2.Revoked(
                task_id=lease.task_id,
                attempt=lease.attempt,
                lease_id=lease.lease_id,
                reason=self.reason,
                message="taken back by the test",
            )
        )

    async def _on_request(
        self,
        req: lease_service_pb2.LeaseRequest,
        out: asyncio.Queue[lease_service_pb2.LeaseResponse | None],
    ) -> None:
        if req.WhichOneof("kind") != "renewal":
            await super()._on_request(req, out)
            return
        r = req.renewal
        lease = self.leases.get((r.task_id, r.attempt))
        if self.silent or lease is None:
            return
        if not lease.live:
            await out.put(self._revoked(lease, 0))
            return
        renewed = lease_service_pb2.Renewed(
            task_id=r.task_id,
            attempt=r.attempt,
            lease_id=r.lease_id,
            lease_remaining=self._duration(self.lease_s),
        )
        await out.put(lease_service_pb2.LeaseResponse(renewed=renewed))


def _summaries(cloud: FakeCloud) -> list[str]:
    """The progress summary of each renewal the host sent, in order."""
    return [r.renewal.progress.summary for r in cloud.received if r.WhichOneof("kind") == "renewal"]


@pytest.mark.parametrize(
    ("reason", "result"),
    [
        # The cloud swept the lease: answered with the retryable result of a lease run out.
        (lease_service_pb2.REVOKE_REASON_EXPIRED, UNREACHABLE_SUMMARY),
        # Another attempt holds the task (another host took it): stopped with no result, as
        # any attempt whose lease the cloud took back for a reason of its own.
        (lease_service_pb2.REVOKE_REASON_SUPERSEDED, None),
    ],
    ids=["swept", "taken-by-another"],
)
async def test_a_paused_attempt_the_cloud_refuses_at_the_reconnect_stops_with_no_step_after(
    node: str,
    tmp_path: Path,
    reason: lease_service_pb2.RevokeReason.ValueType,
    result: str | None,
) -> None:
    """The cloud answers no renewal while step 2 waits for its Decide, past the lease: the
    attempt pauses (the Decide under way abandoned, none after), keeps renewing and says so;
    the link drops, the host reconnects within half the lease, the hello names the attempt,
    the cloud refuses it and the attempt stops.
    Before, the attempt stopped at the lease's end, with no pause."""
    planner = _Planner()
    cloud = _SilentCloud(reason)
    paused = f"step 2: {PAUSED_SUMMARY}"
    # A reconnect backoff of up to an hour: while an attempt is paused it stays under half
    # that attempt's lease (2 s here), or the reconnect below would not come within a minute.
    async with assigned_host(
        node,
        tmp_path,
        HOST_ID,
        cloud,
        planner,
        AMC_TASKS="1",
        AMC_HOST_RECONNECT_INITIAL_S="3600",
        AMC_HOST_RECONNECT_MAX_S="3600",
    ) as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        cloud.silent = True
        await cloud.wait_for(lambda: paused in _summaries(cloud), 60)
        # Renewals go on while paused, at their interval (a third of the lease here).
        await cloud.wait_for(lambda: _summaries(cloud).count(paused) >= 2, 60)
        host.lease.live = False
        hellos = len(cloud.hellos)
        cloud.cut()
        await cloud.wait_for(lambda: len(cloud.hellos) > hellos, 60)
        named = [(h.task_id, h.lease_id) for h in cloud.hellos[-1].held_assignments]
        assert named == [("t1", host.lease.lease_id)], host.text()
        ended = "stopped — the cloud took its lease back" if result is None else "TASK_STATUS_"
        await cloud.wait_for(lambda: ended in host.text(), 60)
        if result is not None:
            await cloud.wait_for(lambda: cloud.results, 30)
    said = host.said
    assert planner.asked == ["1", "2"], said  # no Decide after the pause
    summaries = _summaries(cloud)
    assert set(summaries[summaries.index(paused) :]) == {paused}, said  # no look, no action
    if result is None:
        assert not cloud.results, said
        assert "(REVOKE_REASON_SUPERSEDED: taken back by the test)" in said, said
    else:
        sent = cloud.results[0]
        assert (sent.status, sent.summary, sent.retryable) == (
            types_pb2.TASK_STATUS_FAILED,
            result,
            True,
        ), said
        assert sent.final_progress.summary == paused, said


class _DeadlineCloud(_SilentCloud):
    """`_SilentCloud`, silent from the start, whose assignments give the task `deadline_s`."""

    def __init__(self, deadline_s: float) -> None:
        super().__init__(lease_service_pb2.REVOKE_REASON_EXPIRED)
        self.silent = True
        self.deadline_s = deadline_s

    def _assignment(self, lease: Lease, resumed: bool) -> lease_service_pb2.LeaseResponse:
        response = super()._assignment(lease, resumed)
        response.assignment.deadline_remaining.CopyFrom(self._duration(self.deadline_s))
        return response


@pytest.mark.parametrize(
    ("ending", "summary"),
    [
        # The task's deadline (10 s, after the 4 s lease by the host's own clock) comes first.
        ("deadline", str(PausedPastDeadline())),
        # The host stops (SIGTERM): the attempt is handed back, as a running one is.
        ("host-stop", "stopped: the host stopped"),
    ],
    ids=["deadline", "host-stop"],
)
async def test_a_paused_attempt_ends_retryable_at_its_deadline_or_a_host_stop(
    node: str, tmp_path: Path, ending: str, summary: str
) -> None:
    """No renewal is ever answered: the attempt pauses at the lease's end. Before, it stopped
    there, saying the lease ran out; now a paused attempt waits for the cloud's word until the
    task's deadline, which ends it retryable (the Python host's PausedPastDeadline), or until
    the host stops, which hands it back."""
    cloud = _DeadlineCloud(deadline_s=10.0 if ending == "deadline" else 3600.0)
    async with assigned_host(node, tmp_path, HOST_ID, cloud, _Planner(), AMC_TASKS="1") as host:
        await cloud.wait_for(lambda: any(PAUSED_SUMMARY in s for s in _summaries(cloud)), 60)
        if ending == "host-stop":
            host.process.send_signal(signal.SIGTERM)
        await cloud.wait_for(lambda: cloud.results, 60)
    said = host.said
    sent = cloud.results[0]
    assert (sent.status, sent.summary, sent.retryable) == (
        types_pb2.TASK_STATUS_FAILED,
        summary,
        True,
    ), said
    assert sent.final_progress.summary.endswith(PAUSED_SUMMARY), said


async def test_a_pause_and_its_confirmation_during_one_look_let_the_step_go_on(
    node: str, tmp_path: Path
) -> None:
    """The lease pauses and the cloud confirms it while the first look is under way (its
    dump hangs). Before, the step raced the Decide with the pause of the term the look began
    in, already over: the attempt ended FAILED "host error: paused", not retryable. Now the
    step takes the term it plans in and goes on: step 1 acts and step 2 is asked."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(25)  # under host.js's dump timeout (30 s)
    cloud = _SilentCloud(lease_service_pb2.REVOKE_REASON_EXPIRED)
    planner = _Planner()
    async with assigned_host(
        node, tmp_path, HOST_ID, cloud, planner, [phone], AMC_TASKS="1"
    ) as host:
        await until(lambda: phone.dumper is not None, 60, "the first look under way")
        cloud.silent = True
        await cloud.wait_for(lambda: RAN_OUT in host.text(), 30)
        cloud.silent = False
        cloud.cut()  # the reconnect's hello names the lease; the cloud resumes it
        await cloud.wait_for(lambda: CONFIRMED in host.text(), 30)
        assert phone.dumper is not None, host.text()  # confirmed during the look
        await cloud.wait_for(lambda: cloud.results or "2" in planner.asked, 60)
    said = host.said
    assert not cloud.results and "2" in planner.asked, said


class _RetryLaterPlanner(_Planner):
    """`_Planner` whose first ask of step 2 is refused UNAVAILABLE with a retry 6 s later (the
    cloud's `amc-retry-after-s`), silencing `cloud` if `silence` (the lease pauses 4 s on)."""

    def __init__(self, cloud: _SilentCloud, silence: bool) -> None:
        super().__init__()
        self.cloud = cloud
        self.silence = silence

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        if request.step_key == "2" and "2" not in self.asked:
            self.asked.append(request.step_key)
            self.cloud.silent = self.silence
            retry = (("amc-retry-after-s", "6"),)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "busy", trailing_metadata=retry)
        return await super().Decide(request, context)


@pytest.mark.parametrize(
    ("ending", "ended"),
    [
        ("pause", RAN_OUT),
        ("revoke", "TASK_STATUS_CANCELLED"),  # an operator's cancel
        # The host stops (SIGTERM) and waits up to 10 s for its result's ack, never sent.
        ("host-stop", "waiting up to 10 s for the cloud to answer"),
    ],
    ids=["pause", "revoke", "host-stop"],
)
async def test_a_decide_waiting_to_be_asked_again_is_not_sent_after_a_pause_or_a_stop(
    node: str, tmp_path: Path, ending: str, ended: str
) -> None:
    """Step 2's Decide is refused UNAVAILABLE, to be asked again 6 s later, and meanwhile the
    lease pauses (4 s), the cloud takes it back or the host stops. Before, the wait ran out
    and the Decide went out anyway, its cancel already spent: after a pause the cloud planned
    the screen from before it, and the step the cloud confirms would get that answer
    replayed. Now no Decide goes out after the pause or the stop."""
    cloud = _SilentCloud(lease_service_pb2.REVOKE_REASON_CANCELLED)
    cloud.ack_results = False
    planner = _RetryLaterPlanner(cloud, silence=ending == "pause")
    async with assigned_host(
        node, tmp_path, HOST_ID, cloud, planner, AMC_HOST_STOP_GRACE_S="10"
    ) as host:
        await cloud.wait_for(lambda: "step 2: busy; asking again" in host.text(), 60)
        if ending == "revoke":
            await cloud.revoke("t1")
        elif ending == "host-stop":
            host.process.send_signal(signal.SIGTERM)
        await cloud.wait_for(lambda: ended in host.text(), 60)
        await asyncio.sleep(8)  # past the retry's 6 s
    said = host.said
    assert planner.asked == ["1", "2"], said  # no Decide after the pause or the stop
