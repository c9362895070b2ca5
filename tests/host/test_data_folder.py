"""A host that cannot write its data folder (`host.timeline.data_folder`), seen from `run_host`:
its probe of the folder, what its own console and metrics say meanwhile.

Virtual phones behind the virtual adb server, the lease stream over mTLS to the in-test
LeaseService (lease_fake.py).
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from amc.v1 import decision_log_service_pb2, lease_service_pb2, types_pb2
from host.outbox import OutboxStore
from host.runner import build_host, settle_at_start, start_virtual_phones
from host.settings import HostSettings
from host.start_disk import open_data
from host.timeline import store as timeline_store
from host.timeline.data_folder import PROBE_NAME, DataFolder
from host.timeline.record import TimelineRecord
from host.timeline.storage_faults import storage_fault
from host.timeline.store import INTERRUPTED, TimelineStore
from planner.conversation.items import AssistantText
from tests.host.lease_fake import RunningCloud, host_settings, serving, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner, Step
from tests.support.immutable import immutable, set_immutable
from tests.support.tmpfs import fill, tmpfs
from tests.support.waiting import until

HOST_ID = "h1"
SERIAL = "emulator-5554"
ONLINE, OFFLINE = types_pb2.DEVICE_STATE_ONLINE, types_pb2.DEVICE_STATE_OFFLINE
#: Any kept mark, however long its phone was unlisted.
ALL = timedelta(days=36500)


def _settings(tmp_path: Path, port: int, pki_dir: Path) -> HostSettings:
    base = host_settings(tmp_path, port, pki_dir, HOST_ID)
    return base.model_copy(update={"planner_transport": "direct", "device_poll_interval_s": 0.1})


def _on_disk(tmp_path: Path, cloud: RunningCloud, disk: Path, probe_s: float) -> HostSettings:
    """`_settings` with every file the host writes in `disk` (a test's tmpfs)."""
    return _settings(tmp_path, cloud.port, cloud.pki_dir).model_copy(
        update={
            "data_dir": disk,
            "db_path": disk / "task_progress.sqlite3",
            "artifact_dir": disk / "artifacts",
            "outbox_path": disk / "outbox.sqlite3",
            "data_dir_probe_s": probe_s,
        }
    )


class _Watched(DataFolder):
    """The host's data folder, saying when a probe of it began."""

    def __init__(self, folder: Path, probe_s: float) -> None:
        super().__init__(folder, probe_s)
        self.probing = threading.Event()

    def probe(self) -> bool:
        self.probing.set()
        return super().probe()


def _drain(fifo: Path) -> threading.Thread:
    """Read `fifo` to its end in a thread: a write blocked on it goes on."""

    def read() -> None:
        with fifo.open("rb") as pipe:
            while pipe.read(65536):
                pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


async def test_a_data_folder_write_that_hangs_does_not_stall_the_phone_poll(
    tmp_path: Path,
) -> None:
    """The folder's probe write hangs (its probe file is a FIFO nobody reads: the open blocks,
    as a write to a dead NFS mount or a dying disk does). The device poll still sees a phone
    unplugged meanwhile. Before, the poll awaited the probe and saw nothing more until the
    write returned."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    app = build_host(settings, planner=ScriptedPlanner([]))
    hangs = tmp_path / "hangs"
    hangs.mkdir()
    os.mkfifo(hangs / PROBE_NAME)
    folder = _Watched(hangs, probe_s=0.05)
    app.lease.data_folder = folder
    async with serving(app, virtual, cloud):
        try:
            folder.failed(HOST_ID, "Input/output error")
            await until(folder.probing.is_set, what="the folder's probe began")
            virtual.unplug(SERIAL)
            await until(
                lambda: not getattr(app.registry.get(SERIAL), "online", True),
                within=20,
                what="the poll saw the phone unplugged while the folder's probe hangs",
            )
        finally:
            _drain(hangs / PROBE_NAME)


async def test_a_paused_host_counts_and_lists_its_phones_as_out_of_work(tmp_path: Path) -> None:
    """While the data folder cannot be written the cloud hears every phone OFFLINE, but the
    phones-by-state gauge counted them idle and `HostApp.status()` (the console's live view)
    said online. Both now say offline, and the status says why; a write that works again
    puts them back."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    app = build_host(settings, planner=ScriptedPlanner([]))
    folder = app.lease.data_folder
    assert folder is not None
    async with serving(app, virtual, cloud):
        assert [online for _, online, _ in app.phone_states()] == [True, True]
        why = folder.failed(HOST_ID, "[Errno 28] No space left on device")
        assert [online for _, online, _ in app.phone_states()] == [False, False]
        status = app.status()
        assert status["data_folder_unwritable"] == why
        assert [(d["online"], d["unhealthy"]) for d in status["devices"]] == [(False, why)] * 2
        assert folder.probe()
        assert [online for _, online, _ in app.phone_states()] == [True, True]


async def test_an_outbox_write_the_full_disk_refuses_pauses_the_host(tmp_path: Path) -> None:
    """The host's data folder on a real tmpfs, filled; no task runs, so only the outbox writes.
    A step's shipment (a screenshot into the outbox, as `Shipments.screenshot` writes it)
    fails on the full disk: the host keeps its phones out of work (the cloud hears them
    OFFLINE) until a probe write works. Before, the outbox's failure was only logged (the step
    goes on without its record): the host took work while every step's records were lost."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    with tmpfs(tmp_path / "data", "size=2m") as disk:
        settings = _on_disk(tmp_path, cloud, disk, probe_s=0.2)
        virtual, settings = start_virtual_phones(settings)
        app = build_host(settings, planner=ScriptedPlanner([]))
        assert app.outbox is not None and app.outbox.path.parent == disk
        folder = app.lease.data_folder
        assert folder is not None and folder.folder == disk
        async with serving(app, virtual, cloud) as fake:
            assert OFFLINE not in fake.reported_states(SERIAL)
            filler = fill(disk)
            with pytest.raises(sqlite3.Error, match="database or disk is full"):
                await asyncio.to_thread(app.outbox.put, "screenshot", "s1", b"\0" * 65536)
            assert "database or disk is full" in folder.unwritable
            await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [OFFLINE])
            filler.unlink()  # the host's own probe puts it back to work
            await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [ONLINE])
            assert not folder.unwritable


def test_a_host_whose_folder_probe_hangs_exits_promptly_on_sigterm(tmp_path: Path) -> None:
    """A host process (`tests/host/hung_folder_host.py`: `asyncio.run(run_host(...))`, as `amc
    host run`) whose data-folder probe hangs for good: the probe file is a FIFO nobody reads,
    so its `open()` blocks (as on a dead NFS mount or a dying disk). SIGTERM once the probe
    began: the process exits. Before, the probe ran in asyncio's default pool, whose threads
    `asyncio.run` (and Python at exit) join: the hung write held the exit for as long as it
    hung (here for ever; the 60 s bound only ends the test)."""
    fifo = tmp_path / "host" / PROBE_NAME
    with subprocess.Popen(
        [sys.executable, "-m", "tests.host.hung_folder_host", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "probing"
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pytest.fail("the host's exit still waits on its hung data-folder probe")
            assert proc.returncode == 0
            assert proc.stdout.read().split() == ["stopped"]
        finally:
            if proc.poll() is None:
                proc.kill()
            fifo.unlink(missing_ok=True)


async def test_a_full_screenshot_folder_keeps_the_host_paused_until_it_has_room(
    tmp_path: Path,
) -> None:
    """Two real folders: the timeline and outbox in a writable one, the screenshots on a 1 MiB
    tmpfs of their own, filled. An attempt fails at its first screenshot: the host pauses, its
    words name the screenshots' folder, and it stays paused through its probes until that
    folder has room. Before, the probe wrote only into the timeline's folder: it put the host
    back to work at once, to burn an attempt per probe at the first screenshot, and the words
    named the timeline's folder."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    with tmpfs(tmp_path / "shots", "size=1m") as shots:
        base = _settings(tmp_path, cloud.port, cloud.pki_dir)
        settings = base.model_copy(update={"artifact_dir": shots, "data_dir_probe_s": 0.1})
        virtual, settings = start_virtual_phones(settings)
        app = build_host(settings, planner=ScriptedPlanner([]))
        folder = app.lease.data_folder
        assert folder is not None
        probes: list[bool | OSError] = []
        probe = folder.probe

        def counted() -> bool:  # the real probe, its outcomes kept
            try:
                probes.append(probe())
            except OSError as exc:
                probes.append(exc)
                raise
            return bool(probes[-1])

        folder.probe = counted  # type: ignore[method-assign]
        async with serving(app, virtual, cloud) as fake:
            filler = fill(shots)
            await fake.assign("t1", SERIAL, "open settings")
            await fake.wait_for(lambda: fake.results)
            assert fake.results[0].retryable, fake.results[0]
            await until(
                lambda: len(probes) >= 3 or not folder.unwritable,
                what="three probes of the full folder, or the pause cleared",
            )
            assert str(shots) in folder.unwritable, folder.unwritable
            assert all(isinstance(p, OSError) for p in probes), probes
            assert fake.reported_states(SERIAL)[-1] == OFFLINE
            filler.unlink()
            await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [ONLINE])
            assert not folder.unwritable


async def test_a_screenshot_folder_made_unwritable_pauses_the_host_until_it_is_fixed(
    tmp_path: Path,
) -> None:
    """The screenshots' folder refuses new files under the running host (its permissions
    changed: here `chattr +i`, which refuses root too, EPERM). An attempt fails at its first
    screenshot, retryable; the host pauses as for a full disk: the cloud hears the phone
    OFFLINE with words naming that folder and what it said, an assignment sent meanwhile is
    refused `ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE`, and once the folder takes writes
    again the probe puts the host back to work. Before, a permission error was no disk fault:
    the attempt failed for good ("PermissionError: …", not retryable) and the host went on
    taking work it could not record."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    shots = tmp_path / "shots"
    base = _settings(tmp_path, cloud.port, cloud.pki_dir)
    settings = base.model_copy(update={"artifact_dir": shots, "data_dir_probe_s": 0.1})
    virtual, settings = start_virtual_phones(settings)
    app = build_host(settings, planner=ScriptedPlanner([]))
    folder = app.lease.data_folder
    assert folder is not None
    async with serving(app, virtual, cloud) as fake:
        with immutable(shots):
            await fake.assign("t1", SERIAL, "open settings")
            await fake.wait_for(lambda: fake.results)
            first = fake.results[0]
            assert first.retryable, first
            assert "Operation not permitted" in first.summary, first
            await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [OFFLINE])
            words = folder.unwritable
            assert f"cannot write its data folder {shots} (Operation not permitted)" in words
            reported = [d for d in fake.last_devices() if d.serial == SERIAL]
            assert [d.reason for d in reported] == [words]
            await fake.assign("t2", SERIAL, "open settings")
            await fake.wait_for(lambda: len(fake.results) >= 2)
            refused = fake.results[1]
            assert refused.refusal == lease_service_pb2.ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE
            assert (refused.retryable, refused.summary) == (True, words), refused
            set_immutable(shots, on=False)
            await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [ONLINE])
            assert not folder.unwritable


async def test_a_host_whose_disk_filled_after_its_last_run_starts_paused(tmp_path: Path) -> None:
    """The host's data folder on a real 2 MiB tmpfs. A process died while its attempt ran (its
    connections are left open: the row stays "running", the journal files stay), then the
    disk filled. A new host starts: marking that attempt interrupted is a write the disk
    refuses. Before, `build_host` raised "database or disk is full" (`amc host run` exited 2,
    and a supervisor restarting it looped); now the host starts paused, the cloud hears its
    phones OFFLINE, and once the disk has room the probe marks the attempt interrupted and
    puts the phones back to work."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    with tmpfs(tmp_path / "data", "size=2m") as disk:
        settings = _on_disk(tmp_path, cloud, disk, probe_s=0.1)
        dead = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
        dead_outbox = OutboxStore(settings.resolved_outbox_path)
        try:
            dead.start_task("t0", 1, "goal", SERIAL)
            filler = fill(disk)
            virtual, settings = start_virtual_phones(settings)
            app = build_host(settings, planner=ScriptedPlanner([]))
            folder = app.lease.data_folder
            assert folder is not None
            assert "database or disk is full" in folder.unwritable, folder.unwritable
            async with serving(app, virtual, cloud) as fake:
                hello = [d for d in fake.hellos[0].devices if d.serial == SERIAL]
                assert [(d.state, d.reason) for d in hello] == [(OFFLINE, folder.unwritable)]
                assert ONLINE not in fake.reported_states(SERIAL)
                row = app.store.get_task("t0", 1)
                assert row is not None and row.status == "running"
                filler.unlink()
                await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [ONLINE])
                row = app.store.get_task("t0", 1)
                assert row is not None and row.status == INTERRUPTED, row
        finally:
            dead.close()
            dead_outbox.close()


async def test_a_start_settling_the_full_disk_refuses_off_the_loop_starts_paused(
    tmp_path: Path,
) -> None:
    """As above, on `run_host`'s path: the stores opened without settling (`open_data`, in
    its thread), then the settling made in a thread of its own, bounded
    (`settle_at_start`). The disk refuses it: the host starts paused, and once the disk has
    room the probe makes the settling it is owed (the attempt marked interrupted) and puts
    the phones back to work."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    with tmpfs(tmp_path / "data", "size=2m") as disk:
        settings = _on_disk(tmp_path, cloud, disk, probe_s=0.1)
        dead = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
        dead_outbox = OutboxStore(settings.resolved_outbox_path)
        try:
            dead.start_task("t0", 1, "goal", SERIAL)
            filler = fill(disk)
            virtual, settings = start_virtual_phones(settings)
            opened = open_data(settings, settle=False)
            app = build_host(settings, planner=ScriptedPlanner([]), opened=opened)
            folder = app.lease.data_folder
            assert folder is not None and not folder.unwritable
            await settle_at_start(app)
            assert "database or disk is full" in folder.unwritable, folder.unwritable
            async with serving(app, virtual, cloud) as fake:
                hello = [d for d in fake.hellos[0].devices if d.serial == SERIAL]
                assert [(d.state, d.reason) for d in hello] == [(OFFLINE, folder.unwritable)]
                row = app.store.get_task("t0", 1)
                assert row is not None and row.status == "running"
                filler.unlink()
                await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [ONLINE])
                row = app.store.get_task("t0", 1)
                assert row is not None and row.status == INTERRUPTED, row
        finally:
            dead.close()
            dead_outbox.close()


def test_a_permission_error_is_the_data_folders_only_when_it_names_a_file(tmp_path: Path) -> None:
    """A write refused permission names its file (an `open` into an immutable folder, for
    real): that is the data folder refusing, a pause. The same number without a file (a
    signal or a process call refused) is not the disk: it must not pause the host."""
    with immutable(tmp_path / "locked") as locked, pytest.raises(PermissionError) as refused:
        (locked / "x").write_bytes(b"x")
    assert storage_fault(refused.value) == "Operation not permitted"
    assert storage_fault(PermissionError(errno.EPERM, "Operation not permitted")) is None


async def test_a_permission_error_outside_the_data_folders_fails_the_task_for_what_it_is(
    tmp_path: Path,
) -> None:
    """The attempt runs a program that is not executable, outside the host's data folders:
    EACCES naming that file. That is the attempt's error: it fails with it, not retryable, and
    the host keeps taking work. Before, any refused permission naming a file was the data
    folder refusing writes: the attempt ended retryable "cannot write its data folder", the
    host paused, its probe worked at once, and the task bounced between hosts."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    tool = tmp_path / "elsewhere" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")  # mode 0644: even root may not run it
    tool.chmod(0o644)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))

    def run_tool() -> None:
        subprocess.run([str(tool)], check=True)

    run = Step("complete", {"message": "done"}, before=run_tool)
    app = build_host(settings, planner=ScriptedPlanner([run]))
    folder = app.lease.data_folder
    assert folder is not None
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", SERIAL, "run the tool")
        await fake.wait_for(lambda: fake.results)
        result = fake.results[0]
        assert result.status == types_pb2.TASK_STATUS_FAILED, result
        assert not result.retryable, result
        assert "PermissionError" in result.summary and str(tool) in result.summary, result
        assert "data folder" not in result.summary, result
        assert not folder.unwritable, folder.unwritable


def test_a_refused_permission_is_the_data_folders_only_inside_them(tmp_path: Path) -> None:
    """Given the host's folders, a refused open counts only for a file inside one of them."""
    data = tmp_path / "data"
    with immutable(tmp_path / "other") as other, pytest.raises(PermissionError) as outside:
        (other / "x").write_bytes(b"x")
    with immutable(data / "shots") as shots, pytest.raises(PermissionError) as inside:
        (shots / "x").write_bytes(b"x")
    assert storage_fault(outside.value, [data]) is None
    assert storage_fault(inside.value, [data]) == "Operation not permitted"


@pytest.mark.parametrize("configured", [True, False], ids=["host-id", "certificate-only"])
async def test_a_pause_before_the_clouds_welcome_names_the_host(
    tmp_path: Path, configured: bool
) -> None:
    """A host that starts on a full disk (a real 2 MiB tmpfs, filled) is paused before the
    cloud's welcome has named it: its words named "this host", in the log, in the hello's
    phone reasons an operator reads on the fleet page. They name the host it is configured
    as (`AMC_HOST_HOST_ID`) or, with only a certificate configured, the id the certificate
    names."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    with tmpfs(tmp_path / "data", "size=2m") as disk:
        base = _settings(tmp_path, cloud.port, cloud.pki_dir)
        assert base.client_cert is not None and base.client_cert.is_file()
        on_disk = {
            "data_dir": disk,
            "db_path": disk / "task_progress.sqlite3",
            "artifact_dir": disk / "artifacts",
            "outbox_path": disk / "outbox.sqlite3",
            "data_dir_probe_s": 0.1,
            "host_id": HOST_ID if configured else None,  # the certificate's paths stay set
        }
        settings = base.model_copy(update=on_disk)
        dead = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
        dead_outbox = OutboxStore(settings.resolved_outbox_path)
        try:
            dead.start_task("t0", 1, "goal", SERIAL)
            filler = fill(disk)
            virtual, settings = start_virtual_phones(settings)
            app = build_host(settings, planner=ScriptedPlanner([]))
            folder = app.lease.data_folder
            assert folder is not None
            assert app.lease.host_id is None  # no welcome yet
            assert folder.unwritable.startswith(f"host {HOST_ID} cannot write its data folder")
            async with serving(app, virtual, cloud) as fake:
                hello = [d for d in fake.hellos[0].devices if d.serial == SERIAL]
                assert [d.reason for d in hello] == [folder.unwritable]
                filler.unlink()
                await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [ONLINE])
        finally:
            dead.close()
            dead_outbox.close()


async def test_a_host_whose_disk_filled_with_an_old_mark_kept_starts_paused(
    tmp_path: Path,
) -> None:
    """As above, with what the dead process left an unhealthy mark older than the host keeps
    (its phone long unlisted): deleting it is a write the full disk refuses. Before,
    `build_host` deleted it before the pause machinery existed and raised "database or disk
    is full" (exit 2); now the host starts paused and the probe deletes it once there is
    room."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    with tmpfs(tmp_path / "data", "size=2m") as disk:
        settings = _on_disk(tmp_path, cloud, disk, probe_s=0.1)
        old = datetime(2000, 1, 1, tzinfo=UTC)
        dead = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
        dead_outbox = OutboxStore(settings.resolved_outbox_path)
        try:
            dead.keep_unhealthy("emulator-gone", 3, "dark", "look", now=old)
            # The dead process's last look: its phone long unlisted while it ran.
            dead.saw_unhealthy([], unlisted_s=10 * settings.device_forget_after_s)
            filler = fill(disk)
            virtual, settings = start_virtual_phones(settings)
            app = build_host(settings, planner=ScriptedPlanner([]))
            folder = app.lease.data_folder
            assert folder is not None
            assert "database or disk is full" in folder.unwritable, folder.unwritable
            async with serving(app, virtual, cloud) as fake:
                assert ONLINE not in fake.reported_states(SERIAL)
                assert app.store.unhealthy_phones(ALL) == [("emulator-gone", 3, "dark", "look")]
                filler.unlink()
                await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [ONLINE])
                assert app.store.unhealthy_phones(ALL) == []
        finally:
            dead.close()
            dead_outbox.close()


async def test_a_session_write_the_full_disk_refuses_pauses_naming_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session mode on the direct transport: the planner's conversation file is on the
    host's disk too. A write of it the full disk refuses pauses the host naming that file's
    folder, as the timeline and the outbox do; before, the store told no one and the pause
    a step's failure made later listed every folder of the host."""
    monkeypatch.setenv("AMC_PLANNER_MODE", "session")
    # No model is called: the store is what is written.
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
    monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", "sk-ant-test")
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    with tmpfs(tmp_path / "data", "size=2m") as disk:
        base = _settings(tmp_path, cloud.port, cloud.pki_dir)
        settings = base.model_copy(
            update={
                "data_dir": disk,
                "db_path": disk / "task_progress.sqlite3",
                "artifact_dir": disk / "artifacts",
                "outbox_path": disk / "outbox" / "outbox.sqlite3",
            }
        )
        app = build_host(settings)
        try:
            assert app.session_store is not None
            folder = app.lease.data_folder
            assert folder is not None and not folder.unwritable
            fill(disk)
            with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
                await app.session_store.append(
                    "t1", 1, [AssistantText("anthropic", "turn1", "x" * 100_000)]
                )
            assert f"cannot write its data folder {disk} (database or disk" in (
                folder.unwritable
            ), folder.unwritable
        finally:
            app.store.close()
            if app.outbox is not None:
                app.outbox.close()


async def test_a_start_whose_timeline_disk_is_full_keeps_the_dead_run_s_calls(
    tmp_path: Path,
) -> None:
    """A process died while a model call of its attempt was out (its marker left in the
    outbox), then the timeline's disk (a 2 MiB tmpfs) filled; the outbox's folder has room.
    The start's settle is a write the full disk refuses: the host starts paused and the probe
    makes it once there is room. Before, the outbox released the markers (its own disk took
    it) and the timeline's write of the calls failed after: the retry found no marker, and
    the host's console and export never counted the call of unknown cost. Now the timeline
    keeps the call first, and the outbox still ships it."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    with tmpfs(tmp_path / "data", "size=2m") as disk:
        base = _settings(tmp_path, cloud.port, cloud.pki_dir)
        on_disk = {
            "data_dir": disk,
            "db_path": disk / "task_progress.sqlite3",
            "artifact_dir": disk / "artifacts",
            "outbox_path": tmp_path / "outbox" / "outbox.sqlite3",
        }
        settings = base.model_copy(update={**on_disk, "data_dir_probe_s": 0.1})
        dead = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
        dead_outbox = OutboxStore(settings.resolved_outbox_path)
        call = decision_log_service_pb2.ShippedUnsettledCall(
            host_call_id="call-1", task_id="t0", attempt=1, provider="anthropic", model="m"
        )
        try:
            dead.start_task("t0", 1, "goal", SERIAL)
            dead.finish_task("t0", 1, "failed", "the planner failed")
            dead_outbox.open_call(call.host_call_id, call.SerializeToString())
            filler = fill(disk)
            virtual, settings = start_virtual_phones(settings)
            app = build_host(settings, planner=ScriptedPlanner([]))
            folder = app.lease.data_folder
            assert folder is not None and app.outbox is not None
            assert "database or disk is full" in folder.unwritable, folder.unwritable
            async with serving(app, virtual, cloud) as fake:
                assert ONLINE not in fake.reported_states(SERIAL)
                filler.unlink()
                await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [ONLINE])
                assert app.store.unsettled_calls("t0", 1)[0] == 1
                assert app.outbox.open_calls() == []
        finally:
            dead.close()
            dead_outbox.close()


def test_a_disk_fault_told_while_a_probe_runs_keeps_the_host_paused(tmp_path: Path) -> None:
    """The host is paused; its probe's own writes work, and meanwhile a step's timeline write
    in another thread fails on a full disk (a 1 MiB tmpfs) and is told. Before, the probe
    ended by clearing the mark whatever was told while it ran: the host went back to work on
    a disk that had just refused a write. Now the mark stands, and the next probe writes into
    the disk that refused too (and fails there)."""
    ok = tmp_path / "ok"
    ok.mkdir()
    folder = DataFolder(ok, probe_s=60.0)
    assert folder.failed(HOST_ID, "database or disk is full", ok / "outbox.sqlite3")
    with tmpfs(tmp_path / "full", "size=1m") as disk:
        store = TimelineStore(disk / "task_progress.sqlite3", disk / "artifacts")
        try:

            def tell(reason: str, where: Path) -> None:  # as the host's lease client does
                folder.failed(HOST_ID, reason, where)

            store.on_disk_fault(tell)
            fill(disk)
            step = TimelineRecord("t1", 1, 1, user_prompt="x" * 100_000)

            def a_step_writes() -> None:  # the agent loop's thread, while the probe runs
                with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
                    store.append_step(step)

            def meanwhile() -> None:
                writer = threading.Thread(target=a_step_writes)
                writer.start()
                writer.join()

            folder.owe(meanwhile)
            assert not folder.probe()
            assert "database or disk is full" in folder.unwritable, folder.unwritable
            with pytest.raises(OSError, match="No space left on device") as refused:
                folder.probe()
            assert str(refused.value.filename).startswith(str(disk)), refused.value
            assert folder.unwritable
        finally:
            store.close()


def test_a_file_that_refused_a_write_keeps_the_host_paused_until_it_takes_writes(
    tmp_path: Path,
) -> None:
    """The sessions file (a real SQLite database) lost its write permission (`chattr +i`,
    which refuses root too) in a folder that still takes new files. Its write fails and is
    told, naming the file. Before, the probe wrote its new file in that folder, succeeded, and
    put the host back to work, to pause at the next write: a host flapping paused/working.
    Now the probe opens that file for append too, and the host stays paused until it can."""
    data = tmp_path / "data"
    sessions = data / "sessions.sqlite3"
    data.mkdir()
    sqlite3.connect(sessions).execute("CREATE TABLE t (x)").connection.close()
    folder = DataFolder(data, probe_s=60.0)
    set_immutable(sessions, on=True)
    try:
        db = sqlite3.connect(sessions)
        try:
            with pytest.raises(sqlite3.Error) as refused:  # the host's own write, refused
                db.execute("INSERT INTO t VALUES (1)").connection.commit()
        finally:
            db.close()
        assert folder.failed(HOST_ID, str(refused.value), sessions)
        with pytest.raises(PermissionError) as probed:
            folder.probe()
        assert probed.value.filename == str(sessions)
        assert folder.unwritable
    finally:
        set_immutable(sessions, on=False)
    assert folder.probe()
    assert not folder.unwritable


class _HungStat(type(Path())):  # type: ignore[misc]
    """A path whose `stat` hangs as on a dead NFS mount: it opens a FIFO nobody reads (the
    helpers of test_hung_writes.py do the same for writes). Each path made from it too."""

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        with open(self.parent / "hung-disk", "wb"):  # blocks: nobody reads
            pass
        result: os.stat_result = super().stat(follow_symlinks=follow_symlinks)
        return result


def test_a_refused_write_is_told_without_a_look_at_the_disk(tmp_path: Path) -> None:
    """A write refused (here the timeline's file, named by the lease client at an attempt's
    end, on the event loop) is told while the disk hangs: `failed` returns, pausing the host.
    Before, it asked whether the named path was a file there: that stat hung on a dead
    mount, and with it the event loop (no lease renewed, SIGTERM not handled)."""
    os.mkfifo(tmp_path / "hung-disk")
    folder = DataFolder(tmp_path, probe_s=60.0)
    told: list[str] = []
    where = _HungStat(tmp_path / "task_progress.sqlite3")
    teller = threading.Thread(
        target=lambda: told.append(folder.failed(HOST_ID, "disk I/O error", where)), daemon=True
    )
    teller.start()
    teller.join(30)  # a bound that only ends the test: before, it waited for ever
    try:
        assert told, "telling the fault still waits on the disk"
        assert "disk I/O error" in told[0] and folder.unwritable
    finally:  # a reader lets the hung open go, if it waits
        os.close(os.open(tmp_path / "hung-disk", os.O_RDONLY | os.O_NONBLOCK))


def test_a_fault_in_a_new_folder_while_paused_gets_that_folder_probed(tmp_path: Path) -> None:
    """Paused by a fault in its timeline's folder, the host is told of another in a folder
    outside the configured ones (the session conversations' file, on a full 1 MiB tmpfs).
    Before, `failed` returned before adding that folder when the host was already paused: the
    probe never wrote there and put the host back to work once the timeline's folder had
    room. Now the probe writes there too, and fails while that disk is full."""
    ok = tmp_path / "ok"
    ok.mkdir()
    folder = DataFolder(ok, probe_s=60.0)
    assert folder.failed(HOST_ID, "database or disk is full", ok / "task_progress.sqlite3")
    with tmpfs(tmp_path / "sessions", "size=1m") as disk:
        filler = fill(disk)
        assert folder.failed(HOST_ID, "database or disk is full", disk / "sessions.sqlite3") == ""
        with pytest.raises(OSError, match="No space left on device") as refused:
            folder.probe()
        assert str(refused.value.filename).startswith(str(disk)), refused.value
        assert folder.unwritable
        filler.unlink()
        assert folder.probe() and not folder.unwritable


async def test_a_host_upgraded_on_a_full_disk_starts_paused(tmp_path: Path) -> None:
    """The timeline's file was written by an older host, before marks were aged by when adb
    last listed their phone (no `seen_at` column), and that host's process died; then the disk
    (a 2 MiB tmpfs) filled. The upgraded host adds the column when it opens the file, a write
    the full disk refuses. Before, the TimelineStore constructor raised "database or disk is
    full" before any pause existed (`amc host run` exited 2, a supervisor restarting it in a
    loop); now the host starts paused with the old file's mark restored (read by when it was
    set), and once the disk has room the probe adds the column and the host takes work."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    with tmpfs(tmp_path / "data", "size=2m") as disk:
        settings = _on_disk(tmp_path, cloud, disk, probe_s=0.1)
        older = timeline_store._SCHEMA.replace(",\n    seen_at TEXT,\n    absent_s REAL\n", "\n")
        assert older != timeline_store._SCHEMA
        dead = sqlite3.connect(settings.resolved_db_path, isolation_level=None)
        dead_outbox = OutboxStore(settings.resolved_outbox_path)
        try:
            dead.execute("PRAGMA journal_mode=WAL")
            dead.executescript(older)
            dead.execute(
                "INSERT INTO unhealthy_phones (serial, attempts, last, part, marked_at)"
                " VALUES ('emulator-gone', 3, 'dark', 'look', ?)",
                (datetime.now(UTC).isoformat(),),
            )
            filler = fill(disk)
            virtual, settings = start_virtual_phones(settings)
            app = build_host(settings, planner=ScriptedPlanner([]))
            folder = app.lease.data_folder
            assert folder is not None
            assert "database or disk is full" in folder.unwritable, folder.unwritable
            assert app.health.of("emulator-gone") is not None
            async with serving(app, virtual, cloud) as fake:
                assert ONLINE not in fake.reported_states(SERIAL)
                filler.unlink()
                await fake.wait_for(lambda: fake.reported_states(SERIAL)[-1:] == [ONLINE])
            columns = [r[1] for r in dead.execute("PRAGMA table_info(unhealthy_phones)")]
            assert "seen_at" in columns, columns
        finally:
            dead.close()
            dead_outbox.close()
