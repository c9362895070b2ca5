"""host.js ends with the code `amc host run` ends with for the same cause (docs/cli.md, "Exit
codes"), so one supervisor rule serves either host: its key not its certificate's (5, named
before any connection), a missing key file or a bad setting (2), an error nothing expected
(70, where Node's own code was 1), superseded by another process of its certificate (0, as the
Python host).

Real parts: host.js as its own process, its certificate files on disk, a virtual phone over
adb, and for the superseding a real cloud (`cloud_and_phone`) and a second host.js."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from cloud import pki
from console import exit_codes
from host.devices.virtual.adb_server import VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import cloud_and_phone, spawn_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.processes import free_port

__all__ = ["node"]


async def _ended(host: asyncio.subprocess.Process) -> list[str]:
    """What `host` said, once it stopped (within 60 s, else the test fails)."""
    try:
        _, err = await asyncio.wait_for(host.communicate(), 60)
    except TimeoutError:
        host.kill()
        _, err = await host.communicate()
        raise AssertionError(f"the host did not stop:\n{err.decode()}") from None
    return err.decode().strip().splitlines()


async def _run_alone(node: str, tmp_path: Path, **env: str) -> tuple[int | None, list[str]]:
    """host.js with the fleet's files for `HOST_ID` (changed by the caller) and a phone, its
    cloud address one nobody listens on: it must stop before it connects."""
    adb = VirtualAdbServer([VirtualPhone("emulator-5554")])
    adb_port = await adb.start()
    try:
        host = await spawn_host(
            node,
            f"127.0.0.1:{free_port()}",
            tmp_path / "pki",
            HOST_ID,
            adb_port,
            tmp_path / "host-data",
            **env,
        )
        said = await _ended(host)
    finally:
        await adb.stop()
    return host.returncode, said


async def test_a_key_that_is_not_the_certificate_s_is_named_and_exits_5(
    node: str, tmp_path: Path
) -> None:
    """grpc-js threw "key values mismatch" as host.js loaded: a stack trace, exit 1. The Python
    host names both files and exits 5; so does host.js now, before any connection."""
    certs = pki.ensure_embedded_pki(tmp_path, [HOST_ID], operator="admin")
    key = certs / f"host-{HOST_ID}.key"
    key.write_bytes((certs / "operator-admin.key").read_bytes())
    code, said = await _run_alone(node, tmp_path)
    assert code == exit_codes.CERTIFICATE, said
    assert said[-1].startswith(
        f"[node-host] error: not connecting: the key {key} of host certificate "
        f"{certs / f'host-{HOST_ID}.pem'} is not the key of this certificate (it belongs to "
        "another one); install the key issued with the certificate"
    ), said


async def test_a_missing_key_file_exits_2(node: str, tmp_path: Path) -> None:
    """As `amc host run` says a missing certificate file (exit 2); host.js threw ENOENT as it
    loaded (exit 1)."""
    certs = pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    key = certs / f"host-{HOST_ID}.key"
    key.unlink()
    code, said = await _run_alone(node, tmp_path)
    assert code == exit_codes.USAGE, said
    assert said[-1] == f"[node-host] error: {key} does not exist (AMC_HOST_CERTS_DIR, AMC_HOST_ID)"


@pytest.mark.parametrize(
    ("setting", "value", "range_"),
    [
        ("AMC_HOST_DEVICE_POLL_INTERVAL_S", "2s", "above 0"),
        ("AMC_HOST_RECONNECT_INITIAL_S", "0", "above 0"),
        ("AMC_HOST_RECONNECT_MAX_S", "-1", "above 0"),
        ("AMC_HOST_STOP_GRACE_S", "-1", "from 0"),
        ("AMC_HOST_PROGRESS_RENEW_MIN_INTERVAL_S", "1s", "from 0"),
        ("AMC_HOST_PHONE_LOST_GRACE_S", "-5", "from 0"),
    ],
)
async def test_a_setting_in_seconds_that_is_no_number_above_0_is_named_and_exits_2(
    node: str, tmp_path: Path, setting: str, value: str, range_: str
) -> None:
    """A bad value is a usage error, as `amc host run` refuses one: host.js took `Number()` of
    it, so a typo (`2s`) polled adb, or reconnected, with no pause at all (NaN), and 0 or less
    the same; the poll and the reconnect waits had no setting to get wrong before."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    code, said = await _run_alone(node, tmp_path, **{setting: value})
    assert code == exit_codes.USAGE, said
    assert said[-1] == (
        f"{setting} must be a number of seconds {range_} up to 2147483, not '{value}' "
        "(see the top of host.js)"
    ), said


@pytest.mark.parametrize(
    ("setting", "value", "range_"),
    [
        ("AMC_TASKS", "one", "from 0 to 9007199254740991"),
        ("ADB_PORT", "70000", "from 1 to 65535"),
        ("AMC_HOST_UNHEALTHY_AFTER_ATTEMPTS", "2.5", "from 1 to 9007199254740991"),
    ],
)
async def test_a_counting_setting_that_is_no_whole_number_in_range_is_named_and_exits_2(
    node: str, tmp_path: Path, setting: str, value: str, range_: str
) -> None:
    """Taken as `Number()`, a typo ran on as NaN: AMC_TASKS as 0 (the host ran on for ever),
    ADB_PORT as no port (every phone OFFLINE), AMC_HOST_UNHEALTHY_AFTER_ATTEMPTS as "kept out
    after one failed attempt". As the settings in seconds, it is a usage error (exit 2)."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    code, said = await _run_alone(node, tmp_path, **{setting: value})
    assert code == exit_codes.USAGE, said
    assert said[-1] == (
        f"{setting} must be a whole number {range_}, not '{value}' (see the top of host.js)"
    ), said


async def test_an_error_nothing_expected_exits_70(node: str, tmp_path: Path) -> None:
    """The contract cannot be loaded (AMC_PROTO_DIR names no folder): Node's own uncaught
    exception ended host.js with 1, the code a supervisor or script reads as a failed task."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    code, said = await _run_alone(node, tmp_path, AMC_PROTO_DIR=str(tmp_path / "no-proto"))
    assert code == exit_codes.INTERNAL, said
    assert any(line.startswith("[node-host] internal error: ") for line in said), said


async def _line(host: asyncio.subprocess.Process, words: str, said: list[str]) -> None:
    """Read `host`'s stderr until a line holding `words` (every line kept in `said`)."""
    assert host.stderr is not None
    while line := (await host.stderr.readline()).decode():
        said.append(line)
        if words in line:
            return
    raise AssertionError(f"host.js ended before saying {words!r}:\n{''.join(said)}")


@pytest.mark.timeout(180)
async def test_a_superseded_node_host_stops_with_0(node: str, tmp_path: Path) -> None:
    """A second process started with the same certificate takes the stream (Superseded): the
    first stops and does not reconnect, as `amc host run` does, with 0 (host.js exited 1: a
    supervisor restarting it on failure had the two take the stream from each other)."""
    async with cloud_and_phone(tmp_path, VirtualPhone("emulator-5554"), HOST_ID) as rig:
        spawn = (node, rig.address, rig.pki, HOST_ID, rig.adb_port)
        first = await spawn_host(*spawn, tmp_path / "first")
        second: asyncio.subprocess.Process | None = None
        said: list[str] = []
        try:
            await asyncio.wait_for(_line(first, "connected as", said), 60)
            second = await spawn_host(*spawn, tmp_path / "second")
            assert first.stderr is not None
            said += (await asyncio.wait_for(first.stderr.read(), 60)).decode().splitlines()
            await asyncio.wait_for(first.wait(), 30)
        finally:
            for process in (first, second):
                if process is not None and process.returncode is None:
                    process.terminate()
                    await process.wait()
    assert first.returncode == 0, said
    assert any(
        "[node-host] stopping: " in line and "does not reconnect" in line for line in said
    ), said


async def test_certificate_files_that_hang_are_said_and_a_signal_still_stops_the_host(
    node: str, tmp_path: Path
) -> None:
    """host.js read its .pem files with a blocking read (at load, and before each
    connection): a certs folder on a disk that hangs held the whole process, and SIGTERM (its
    handler runs on the event loop) killed it instead of stopping it. Now the files are read in
    a process of their own, waited for 10 s at a time: the host says so, tries again (waiting
    on the same read), and stops cleanly on SIGTERM. The hang is a FIFO nobody writes to, in
    place of the host certificate."""
    certs = pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    cert = certs / f"host-{HOST_ID}.pem"
    cert.unlink()
    os.mkfifo(cert)
    adb = VirtualAdbServer([VirtualPhone("emulator-5554")])
    adb_port = await adb.start()
    said: list[str] = []
    try:
        host = await spawn_host(
            node, f"127.0.0.1:{free_port()}", certs, HOST_ID, adb_port, tmp_path / "host-data"
        )
        try:
            await asyncio.wait_for(_line(host, "did not return within 10 s", said), 40)
            host.send_signal(signal.SIGTERM)
            said += await _ended(host)
        finally:
            if host.returncode is None:
                host.kill()
                await host.wait()
    finally:
        await adb.stop()
    assert host.returncode == 0, said
    assert said[0].startswith(
        f"[node-host] not connecting: reading the host certificate files ({certs}) did not "
        "return within 10 s: the disk hangs; reconnecting in "
    ), said
