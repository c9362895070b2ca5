"""The Node example host's requests to the adb server it gave up on end with the host: its
watch of the server (`host:track-devices`) and its device lists.

Real parts: `amc cloud serve` (SQLite, mTLS, offline planner), a virtual phone on the virtual
adb server, host.js as its own process, and (for the watch) between host.js and the adb server
a TCP proxy of the test's own that passes every request on but can leave a
`host:track-devices` request unanswered, as a wedged adb server does (the virtual server
cannot: it answers or refuses).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import threading
import time
from pathlib import Path

from amc.v1 import task_service_pb2, types_pb2
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import Rig, cloud_and_phone, fake_cloud_and_phones, running_host, spawn_host
from tests.node.test_node_host import HOST_ID, node
from tests.node.test_node_host_phones import QUICK_POLL_S
from tests.support.processes import wait_task
from tests.support.waiting import until

__all__ = ["node"]

_TRACK = b"host:track-devices"
_ENDED = (
    types_pb2.TASK_STATUS_SUCCEEDED,
    types_pb2.TASK_STATUS_FAILED,
    types_pb2.TASK_STATUS_CANCELLED,
)


class _AdbProxy:
    """Passes adb clients on to the adb server at `port`. While `stall_tracks` is set, a
    `host:track-devices` request is never answered (the connection is held until the client
    closes it); `cut_tracks` ends the watches passed on so far, as a server restart does."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._server: asyncio.Server | None = None
        self._tracks: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[None]] = set()
        self.stall_tracks = False
        #: Set (seen from any thread) once a track request went unanswered.
        self.stalled = threading.Event()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        for pipe in list(self._pipes):
            with contextlib.suppress(asyncio.CancelledError):
                await pipe

    def cut_tracks(self) -> None:
        for writer in self._tracks:
            writer.transport.abort()
        self._tracks.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pipe = asyncio.current_task()
        assert pipe is not None
        self._pipes.add(pipe)
        try:
            header = await reader.readexactly(4)
            request = await reader.readexactly(int(header, 16))
            if request == _TRACK and self.stall_tracks:
                self.stalled.set()
                await reader.read()  # until the client hangs up
                return
            if request == _TRACK:
                self._tracks.append(writer)
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
            up_writer.write(header + request)
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.transport.abort()
            self._pipes.discard(pipe)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.transport.abort()


async def test_a_watch_the_adb_server_never_answers_does_not_keep_a_finished_host_running(
    node: str, tmp_path: Path
) -> None:
    """The adb server ends host.js's watch mid-task (a restart) and the server then answering
    never answers the next `host:track-devices` (wedged). host.js left that request's connection
    open for good once it stopped waiting for it (one more at each poll), and it kept the host
    from exiting once its task was done: the process ran on. As the Python host closes a watch
    that got no answer and closes its watch when it stops (host/devices/adb_restarts.py,
    `ServerWatch`), host.js now closes the watch and every watch asked for when it is done,
    and exits."""
    phone = VirtualPhone("emulator-5554")
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        proxy = _AdbProxy(rig.adb_port)
        proxy_port = await proxy.start()
        loop = asyncio.get_running_loop()

        def wedge_after_tap() -> None:
            # Runs on the virtual server's shell thread, right after the task's first tap: the
            # tap is answered once host.js asks the wedged server to be watched.
            proxy.stall_tracks = True
            loop.call_soon_threadsafe(proxy.cut_tracks)
            proxy.stalled.wait(60)

        phone.interrupt_after(1, wedge_after_tap)
        try:
            final, code, said = await _task_to_exit(node, rig, tmp_path, proxy_port)
        finally:
            await proxy.stop()
    assert proxy.stalled.is_set(), said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    assert code == 0, said  # before: it never exited


async def test_a_device_list_the_adb_server_never_answers_does_not_keep_a_finished_host_running(
    node: str, tmp_path: Path
) -> None:
    """The adb server leaves one device list unanswered mid-task (its USB thread held by a bad
    cable). host.js gave up on it after 10 s but left its connection open, and that kept the
    host from exiting once its task was done. The connection of a list given up on is now
    closed."""
    phone = VirtualPhone("emulator-5554")
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:

        def stall_after_tap() -> None:
            # Runs on the virtual server's shell thread, right after the task's first tap: the
            # tap is answered once host.js asked for the list that goes unanswered.
            rig.adb.stall_device_lists(1)
            deadline = time.monotonic() + 60
            while rig.adb._stalling_lists and time.monotonic() < deadline:
                time.sleep(0.05)

        phone.interrupt_after(1, stall_after_tap)
        final, code, said = await _task_to_exit(node, rig, tmp_path, rig.adb_port)
        stalled = rig.adb._stalling_lists == 0
    assert stalled, said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    assert code == 0, said  # before: it never exited
    assert "adb device list failed (1 in a row)" in said, said


async def _task_to_exit(
    node: str, rig: Rig, tmp_path: Path, adb_port: int
) -> tuple[types_pb2.Task, int | None, str]:
    """One task of "Turn on dark theme" run by host.js (AMC_TASKS=1) reaching adb at
    `adb_port`: the task once ended, host.js's exit code if it then exited by itself within
    60 s (None: it ran on, and was killed), and what it said."""
    request = task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme", max_attempts=1)
    task = (await rig.client.tasks.SubmitTask(request, timeout=10)).task
    host = await spawn_host(
        node,
        rig.address,
        rig.pki,
        HOST_ID,
        adb_port,
        tmp_path / "host-data",
        AMC_TASKS="1",
        AMC_HOST_DEVICE_POLL_INTERVAL_S=QUICK_POLL_S,
    )
    try:
        final = await wait_task(rig.client, task.task_id, lambda t: t.status in _ENDED, 180)
        try:
            _, err = await asyncio.wait_for(host.communicate(), 60)
            code = host.returncode
        except TimeoutError:
            code = None
            host.kill()
            _, err = await host.communicate()
    finally:
        if host.returncode is None:
            host.kill()
            await host.wait()
    return final, code, err.decode()


def _host_sockets_to(port: int) -> list[str]:
    """The established TCP connections to `port` (their client side) with their timers, as
    `ss -o` shows them: "timer:(keepalive,14sec,0)" on one the kernel probes."""
    out = subprocess.run(
        ["ss", "-tnoH", "state", "established", f"( dport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines()


async def test_the_idle_watch_of_the_adb_server_is_probed_so_a_dropped_one_is_noticed(
    node: str, tmp_path: Path
) -> None:
    """The watch sits idle while no phone changes; a NAT or firewall that forgot it (a remote
    adb server) drops it without a word, and the server's restart then reached no one: host.js
    kept trusting the transport ids of the run before. The kernel now probes it after 15 s
    idle, as it probes the Python host's. The drop itself needs a real NAT: what is checked is
    the keepalive timer the kernel keeps on host.js's real connection (`ss`)."""
    async with (
        fake_cloud_and_phones(tmp_path, HOST_ID) as rig,
        running_host(node, rig, HOST_ID, tmp_path / "host-data") as run,
    ):
        await rig.cloud.wait_for(lambda: rig.cloud.hellos, 60)  # its phones listed, watched

        def probed() -> bool:
            return any("timer:(keepalive," in line for line in _host_sockets_to(rig.adb_port))

        with contextlib.suppress(AssertionError):
            await until(probed, 10, "a keepalive timer on the watch")
        sockets = _host_sockets_to(rig.adb_port)
    assert run.alive, run.said
    timers = [re.search(r"timer:\(keepalive,(\d+)sec", line) for line in sockets]
    assert [t for t in timers if t], sockets
    assert all(int(t.group(1)) <= 15 for t in timers if t), sockets
