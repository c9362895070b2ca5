"""The Node example host whose data folder hangs a call (a dead NFS mount, a dying SSD: a write
or read that never returns) stays responsive and exits on SIGTERM, as the Python host does
(tests/host/test_hung_writes.py).

Real parts: host.js as its own process, the in-test LeaseService of tests/host/lease_fake.py
(real mTLS, a real stream; it names its leases, so the test knows which result file the host
writes, and it sends an assignment the real cloud sends only in a race: one for a phone the
host does not have, refused, so its result is kept at once), a virtual phone served over the
adb protocol whose look hangs (the attempt on it runs on, renewed every second). The call that
hangs opens a FIFO nobody opens from the other side. Before the fix each test failed within
its bounds (they only end the test: the host waited for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from host.devices.virtual.phone import VirtualPhone
from tests.host.lease_fake import FakeCloud
from tests.node.rig import fake_cloud_and_phones, spawn_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.waiting import until

__all__ = ["node"]

#: Seconds host.js has to exit after SIGTERM: its stop waits AMC_HOST_STOP_GRACE_S (1 s here)
#: for its attempts and as long for the cloud's answers, then 2 s for the data folder's calls
#: under way; the rest is the bound's slack.
EXIT_S = 30.0
#: How long host.js waits for a call to its data folder before the folder counts as hanging
#: (`AMC_HOST_DISK_WAIT_S`, 10 s by default): short, so that each test waits out a few seconds
#: of the hang rather than ten; long enough that the data folder's calls that do return (the
#: disk process's start on a loaded machine included) never count as hung.
DISK_WAIT_S = 4
HUNG = f"did not return within {DISK_WAIT_S} s: the disk or mount hangs"


@dataclass
class _Host:
    proc: asyncio.subprocess.Process
    fake: FakeCloud
    results: Path
    said: list[str] = field(default_factory=list)

    def log(self) -> str:
        return "".join(self.said)

    async def said_line(self, words: str) -> None:
        await until(lambda: any(words in line for line in self.said), 60, words)

    def renewals(self, task_id: str) -> int:
        return sum(
            1
            for r in self.fake.received
            if r.WhichOneof("kind") == "renewal" and r.renewal.task_id == task_id
        )

    async def exits_on_sigterm(self) -> None:
        """SIGTERM: the process must exit, status 0, within `EXIT_S`."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), EXIT_S)
        except TimeoutError:
            raise AssertionError(f"the exit waits on the hung call:\n{self.log()}") from None
        assert self.proc.returncode == 0, self.log()


@contextlib.asynccontextmanager
async def _host(node: str, tmp_path: Path, fifo: str) -> AsyncIterator[_Host]:
    """host.js against the fake cloud (leases renewed every second), its phone's looks hung,
    and a FIFO named `fifo` (its `{pid}` filled in) in its results folder; the FIFO let go
    and the process killed at the end, whatever happened."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig:
        fake = rig.fake
        # Renewed every second, each answer a new term (the fake's Renewed says only when it
        # ends, `lease_expires_at`); the lease is long enough to outlast the test on one term.
        fake.cloud.lease_s = 300.0
        fake.cloud.renew_s = 1.0
        results = tmp_path / "host-data" / "node-host" / HOST_ID / "results"
        results.mkdir(parents=True)
        if "{pid}" not in fifo:  # there before the host starts
            os.mkfifo(results / fifo)
        proc = await spawn_host(
            node,
            rig.address,
            fake.pki_dir,
            HOST_ID,
            rig.adb_port,
            tmp_path / "host-data",
            AMC_HOST_STOP_GRACE_S="1",
            AMC_HOST_DISK_WAIT_S=str(DISK_WAIT_S),
            AMC_HOST_DUMP_TIMEOUT_S="300",
            AMC_HOST_HIERARCHY_DEADLINE_S="300",
        )
        hung = results / fifo.format(pid=proc.pid)
        if not hung.exists():
            os.mkfifo(hung)
        host = _Host(proc, fake.cloud, results)
        assert proc.stderr is not None
        stderr = proc.stderr

        async def read() -> None:
            while line := (await stderr.readline()).decode():
                host.said.append(line)

        reader = asyncio.create_task(read())
        try:
            yield host
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            for flags in (os.O_RDONLY, os.O_WRONLY):  # the other side lets a hung open go
                with contextlib.suppress(OSError):
                    os.close(os.open(hung, flags | os.O_NONBLOCK))
            await reader


async def test_a_result_keep_hung_on_the_disk_leaves_the_other_lease_renewed(
    node: str, tmp_path: Path
) -> None:
    """Attempt t2 runs on the host's phone; t1, for a phone the host does not have, is refused
    and its result's write hangs. t2's lease is still renewed, t1's result reaches the cloud
    once the write has not returned within `DISK_WAIT_S` (sent from memory, the host paused:
    its phone OFFLINE, saying why), and the host exits on SIGTERM. Before, host.js wrote
    results with synchronous calls on its only thread: it stopped with the write, renewed no
    lease, sent no result and never handled SIGTERM."""
    async with _host(node, tmp_path, "lease-t1-1.json.{pid}.partial") as host:
        fake = host.fake
        await fake.wait_for(lambda: fake.hellos, 60)
        await fake.assign("t2", "emulator-5554", "Turn on dark theme")
        await fake.wait_for(lambda: host.renewals("t2") >= 1, 30)
        await fake.assign("t1", "emulator-5556", "Turn on dark theme")
        await host.said_line("assignment t1 on emulator-5556 refused")
        before = host.renewals("t2")
        try:
            await fake.wait_for(lambda: host.renewals("t2") >= before + 3, 20)
        except TimeoutError:
            raise AssertionError(f"no renewal after the hung write:\n{host.log()}") from None
        await fake.wait_for(lambda: fake.results, 30)
        assert [r.task_id for r in fake.results] == ["t1"], host.log()
        await fake.wait_for(lambda: [d.reason for d in fake.last_devices() if HUNG in d.reason], 30)
        await host.exits_on_sigterm()
    assert (
        "could not keep the result of lease lease-t1-1 on disk (sent from memory): "
        f"a keep there {HUNG}" in host.log()
    )


async def test_a_kept_result_whose_read_hangs_at_start_leaves_the_host_connecting(
    node: str, tmp_path: Path
) -> None:
    """A result a previous process kept cannot be read: the read hangs. The host skips it,
    says hello (its phone OFFLINE: the folder hangs) and exits on SIGTERM. Before, host.js
    read kept results with synchronous calls before its first hello: it never connected and
    never handled SIGTERM."""
    async with _host(node, tmp_path, "lease-old-1.json") as host:
        fake = host.fake
        try:
            await fake.wait_for(lambda: fake.hellos, 60)
        except TimeoutError:
            raise AssertionError(f"no hello with a kept result unreadable:\n{host.log()}") from None
        reasons = [d.reason for d in fake.hellos[0].devices]
        assert len(reasons) == 1 and HUNG in reasons[0], (reasons, host.log())
        await host.exits_on_sigterm()
    assert (
        f"a result the previous process kept cannot be read (lease-old-1.json: a read there {HUNG})"
        in host.log()
    )


async def test_a_stop_with_a_result_whose_keep_hung_says_it_is_lost(
    node: str, tmp_path: Path
) -> None:
    """t1, for a phone the host does not have, is refused; its result's write hangs, so it is
    sent from memory, and the cloud does not answer it. Stopped, the host says that result is
    not on disk and goes with it, as the Python host says (`_hand_back`). Before, the stop's
    line said every unanswered result was "kept on disk and sent by the next start"."""
    async with _host(node, tmp_path, "lease-t1-1.json.{pid}.partial") as host:
        fake = host.fake
        fake.ack_results = False
        await fake.wait_for(lambda: fake.hellos, 60)
        await fake.assign("t1", "emulator-5556", "Turn on dark theme")
        await fake.wait_for(lambda: fake.results, 30)  # sent from memory: the write hung
        await host.exits_on_sigterm()
    stops = [line for line in host.said if "stopping with 1 result(s)" in line]
    assert len(stops) == 1, host.log()
    assert "0 kept on disk and sent by the next start, 1 not" in stops[0], host.log()
    assert not list(host.results.glob("*.json")), host.log()
