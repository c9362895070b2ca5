"""The lease client over a real mTLS grpc.aio stream.

The cloud's LeaseService was not in the tree yet when this was written, so the server is the
minimal in-test implementation in `lease_fake.py` (same protocol, real TLS, real stream). The
task body here is a stepper the test advances, so each protocol moment is reached on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from amc.v1 import lease_service_pb2, types_pb2
from host import lease_client
from host.agent.loop import TaskOutcome, TaskSpec
from host.agent.progress import ProgressHolder
from host.cloud_channel import open_channel
from host.devices.registry import DeviceInfo
from host.lease_client import (
    UNREACHABLE_SUMMARY,
    LeaseClient,
    LeaseClientConfig,
    backoff_delay,
)
from host.outbox.store import OutboxStore
from host.settings import HostSettings
from host.timeline.data_folder import DataFolder
from host.timeline.store import TimelineStore
from tests.host.lease_fake import FreezableProxy, RunningCloud, start_fake_cloud
from tests.support.tmpfs import fill, tmpfs
from tests.support.waiting import until

HOST_ID = "h1"


class StaticDevices:
    """The host's phones, set by the test."""

    def __init__(self, *serials: str) -> None:
        self.infos = {
            s: DeviceInfo(s, "test phone", types_pb2.DEVICE_STATE_ONLINE) for s in serials
        }
        self.listeners: list[Callable[[DeviceInfo, str], None]] = []

    def devices(self) -> list[DeviceInfo]:
        return list(self.infos.values())

    def add_listener(self, listener: Callable[[DeviceInfo, str], None]) -> None:
        self.listeners.append(listener)

    def set_state(self, serial: str, state: types_pb2.DeviceState.ValueType) -> None:
        info = DeviceInfo(serial, "test phone", state)
        self.infos[serial] = info
        for listener in self.listeners:
            listener(info, "offline" if state != types_pb2.DEVICE_STATE_ONLINE else "online")


class Stepper:
    """A task body that runs one step each time the test calls `allow()`."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.sem = asyncio.Semaphore(0)
        self.started: list[TaskSpec] = []
        self.done_steps = 0

    def allow(self, n: int = 1) -> None:
        for _ in range(n):
            self.sem.release()

    async def __call__(
        self, spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
    ) -> TaskOutcome:
        self.started.append(spec)
        for i in range(1, self.steps + 1):
            progress.update(i, types_pb2.STEP_STATUS_ACTING, f"step {i}: tap 'Next' — go on")
            waiter = asyncio.ensure_future(self.sem.acquire())
            stopper = asyncio.ensure_future(cancel.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if cancel.is_set():
                waiter.cancel()
                return TaskOutcome("cancelled", "stopped: the lease was revoked", i)
            progress.update(i, types_pb2.STEP_STATUS_SUCCEEDED, f"step {i}: done")
            self.done_steps = i
        return TaskOutcome("succeeded", "goal reached", self.steps)


@pytest.fixture
async def cloud(tmp_path: Path) -> AsyncIterator[RunningCloud]:
    running = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    yield running
    await running.server.stop(grace=None)


def _client(
    cloud: RunningCloud, devices: StaticDevices, body: Stepper, tmp_path: Path
) -> LeaseClient:
    settings = HostSettings(
        cloud_address=f"127.0.0.1:{cloud.port}",
        certs_dir=cloud.pki_dir,
        host_id=HOST_ID,
        data_dir=tmp_path / "host",
    )
    return LeaseClient(
        lambda: open_channel(settings),
        devices,
        body,
        LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.2),
        rng=random.Random(7),
    )


@contextlib.asynccontextmanager
async def _running(client: LeaseClient) -> AsyncIterator[None]:
    """`client` running and connected for the block; stopped (and let finish) however it ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(client.run(stop))
    try:
        await asyncio.wait_for(client.wait_connected(), 20)
        yield
    finally:
        stop.set()
        await task


async def test_hello_identity_and_devices(cloud: RunningCloud, tmp_path: Path) -> None:
    devices = StaticDevices("emulator-5554", "emulator-5556")
    client = _client(cloud, devices, Stepper(1), tmp_path)
    async with _running(client):
        assert client.host_id == HOST_ID  # from the certificate, never sent
        [hello] = cloud.cloud.hellos
        assert [d.serial for d in hello.devices] == ["emulator-5554", "emulator-5556"]
        assert hello.agent_version.startswith("amc-host/")
        assert hello.planner_transport == types_pb2.PLANNER_TRANSPORT_DIRECT
        assert not hello.held_assignments
        # A phone going offline is reported as a device update.
        devices.set_state("emulator-5556", types_pb2.DEVICE_STATE_OFFLINE)
        await cloud.cloud.wait_for(
            lambda: any(r.WhichOneof("kind") == "device_update" for r in cloud.cloud.received)
        )
        update = next(
            r.device_update for r in cloud.cloud.received if r.WhichOneof("kind") == "device_update"
        )
        states = {d.serial: d.state for d in update.devices}
        assert states["emulator-5556"] == types_pb2.DEVICE_STATE_OFFLINE


async def test_task_runs_renews_with_progress_and_result_is_acked(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    body = Stepper(3)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        assert body.started == []  # nothing touches a phone before an assignment
        await fake.assign("t1", "emulator-5554", "open settings")
        await fake.wait_for(
            lambda: any(
                r.WhichOneof("kind") == "renewal" and r.renewal.progress.step_index == 1
                for r in fake.received
            )
        )
        body.allow(3)
        await fake.wait_for(lambda: len(fake.results) == 1)
        [result] = fake.results
        assert result.status == types_pb2.TASK_STATUS_SUCCEEDED
        assert result.lease_id == "lease-t1-1"
        assert result.final_progress.step_index == 3
        renewal = next(r.renewal for r in fake.received if r.WhichOneof("kind") == "renewal")
        assert renewal.progress.summary.startswith("step 1: tap 'Next'")
        assert len(renewal.progress.summary) <= 200
        await fake.wait_for(lambda: True)
        for _ in range(100):
            if not client.pending_results():
                break
            await asyncio.sleep(0.05)
        assert client.pending_results() == []


async def test_stream_cut_mid_task_reconnects_reannounces_and_finishes(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    body = Stepper(3)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        await fake.assign("t2", "emulator-5554", "add a contact")
        body.allow(1)
        await fake.wait_for(lambda: body.done_steps == 1 or bool(fake.results))
        fake.cut()
        # The client reconnects and re-announces what it holds; the cloud resumes it.
        await fake.wait_for(lambda: len(fake.hellos) >= 2)
        held = fake.hellos[-1].held_assignments
        assert [(h.task_id, h.attempt, h.lease_id) for h in held] == [("t2", 1, "lease-t2-1")]
        await asyncio.wait_for(client.wait_connected(), 20)
        body.allow(2)
        await fake.wait_for(lambda: len(fake.results) >= 1)
        assert fake.results[-1].status == types_pb2.TASK_STATUS_SUCCEEDED
        assert len(body.started) == 1  # resumed, not restarted
        assert fake.streams >= 2


async def test_result_is_resent_after_reconnect_until_acked(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    body = Stepper(1)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        fake.ack_results = False
        await fake.assign("t3", "emulator-5554", "g")
        body.allow(1)
        await fake.wait_for(lambda: len(fake.results) == 1)
        assert client.pending_results() == [("t3", 1)]
        fake.ack_results = True
        fake.cut()
        await fake.wait_for(lambda: len(fake.results) >= 2)
        for _ in range(100):
            if not client.pending_results():
                break
            await asyncio.sleep(0.05)
        assert client.pending_results() == []


async def test_revoke_stops_the_task_within_a_step(cloud: RunningCloud, tmp_path: Path) -> None:
    body = Stepper(50)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        await fake.assign("t4", "emulator-5554", "g")
        body.allow(2)
        await fake.wait_for(lambda: body.done_steps >= 2)
        await fake.revoke("t4")
        await fake.wait_for(lambda: len(fake.results) >= 1)
        assert fake.results[-1].status == types_pb2.TASK_STATUS_CANCELLED
        # The acknowledgement repeats the operator's reason the revoke carried.
        assert fake.results[-1].summary == "cancelled by operator"
        assert body.done_steps == 2  # no further step ran
        assert client.running() == []


async def test_a_revoke_with_a_reason_this_host_does_not_know_stops_the_task(
    cloud: RunningCloud, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A newer cloud may revoke with a reason this host has no name for (99): the lease is
    gone all the same, so the task stops like any revoke, and the log names the number."""
    body = Stepper(50)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        lease = await fake.assign("t99", "emulator-5554", "g")
        body.allow(1)
        await fake.wait_for(lambda: body.done_steps >= 1)
        with caplog.at_level(logging.WARNING, logger="host.lease_client"):
            await fake.send(
                lease_service_pb2.LeaseResponse(
                    revoked=lease_service_pb2.Revoked(
                        task_id="t99",
                        attempt=1,
                        lease_id=lease.lease_id,
                        reason=99,  # type: ignore[arg-type]
                        message="a reason from a newer cloud",
                    )
                )
            )
            for _ in range(200):
                if not client.running():
                    break
                await asyncio.sleep(0.05)
        assert client.running() == []
        assert body.done_steps == 1  # no further step ran
        assert any("reason 99" in r.getMessage() for r in caplog.records)


async def test_each_lease_is_renewed_at_its_assignments_interval(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """The Welcome's interval is a third of the cloud's *default* lease (here 10 s); a task
    with a short lease says its own interval, and that is the one the host keeps to."""
    fake = cloud.cloud
    fake.renew_s = 0.25
    body = Stepper(1)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        await fake.assign("t9", "emulator-5554", "g")
        await fake.wait_for(lambda: len(body.started) == 1)
        [running] = client._tasks.values()
        assert running.renew_s == 0.25
        assert client._interval(running) == 0.25
        # Renewals keep coming with no progress change in between (the body is parked).
        await fake.wait_for(
            lambda: sum(r.WhichOneof("kind") == "renewal" for r in fake.received) >= 4
        )
        body.allow(1)
        await fake.wait_for(lambda: len(fake.results) == 1)
    fake.renew_s = None  # an older cloud: a third of the lease it granted
    client = _client(cloud, StaticDevices("emulator-5554"), Stepper(1), tmp_path / "old")
    async with _running(client):
        await fake.assign("t10", "emulator-5554", "g")
        await fake.wait_for(lambda: len(client._tasks) == 1)
        [running] = client._tasks.values()
        assert client._interval(running) == fake.lease_s / 3


async def test_assignment_for_an_unknown_or_busy_phone_fails_clearly(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    body = Stepper(5)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        await fake.assign("t5", "emulator-9999", "g")
        await fake.wait_for(lambda: len(fake.results) >= 1)
        assert fake.results[-1].status == types_pb2.TASK_STATUS_FAILED
        assert "emulator-9999" in fake.results[-1].summary
        await fake.assign("t6", "emulator-5554", "g")
        await fake.assign("t7", "emulator-5554", "g")
        await fake.wait_for(lambda: any(r.task_id == "t7" for r in fake.results))
        refused = next(r for r in fake.results if r.task_id == "t7")
        assert "busy" in refused.summary
        assert [s.task_id for s in body.started] == ["t6"]
        # Not the task's fault: its next attempt is queued (TaskResult.retryable), and nothing
        # ran, so the refusal says why and the attempt is not counted (TaskResult.refusal).
        assert refused.retryable and fake.results[0].retryable
        assert refused.refusal == lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_BUSY
        assert fake.results[0].refusal == lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_NOT_ATTACHED


async def test_an_assignment_on_an_unhealthy_phone_is_refused_saying_why(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """A phone the host keeps out of work (its screen could not be read, attempt after
    attempt: `host.devices.health`) is reported OFFLINE, and an assignment already on its way
    is refused as PHONE_UNHEALTHY with the words that say what failed and how it clears,
    not run to burn one more attempt."""
    devices = StaticDevices("emulator-5554")
    why = "phone emulator-5554 is unhealthy: its screen could not be read in 3 attempts"
    info = dataclasses.replace(devices.infos["emulator-5554"], unhealthy=why)
    devices.infos["emulator-5554"] = info
    assert info.to_proto().state == types_pb2.DEVICE_STATE_OFFLINE
    body = Stepper(5)
    client = _client(cloud, devices, body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        await fake.assign("t8", "emulator-5554", "g")
        await fake.wait_for(lambda: any(r.task_id == "t8" for r in fake.results))
        (refused,) = [r for r in fake.results if r.task_id == "t8"]
        assert refused.refusal == lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_UNHEALTHY
        assert refused.retryable and refused.summary == why
        assert body.started == []


async def test_a_host_that_cannot_write_its_data_folder_takes_no_work_until_a_write_works(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """An attempt that meets the full data folder (a real tmpfs, filled) ends retryable, and
    the host then takes no work: its phones go OFFLINE before that result (so the cloud does not
    hand the task straight back), an assignment already on its way is refused as
    DATA_FOLDER_UNWRITABLE naming the folder, nothing runs; once a probe write there works the
    phones are ONLINE again and the next assignment runs. Before, each assignment ran, and
    failed in milliseconds, burning the task's attempts while the disk stayed full."""
    with tmpfs(tmp_path / "data", "size=1m") as disk:
        ran: list[str] = []

        async def writes_a_screenshot(
            spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
        ) -> TaskOutcome:
            ran.append(spec.task_id)
            (disk / f"{spec.task_id}.png").write_bytes(b"\0" * 65536)
            return TaskOutcome("succeeded", "goal reached", 1)

        devices = StaticDevices("emulator-5554")
        client = _client(cloud, devices, Stepper(1), tmp_path)
        client._run_task = writes_a_screenshot
        client.data_folder = folder = DataFolder(disk, probe_s=60.0)
        filler = fill(disk)
        async with _running(client):
            fake = cloud.cloud
            await fake.assign("t1", "emulator-5554", "g")
            await fake.wait_for(lambda: any(r.task_id == "t1" for r in fake.results))
            (first,) = [r for r in fake.results if r.task_id == "t1"]
            assert first.retryable, first
            assert f"host {HOST_ID} cannot write its data folder (" in first.summary, first
            kinds = [r.WhichOneof("kind") for r in fake.received]
            offline = next(
                i
                for i, r in enumerate(fake.received)
                if r.WhichOneof("kind") == "device_update"
                and r.device_update.devices[0].state == types_pb2.DEVICE_STATE_OFFLINE
            )
            assert offline < kinds.index("result"), kinds  # the cloud hears OFFLINE first

            await fake.assign("t2", "emulator-5554", "g")
            await fake.wait_for(lambda: any(r.task_id == "t2" for r in fake.results))
            (refused,) = [r for r in fake.results if r.task_id == "t2"]
            refusal = lease_service_pb2.ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE
            assert refused.refusal == refusal, refused
            assert refused.retryable and str(disk) in refused.summary, refused
            assert "takes no work until a write there succeeds" in refused.summary
            assert ran == ["t1"]

            with pytest.raises(OSError, match="No space left"):  # still full: it stays out
                folder.probe()
            assert folder.unwritable
            filler.unlink()
            assert folder.probe() and not folder.unwritable
            client.writable_again()  # what the host's probe does once a write works
            await fake.wait_for(
                lambda: (
                    fake.reported_states("emulator-5554")[-1:] == [types_pb2.DEVICE_STATE_ONLINE]
                )
            )
            await fake.assign("t3", "emulator-5554", "g")
            await fake.wait_for(lambda: any(r.task_id == "t3" for r in fake.results))
            (done,) = [r for r in fake.results if r.task_id == "t3"]
            assert done.status == types_pb2.TASK_STATUS_SUCCEEDED, done
            assert ran == ["t1", "t3"]


async def test_an_attempt_end_the_full_disk_refused_is_recorded_once_a_write_works(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """The attempt's timeline row (a real store on a real tmpfs) is started, then the disk
    fills: the attempt ends retryable, and recording its end fails too. Before, the row said
    "running" until the host restarted (a ghost attempt on the host's console); it is now
    recorded once a probe write works, when the host puts itself back to work."""
    with tmpfs(tmp_path / "data", "size=1m") as disk:
        store = TimelineStore(disk / "timeline.sqlite3", disk / "artifacts")
        fillers: list[Path] = []

        async def fills_the_disk(
            spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
        ) -> TaskOutcome:
            store.start_task(spec.task_id, spec.attempt, spec.goal, spec.device_serial)
            fillers.append(fill(disk))
            (disk / f"{spec.task_id}.png").write_bytes(b"\0" * 65536)
            return TaskOutcome("succeeded", "goal reached", 1)

        def ended(spec: TaskSpec, outcome: TaskOutcome) -> None:
            store.finish_task(spec.task_id, spec.attempt, outcome.status, outcome.summary)

        client = _client(cloud, StaticDevices("emulator-5554"), Stepper(1), tmp_path)
        client._run_task = fills_the_disk
        client._ended = ended
        client.data_folder = folder = DataFolder(disk, probe_s=60.0)
        try:
            async with _running(client):
                fake = cloud.cloud
                await fake.assign("t1", "emulator-5554", "g")
                await fake.wait_for(lambda: any(r.task_id == "t1" for r in fake.results))
                # The end is written in the background (`_record_end`): refused, it pauses.
                await until(lambda: bool(folder.unwritable), what="the end's write refused")
                row = store.get_task("t1", 1)
                assert row is not None and row.status == "running", row

                fillers[0].unlink()
                assert folder.probe()
                client.writable_again()  # what the host's probe does once a write works
                await until(
                    lambda: getattr(store.get_task("t1", 1), "status", "") != "running",
                    what="the end recorded",
                )
                row = store.get_task("t1", 1)
                assert row is not None and row.status == "failed", row
                assert "cannot write its data folder" in row.summary, row
                await fake.wait_for(
                    lambda: (
                        fake.reported_states("emulator-5554")[-1:]
                        == [types_pb2.DEVICE_STATE_ONLINE]
                    )
                )
        finally:
            store.close()


async def test_a_result_the_full_disk_refused_is_kept_once_a_write_works(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """The attempt fills the disk (a real tmpfs; the outbox a real store on it), so its result
    cannot be kept: it is still sent, and the cloud does not answer it (its link is down, say).
    Before, it stayed in memory only even after the disk took writes again: a host restarted
    then, before the cloud answered, lost it (decision 0082). Once a probe write works it is
    now kept, so the next start sends it and names its lease."""
    with tmpfs(tmp_path / "data", "size=1m") as disk:
        outbox = OutboxStore(disk / "outbox.sqlite3")
        fillers: list[Path] = []

        async def fills_the_disk(
            spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
        ) -> TaskOutcome:
            fillers.append(fill(disk))
            return TaskOutcome("succeeded", "goal reached", 1)

        client = _client(cloud, StaticDevices("emulator-5554"), Stepper(1), tmp_path)
        client._run_task = fills_the_disk
        client._results = outbox
        client.data_folder = folder = DataFolder(disk, probe_s=60.0)
        try:
            async with _running(client):
                fake = cloud.cloud
                fake.ack_results = False
                await fake.assign("t1", "emulator-5554", "g")
                await fake.wait_for(lambda: any(r.task_id == "t1" for r in fake.results))
                # The keep is written in the background (`_write`): refused, it pauses.
                await until(lambda: bool(folder.unwritable), what="the keep refused")
                assert outbox.held_results() == []  # the disk refused it

                fillers[0].unlink()
                assert folder.probe()
                client.writable_again()  # what the host's probe does once a write works
                await until(lambda: bool(outbox.held_results()), what="the result kept")
                ((serial, body),) = outbox.held_results()
                kept = lease_service_pb2.TaskResult.FromString(body)
                assert (serial, kept.task_id, kept.status) == (
                    "emulator-5554",
                    "t1",
                    types_pb2.TASK_STATUS_SUCCEEDED,
                )
                fake.ack_results = True
        finally:
            outbox.close()


@pytest.mark.parametrize("late", ["end", "keep"])
async def test_a_write_refused_before_the_probe_but_reported_after_it_is_tried_again_at_once(
    cloud: RunningCloud, tmp_path: Path, late: str
) -> None:
    """The attempt's end (or its result's keep) is refused by the full disk (a real tmpfs), but
    the disk lane reports the refusal only after the probe write worked and `writable_again`
    ran (held here by an event: the order CI met once). Before, it then waited for the next
    probe (60 s) with the host marked unwritable meanwhile, taking no work, the row saying
    "running" (or the result kept in memory only); it is now tried again at once."""
    with tmpfs(tmp_path / "data", "size=1m") as disk:
        store = TimelineStore(disk / "timeline.sqlite3", disk / "artifacts")
        outbox = OutboxStore(disk / "outbox.sqlite3")
        fillers: list[Path] = []
        probed = threading.Event()
        refused: list[str] = []

        def write(call: Callable[[], None], what: str) -> None:
            try:
                call()
            except Exception:  # the disk's refusal, as the store raises it
                refused.append(what)
                if what == late and refused.count(what) == 1:
                    probed.wait(30)
                raise

        class Outbox:
            def __getattr__(self, name: str) -> object:
                return getattr(outbox, name)

            def keep_result(self, task_id: str, attempt: int, serial: str, body: bytes) -> None:
                write(lambda: outbox.keep_result(task_id, attempt, serial, body), "keep")

        async def fills_the_disk(
            spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
        ) -> TaskOutcome:
            store.start_task(spec.task_id, spec.attempt, spec.goal, spec.device_serial)
            fillers.append(fill(disk))
            (disk / f"{spec.task_id}.png").write_bytes(b"\0" * 65536)  # refused: marks it
            return TaskOutcome("succeeded", "goal reached", 1)

        def ended(spec: TaskSpec, outcome: TaskOutcome) -> None:
            finish = store.finish_task
            write(
                lambda: finish(spec.task_id, spec.attempt, outcome.status, outcome.summary), "end"
            )

        client = _client(cloud, StaticDevices("emulator-5554"), Stepper(1), tmp_path)
        client._run_task = fills_the_disk
        client._ended = ended
        client._results = Outbox()  # type: ignore[assignment]
        client.data_folder = folder = DataFolder(disk, probe_s=60.0)
        try:
            async with _running(client):
                fake = cloud.cloud
                fake.ack_results = False
                await fake.assign("t1", "emulator-5554", "g")
                await until(lambda: late in refused, what=f"the {late} refused")
                assert folder.unwritable
                fillers[0].unlink()
                assert folder.probe()
                client.writable_again()  # what the host's probe does once a write works
                probed.set()
                await until(
                    lambda: getattr(store.get_task("t1", 1), "status", "") == "failed",
                    what="the end recorded",
                )
                await until(lambda: bool(outbox.held_results()), what="the result kept")
                assert not folder.unwritable, folder.unwritable
                fake.ack_results = True
        finally:
            store.close()
            outbox.close()


def test_backoff_is_capped_and_jittered() -> None:
    rng = random.Random(1)
    delays = [backoff_delay(n, 0.5, 30.0, rng) for n in range(40)]
    assert all(0.05 <= d <= 30.0 for d in delays)
    assert len({round(d, 3) for d in delays}) > 30


def test_backoff_never_sleeps_past_half_of_the_lease_left() -> None:
    """A host that doubled its backoff while the cloud restarted still tries again before its
    lease runs out (it would stop its task then)."""
    rng = random.Random(2)
    late = [backoff_delay(6, 0.5, 30.0, rng, lease_left=8.0) for _ in range(200)]
    assert all(0.05 <= d <= 4.0 for d in late)
    assert max(late) > 3.0  # still jittered over the whole allowed range
    assert backoff_delay(6, 0.5, 30.0, rng, lease_left=-1.0) == 0.05  # expired: at once
    unbounded = [backoff_delay(6, 0.5, 30.0, rng) for _ in range(200)]
    assert max(unbounded) > 8.0  # no lease held: the usual ceiling


async def test_lease_run_out_while_the_cloud_is_unreachable_pauses_the_task(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """The cloud gone past the lease: the attempt pauses (`host.agent.lease_pause`), not stops:
    a cloud that was down gives live leases a new term (tests/host/test_lease_pause.py). Its
    lease counts as a whole one for the reconnect backoff (at most half of it: only a
    connection brings the cloud's word now)."""
    body = Stepper(50)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    client.config = LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.2)
    async with _running(client):
        fake = cloud.cloud
        fake.lease_s = 0.6
        await fake.assign("t8", "emulator-5554", "g")
        body.allow(1)
        await fake.wait_for(lambda: body.done_steps >= 1)
        await cloud.server.stop(grace=None)  # the cloud is gone; renewals cannot land
        rt = client._tasks[("t8", 1)]
        await fake.wait_for(lambda: rt.cancel.lease.paused)
        assert not rt.cancel.is_set()
        assert rt.revoked is None
        assert [spec.task_id for spec, _ in client.running()] == ["t8"]
        assert client._lease_left() == rt.lease_s


async def test_keepalive_notices_a_silent_dead_link(tmp_path: Path) -> None:
    # Production pings every 10 s with a 10 s timeout (dead link noticed in ~20 s); here 1 s / 1 s
    # so the test is quick. The server must accept pings that often (see SERVER_OPTIONS).
    fast = [
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 500),
        ("grpc.http2.min_ping_interval_without_data_ms", 500),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID, options=fast)
    proxy = FreezableProxy(cloud.port)
    proxy_port = await proxy.start()
    settings = HostSettings(
        cloud_address=f"127.0.0.1:{proxy_port}",
        certs_dir=cloud.pki_dir,
        host_id=HOST_ID,
        data_dir=tmp_path / "host",
        keepalive_time_s=1.0,
        keepalive_timeout_s=1.0,
    )
    client = LeaseClient(
        lambda: open_channel(settings),
        StaticDevices("emulator-5554"),
        Stepper(1),
        LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.2),
    )
    async with _running(client):
        proxy.frozen = True  # the link goes silent: no FIN, no RST, no data
        await cloud.cloud.wait_for(lambda: len(cloud.cloud.hellos) >= 2, within=30)
        assert proxy.connections >= 2
        await proxy.stop()
        await cloud.server.stop(grace=None)


# --- results kept until answered; phones still stopping; leases the cloud says are lost ------


async def _drained(client: LeaseClient) -> None:
    for _ in range(200):
        if not client.pending_results():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"results still pending: {client.pending_results()}")


async def test_an_unanswered_result_is_sent_again_until_acknowledged(
    cloud: RunningCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ack and no refusal (an answer lost on a stream that still looks up): sent again."""
    monkeypatch.setattr(lease_client, "RESULT_RESEND_S", 0.1)
    body = Stepper(1)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        fake.ack_results = False
        await fake.assign("t11", "emulator-5554", "g")
        body.allow(1)
        await fake.wait_for(lambda: len(fake.results) >= 3)  # the same stream, again and again
        assert fake.streams == 1
        assert {(r.task_id, r.status) for r in fake.results} == {
            ("t11", types_pb2.TASK_STATUS_SUCCEEDED)
        }
        fake.ack_results = True
        await _drained(client)


async def test_a_result_whose_lease_ran_out_is_sent_once_more_for_a_late_ack(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """The sweeper's "expired" reached the host after it finished: the result still goes (the
    cloud accepts it late while no other attempt started); a second "expired" drops it."""
    body = Stepper(1)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        fake.ack_results = False
        await fake.assign("t12", "emulator-5554", "g")
        body.allow(1)
        await fake.wait_for(lambda: len(fake.results) == 1)
        await fake.send(fake.expired("t12"))
        await fake.wait_for(lambda: len(fake.results) == 2)
        assert client.pending_results() == [("t12", 1)]
        await fake.send(fake.expired("t12"))  # the cloud did not take it: the result is dropped
        await _drained(client)
        # A late ack ends it the normal way.
        await fake.assign("t13", "emulator-5554", "g")
        body.allow(1)
        await fake.wait_for(lambda: any(r.task_id == "t13" for r in fake.results))
        await fake.send(
            lease_service_pb2.LeaseResponse(
                result_ack=lease_service_pb2.ResultAck(
                    task_id="t13", attempt=1, lease_id="lease-t13-1", late=True
                )
            )
        )
        await _drained(client)


class SlowToStop(Stepper):
    """A task body whose last step takes until the test lets it end, even when cancelled."""

    def __init__(self, steps: int) -> None:
        super().__init__(steps)
        self.stopped = asyncio.Event()
        self.may_stop = asyncio.Event()

    async def __call__(
        self, spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
    ) -> TaskOutcome:
        if spec.task_id != "slow":
            return await super().__call__(spec, progress, cancel)
        self.started.append(spec)
        await cancel.wait()
        await self.may_stop.wait()
        self.stopped.set()
        return TaskOutcome("cancelled", "stopped: the lease was revoked", 1)


async def test_an_assignment_waits_for_the_phones_stopping_attempt(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """Right after a reconnect the cloud may give a phone new work while the attempt it revoked
    there is still within its last step: the new one starts once the old one stopped."""
    body = SlowToStop(1)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        await fake.assign("slow", "emulator-5554", "g")
        await fake.wait_for(lambda: len(body.started) == 1)
        await fake.send(fake.expired("slow"))
        await fake.assign("next", "emulator-5554", "g")
        await fake.wait_for(lambda: len(client._tasks) == 2)
        assert [s.task_id for s in body.started] == ["slow"]  # waiting, not refused
        assert not fake.results
        body.may_stop.set()
        await fake.wait_for(lambda: len(body.started) == 2)
        assert body.stopped.is_set()
        body.allow(1)
        await fake.wait_for(lambda: len(fake.results) == 1)
        [done] = fake.results
        assert (done.task_id, done.status) == ("next", types_pb2.TASK_STATUS_SUCCEEDED)


async def test_an_attempt_paused_by_its_own_clock_answers_a_late_expiry_revoke_with_its_result(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """The host's clock ran the lease out (renewals unanswered: a host let go after a freeze),
    the attempt paused, and the cloud's expiry revoke comes in, its step still under way. The
    attempt ends with the retryable result a lease run out by the host's clock sends: that
    result is how the cloud hears the host is back, and hands it work again (until then it
    holds new work back for its keepalive window). Before, the revoke overwrote why the
    attempt stopped and it ended with no result: which of the two the host read first decided
    whether it idled for up to 40 s (tests/faults/test_host_frozen.py took 23 s or 51 s)."""
    body = SlowToStop(1)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        fake.lease_s = 0.6
        fake.ack_results = False
        await fake.assign("slow", "emulator-5554", "g")
        await fake.wait_for(lambda: len(body.started) == 1)
        lease = fake.leases.pop(("slow", 1))  # renewals of a lease it does not know: unanswered
        key = ("slow", 1)
        await fake.wait_for(lambda: client._tasks[key].cancel.lease.paused)
        fake.leases[key] = lease
        expired = fake.expired("slow")
        # Renewals go on while paused: still unanswered (the fake would answer one of a lease
        # no longer live with a revoke of its own, an operator's cancel).
        del fake.leases[key]
        await fake.send(expired)
        await fake.wait_for(lambda: client._tasks[key].revoke_message == "lease expired")
        assert not fake.results
        body.may_stop.set()
        await fake.wait_for(lambda: len(fake.results) == 1)
        [sent] = fake.results
        assert (sent.task_id, sent.attempt, sent.lease_id) == ("slow", 1, lease.lease_id)
        assert (sent.status, sent.retryable) == (types_pb2.TASK_STATUS_FAILED, True), sent
        assert sent.summary == UNREACHABLE_SUMMARY


async def test_a_lease_the_cloud_says_is_lost_is_answered_retryable(
    cloud: RunningCloud, tmp_path: Path
) -> None:
    """The cloud refused a step because the lease is not live. Mostly it ended the attempt
    itself, and refuses a result too; but a task an operator is cancelling keeps its lease
    until the host answers (tests/host/test_real_cloud.py), so the host offers a retryable
    result (the cloud cancels a task with a cancel pending, and requeues one nobody
    cancelled), and forgets the attempt once the cloud has answered it."""
    ran = asyncio.Event()

    async def lost(spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event) -> TaskOutcome:
        ran.set()
        return TaskOutcome("cancelled", "stopped: the lease is no longer live", 2, lease_lost=True)

    client = _client(cloud, StaticDevices("emulator-5554"), Stepper(1), tmp_path)
    client._run_task = lost
    async with _running(client):
        fake = cloud.cloud
        await fake.assign("t14", "emulator-5554", "g")
        await asyncio.wait_for(ran.wait(), 10)
        await fake.wait_for(lambda: len(fake.results) == 1)
        [offered] = fake.results
        assert (offered.status, offered.retryable) == (types_pb2.TASK_STATUS_FAILED, True)
        for _ in range(100):
            if not client._tasks:
                break
            await asyncio.sleep(0.05)
        assert not client._tasks and client.pending_results() == []


@pytest.mark.parametrize(
    ("task_status", "said"),
    [
        (types_pb2.TASK_STATUS_SUCCEEDED, "the cloud already has it"),
        (types_pb2.TASK_STATUS_FAILED, "the cloud recorded another end for its attempt"),
    ],
)
async def test_a_finished_revoke_is_read_from_its_task_status_not_its_words(
    cloud: RunningCloud,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    task_status: types_pb2.TaskStatus.ValueType,
    said: str,
) -> None:
    """A kept result answered Revoked FINISHED: whether the cloud has it is its `task_status`
    (a newer cloud may word the message otherwise), not the message's text."""
    body = Stepper(1)
    client = _client(cloud, StaticDevices("emulator-5554"), body, tmp_path)
    async with _running(client):
        fake = cloud.cloud
        fake.ack_results = False
        lease = await fake.assign("t12", "emulator-5554", "g")
        body.allow(1)
        await fake.wait_for(lambda: len(fake.results) == 1)
        with caplog.at_level(logging.INFO, logger="host.lease_client"):
            await fake.send(
                lease_service_pb2.LeaseResponse(
                    revoked=lease_service_pb2.Revoked(
                        task_id="t12",
                        attempt=1,
                        lease_id=lease.lease_id,
                        reason=lease_service_pb2.REVOKE_REASON_FINISHED,
                        message="this attempt is over",
                        task_status=task_status,
                    )
                )
            )
            await _drained(client)
        lines = [r.getMessage() for r in caplog.records if "t12" in r.getMessage()]
        assert any(said in line for line in lines), lines
