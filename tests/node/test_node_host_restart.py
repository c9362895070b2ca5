"""The Node example host rides out a cloud restart, as the Lease and Planner contracts ask.

Real parts: `amc cloud serve` (SQLite, mTLS) killed with SIGKILL and started again on the same
database and port, the cloud's real Anthropic SDK against the fake Messages server, a virtual
phone served over the adb protocol, and host.js as its own process. The host reaches the cloud
through a loopback TCP proxy, so the test can cut its connections at a moment it chooses: the
answer to a Decide is lost (as a restart loses an answer on its way), the cloud logs the step
once its plan ends, and is then killed and restarted before the host can ask again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from amc.v1 import decision_log_service_pb2, lease_service_pb2, task_service_pb2, types_pb2
from console import exit_codes
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import (
    HOST,
    cloud_and_phone,
    dark_theme_task,
    fake_cloud_and_phones,
    running_host,
    spawn_host,
    start_host,
    task_line,
)
from tests.node.test_node_host import HOST_ID, node
from tests.support.bad_certs import Flaw, flawed_copy
from tests.support.fakes import ANTHROPIC_KEY, FakeModelServer, anthropic_message, tool_use
from tests.support.processes import OPERATOR, wait_serving, wait_task
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import until

#: What host.js says when a lease ran out by its own clock with no renewal answered.
PAUSES = "ran out with no renewal answered: the attempt pauses until the cloud confirms it"


async def said_until(host: asyncio.subprocess.Process, said: list[str], words: str) -> None:
    """Reads what host.js says (adding each line to `said`) until a line holds `words`;
    AssertionError if it exits first."""
    assert host.stderr is not None
    while line := (await host.stderr.readline()).decode():
        said.append(line)
        if words in line:
            return
    raise AssertionError(f"host.js exited before saying {words!r}: {''.join(said)}")


__all__ = ["node"]


async def test_the_node_host_finishes_its_task_across_a_cloud_restart_billed_once(
    node: str, tmp_path: Path
) -> None:
    """host.js exited with code 1 when the cloud went away: no reconnect, no `process_id`, no
    `held_assignments`, and a Decide without a `step_key`, so a retry would have been planned
    (and billed) again. Now it reconnects listing its lease, which the restarted cloud confirms
    (the task succeeds on its first attempt), and asks again for the lost step under the same
    key: answered from the log, one model call per decision."""
    hold = threading.Event()
    launch = anthropic_message(
        tool_use(
            "launch_app",
            {"package_name": "com.android.settings", "purpose": "open", "expected_outcome": "open"},
        ),
        input_tokens=500,
        output_tokens=100,
    )
    launch.hold = hold
    done = anthropic_message(
        tool_use("complete", {"success": True, "reason": "settings are open"}),
        input_tokens=700,
        output_tokens=50,
    )
    planner = {
        "AMC_PLANNER_PROVIDER": "anthropic",
        "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
        "AMC_PLANNER_ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "AMC_PLANNER_MAX_RETRIES": "0",
        # A lease long enough to outlast the outage by the host's own clock, as in production.
        "AMC_CLOUD_DEFAULT_LEASE_SECONDS": "30",
    }
    phone = VirtualPhone("emulator-5554")
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as provider:
        provider.script_anthropic(launch, done)
        planner["AMC_PLANNER_ANTHROPIC_BASE_URL"] = provider.anthropic_base_url
        async with cloud_and_phone(tmp_path, phone, HOST_ID, planner, own_process=True) as rig:
            assert rig.cloud is not None
            cloud_port = int(rig.address.rsplit(":", 1)[1])
            proxy = TcpProxy([("127.0.0.1", cloud_port)]).start()
            task = (
                await rig.client.tasks.SubmitTask(
                    task_service_pb2.SubmitTaskRequest(goal="Open the settings", max_attempts=2),
                    timeout=10,
                )
            ).task
            # Reconnects at most 1 s apart (30 s by default): the host finds the cloud back
            # within a second of its restart, not after the backoff its outage built up.
            host = await start_host(
                node,
                rig,
                HOST_ID,
                tmp_path / "host-data",
                address=proxy.address,
                AMC_HOST_RECONNECT_MAX_S="1",
            )
            try:
                await until(
                    lambda: len(provider.bodies("/v1/messages")) == 1,
                    within=60,
                    what="step 1 at the model",
                )
                proxy.stop()  # the answer to step 1 is lost on its way to the host
                hold.set()
                listing = decision_log_service_pb2.ListDecisionsRequest(task_id=task.task_id)

                async def logged() -> bool:
                    return bool((await rig.client.decisions.ListDecisions(listing)).decisions)

                await until(logged, within=30, what="step 1 logged by the cloud")
                rig.cloud.kill()
                rig.cloud.start()
                await wait_serving(rig.address, rig.pki)
                proxy = TcpProxy([("127.0.0.1", cloud_port)], port=proxy.port).start()
                _, err = await asyncio.wait_for(host.communicate(), 180)
            finally:
                hold.set()
                if host.returncode is None:
                    host.kill()
                    await host.wait()
                proxy.stop()
            said = err.decode()
            assert host.returncode == 0, said
            final = await wait_task(
                rig.client, task.task_id, lambda t: t.status != types_pb2.TASK_STATUS_RUNNING, 10
            )
            decisions = (await rig.client.decisions.ListDecisions(listing)).decisions
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, (final, said)
    assert [a.attempt for a in final.attempts] == [1], final
    assert [(d.step_index, d.tool_name) for d in decisions] == [(1, "launch_app"), (2, "complete")]
    assert decisions[0].outcome.executed, said  # the replayed answer was carried out
    assert len(provider.bodies("/v1/messages")) == 2  # one model call per decision
    usage = final.totals.usage
    assert (usage.input_tokens, usage.output_tokens) == (1200, 150)


async def test_the_node_host_stops_with_one_line_when_the_cloud_refuses_its_certificate(
    node: str, tmp_path: Path
) -> None:
    """A stream ended PERMISSION_DENIED (the certificate carries no host identity: here an
    operator's) is final (lease_service.proto): reconnecting cannot help, so the host does not
    retry it but exits 4, as `amc host run` does (docs/cli.md "Exit codes"; it exited 1),
    saying why in one line."""
    async with cloud_and_phone(tmp_path, VirtualPhone("emulator-5554"), HOST_ID) as rig:
        certs = tmp_path / "impostor"
        certs.mkdir()
        shutil.copy(rig.pki / "ca.pem", certs / "ca.pem")
        shutil.copy(rig.pki / f"operator-{OPERATOR}.pem", certs / "host-impostor.pem")
        shutil.copy(rig.pki / f"operator-{OPERATOR}.key", certs / "host-impostor.key")
        host = await asyncio.create_subprocess_exec(
            node,
            str(HOST),
            env={
                "PATH": os.environ.get("PATH", ""),
                "AMC_CLOUD_ADDRESS": rig.address,
                "AMC_HOST_CERTS_DIR": str(certs),
                "AMC_HOST_ID": "impostor",
                "ADB_PORT": str(rig.adb_port),
                "AMC_HOST_DATA_DIR": str(tmp_path / "host-data"),
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await asyncio.wait_for(host.communicate(), 60)
        finally:
            if host.returncode is None:
                host.kill()
                await host.wait()
    said = err.decode().strip().splitlines()
    assert host.returncode == exit_codes.CLOUD, said
    assert len(said) == 1 and said[0].startswith("[node-host] error: code 7: "), said


@pytest.mark.parametrize(
    ("flaw", "words"),
    [
        ("expired", "expired"),
        ("not_yet_valid", "is not valid before"),
        ("other_ca", "is not signed by the fleet CA"),
    ],
)
async def test_the_node_host_names_a_certificate_the_cloud_would_refuse_in_the_handshake(
    node: str, tmp_path: Path, flaw: Flaw, words: str
) -> None:
    """A host certificate that is expired, not valid yet or signed by another CA is refused in
    the TLS handshake, which grpc-js reports as "No connection established ... Failed to
    connect" only. Before, host.js reconnected for ever saying that; now it checks its
    certificate before connecting, as the Python host does (cloud/cert_validity.py), and exits
    5 (as `amc host run` does at its start, docs/cli.md "Exit codes"; it exited 1) with one
    line naming the file and why."""
    async with cloud_and_phone(tmp_path, VirtualPhone("emulator-5554"), HOST_ID) as rig:
        cert = flawed_copy(rig.pki, f"host-{HOST_ID}", flaw, tmp_path / "flawed")
        host = await spawn_host(
            node, rig.address, cert.parent, HOST_ID, rig.adb_port, tmp_path / "host-data"
        )
        try:
            _, err = await asyncio.wait_for(host.communicate(), 60)
        except TimeoutError:
            host.kill()
            _, err = await host.communicate()
            raise AssertionError(f"the host did not stop:\n{err.decode()}") from None
    said = err.decode().strip().splitlines()
    assert host.returncode == exit_codes.CERTIFICATE, said
    assert said[-1].startswith(
        f"[node-host] error: not connecting: host certificate {cert} {words}"
    ), said
    assert said[-1].endswith(f"(`amc certs host DIR {HOST_ID}`) and start the host again"), said
    assert not any("lease stream lost" in line for line in said), said


async def test_the_node_host_stops_a_task_whose_lease_ran_out_while_the_cloud_was_unreachable(
    node: str, tmp_path: Path
) -> None:
    """The cloud cannot be reached mid-step (its connections cut at a proxy) for longer than
    the lease: the cloud sweeps the attempt. host.js asked Decide again for as long as the
    cloud stayed away, driving a phone whose task was no longer its own. Now it pauses the
    attempt once the lease has run out by its own clock, as the Python host does; reachable
    again, its hello names the attempt, the cloud refuses it (expired: the task's only
    attempt, which the cloud gives no new term, `leases.resume._revive`), and the attempt
    ends with the retryable result of a lease run out while the cloud was unreachable."""
    hold = threading.Event()
    launch = anthropic_message(
        tool_use(
            "launch_app",
            {"package_name": "com.android.settings", "purpose": "open", "expected_outcome": "open"},
        )
    )
    launch.hold = hold
    planner = {
        "AMC_PLANNER_PROVIDER": "anthropic",
        "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
        "AMC_PLANNER_ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "AMC_PLANNER_MAX_RETRIES": "0",
        "AMC_CLOUD_DEFAULT_LEASE_SECONDS": "5",
    }
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as provider:
        provider.script_anthropic(launch)
        planner["AMC_PLANNER_ANTHROPIC_BASE_URL"] = provider.anthropic_base_url
        async with cloud_and_phone(
            tmp_path, VirtualPhone("emulator-5554"), HOST_ID, planner
        ) as rig:
            cloud_port = int(rig.address.rsplit(":", 1)[1])
            proxy = TcpProxy([("127.0.0.1", cloud_port)]).start()
            task = (
                await rig.client.tasks.SubmitTask(
                    task_service_pb2.SubmitTaskRequest(goal="Open the settings", max_attempts=1),
                    timeout=10,
                )
            ).task
            host = await start_host(
                node, rig, HOST_ID, tmp_path / "host-data", tasks=None, address=proxy.address
            )
            said: list[str] = []
            try:
                await until(
                    lambda: len(provider.bodies("/v1/messages")) == 1,
                    within=60,
                    what="step 1 at the model",
                )
                proxy.stop()  # the cloud is unreachable from here on
                hold.set()
                await asyncio.wait_for(said_until(host, said, PAUSES), 60)
                # The cloud sweeps the lease meanwhile (its own clock, a 5 s lease).
                await wait_task(
                    rig.client,
                    task.task_id,
                    lambda t: bool(t.attempts) and t.attempts[0].HasField("ended_at"),
                    60,
                    "attempt 1 swept",
                )
                proxy = TcpProxy([("127.0.0.1", cloud_port)], port=proxy.port).start()
                end = await asyncio.wait_for(task_line(host, said), 60)
            finally:
                hold.set()
                proxy.stop()
                host.kill()
                await host.wait()
    assert end.endswith(
        "TASK_STATUS_FAILED — stopped: the lease ran out while the cloud was unreachable\n"
    ), "".join(said)


async def test_a_result_the_cloud_never_heard_outlives_a_node_host_restart(
    node: str, tmp_path: Path
) -> None:
    """An attempt ends while the cloud cannot be reached (its connections cut at a proxy) and
    the host restarts before the cloud is back. host.js kept the result in memory only: the
    new process did not know it, named no lease in its hello, and the cloud released the
    attempt as the old process's ("released") and ran the task again. As the Python host
    keeps it (host/outbox/store.py, `keep_result`), host.js now keeps each result on disk
    (AMC_HOST_DATA_DIR) until the cloud answers it: the next process names its lease in the
    hello and sends it, and the attempt ends as the host saw it end."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(120)  # the first look hangs until the phone is unplugged
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        cloud_port = int(rig.address.rsplit(":", 1)[1])
        proxy = TcpProxy([("127.0.0.1", cloud_port)]).start()
        task_id = await dark_theme_task(rig.client, max_attempts=2)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "AMC_CLOUD_ADDRESS": proxy.address,
            "AMC_HOST_CERTS_DIR": str(rig.pki),
            "AMC_HOST_ID": HOST_ID,
            "ADB_PORT": str(rig.adb_port),
            "AMC_HOST_DATA_DIR": str(tmp_path / "host-data"),
        }
        said: list[str] = []
        first = await asyncio.create_subprocess_exec(
            node, str(HOST), env=env, stderr=asyncio.subprocess.PIPE
        )
        second: asyncio.subprocess.Process | None = None
        try:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            proxy.stop()  # the cloud is unreachable from here on
            rig.adb.unplug(phone.serial)  # the look fails: the attempt ends on the host
            end = await asyncio.wait_for(task_line(first, said), 60)
            first.kill()  # and the host restarts before the cloud heard the result
            await first.wait()
            proxy = TcpProxy([("127.0.0.1", cloud_port)], port=proxy.port).start()
            second = await asyncio.create_subprocess_exec(
                node, str(HOST), env=env, stderr=asyncio.subprocess.DEVNULL
            )
            final = await wait_task(
                rig.client,
                task_id,
                # The lease runs out while the cloud is cut off (an attempt ended "lease
                # expired"): the result the next process sends takes its place.
                # Until then the attempt reads ASSIGNED or RUNNING with no reason (the dry run
                # read it ASSIGNED, before the result arrived): wait for the reason itself.
                lambda t: (
                    bool(t.attempts)
                    and t.attempts[0].failure_reason not in ("", "lease expired")
                    and t.attempts[0].status != types_pb2.TASK_STATUS_RUNNING
                ),
                60,
            )
        finally:
            for process in (first, second):
                if process is not None and process.returncode is None:
                    process.kill()
                    await process.wait()
            proxy.stop()
    assert "TASK_STATUS_FAILED — phone emulator-5554 disconnected" in end, "".join(said)
    reason = end.split(" — ", 1)[1].strip()
    assert final.attempts[0].failure_reason == reason, (final, "".join(said))


async def test_a_result_left_unanswered_on_a_live_stream_is_sent_again(
    node: str, tmp_path: Path
) -> None:
    """A result the cloud neither acknowledges nor refuses (lost on a stream that still looks
    up, or its answer lost on the way back): the Python host sends it again every 5 s
    (host/lease_client.py, RESULT_RESEND_S) until it is answered. host.js sent it again only
    after a Welcome or a Rejected UNAVAILABLE: on a live stream it waited for good, its lease
    held, and the cloud released the attempt when the lease ran out and ran the task again.

    The cloud here is the in-test LeaseService of tests/host/lease_fake.py (real mTLS, a real
    stream), as in the Python host's test of the same: the real cloud answers every result it
    reads, so it cannot leave one unanswered. It serves no PlannerService: the step's Decide
    is refused UNIMPLEMENTED and the attempt ends at once, with a result to send."""
    phone = VirtualPhone("emulator-5554")
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig:
        cloud = rig.cloud
        cloud.ack_results = False
        cloud.renew_s = 10.0
        async with running_host(node, rig, HOST_ID, tmp_path / "host-data") as run:
            await cloud.wait_for(lambda: cloud.hellos, 60)  # the stream is open
            await cloud.assign("t1", phone.serial, "Turn on dark theme")
            await cloud.wait_for(lambda: cloud.results, 60)  # the attempt ended: its result sent
            with contextlib.suppress(TimeoutError):  # and, unanswered, sent again
                await cloud.wait_for(lambda: len(cloud.results) >= 2, 30)
            streams = cloud.streams
    said = run.said
    assert len(cloud.results) >= 2, said
    assert streams == 1, said  # the same stream, no reconnect in between
    assert {(r.task_id, r.lease_id) for r in cloud.results} == {("t1", "lease-t1-1")}, said


async def test_a_node_host_whose_renewals_go_unanswered_pauses_when_its_lease_runs_out(
    node: str, tmp_path: Path
) -> None:
    """The link to the cloud goes silent (a dead NAT entry: frozen at a proxy, neither end
    told) while the host looks at a screen that never goes idle. The cloud's lease runs out
    and it may hand the task to another phone at that moment. host.js stopped a task on its
    own clock only once it had no stream, and 2 s after the lease: a silent link keeps the
    stream open, so it held the phone on past the lease (for as long as the look, or a
    Decide with no answer, took). As the Python host does, it pauses the attempt when the
    lease runs out by its own clock, though its stream still looks open (the look under way
    ends as it would, nothing after it: tests/node/test_node_host_lease_pause.py)."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)  # the first look waits for an idle screen, well past the lease
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        proxy = TcpProxy([("127.0.0.1", int(rig.address.rsplit(":", 1)[1]))]).start()
        await dark_theme_task(rig.client, lease_duration=Duration(seconds=4), max_attempts=2)
        host = await start_host(
            node, rig, HOST_ID, tmp_path / "host-data", tasks=None, address=proxy.address
        )
        said: list[str] = []
        try:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            frozen = proxy.blackhole()
            assert frozen, "no open connection to freeze"
            await asyncio.wait_for(said_until(host, said, PAUSES), 60)
            # Paused by its lease, while the look still hung and the link still looked open.
            assert phone.dumper is not None
            assert all(link.client_gone_at is None for link in frozen)
        finally:
            rig.adb.unplug(phone.serial)  # ends the hung look
            host.kill()
            await host.wait()
            proxy.stop()


async def test_a_result_whose_lease_the_cloud_expired_is_sent_once_more_to_be_taken_late(
    node: str, tmp_path: Path
) -> None:
    """An attempt ended and its result is still unanswered (the cloud, or its database, was
    away) when the cloud's sweeper revokes the lease as expired. The cloud still takes such a
    result as late while no other attempt has started (lease_service.proto, ResultAck.late),
    and the Python host sends it once more for that (host/lease_client.py, `_on_revoked`).
    host.js let the result go at the revoke, unsent: finished work was lost and its task run
    again. The cloud here is the in-test LeaseService of tests/host/lease_fake.py, which can
    leave a result unanswered and then revoke its lease; it serves no PlannerService, so the
    step's Decide is refused UNIMPLEMENTED and the attempt ends at once, with a result."""
    phone = VirtualPhone("emulator-5554")
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig:
        cloud = rig.cloud
        cloud.ack_results = False
        cloud.renew_s = 10.0
        async with running_host(node, rig, HOST_ID, tmp_path / "host-data") as run:
            await cloud.wait_for(lambda: cloud.hellos, 60)
            await cloud.assign("t1", phone.serial, "Turn on dark theme")
            await cloud.wait_for(lambda: cloud.results, 60)  # the attempt ended, unanswered
            sent = len(cloud.results)
            await cloud.send(cloud.expired("t1"))
            await cloud.wait_for(lambda: len(cloud.results) > sent, 20)  # sent again, to be late
    said = run.said
    assert {(r.task_id, r.lease_id) for r in cloud.results} == {("t1", "lease-t1-1")}, said


@pytest.mark.parametrize("cancelled", [False, True], ids=["expired", "cancelled"])
async def test_an_attempt_whose_lease_the_cloud_expired_ends_without_a_result(
    node: str, tmp_path: Path, cancelled: bool
) -> None:
    """The cloud's sweeper revokes a running attempt's lease as expired (REVOKE_REASON_EXPIRED)
    mid-look. The attempt is over and the cloud takes no result of it; the Python host sends
    none (host/lease_client.py, `_execute`: a CANCELLED result answers an operator's cancel
    only). host.js sent TASK_STATUS_CANCELLED, "lease expired", for every revoke: refused by the
    cloud, and, when the process stopped before the refusal, kept on disk with no lease to
    name. An operator's cancel (REVOKE_REASON_CANCELLED) is still answered, CANCELLED: the
    cloud keeps that lease for the answer. The cloud here is the in-test LeaseService of
    tests/host/lease_fake.py (real mTLS, a real stream), which sends the revoke when the test
    says; it serves no PlannerService."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(3)  # the first look takes a while: the revoke comes mid-look
    said: list[str] = []
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig:
        cloud = rig.cloud
        cloud.renew_s = 10.0
        async with running_host(node, rig, HOST_ID, tmp_path / "host-data") as run:
            host = run.process

            async def ended(task_id: str) -> None:
                assert host.stderr is not None
                while line := (await host.stderr.readline()).decode():
                    said.append(line)
                    if f"task {task_id}: " in line:
                        return

            await cloud.wait_for(lambda: cloud.hellos, 60)
            await cloud.assign("t1", phone.serial, "Turn on dark theme")
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            if cancelled:
                await cloud.revoke("t1")
            else:
                await cloud.send(cloud.expired("t1"))
            await asyncio.wait_for(ended("t1"), 60)
            # A result of t1 would have gone on the stream before t2's.
            await cloud.assign("t2", phone.serial, "Turn on dark theme")
            await cloud.wait_for(lambda: any(r.task_id == "t2" for r in cloud.results), 60)
    everything = "".join(said) + run.said
    answered = [(r.task_id, r.status) for r in cloud.results if r.task_id == "t1"]
    assert answered == ([("t1", types_pb2.TASK_STATUS_CANCELLED)] if cancelled else []), everything
    assert [r.task_id for r in cloud.results][-1] == "t2", everything


async def test_a_cancel_answered_after_its_revoke_is_sent_by_the_next_process(
    node: str, tmp_path: Path
) -> None:
    """An operator's cancel revokes a lease mid-look; the host answers CANCELLED, but the
    cloud has not acknowledged it when the host dies (SIGKILL). The revoke had already let the
    lease go (`release`), so host.js kept the answer on disk with an undefined lease
    (`{"message": …}`, no `held`): the next process could not read it ("cannot be read:
    skipped"), never sent it, and skipped it again at every start. It now keeps the record
    under the result's own lease, not named in the hello (the lease is gone, as the Python
    host names none), and the next process sends it until the cloud acknowledges it."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)  # the first look waits for an idle screen: the cancel comes mid-look
    data = tmp_path / "host-data"
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig:
        cloud = rig.cloud
        cloud.ack_results = False  # the answer waits, unacknowledged, when the host dies

        def cancels() -> list[lease_service_pb2.TaskResult]:
            return [r for r in cloud.results if r.task_id == "t1"]

        first = await spawn_host(node, rig.address, rig.fake.pki_dir, HOST_ID, rig.adb_port, data)
        second: asyncio.subprocess.Process | None = None
        said = ""
        try:
            await cloud.wait_for(lambda: cloud.hellos, 60)
            await cloud.assign("t1", phone.serial, "Turn on dark theme")
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            await cloud.revoke("t1")
            await cloud.wait_for(cancels, 60)
            first.kill()
            _, err = await first.communicate()
            said = err.decode()
            sent = len(cancels())
            cloud.ack_results = True
            second = await spawn_host(
                node, rig.address, rig.fake.pki_dir, HOST_ID, rig.adb_port, data
            )
            await cloud.wait_for(lambda: len(cancels()) > sent, 60)
            await until(
                lambda: not list(data.rglob("*.json")), 30, "the acknowledged answer let go"
            )
        finally:
            for host in (first, second):
                if host is not None and host.returncode is None:
                    host.kill()
            if second is not None:
                _, err = await second.communicate()
                said += err.decode()
            rig.adb.unplug(phone.serial)  # ends the hung look
    assert {(r.lease_id, r.status) for r in cancels()} == {
        ("lease-t1-1", types_pb2.TASK_STATUS_CANCELLED)
    }, said
    assert all(h.lease_id != "lease-t1-1" for h in cloud.hellos[-1].held_assignments), said
    assert "cannot be read" not in said, said
