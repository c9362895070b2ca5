"""A phone's unhealthy mark kept on disk (`TimelineStore.keep_unhealthy` / `drop_unhealthy`):
a write of it that fails costs only that copy, never the attempt's outcome or the device poll.

`run_host`'s parts end to end: virtual phones behind the virtual adb server, the adbutils
driver, the lease stream over mTLS to the in-test LeaseService (lease_fake.py), and the real
timeline SQLite file made to refuse the mark's write in one of two ways: its folder (a tmpfs
of the test's own, as tests/faults/test_host_disk_full.py uses) filled to the last byte, a
disk fault ("database or disk is full"); or a trigger on the marks' table that aborts the
write, an SQLite error that is not the disk's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from amc.v1 import types_pb2
from host.devices.registry import DeviceInfo
from host.runner import HostApp, build_host, start_virtual_phones
from host.settings import HostSettings
from host.timeline.store import TimelineStore
from tests.host.hung_disk_host import exits_on_sigterm
from tests.host.lease_fake import FakeCloud, host_settings, serving, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner, Step
from tests.support.tmpfs import fill, tmpfs
from tests.support.waiting import until

HOST_ID = "h1"
SERIAL = "emulator-5554"
FAULTS = ["disk", "other"]


def _settings(tmp_path: Path, port: int, pki_dir: Path, **update: object) -> HostSettings:
    """A direct host (the test's planner) whose phone is unhealthy after one unreadable
    attempt and probed every fifth of a second."""
    base = host_settings(tmp_path, port, pki_dir, HOST_ID)
    return base.model_copy(
        update={
            "planner_transport": "direct",
            "unhealthy_after_attempts": 1,
            "unhealthy_probe_s": 0.2,
            **update,
        }
    )


def _planner() -> ScriptedPlanner:
    return ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}, "open Settings"),
            Step("complete", {"success": True, "reason": "Settings is open"}),
        ]
    )


@contextlib.contextmanager
def _data_folder(tmp_path: Path, fault: str) -> Iterator[None]:
    """The host's data folder (`host_settings`: tmp_path / "host") on a small disk of its
    own when the fault is the disk's."""
    if fault == "disk":
        with tmpfs(tmp_path / "host", "size=8m"):
            yield
    else:
        yield


def _refuse(settings: HostSettings, fault: str, write: str) -> None:
    """From now on the timeline file refuses the marks' `write` ("INSERT" or "DELETE")."""
    if fault == "disk":
        fill(settings.resolved_db_path.parent)
        return
    db = sqlite3.connect(settings.resolved_db_path)
    try:
        db.execute(
            f"CREATE TRIGGER refuse_{write.lower()} BEFORE {write} ON unhealthy_phones"
            " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
        db.commit()
    finally:
        db.close()


def _said(caplog: pytest.LogCaptureFixture, done: str) -> list[str]:
    words = f"the unhealthy mark of phone {SERIAL} could not be {done}"
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "host.runner" and r.getMessage().startswith(words)
    ]


def _check(app: HostApp, caplog: pytest.LogCaptureFixture, fault: str, done: str) -> None:
    """A disk fault paused the host; either failure was logged once, naming the phone."""
    assert len(_said(caplog, done)) == 1, [r.getMessage() for r in caplog.records]
    if fault == "disk":
        assert "cannot write its data folder" in app.paused(), app.status()
    else:
        assert app.paused() == "", app.paused()


async def _marked(fake: FakeCloud, app: HostApp) -> None:
    """An attempt on the dark phone: it ends retryable and marks the phone."""
    await fake.assign("t1", SERIAL, "Open Settings")
    await fake.wait_for(lambda: len(fake.results) == 1, within=60)
    assert app.health.of(SERIAL) is not None


async def _kept(fake: FakeCloud, app: HostApp) -> None:
    """`_marked`, and its mark on disk: there is a row for a drop to fail on. The save is not
    awaited by the attempt's end (c204da2): on a loaded machine it ran after the result, after
    the test had filled the disk; it failed ("could not be saved"), and the drop, with no row
    to delete, wrote nothing and succeeded, so the failure the test waits for never came."""
    await _marked(fake, app)

    def on_disk() -> bool:
        return [m[0] for m in app.store.unhealthy_phones(timedelta(hours=1))] == [SERIAL]

    await until(lambda: asyncio.to_thread(on_disk), within=30, what="the mark saved")


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_mark_that_cannot_be_saved_keeps_the_attempts_outcome(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """The mark is saved after the attempt's loop ended. A save that raised left the runner:
    the lease client replaced the real outcome (the phone did not wake up) with a step-0
    "cannot write its data folder" one (a disk fault) or a non-retryable "host error" (any
    other), and retention was skipped. Now the real outcome goes to the cloud."""
    caplog.set_level(logging.INFO, logger="host.runner")
    with _data_folder(tmp_path, fault):
        cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
        virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
        phone = virtual.server.phones[SERIAL]
        phone.stays_dark = True
        phone.sleep()
        app = build_host(settings, planner=_planner())

        def on_mark(info: DeviceInfo, _: str) -> None:
            """The registry hears the mark just before it is saved: the file fails then."""
            if info.serial == SERIAL and info.unhealthy:
                _refuse(settings, fault, "INSERT")

        app.registry.add_listener(on_mark)
        async with serving(app, virtual, cloud) as fake:
            await _marked(fake, app)
            result = fake.results[0]
            assert result.retryable, result
            assert "did not wake up" in result.summary, result.summary
            assert result.status == types_pb2.TASK_STATUS_FAILED, result
            info = app.registry.get(SERIAL)
            assert info is not None and info.unhealthy, info
            # The save is not awaited by the attempt's end (c204da2): it may end after the result.
            await until(lambda: not app.marks_writing, within=10, what="the mark's save ended")
            _check(app, caplog, fault, "saved")


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_mark_that_cannot_be_dropped_with_its_phone_leaves_the_poll_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """The registry's listener drops the mark of a phone it forgets. A drop that raised left
    the registry's poll mid-way: the listeners after it (the lease client's) never heard the
    phone was forgotten, so the cloud was not told, nor were that poll's probes started. Now
    the cloud hears the phone list without it."""
    caplog.set_level(logging.INFO, logger="host.runner")
    with _data_folder(tmp_path, fault):
        cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
        virtual, settings = start_virtual_phones(
            _settings(tmp_path, cloud.port, cloud.pki_dir, device_forget_after_s=0.5)
        )
        phone = virtual.server.phones[SERIAL]
        phone.stays_dark = True
        phone.sleep()
        app = build_host(settings, planner=_planner())
        async with serving(app, virtual, cloud) as fake:
            await _kept(fake, app)
            _refuse(settings, fault, "DELETE")
            virtual.unplug(SERIAL)
            await until(lambda: app.registry.get(SERIAL) is None, within=30, what="forgotten")

            def told() -> bool:
                updates = [r.device_update for r in fake.received if r.HasField("device_update")]
                return bool(updates) and SERIAL not in {d.serial for d in updates[-1].devices}

            await until(told, within=30, what="the cloud told the phone list without it")
            # The drop runs in the marks' lane, not awaited by the poll: it may end after the
            # lease client sent the phone list.
            await until(lambda: bool(_said(caplog, "dropped")), within=10, what="the failure said")
            _check(app, caplog, fault, "dropped")


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_cleared_mark_that_cannot_be_dropped_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """A probe that reads the phone again drops its kept mark. A drop that raised ended the
    probe's task with an exception no one read: the disk fault did not pause the host, and
    nothing said which phone's mark stayed on disk."""
    caplog.set_level(logging.INFO, logger="host.runner")
    with _data_folder(tmp_path, fault):
        cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
        virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
        phone = virtual.server.phones[SERIAL]
        phone.stays_dark = True
        phone.sleep()
        app = build_host(settings, planner=_planner())
        async with serving(app, virtual, cloud):
            await _kept(cloud.cloud, app)
            _refuse(settings, fault, "DELETE")
            phone.stays_dark = False  # mended: the next probe reads it

            def back() -> bool:
                info = app.registry.get(SERIAL)
                return info is not None and not info.unhealthy

            await until(back, within=30, what="the mended phone back at work")
            await until(lambda: bool(_said(caplog, "dropped")), within=10, what="the failure said")
            _check(app, caplog, fault, "dropped")


async def test_a_mark_outlives_a_restart_while_its_phone_stays_plugged_in(
    tmp_path: Path,
) -> None:
    """A kept mark was aged out at start by when it was set: a host restarted more than
    `device_forget_after_s` after marking a phone that never stopped being plugged in, still
    dark, dropped the mark and reported the phone ONLINE, to burn more attempts. A mark is
    now aged by how long adb has not listed its phone: the restarted host reports it OFFLINE
    from its first report."""
    forget = 12.0
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    update = {"device_forget_after_s": forget}
    virtual, settings = start_virtual_phones(
        _settings(tmp_path, cloud.port, cloud.pki_dir, **update)
    )
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True
    phone.sleep()
    app = build_host(settings, planner=_planner())
    async with serving(app, virtual, cloud) as fake:
        await _marked(fake, app)
        marked = datetime.now(UTC)
        past = marked + timedelta(seconds=forget + 1)
        await until(lambda: datetime.now(UTC) > past, within=forget + 30, what="the mark aged")
        info = app.registry.get(SERIAL)
        assert info is not None and info.unhealthy, info  # still listed, still marked

    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(
        _settings(tmp_path, cloud.port, cloud.pki_dir, **update)
    )
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True
    phone.sleep()
    app = build_host(settings, planner=_planner())
    async with serving(app, virtual, cloud) as fake:

        def reports() -> list[types_pb2.Device]:
            updates = [r.device_update for r in fake.received]
            phones = [
                *(d for h in fake.hellos[-1:] for d in h.devices),
                *(d for u in updates for d in u.devices),
            ]
            return [d for d in phones if d.serial == SERIAL]

        await fake.wait_for(lambda: bool(reports()))
        first = reports()[0]
        assert first.state == types_pb2.DEVICE_STATE_OFFLINE, first
        assert "did not wake up" in first.reason, first


def test_a_host_whose_marks_refresh_hangs_exits_on_sigterm(tmp_path: Path) -> None:
    """A host process (`tests/host/hung_disk_host.py`: `asyncio.run(run_host(...))`, as `amc
    host run`) whose refresh of a kept mark (`_saw_marked`) hangs on the disk, holding the
    timeline's lock (a FIFO nobody reads). SIGTERM once it hangs: the process exits, status 0.
    Before, the refresh was background work the stop waited for without a bound, in asyncio's
    pool (which `asyncio.run` joins), and closing the timeline waited for its lock: the hung
    write held the exit for as long as it hung (here for ever; the 60 s bound ends the
    test)."""
    exits_on_sigterm(tmp_path, "marks", "refreshing")


async def test_a_mark_is_not_aged_by_the_hosts_own_downtime(tmp_path: Path) -> None:
    """The last run kept a mark of a phone it saw listed at its last look, two hours ago, and
    then the host was down for those two hours (`device_forget_after_s` is one). Before, a
    restart aged the mark by the wall clock since that look: the host's own downtime counted
    as the phone's absence, the mark was dropped and the phone, still dark, reported ONLINE,
    to burn more attempts. A mark is now aged by the absence running hosts saw (none here):
    the restarted host reports the phone OFFLINE, saying why, from its first report."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(
        _settings(tmp_path, cloud.port, cloud.pki_dir, device_forget_after_s=3600.0)
    )
    stopped = datetime.now(UTC) - timedelta(hours=2)
    last_run = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
    last_run.keep_unhealthy(SERIAL, 3, "the screen stayed dark", "look", now=stopped)
    last_run.saw_unhealthy([SERIAL], now=stopped)  # its last look: listed
    last_run.close()
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True
    phone.sleep()
    app = build_host(settings, planner=_planner())
    async with serving(app, virtual, cloud) as fake:
        await fake.wait_for(lambda: bool(fake.hellos))
        first = [d for d in fake.hellos[0].devices if d.serial == SERIAL]
    assert [d.state for d in first] == [types_pb2.DEVICE_STATE_OFFLINE], first
    assert "the screen stayed dark" in first[0].reason, first


async def test_a_mark_save_hung_on_the_disk_holds_no_attempts_result(tmp_path: Path) -> None:
    """An attempt on a dark phone marks it unhealthy; saving the mark hangs on the disk (it
    waits until the test lets it go, as a write to a dead NFS mount). The attempt's result
    still reaches the cloud, and the phone is kept out of work, while the save hangs. Before,
    the attempt's end awaited the save: its result waited for as long as the disk hung (here
    until the test's bound)."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True
    phone.sleep()
    app = build_host(settings, planner=_planner())
    keep = app.store.keep_unhealthy
    hung, disk_back = threading.Event(), threading.Event()

    def keep_hung(*args: Any, **kwargs: Any) -> None:
        hung.set()
        disk_back.wait(120)
        keep(*args, **kwargs)

    app.store.keep_unhealthy = keep_hung  # type: ignore[method-assign]
    async with serving(app, virtual, cloud) as fake:
        try:
            await fake.assign("t1", SERIAL, "Open Settings")
            await until(hung.is_set, within=60, what="the mark's save")
            await fake.wait_for(lambda: len(fake.results) == 1, within=60)
            assert fake.results[0].retryable, fake.results[0]
            assert not disk_back.is_set() and app.health.of(SERIAL) is not None
        finally:
            disk_back.set()
    saved = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
    try:
        assert [m[0] for m in saved.unhealthy_phones(timedelta(hours=1))] == [SERIAL]
    finally:
        saved.close()


async def test_a_kept_mark_whose_phone_never_shows_up_is_forgotten_as_a_listed_one(
    tmp_path: Path,
) -> None:
    """The last run kept a mark of a phone adb does not list to this one (unplugged while the
    host was down), and it never shows up. Before, the registry never forgot a phone it had
    never listed: the mark stayed in memory (and on disk, for this run) for the whole run. It
    is now forgotten after `device_forget_after_s` of absence, as a listed phone would be:
    out of the host's health and off the disk."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(
        _settings(tmp_path, cloud.port, cloud.pki_dir, device_forget_after_s=0.5)
    )
    gone = "emulator-gone"
    last_run = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
    last_run.keep_unhealthy(gone, 3, "the screen stayed dark", "look")
    last_run.close()
    app = build_host(settings, planner=_planner())
    assert app.health.of(gone) is not None  # restored: absent for no time yet
    async with serving(app, virtual, cloud):
        await until(lambda: app.health.of(gone) is None, what="the mark forgotten")
        await until(
            lambda: app.store.unhealthy_phones(timedelta(days=1)) == [], what="its row dropped"
        )
    assert [d.serial for d in app.registry.devices()] == [SERIAL, "emulator-5556"]
