"""host.js and certificate files that vanish while it runs, and what it says while its files
keep it from connecting: as `amc host run` does (tests/host/test_certificate_files_missing.py;
docs/deployment.md, "Certificates and rotation").

Real parts: host.js as its own process, its certificate files on disk issued by the fleet CA
(`cloud.pki`), a virtual phone over adb, and the in-test LeaseService of tests/host/lease_fake.py
over real mTLS.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from cloud import pki
from host.devices.virtual.adb_server import VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from tests.host.lease_fake import FakeCloud, start_fake_cloud
from tests.node.rig import spawn_host
from tests.node.test_node_host import HOST_ID, node
from tests.node.test_node_host_certificates import _said
from tests.support.bad_certs import flawed_copy

__all__ = ["node"]

#: How long the files stay bad, at an attempt every 0.2 s (`AMC_HOST_RECONNECT_MAX_S`): enough
#: attempts for a line at each to show more than once (not a timing assertion: only a count).
BAD_FOR_S = 3.0


@dataclass
class _Run:
    cloud: FakeCloud
    host: asyncio.subprocess.Process
    pki_dir: Path
    #: What host.js said: the lines `_said` read, then the rest once it was stopped.
    said: list[str]


@asynccontextmanager
async def _connected_host(node: str, tmp_path: Path) -> AsyncIterator[_Run]:
    """host.js connected to the fake cloud, trying again every 0.2 s at most; killed (if it
    still runs) when the block ends, the rest of what it said added to `said`."""
    fake = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    adb = VirtualAdbServer([VirtualPhone("emulator-5554")])
    adb_port = await adb.start()
    host = await spawn_host(
        node,
        f"127.0.0.1:{fake.port}",
        fake.pki_dir,
        HOST_ID,
        adb_port,
        tmp_path / "host-data",
        AMC_HOST_RECONNECT_INITIAL_S="0.05",
        AMC_HOST_RECONNECT_MAX_S="0.2",
    )
    run = _Run(fake.cloud, host, fake.pki_dir, [])
    try:
        await fake.cloud.wait_for(
            lambda: len(fake.cloud.hellos) == 1 or host.returncode is not None, 60
        )
        yield run
    finally:
        if host.returncode is None:
            host.kill()
        _, err = await host.communicate()
        run.said.append(err.decode())
        await adb.stop()
        await fake.server.stop(grace=None)


async def _back(run: _Run) -> bool:
    """Whether host.js says it connected again (welcomed on a new stream) before it exits."""
    return await asyncio.wait_for(_said(run.host, run.said, "connected to the cloud again"), 60)


async def test_a_node_host_waits_for_a_certificate_file_gone_while_it_ran(
    node: str, tmp_path: Path
) -> None:
    """The key is deleted after host.js connected, and its stream is lost: the next attempt
    found the file missing and the host stopped with 2 (a setting to fix), where `amc host run`
    now says it is missing, once, and tries again. host.js does too, in the same words, and
    connects once the file is back (copied in under another name, then renamed)."""
    async with _connected_host(node, tmp_path) as run:
        key = run.pki_dir / pki.host_files(HOST_ID)[1]
        kept = shutil.copy2(key, tmp_path / "kept.key")
        key.unlink()
        run.cloud.cut()  # the stream is lost: the host reconnects, without its key
        told = await asyncio.wait_for(_said(run.host, run.said, "is missing"), 60)
        await asyncio.sleep(BAD_FOR_S)
        os.replace(kept, key)
        back = told and await _back(run)
    lines = "".join(run.said)
    assert told and back, lines
    said = [line for line in lines.splitlines() if "not connecting" in line]
    assert len(said) == 1, lines
    assert re.fullmatch(
        rf"\[node-host\] not connecting: {re.escape(str(key))} is missing; put it back \(copied "
        r"in under another name, then renamed into place with `mv`\)\. Checking again in "
        r"\d+\.\d s",
        said[0],
    ), said
    assert (
        f"connected to the cloud again: the certificate files can be used (they could not: "
        f"{key} is missing)"
    ) in lines


async def test_a_node_host_says_once_that_its_files_would_be_refused(
    node: str, tmp_path: Path
) -> None:
    """Files gone bad after host.js connected (here: the certificate expired) were said at
    every connection attempt: the same line filled the log for as long as they stayed bad.
    Said once now, as `amc host run` says it, and the connection that follows is said too."""
    async with _connected_host(node, tmp_path) as run:
        cert = run.pki_dir / pki.host_files(HOST_ID)[0]
        good = shutil.copy2(cert, tmp_path / "good.pem")
        os.replace(flawed_copy(run.pki_dir, f"host-{HOST_ID}", "expired", tmp_path / "x"), cert)
        run.cloud.cut()
        told = await asyncio.wait_for(_said(run.host, run.said, "Checking again in"), 60)
        await asyncio.sleep(BAD_FOR_S)
        os.replace(good, cert)
        back = told and await _back(run)
    lines = "".join(run.said)
    assert told and back, lines
    said = [line for line in lines.splitlines() if "not connecting" in line]
    assert len(said) == 1, lines
    assert f"not connecting: host certificate {cert} expired" in said[0], said
    assert (
        "connected to the cloud again: the certificate files can be used (they could not: "
        f"host certificate {cert} expired" in lines
    )


async def test_a_node_host_says_once_that_it_cannot_read_its_files(
    node: str, tmp_path: Path
) -> None:
    """A certificate file that cannot be read after host.js connected (an I/O error; here a
    link to /proc/self/mem, whose read fails with EIO) was said at every connection attempt
    ("not connecting: …: EIO …; reconnecting in …", every 0.2 s here). Said once now, as
    `amc host run` says it, and the connection once the file can be read is said too."""
    async with _connected_host(node, tmp_path) as run:
        cert = run.pki_dir / pki.host_files(HOST_ID)[0]
        good = shutil.copy2(cert, tmp_path / "good.pem")
        cert.unlink()
        cert.symlink_to("/proc/self/mem")
        run.cloud.cut()  # the stream is lost: the host reconnects, and cannot read the file
        told = await asyncio.wait_for(_said(run.host, run.said, f"{cert}: EIO"), 60)
        await asyncio.sleep(BAD_FOR_S)
        os.replace(good, cert)  # readable again
        back = told and await _back(run)
    lines = "".join(run.said)
    assert told and back, lines
    said = [line for line in lines.splitlines() if "not connecting" in line]
    assert len(said) == 1, lines
    assert re.fullmatch(
        rf"\[node-host\] not connecting: {re.escape(str(cert))}: EIO[^\n]*; reconnecting in "
        r"\d+\.\d s",
        said[0],
    ), said
    assert (
        "connected to the cloud again: the certificate files could be read (reading them "
        f"failed: {cert}: EIO"
    ) in lines


async def test_a_node_host_whose_files_hang_at_its_first_start_says_it_connected(
    node: str, tmp_path: Path
) -> None:
    """The certs folder's disk hangs when host.js first starts, then answers: its first ever
    welcome was said "connected to the cloud again: the certificate files can be used (they
    could not: … the disk hangs)", a connection it never had, and files it could not read said
    to be files the cloud would refuse. It says it connected, and that the files could be
    read, as `amc host run` does. The hang: a FIFO in place of the certificate, written once
    the host said it."""
    fake = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    cert = fake.pki_dir / pki.host_files(HOST_ID)[0]
    pem = cert.read_bytes()
    cert.unlink()
    os.mkfifo(cert)
    adb = VirtualAdbServer([VirtualPhone("emulator-5554")])
    adb_port = await adb.start()
    said: list[str] = []
    host = await spawn_host(
        node, f"127.0.0.1:{fake.port}", fake.pki_dir, HOST_ID, adb_port, tmp_path / "host-data",
        AMC_HOST_RECONNECT_INITIAL_S="0.05", AMC_HOST_RECONNECT_MAX_S="0.2",
        AMC_HOST_DISK_WAIT_S="2",
    )  # fmt: skip
    try:
        told = await asyncio.wait_for(_said(host, said, "the disk hangs"), 60)
        good = tmp_path / "good.pem"
        good.write_bytes(pem)

        def answer() -> None:  # the disk answers: the read under way gets the certificate
            with cert.open("wb") as fifo:  # the reader waits in its open: it opens now
                os.replace(good, cert)  # the reads after it read a file
                fifo.write(pem)

        await asyncio.to_thread(answer)
        back = told and await asyncio.wait_for(_said(host, said, "connected to the cloud"), 60)
    finally:
        if host.returncode is None:
            host.kill()
        _, err = await host.communicate()
        said.append(err.decode())
        await adb.stop()
        await fake.server.stop(grace=None)
    lines = "".join(said)
    assert told and back, lines
    assert "connected to the cloud again" not in lines, lines
    assert (
        "connected to the cloud: the certificate files could be read (reading them hung: "
        f"reading the host certificate files ({fake.pki_dir}) did not return within 2 s: the "
        "disk hangs)"
    ) in lines, lines
