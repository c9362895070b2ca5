"""host.js presents a certificate issued again while it runs from its next connection on, as
the Python host does (host/cloud_channel.py, `read_credentials`): operators rotate host
certificates (`amc certs host`) without restarting hosts.

Real parts: host.js as its own process, its certificate files on disk issued by the fleet CA
(`cloud.pki`), a virtual phone over adb, and the in-test LeaseService of tests/host/lease_fake.py
over real mTLS, which reads the serial of the certificate each stream was opened with and
ends a stream as the cloud ends that of a revoked certificate.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import os
import re
import shutil
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, NoReturn

import grpc
from cryptography import x509

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc, types_pb2
from cloud import pki
from cloud.identity import peer_serial
from console import exit_codes
from tests.host.lease_fake import FakeCloud
from tests.node.rig import FakeRig, HostRun, fake_cloud_and_phones, running_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.bad_certs import expired, flawed_copy
from tests.support.waiting import until

__all__ = ["node"]


def _host(
    node: str, rig: FakeRig, tmp_path: Path, *, certs: Path | None = None, **env: str
) -> AbstractAsyncContextManager[HostRun]:
    """host.js as most tests here run it: against `rig`, its data under `tmp_path`, reconnecting
    0.1 s after a lost stream (not 1 s), so that each reconnect a test makes comes at once."""
    return running_host(
        node,
        rig,
        HOST_ID,
        tmp_path / "host-data",
        certs=certs,
        AMC_HOST_RECONNECT_INITIAL_S="0.1",
        **env,
    )


def _own_certificate(pki_dir: Path) -> tuple[Path, str]:
    """This host's certificate file in `pki_dir`, and the serial of the certificate it holds."""
    cert = pki_dir / pki.host_files(HOST_ID)[0]
    return cert, pki.serial_hex(cert.read_bytes())


async def _hellos(cloud: FakeCloud, host: asyncio.subprocess.Process, count: int) -> None:
    """Waits (60 s at most) until the cloud has had `count` hellos, or host.js has exited: a
    host that stopped fails the test's assertions on what it said, not a timeout."""
    await cloud.wait_for(lambda: len(cloud.hellos) == count or host.returncode is not None, 60)


async def test_a_certificate_issued_again_is_presented_at_the_next_connection(
    node: str, tmp_path: Path
) -> None:
    """The host's certificate is issued again while it runs, and its stream is then lost. host.js
    read the new files before reconnecting, found them valid, and presented the old
    certificate all the same (its clients were made once, from the first files): a host went on
    with a certificate its operator had replaced, and once that one expired or was revoked, it
    could not connect again until restarted. It now reconnects with the new one."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud = rig.cloud
        cert, first = _own_certificate(rig.fake.pki_dir)
        async with _host(node, rig, tmp_path) as run:
            host = run.process
            await _hellos(cloud, host, 1)
            pki.write_host_cert(rig.fake.pki_dir, HOST_ID)  # as `amc certs host` issues it again
            second = pki.serial_hex(cert.read_bytes())
            cloud.cut()  # the stream is lost: the host reconnects
            await _hellos(cloud, host, 2)
    said = run.said
    assert run.alive, said
    assert first != second
    assert cloud.serials == [first, second], said
    assert cloud.host_ids == [HOST_ID, HOST_ID], said
    assert "the host certificate files changed" in said, said


async def test_a_node_host_whose_old_certificate_is_revoked_connects_with_the_new_one(
    node: str, tmp_path: Path
) -> None:
    """Rotating a host certificate ends with revoking the old one (docs/deployment.md), and the
    cloud ends the open stream of a revoked certificate UNAUTHENTICATED. A host whose stream
    stayed up from the new certificate's issue to that revocation had never connected with the
    new one, and host.js stopped there (exit 4) with the new certificate on its disk. When its
    files hold another certificate than the one refused, it now connects with that; the
    refusal of the certificate its files hold still stops it (exit 4)."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud = rig.cloud
        cert, first = _own_certificate(rig.fake.pki_dir)
        async with _host(node, rig, tmp_path) as run:
            host = run.process
            revoked = grpc.StatusCode.UNAUTHENTICATED
            await _hellos(cloud, host, 1)
            pki.write_host_cert(rig.fake.pki_dir, HOST_ID)
            second = pki.serial_hex(cert.read_bytes())
            cloud.cut(revoked, f"certificate revoked (serial {first})")  # `amc certs revoke`
            await _hellos(cloud, host, 2)
            cloud.cut(revoked, f"certificate revoked (serial {second})")
            code = await asyncio.wait_for(host.wait(), 60)
    said = run.said
    assert cloud.serials == [first, second], said
    assert code == exit_codes.CLOUD, said
    assert said.strip().splitlines()[-1] == (
        f"[node-host] error: code {revoked.value[0]}: certificate revoked (serial {second})"
    ), said


async def test_a_node_host_whose_files_hold_another_host_s_certificate_stops_when_refused(
    node: str, tmp_path: Path
) -> None:
    """The files holding a different certificate overruled the cloud's refusal even when it
    named another host (h2's files copied over this host's): host.js reconnected, silently,
    as h2. A replacement counts only when it names this host; else the refusal stands (4)."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud, pki_dir = rig.cloud, rig.fake.pki_dir
        _, first = _own_certificate(pki_dir)
        async with _host(node, rig, tmp_path) as run:
            host = run.process
            revoked = grpc.StatusCode.UNAUTHENTICATED
            code: int | None = None
            await _hellos(cloud, host, 1)
            pki.write_host_cert(pki_dir, "h2")
            for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
                os.replace(pki_dir / theirs, pki_dir / mine)
            cloud.cut(revoked, f"certificate revoked (serial {first})")
            code = await asyncio.wait_for(host.wait(), 30)
    said = run.said
    assert cloud.serials == [first], said
    assert code == exit_codes.CLOUD, said
    assert "now hold another host's certificate (h2;" in said, said


#: How the planner below ends a step asked with a certificate it has not revoked: a refusal
#: that ends the attempt (the fake has no decisions to give).
BUDGET = "budget exhausted: 10,412 tokens of the task's 10,000"


class _RevokingPlanner(planner_service_pb2_grpc.PlannerServiceServicer):
    """Refuses a Decide made with the `revoked` certificate as the cloud refuses every call of
    a revoked one (UNAUTHENTICATED), ending that certificate's Lease stream as the cloud does;
    any other ends the attempt (BUDGET). Notes each call's certificate serial."""

    def __init__(self, cloud: FakeCloud) -> None:
        self.cloud, self.revoked, self.serials = cloud, "", list[str | None]()
        #: Done once, while the next Decide is in flight (before it is answered): files issued
        #: again then are presented by the Decide after it, not by this one.
        self.meanwhile: Callable[[], object] | None = None

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> NoReturn:
        serial = peer_serial(context)
        self.serials.append(serial)
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
        if serial == self.revoked:
            said = f"certificate revoked (serial {serial})"
            self.cloud.cut(grpc.StatusCode.UNAUTHENTICATED, said)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, said)
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, BUDGET)
        raise AssertionError("abort returns only by raising")


async def test_a_step_refused_for_a_certificate_revoked_after_its_rotation_is_asked_again(
    node: str, tmp_path: Path
) -> None:
    """The certificate is issued again and the old one revoked (the last step of rotating it)
    while a step's Decide is in flight on the old one: the cloud refuses that Decide
    UNAUTHENTICATED, and ends the Lease stream. host.js
    ended the attempt for good on that refusal ("host error: certificate revoked …", not
    retryable): a task failed for a certificate rotation. It now asks again, and the host,
    connected again with the new certificate (its planner client too), is answered."""
    cloud = FakeCloud()
    planner = _RevokingPlanner(cloud)
    async with fake_cloud_and_phones(tmp_path, HOST_ID, cloud=cloud, planner=planner) as rig:
        pki_dir = rig.fake.pki_dir
        cert, first = _own_certificate(pki_dir)
        async with _host(node, rig, tmp_path) as run:
            host = run.process
            await cloud.wait_for(lambda: cloud.hellos or host.returncode is not None, 60)
            planner.meanwhile = lambda: pki.write_host_cert(pki_dir, HOST_ID)
            planner.revoked = first  # `amc certs revoke` of the old one
            await cloud.assign("t1", "emulator-5554", "Turn on dark theme")
            await cloud.wait_for(lambda: cloud.results or host.returncode is not None, 60)
            second = pki.serial_hex(cert.read_bytes())
    said = run.said
    [result] = cloud.results
    assert (result.status, result.summary) == (
        types_pb2.TASK_STATUS_FAILED,
        f"host error: {BUDGET}",
    ), said
    assert planner.serials[0] == first, said
    assert planner.serials[-1] == second, said
    assert cloud.serials == [first, second], said


async def _serve_once(
    fifo: Path, body: bytes, then: Path, host: asyncio.subprocess.Process
) -> None:
    """`body` to the first reader of the FIFO `fifo` (opened for writing once a reader has it
    open: polled, so a host that never reads it fails the test instead of hanging it); then
    `then` renamed over `fifo`, before the reader can read the name again."""
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:  # ENXIO: no reader yet
            if exc.errno != errno.ENXIO or host.returncode is not None:
                raise
            await asyncio.sleep(0.01)
            continue
        break
    try:
        os.set_blocking(fd, True)
        os.write(fd, body)
    finally:
        os.close(fd)
    os.replace(then, fifo)


async def test_a_key_read_between_the_renames_of_a_new_pair_is_read_once_more(
    node: str, tmp_path: Path
) -> None:
    """`amc certs` renames a new key into place, then its certificate: host.js reading its
    files between the two found the new key beside the old certificate and refused to start
    (exit 5), where `amc host run` reads them once more after 0.5 s. host.js does too: its
    first read of the key (a FIFO) gets another certificate's key, the right one is renamed
    into place meanwhile, and the host connects."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud, pki_dir = rig.cloud, rig.fake.pki_dir
        pki.write_host_cert(pki_dir, "h2")
        key = pki_dir / pki.host_files(HOST_ID)[1]
        staged = tmp_path / "staged.key"  # the rest of the issuing: this host's own key
        shutil.copy2(key, staged)
        key.unlink()
        os.mkfifo(key)
        async with running_host(node, rig, HOST_ID, tmp_path / "host-data") as run:
            host = run.process
            other = (pki_dir / pki.host_files("h2")[1]).read_bytes()
            await asyncio.wait_for(_serve_once(key, other, staged, host), 60)
            await _hellos(cloud, host, 1)
    said = run.said
    assert run.alive, said
    assert cloud.host_ids == [HOST_ID], said


async def test_a_node_host_keeps_its_own_certificate_when_its_files_name_another_host(
    node: str, tmp_path: Path
) -> None:
    """Only the cloud's refusal checked whom the files named: an ordinary reconnect (the stream
    lost) after h2's files were copied over this host's took them, and host.js went on,
    silently, as h2. Once connected as h1 it refuses files naming another host at every read:
    it reconnects with its own certificate while the cloud would take it, and once that one
    expired it stops (exit 4) naming both hosts and the file."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud = rig.cloud
        certs = tmp_path / "short"  # this host's certificate, valid for seconds more
        cert = flawed_copy(
            rig.fake.pki_dir,
            f"host-{HOST_ID}",
            "expires_in_seconds",
            certs,
            dt.timedelta(seconds=20),
        )
        end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
        first = pki.serial_hex(cert.read_bytes())
        async with _host(node, rig, tmp_path, certs=certs) as run:
            host = run.process
            code: int | None = None
            await _hellos(cloud, host, 1)
            pki.write_host_cert(certs, "h2")
            for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
                os.replace(certs / theirs, certs / mine)
            other = pki.serial_hex(cert.read_bytes())
            cloud.cut()  # the stream is lost: the host reconnects
            await _hellos(cloud, host, 2)
            assert cloud.serials == [first, first], "it reconnected with h2's certificate"
            await until(lambda: expired(end), 60, "the host certificate expired")
            cloud.cut()
            code = await asyncio.wait_for(host.wait(), 60)
    said = run.said
    assert cloud.serials == [first, first], said
    assert cloud.host_ids == [HOST_ID, HOST_ID], said
    # Node writes a serial in upper case, with a leading zero to an even number of digits.
    claim = (
        rf"the host certificate files now hold another host's certificate \(h2, serial "
        rf"0?{other.upper()}, in {re.escape(str(cert))}; this host connected as {HOST_ID}\)"
    )
    mine = rf"\(serial 0?{first.upper()}\)"
    assert re.search(rf"{claim}: it keeps presenting its own {mine}", said), said
    assert code == exit_codes.CLOUD, said
    last = said.strip().splitlines()[-1]
    assert re.match(
        rf"\[node-host\] error: {claim}, and its own certificate {mine} cannot be used any "
        rf"more: host certificate {re.escape(str(cert))} expired",
        last,
    ), said


async def _said(host: asyncio.subprocess.Process, said: list[str], words: str) -> bool:
    """Whether host.js says a line with `words` before it exits; each line read is added to
    `said` (the rest is left to `communicate`)."""
    assert host.stderr is not None
    while line := (await host.stderr.readline()).decode():
        said.append(line)
        if words in line:
            return True
    return False


async def test_a_node_host_checks_again_certificate_files_gone_bad_while_it_ran(
    node: str, tmp_path: Path
) -> None:
    """Its certificate files became ones the cloud would refuse (here: expired) after host.js
    connected with them: at its next connection it stopped with 5, where `amc host run` says
    why and checks again after its longest reconnect wait, so the operator fixes the files
    without a restart. host.js does as `amc host run`, in its words; once the files are fixed
    it connects with them."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud = rig.cloud
        cert, first = _own_certificate(rig.fake.pki_dir)
        good = shutil.copy2(cert, tmp_path / "good.pem")
        bad = flawed_copy(rig.fake.pki_dir, f"host-{HOST_ID}", "expired", tmp_path / "expired")
        async with _host(node, rig, tmp_path, AMC_HOST_RECONNECT_MAX_S="1") as run:
            host = run.process
            said: list[str] = []
            checking = False
            await _hellos(cloud, host, 1)
            os.replace(bad, cert)
            cloud.cut()  # the stream is lost: the host reconnects, with files gone bad
            checking = await asyncio.wait_for(_said(host, said, "Checking again in"), 60)
            if checking:
                os.replace(good, cert)  # fixed
                await _hellos(cloud, host, 2)
    lines = "".join(said) + run.said
    assert checking and run.alive, lines
    assert cloud.serials == [first, first], lines
    assert re.search(
        rf"\[node-host\] not connecting: host certificate {re.escape(str(cert))} expired [^\n]* "
        rf"\(the cloud would refuse it\); install a new one \(`amc certs host DIR {HOST_ID}`\)\. "
        r"Checking again in 1 s\n",
        lines,
    ), lines


async def test_a_node_host_keeps_its_own_certificate_when_its_files_name_no_host(
    node: str, tmp_path: Path
) -> None:
    """host.js read a certificate naming no host id (an operator's, copied over this host's
    files) as naming '', which its identity checks let through: it reconnected with it, and
    stopped with 4 when the cloud refused it. `amc host run` takes such files as another
    host's (its subject names them): it keeps its own certificate. host.js does too."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud, pki_dir = rig.cloud, rig.fake.pki_dir
        cert, first = _own_certificate(pki_dir)
        async with _host(node, rig, tmp_path) as run:
            host = run.process
            await _hellos(cloud, host, 1)
            for mine, theirs in zip(
                pki.host_files(HOST_ID), ("operator-local.pem", "operator-local.key"), strict=True
            ):
                shutil.copy(pki_dir / theirs, pki_dir / mine)
            cloud.cut()  # the stream is lost: the host reconnects
            await _hellos(cloud, host, 2)
    said = run.said
    assert run.alive, said
    assert cloud.serials == [first, first], said
    assert re.search(
        r"now hold another host's certificate \(CN=operator local, serial [0-9A-F]+, in "
        rf"{re.escape(str(cert))}; this host connected as {HOST_ID}\): it keeps presenting its own",
        said,
    ), said


async def test_a_node_host_says_once_per_certificate_that_it_keeps_its_own(
    node: str, tmp_path: Path
) -> None:
    """Once connected as this host, files naming h2 are refused at every read, and host.js
    said so at every read: each reconnect logged the same line again, for as long as the
    files stayed wrong. It says it once per file and certificate, as `amc host run` does:
    again only when another certificate lands in the files."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud, pki_dir = rig.cloud, rig.fake.pki_dir
        _, first = _own_certificate(pki_dir)
        async with _host(node, rig, tmp_path) as run:
            host = run.process

            def copied_over() -> None:
                """h2's files issued anew and copied over this host's."""
                pki.write_host_cert(pki_dir, "h2")
                for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
                    shutil.copy(pki_dir / theirs, pki_dir / mine)

            await _hellos(cloud, host, 1)
            for reconnect in range(2, 6):
                if reconnect in (2, 5):
                    copied_over()
                cloud.cut()  # the stream is lost: the host reconnects
                await _hellos(cloud, host, reconnect)
    said = run.said
    assert run.alive, said
    assert cloud.serials == [first] * 5, said
    kept = [line for line in said.splitlines() if "it keeps presenting its own" in line]
    assert len(kept) == 2, said


async def test_a_node_host_tries_again_certificate_files_it_cannot_read_while_it_runs(
    node: str, tmp_path: Path
) -> None:
    """A certificate file that cannot be read (an I/O error; a permission taken away) after
    host.js connected with it stopped the host with 70, where `amc host run` says so and
    tries again with its backoff (an OSError). host.js does too, and connects once the file
    can be read. The unreadable file: a link to /proc/self/mem, whose read fails with EIO."""
    async with fake_cloud_and_phones(tmp_path, HOST_ID) as rig:
        cloud = rig.cloud
        cert, first = _own_certificate(rig.fake.pki_dir)
        good = shutil.copy2(cert, tmp_path / "good.pem")
        async with _host(node, rig, tmp_path) as run:
            host = run.process
            said: list[str] = []
            told = False
            await _hellos(cloud, host, 1)
            cert.unlink()
            cert.symlink_to("/proc/self/mem")
            cloud.cut()  # the stream is lost: the host reconnects, and cannot read the file
            told = await asyncio.wait_for(_said(host, said, f"not connecting: {cert}: EIO"), 60)
            if told:
                os.replace(good, cert)  # readable again
                await _hellos(cloud, host, 2)
    lines = "".join(said) + run.said
    assert told and run.alive, lines
    assert cloud.serials == [first, first], lines
    assert re.search(rf"not connecting: {re.escape(str(cert))}: EIO[^\n]*; reconnecting in", lines)


async def test_a_node_host_s_decide_presents_new_files_while_its_stream_stays_up(
    node: str, tmp_path: Path
) -> None:
    """The certificate is issued again while host.js's lease stream stays up: its planner
    client was made again only at a connection, so every Decide presented the old certificate
    until the stream ended. Each Decide now looks at the files first, as `amc host run` does
    (tests/host/test_certificate_rotation.py): the next one presents the new certificate, on
    the stream that never reconnected (looked at before each Decide here: not every 5 s)."""
    cloud = FakeCloud()
    planner = _RevokingPlanner(cloud)
    async with fake_cloud_and_phones(tmp_path, HOST_ID, cloud=cloud, planner=planner) as rig:
        pki_dir = rig.fake.pki_dir
        cert, first = _own_certificate(pki_dir)
        async with _host(node, rig, tmp_path, AMC_HOST_CERT_LOOK_S="0") as run:
            host = run.process
            await _hellos(cloud, host, 1)
            for done, task_id in enumerate(("t1", "t2"), start=1):

                def answered(n: int = done) -> bool:
                    return len(cloud.results) == n or host.returncode is not None

                await cloud.assign(task_id, "emulator-5554", "Turn on dark theme")
                await cloud.wait_for(answered, 60)
                if task_id == "t1":
                    pki.write_host_cert(pki_dir, HOST_ID)  # as `amc certs host` issues it again
            second = pki.serial_hex(cert.read_bytes())
    said = run.said
    assert first != second
    assert [r.summary for r in cloud.results] == [f"host error: {BUDGET}"] * 2, said
    assert planner.serials == [first, second], said
    assert cloud.serials == [first], said


class _RefusingPlanner(planner_service_pb2_grpc.PlannerServiceServicer):
    """Refuses a Decide of the `revoked` serial UNAUTHENTICATED, as the cloud refuses a revoked
    certificate's calls, without ending the Lease stream of another serial; ends any other
    with a budget. Notes each call's certificate serial."""

    def __init__(self) -> None:
        self.revoked, self.serials = "", list[str | None]()

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> NoReturn:
        serial = peer_serial(context)
        self.serials.append(serial)
        if serial == self.revoked:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, f"certificate revoked (serial {serial})"
            )
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, BUDGET)
        raise AssertionError("abort returns only by raising")


async def test_a_refused_new_certificate_ends_the_step_instead_of_asking_again(
    node: str, tmp_path: Path
) -> None:
    """The certificate is issued again while the lease stream stays up on the old one; a
    Decide presents the new one (its planner client made again from the files), and the cloud
    refuses THAT one (revoked by mistake). host.js compared the files with the stream's (the
    old certificate), found them "replaced", and asked the step again for ever, each ask
    refused. It compares them with the refused client's now: the refusal stands, the attempt
    ends."""
    cloud = FakeCloud()
    planner = _RefusingPlanner()
    async with fake_cloud_and_phones(tmp_path, HOST_ID, cloud=cloud, planner=planner) as rig:
        pki_dir = rig.fake.pki_dir
        cert, first = _own_certificate(pki_dir)
        async with _host(node, rig, tmp_path) as run:
            host = run.process
            await _hellos(cloud, host, 1)
            pki.write_host_cert(pki_dir, HOST_ID)  # issued again; the stream stays up on `first`
            second = pki.serial_hex(cert.read_bytes())
            planner.revoked = second  # `amc certs revoke --cert pki/host-h1.pem` by mistake
            await cloud.assign("t1", "emulator-5554", "Turn on dark theme")
            await cloud.wait_for(lambda: cloud.results or host.returncode is not None, 60)
    said = run.said
    [result] = cloud.results
    assert result.status == types_pb2.TASK_STATUS_FAILED, said
    assert "certificate revoked" in result.summary, said
    assert planner.serials == [second], said
    assert cloud.serials == [first], said  # the lease stream never reconnected


async def test_a_node_host_keeps_its_newest_own_certificate_when_its_files_name_another_host(
    node: str, tmp_path: Path
) -> None:
    """Its certificate issued again while the stream stayed up, a Decide presented the new one;
    then h2's files were copied over. Reconnecting, host.js kept "its own" certificate: the
    stream's, the old one (the one being revoked in that rotation), not the newest it had. It
    keeps the newest now, as `amc host run` does."""
    cloud = FakeCloud()
    planner = _RefusingPlanner()
    async with fake_cloud_and_phones(tmp_path, HOST_ID, cloud=cloud, planner=planner) as rig:
        pki_dir = rig.fake.pki_dir
        cert, first = _own_certificate(pki_dir)
        async with _host(node, rig, tmp_path) as run:
            host = run.process
            await _hellos(cloud, host, 1)
            pki.write_host_cert(pki_dir, HOST_ID)  # issued again; the stream stays up on `first`
            second = pki.serial_hex(cert.read_bytes())
            await cloud.assign("t1", "emulator-5554", "Turn on dark theme")
            await cloud.wait_for(lambda: cloud.results or host.returncode is not None, 60)
            pki.write_host_cert(pki_dir, "h2")
            for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
                os.replace(pki_dir / theirs, pki_dir / mine)
            cloud.cut()  # the stream is lost: the host reconnects
            await _hellos(cloud, host, 2)
    said = run.said
    assert planner.serials == [second], said
    assert cloud.serials == [first, second], said
    assert re.search(rf"it keeps presenting its own \(serial 0?{second.upper()}\)", said), said


async def test_a_node_host_looks_at_its_files_before_a_decide_at_most_every_few_seconds(
    node: str, tmp_path: Path
) -> None:
    """host.js looked at its certificate files before every Decide, each look a process of its
    own (about 175 ms, 40 MB). It looks once every `AMC_HOST_CERT_LOOK_S` at most (an hour
    here): a certificate issued again after the first Decide's look is not presented by the
    second Decide, made within that time."""
    cloud = FakeCloud()
    planner = _RefusingPlanner()
    async with fake_cloud_and_phones(tmp_path, HOST_ID, cloud=cloud, planner=planner) as rig:
        pki_dir = rig.fake.pki_dir
        cert, first = _own_certificate(pki_dir)
        async with _host(node, rig, tmp_path, AMC_HOST_CERT_LOOK_S="3600") as run:
            host = run.process
            await _hellos(cloud, host, 1)
            for done, task_id in enumerate(("t1", "t2"), start=1):

                def answered(n: int = done) -> bool:
                    return len(cloud.results) == n or host.returncode is not None

                await cloud.assign(task_id, "emulator-5554", "Turn on dark theme")
                await cloud.wait_for(answered, 60)
                if task_id == "t1":
                    pki.write_host_cert(pki_dir, HOST_ID)  # as `amc certs host` issues it again
            second = pki.serial_hex(cert.read_bytes())
    said = run.said
    assert first != second
    assert [r.summary for r in cloud.results] == [f"host error: {BUDGET}"] * 2, said
    assert planner.serials == [first, first], said
