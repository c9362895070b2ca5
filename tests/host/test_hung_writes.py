"""A host whose disk hangs a write (a dead NFS mount, a dying SSD: a write that never
returns) stays responsive and exits on SIGTERM.

A real host process (`tests/host/hung_write_host.py`: `asyncio.run(run_host(...))`, as `amc
host run`, two virtual phones behind the virtual adb server) dials the fake cloud this test
serves on loopback over mTLS (`lease_fake.py`), so what the cloud hears is what the host's
event loop and device poll still do while the write hangs. The write opens a FIFO nobody
reads. Each test fails before its fix within its bounds (they only end the test: before,
the host waited for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from amc.v1 import types_pb2
from tests.host.hung_write_host import FINISH, GONE, HOST_ID, OTHER
from tests.host.lease_fake import FakeCloud, RunningCloud, start_fake_cloud

#: Seconds the host process has to exit after SIGTERM: its stop waits `stop_grace_s` (1 s
#: here) for its attempts and as long for the cloud's answers, then `BACKGROUND_STOP_S` (2 s)
#: at most for each kind of background write; the rest is the bound's slack.
EXIT_S = 30.0


class _Host:
    """The host process and the lines it printed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def said(self, line: str, within: float = 60.0) -> None:
        assert self.proc.stdout is not None
        got = await asyncio.wait_for(self.proc.stdout.readline(), within)
        assert got.decode().strip() == line

    async def exits_on_sigterm(self, hung: str) -> None:
        """SIGTERM: the process must exit, status 0, within `EXIT_S`, saying "stopped"."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), EXIT_S)
        except TimeoutError:
            raise AssertionError(f"the host's exit still waits on its hung {hung}") from None
        assert self.proc.returncode == 0
        assert self.proc.stdout is not None
        assert (await self.proc.stdout.read()).decode().split() == ["stopped"]


@contextlib.asynccontextmanager
async def _host(
    tmp_path: Path, hangs: str, *, connected: bool = True
) -> AsyncIterator[tuple[_Host, FakeCloud]]:
    """The fake cloud, and the host process dialing it, connected (unless not `connected`:
    then as soon as it runs); killed if still running at the end, and its hung write let go
    (a reader opens the FIFO)."""
    cloud: RunningCloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    cloud.cloud.lease_s = 3.0  # renewed every second
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.host.hung_write_host",
        str(tmp_path),
        str(cloud.port),
        hangs,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        if connected:
            await cloud.cloud.wait_for(lambda: bool(cloud.cloud.hellos), within=60)
        yield _Host(proc), cloud.cloud
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        with contextlib.suppress(OSError):  # a reader lets the hung open go, if it waits
            os.close(os.open(tmp_path / "hung-disk", os.O_RDONLY | os.O_NONBLOCK))
        await cloud.server.stop(grace=None)


def _renewals(fake: FakeCloud, task_id: str) -> int:
    return sum(
        1
        for r in fake.received
        if r.WhichOneof("kind") == "renewal" and r.renewal.task_id == task_id
    )


async def test_an_attempt_end_hung_on_the_disk_leaves_the_other_leases_renewed(
    tmp_path: Path,
) -> None:
    """Attempt t2 runs (its planner thinks for ever) while t1 ends; t1's end write to the
    timeline hangs. t2's lease is still renewed (the cloud keeps receiving its renewals), and
    the host exits on SIGTERM. Before, the lease client wrote the end on the event loop: the
    loop stopped with the write, so no lease was renewed any more (the cloud hands such a
    task to another phone while this one still runs it), no revocation was heard, and SIGTERM
    was never handled."""
    await _t1_hangs_t2_renewed(tmp_path, "end", "ending", "attempt end")


async def test_a_result_keep_hung_on_the_disk_leaves_the_other_leases_renewed(
    tmp_path: Path,
) -> None:
    """As above, but what hangs is keeping t1's result on disk (the outbox's write, holding
    its lock). t1's result still reaches the cloud, t2's lease is still renewed, and the host
    exits on SIGTERM. Before, the lease client kept the result on the event loop: the loop
    stopped with the write, and the result was never sent, no lease renewed."""
    await _t1_hangs_t2_renewed(tmp_path, "keep", "keeping", "result keep")


async def _t1_hangs_t2_renewed(tmp_path: Path, mode: str, said: str, what: str) -> None:
    """t1 finishes and its `mode` write hangs (the host says `said`); t2's lease keeps being
    renewed, t1's result reaches the cloud, and the host exits on SIGTERM despite the hung
    `what`."""
    async with _host(tmp_path, mode) as (host, fake):
        await fake.assign("t2", OTHER, "keep planning")
        await fake.wait_for(lambda: _renewals(fake, "t2") >= 1, within=30)
        await fake.assign("t1", GONE, FINISH)
        await host.said(said)
        before = _renewals(fake, "t2")
        await fake.wait_for(lambda: _renewals(fake, "t2") >= before + 3, within=20)
        assert [r.task_id for r in fake.results] == ["t1"]
        await host.exits_on_sigterm(what)


async def test_an_outbox_read_hung_on_the_disk_holds_no_exit(tmp_path: Path) -> None:
    """The outbox sender's read of its head hangs on the disk, holding the outbox's lock (so
    the backlog report's read waits behind it). SIGTERM: the host exits. Before, both reads
    ran in asyncio's default pool, whose threads `asyncio.run` joins at exit
    (`shutdown_default_executor`): the hung read held the exit for ever."""
    async with _host(tmp_path, "outbox") as (host, _):
        await host.said("reading")
        await host.exits_on_sigterm("outbox read")


async def test_a_forgotten_phones_mark_delete_hung_on_the_disk_leaves_the_poll_going(
    tmp_path: Path,
) -> None:
    """A phone unplugged for longer than `device_forget_after_s` is forgotten, and deleting
    its kept unhealthy mark hangs on the disk, holding the timeline's lock. Another phone
    unplugged meanwhile is still seen gone (the cloud hears it OFFLINE), and the host exits
    on SIGTERM. Before, the delete ran in the registry's listener, in the device poll's
    thread: the poll stopped with it (no phone came or went any more), and that thread, in
    asyncio's default pool, held the exit for ever."""
    async with _host(tmp_path, "forget") as (host, fake):
        await host.said("dropping")
        offline = types_pb2.DEVICE_STATE_OFFLINE
        await fake.wait_for(lambda: fake.reported_states(OTHER)[-1:] == [offline], within=20)
        await host.exits_on_sigterm("mark delete")


async def test_a_progress_write_hung_on_the_disk_leaves_the_other_leases_renewed(
    tmp_path: Path,
) -> None:
    """Attempt t2 runs (its planner thinks for ever) while t1 starts, and t1's first progress
    write to the timeline hangs, holding its lock. t2's lease is still renewed and the host
    exits on SIGTERM. Before, the agent loop wrote each progress change on the event loop:
    the loop stopped with the write, so no lease was renewed any more."""
    async with _host(tmp_path, "progress") as (host, fake):
        await fake.assign("t2", OTHER, "keep planning")
        await fake.wait_for(lambda: _renewals(fake, "t2") >= 1, within=30)
        await fake.assign("t1", GONE, FINISH)
        await host.said("progressing")
        before = _renewals(fake, "t2")
        await fake.wait_for(lambda: _renewals(fake, "t2") >= before + 3, within=20)
        await host.exits_on_sigterm("progress write")


async def test_a_step_record_hung_on_the_disk_holds_no_exit(tmp_path: Path) -> None:
    """Attempt t1's step record (`append_step`) hangs on the disk. SIGTERM: the host hands the
    attempt back (its step is stuck past `stop_grace_s`) and exits. Before, the agent loop
    wrote its records in asyncio's default pool, whose threads `asyncio.run` joins at exit
    (`shutdown_default_executor`): the hung write held the exit for ever."""
    async with _host(tmp_path, "step") as (host, fake):
        await fake.assign("t1", GONE, FINISH)
        await host.said("recording")
        await host.exits_on_sigterm("step record")


@pytest.mark.parametrize("read", ["held", "backlog"])
async def test_a_start_read_hung_on_the_disk_starts_the_host_paused(
    tmp_path: Path, read: str
) -> None:
    """The start's read of the results the previous process kept (`held`), or of the outbox's
    backlog (`backlog`), hangs on the disk. The host still connects, paused as on a full
    disk: its phones OFFLINE, saying why; and exits on SIGTERM. Before, both reads were
    awaited with no bound before the host dialed the cloud: it never connected (no hello)
    and never stopped."""
    async with _host(tmp_path, read) as (host, fake):  # connected: the hello came
        await host.said("reading")
        phones = fake.hellos[0].devices
        assert phones
        for phone in phones:
            assert phone.state == types_pb2.DEVICE_STATE_OFFLINE
            assert "did not return within 2 s: the disk hangs" in phone.reason
            assert "takes no work until a write there succeeds" in phone.reason
        await host.exits_on_sigterm("start read")


async def test_a_start_read_that_returns_late_is_used_and_the_host_resumes(
    tmp_path: Path,
) -> None:
    """As above (`held`: the previous process kept t0's result), then the disk answers again
    (a reader opens the FIFO): the read returns, t0's result is sent to the cloud, and the
    next probe write puts the phones back to work (the cloud hears them ONLINE)."""
    async with _host(tmp_path, "held") as (host, fake):
        await host.said("reading")
        assert not fake.results
        os.close(os.open(tmp_path / "hung-disk", os.O_RDONLY | os.O_NONBLOCK))
        await fake.wait_for(lambda: [r.task_id for r in fake.results][:1] == ["t0"], within=20)
        online = types_pb2.DEVICE_STATE_ONLINE
        await fake.wait_for(lambda: fake.reported_states(GONE)[-1:] == [online], within=20)
        await host.exits_on_sigterm("start read")


async def test_a_start_write_hung_on_the_disk_starts_the_host_paused(tmp_path: Path) -> None:
    """The start's settling of what the last run left (marking its attempts interrupted)
    hangs on the disk. The host still connects, paused as on a full disk: its phones
    OFFLINE, saying why; and exits on SIGTERM. Before, the start made it on the event loop
    (`build_host`): the loop stopped with the write, the host never connected, and the
    SIGTERM handler `run_host` had installed never ran: it waited for ever."""
    async with _host(tmp_path, "settle") as (host, fake):  # connected: the hello came
        await host.said("settling")
        phones = fake.hellos[0].devices
        assert phones
        for phone in phones:
            assert phone.state == types_pb2.DEVICE_STATE_OFFLINE
            assert (
                "settling what the last run left did not return within 2 s: the disk hangs"
                in phone.reason
            )
        await host.exits_on_sigterm("start write")


async def test_a_store_opening_hung_on_the_disk_holds_no_stop(tmp_path: Path) -> None:
    """Opening the timeline at start hangs on the disk: the host cannot start without it.
    SIGTERM: it stops, status 0, having sent nothing. Before, it opened the timeline on the
    event loop: the SIGTERM handler never ran, and the host waited for ever."""
    async with _host(tmp_path, "open", connected=False) as (host, fake):
        await host.said("opening")
        await host.exits_on_sigterm("store opening")
        assert not fake.hellos
