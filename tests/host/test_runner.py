"""`run_host` end to end: virtual phones behind the virtual adb server, the adbutils driver,
the lease stream over mTLS (in-test LeaseService, see lease_fake.py), the timeline on disk."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from amc.v1 import decision_log_service_pb2, types_pb2
from host.devices.virtual.phone import AdbState, DumpGlitch
from host.outbox import OutboxStore
from host.runner import build_host, start_virtual_phones
from host.settings import HostSettings
from planner.decision import Decision
from planner.history import WorldEvent
from planner.scene import Scene
from tests.host.hung_disk_host import exits_on_sigterm
from tests.host.lease_fake import host_settings, serving, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner, Step, by_text
from tests.support.waiting import until

HOST_ID = "h1"


def _settings(tmp_path: Path, port: int, pki_dir: Path) -> HostSettings:
    # The tests hand the host a scripted planner: it plans itself.
    direct = {"planner_transport": "direct"}
    return host_settings(tmp_path, port, pki_dir, HOST_ID).model_copy(update=direct)


async def test_host_runs_an_assignment_on_a_virtual_phone(tmp_path: Path) -> None:
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}, "open Settings"),
            Step("tap", by_text("Display"), "open display settings"),
            Step("tap", by_text("Dark theme"), "turn dark theme on"),
            Step("complete", {"success": True, "reason": "dark theme is on"}),
        ]
    )
    app = build_host(settings, planner=planner)
    async with serving(app, virtual, cloud) as fake:
        hello = fake.hellos[0]
        assert {d.serial for d in hello.devices} == {"emulator-5554", "emulator-5556"}
        assert all(d.state == types_pb2.DEVICE_STATE_ONLINE for d in hello.devices)
        await fake.assign("t1", "emulator-5554", "Turn on dark theme")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        [result] = fake.results
        assert result.status == types_pb2.TASK_STATUS_SUCCEEDED, result.summary
        phone = virtual.server.phones["emulator-5554"]
        assert phone.state.flag("dark_theme")
        assert not virtual.server.phones["emulator-5556"].state.flag("dark_theme")
        records = app.store.steps("t1", 1)
        assert len(records) == 4
        status = app.status()
        assert status["connected"]
        assert status["host_id"] == HOST_ID
        assert status["running"] == []
        assert {d["serial"] for d in status["devices"]} == {"emulator-5554", "emulator-5556"}
        assert (settings.resolved_artifact_dir / (records[1].after_screenshot_path or "")).is_file()

        # A phone that vanishes is reported offline.
        virtual.unplug("emulator-5556")
        await fake.wait_for(
            lambda: types_pb2.DEVICE_STATE_OFFLINE in fake.reported_states("emulator-5556"),
            within=20,
        )
    assert settings.resolved_db_path.is_file()


class PerGoal:
    """One scripted planner per goal, so two phones can run different scripts at once."""

    def __init__(self, scripts: dict[str, ScriptedPlanner]) -> None:
        self.scripts = scripts

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        return await self.scripts[goal].decide(goal, scene, history, screenshot)


async def test_disconnected_phone_fails_its_task_and_nothing_else_stops(tmp_path: Path) -> None:
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    planner = PerGoal(
        {
            "doomed": ScriptedPlanner(
                [
                    Step("launch_app", {"package_name": "com.android.settings"}),
                    Step("tap", by_text("Display"), before=lambda: virtual.unplug("emulator-5554")),
                    Step("complete", {"success": True, "reason": "?"}),
                ]
            ),
            "Turn on dark theme": ScriptedPlanner(
                [
                    Step("launch_app", {"package_name": "com.android.settings"}),
                    Step("tap", by_text("Display")),
                    Step("tap", by_text("Dark theme")),
                    Step("complete", {"success": True, "reason": "dark theme is on"}),
                ]
            ),
        }
    )
    app = build_host(settings, planner=planner)
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("ok", "emulator-5556", "Turn on dark theme")
        await fake.assign("bad", "emulator-5554", "doomed")
        await fake.wait_for(lambda: len(fake.results) == 2, within=60)
        by_task = {r.task_id: r for r in fake.results}
        assert by_task["bad"].status == types_pb2.TASK_STATUS_FAILED
        assert by_task["bad"].summary == "phone emulator-5554 disconnected"
        assert by_task["bad"].retryable  # the task is not failed for good: it runs again
        assert by_task["ok"].status == types_pb2.TASK_STATUS_SUCCEEDED
        assert virtual.server.phones["emulator-5556"].state.flag("dark_theme")
        await fake.wait_for(
            lambda: types_pb2.DEVICE_STATE_OFFLINE in fake.reported_states("emulator-5554"),
            within=20,
        )
        assert app.lease.connected


async def test_a_task_after_a_cancelled_one_waits_for_the_phones_abandoned_call(
    tmp_path: Path,
) -> None:
    """An operator cancels a task stuck in a `uiautomator dump` that never finds an idle
    screen, and runs it again on the same phone. The cancelled attempt stopped at once, but its
    abandoned dump ran on in its thread (until the driver's timeout stops it), holding the
    phone's accessibility bridge: the new attempt's dumps, run beside it, all failed with
    "… already registered!" and it failed without a step. A phone's calls now run one at a
    time across attempts: the new attempt's first look waits for the abandoned one to end."""
    from host.devices.adb_driver import AdbDriver

    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}, "open Settings"),
            Step("complete", {"success": True, "reason": "Settings is open"}),
        ]
    )
    phone = virtual.server.phones["emulator-5554"]
    phone.hang_dumps(600.0)
    app = build_host(
        settings,
        planner=planner,
        # The abandoned dump is still running when the new attempt looks, as with the real 30 s.
        make_driver=lambda serial: AdbDriver(serial, port=settings.adb_port, timeout_s=10),
    )
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("stuck", "emulator-5554", "Open Settings")
        await fake.wait_for(lambda: phone.dumper is not None)
        await fake.revoke("stuck")
        await fake.wait_for(lambda: any(r.task_id == "stuck" for r in fake.results))
        await fake.assign("again", "emulator-5554", "Open Settings")
        await fake.wait_for(lambda: any(r.task_id == "again" for r in fake.results), within=60)
        again = next(r for r in fake.results if r.task_id == "again")
        assert again.status == types_pb2.TASK_STATUS_SUCCEEDED, again.summary


async def test_a_gone_phones_lane_thread_is_retired(tmp_path: Path) -> None:
    """Each phone's calls run in a thread of its own, kept across its attempts; it was kept
    for every serial ever seen, so a host whose phones come and go (USB hubs, emulators that
    reboot under new serials) piled up idle threads for good. A lane whose phone is gone and
    that nothing uses is now let go at the next device poll; the phone back gets a new one."""
    import threading

    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}, "open Settings"),
            Step("complete", {"success": True, "reason": "Settings is open"}),
        ]
        * 2
    )
    app = build_host(settings, planner=planner)

    def lane_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("phone-emulator-5554_")]

    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", "emulator-5554", "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        assert fake.results[0].status == types_pb2.TASK_STATUS_SUCCEEDED, fake.results[0].summary
        assert lane_threads()
        virtual.unplug("emulator-5554")
        await until(lambda: not lane_threads(), within=20, what="the gone phone's thread ends")
        assert "emulator-5554" not in app.lanes.serials()
        virtual.replug("emulator-5554")
        await until(
            lambda: any(d.serial == "emulator-5554" and d.online for d in app.registry.devices()),
            what="the phone is back",
        )
        await fake.assign("t2", "emulator-5554", "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 2, within=60)
        assert fake.results[1].status == types_pb2.TASK_STATUS_SUCCEEDED, fake.results[1].summary


@pytest.mark.parametrize(
    ("adb_state", "listed", "fix"),
    [
        ("unauthorized", types_pb2.DEVICE_STATE_UNAUTHORIZED, "accept its 'Allow USB debugging?'"),
        ("offline", types_pb2.DEVICE_STATE_OFFLINE, "replug the cable"),
    ],
)
async def test_a_phone_adb_cannot_reach_is_reported_as_adb_lists_it(
    tmp_path: Path, adb_state: AdbState, listed: int, fix: str
) -> None:
    """A phone whose USB debugging prompt was not accepted (or whose authorizations were
    revoked) is listed by adb as "unauthorized", one whose adbd stopped answering as
    "offline"; either way every request for it fails, and the task on it ended "phone …
    disconnected", sending the operator to a cable that is plugged in. The result now says
    what adb lists the phone as and what to do, and the phone is reported in that state."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    phone = virtual.server.phones["emulator-5554"]
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}),
            Step("tap", by_text("Display"), before=lambda: phone.set_adb_state(adb_state)),
            Step("complete", {"success": True, "reason": "?"}),
        ]
    )
    app = build_host(settings, planner=planner)
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", "emulator-5554", "Open display settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        [result] = fake.results
        assert result.status == types_pb2.TASK_STATUS_FAILED
        assert result.retryable
        assert "disconnected" not in result.summary, result.summary
        assert f"phone emulator-5554 is {adb_state} in adb" in result.summary, result.summary
        assert fix in result.summary, result.summary
        await fake.wait_for(lambda: listed in fake.reported_states("emulator-5554"), within=20)
        # Never OFFLINE on the way (the host reported the phone gone as adb lists it).
        reported = [
            state
            for state in fake.reported_states("emulator-5554")
            if state != types_pb2.DEVICE_STATE_ONLINE
        ]
        assert set(reported) == {listed}, reported


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
async def test_a_stuck_phone_ends_its_attempt_retryable(tmp_path: Path, driver: str) -> None:
    """A phone whose uiautomator stops answering (its screen never idle, its dumper hung;
    uiautomator2's server wedged) failed every look, and the task ended FAILED for good (not
    retryable), although nothing was wrong with the task: the cloud never gave it another
    attempt. The attempt now ends retryable, its summary naming the phone and what did not
    answer."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    base = _settings(tmp_path, cloud.port, cloud.pki_dir).model_copy(
        update={
            "dump_timeout_s": 1.0,
            "u2_rpc_timeout_s": 1.0,
            "hierarchy_deadline_s": 2.5,
            "hierarchy_retries": 3,
        }
    )
    virtual, settings = start_virtual_phones(base)
    settings = settings.model_copy(update={"driver": driver})  # virtual phones say adbutils
    phone = virtual.server.phones["emulator-5554"]
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}, "open Settings"),
            Step("complete", {"success": True, "reason": "Settings is open"}),
        ]
    )
    phone.hang_dumps(3.0, count=50)
    phone.hang_u2_agent(3.0, calls=50)
    app = build_host(settings, planner=planner)
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("stuck", "emulator-5554", "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        [result] = fake.results
        assert result.status == types_pb2.TASK_STATUS_FAILED
        assert result.retryable, result.summary
        assert result.summary.startswith("phone emulator-5554 did not answer"), result.summary
        assert "timed out" in result.summary, result.summary
        assert not planner.seen  # the task's own steps never ran: nothing it did failed


@pytest.mark.parametrize("glitch", ["idle", "null_root", "empty"])
async def test_a_window_that_gives_no_ui_tree_is_planned_from_its_screenshot(
    tmp_path: Path, glitch: DumpGlitch
) -> None:
    """A window whose every dump fails while the phone answers (uiautomator's "could not get
    idle state" on a screen that never settles, a null root, an empty tree: a secure window)
    ended each attempt retryable ("did not answer a look at its screen"), and every attempt
    after it the same way, on any phone: the task spent its whole attempt budget and ended
    FAILED without one step planned. After the look's bounded tries the step now goes on
    without the tree, from the screenshot, the model told why ("ui_tree": "missing (…)" in the
    scene, carried to the cloud in ScreenObservation.ui_tree_missing); a stuck phone (dumps
    unanswered) still ends its attempt retryable (test_a_stuck_phone_ends_its_attempt_retryable)."""
    from planner.observation import observation_from_scene, scene_from_observation

    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    base = _settings(tmp_path, cloud.port, cloud.pki_dir).model_copy(
        update={"hierarchy_retries": 3, "hierarchy_retry_delay_s": 0.0}
    )
    virtual, settings = start_virtual_phones(base)
    phone = virtual.server.phones["emulator-5554"]
    phone.glitch_every(1, glitch)  # every dump fails: the window never gives a tree
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}, "open Settings"),
            Step("complete", {"success": True, "reason": "Settings is open"}),
        ]
    )
    app = build_host(settings, planner=planner)
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("treeless", "emulator-5554", "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        [result] = fake.results
        assert result.status == types_pb2.TASK_STATUS_SUCCEEDED, result.summary
        assert phone.current_package() == "com.android.settings"
        scene = planner.seen[0]
        assert not scene.elements and "after 3 tries" in scene.tree_missing, scene
        told = scene_from_observation(observation_from_scene(scene)).to_prompt()
        assert told["ui_tree"].startswith("missing (no usable hierarchy"), told


@pytest.mark.parametrize(
    ("trouble", "driver", "words"),
    [
        ("garbage", "adbutils", "unreadable screenshot"),
        ("empty", "adbutils", "returned no PNG"),
        ("garbage", "uiautomator2", "unreadable screenshot"),
        ("dark", "adbutils", "did not wake up"),
    ],
)
async def test_a_phone_whose_screen_cannot_be_seen_ends_its_attempt_retryable(
    tmp_path: Path, trouble: str, driver: str, words: str
) -> None:
    """A phone whose screenshots came back unreadable (no bytes, or noise framed as an image)
    or whose display stayed off after the wake-up key ended the task FAILED for good, not
    retryable ("ScreenshotError: …", "DeviceError: phone … did not wake up"), although the
    task had done nothing wrong: the cloud never gave it another attempt, which another phone
    could have run. The attempt now ends retryable, as for a stuck phone, its summary naming
    the phone and what is wrong with it."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    settings = settings.model_copy(update={"driver": driver})  # virtual phones say adbutils
    phone = virtual.server.phones["emulator-5554"]
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}, "open Settings"),
            Step("complete", {"success": True, "reason": "Settings is open"}),
        ]
    )
    if trouble == "dark":
        phone.stays_dark = True
        phone.sleep()
    else:
        phone.garble_screenshots("garbage" if trouble == "garbage" else "empty", count=50)
    app = build_host(settings, planner=planner)
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("unseen", "emulator-5554", "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        [result] = fake.results
        assert result.status == types_pb2.TASK_STATUS_FAILED
        assert result.retryable, result.summary
        assert result.summary.startswith("phone emulator-5554 cannot show its screen"), (
            result.summary
        )
        assert words in result.summary, result.summary
        assert not planner.seen  # the task's own steps never ran: nothing it did failed


async def test_phones_that_come_and_go_never_push_an_online_phone_out_of_the_reports(
    tmp_path: Path,
) -> None:
    """Each device update carries the whole phone list, cut at 256; the registry kept every
    serial it ever saw, sorted by serial, so on a host where phones come and go under new
    serials (adb over Wi-Fi: "10.0.0.7:5555", which sort first) its plugged-in phones were cut
    from the updates and the cloud no longer offered them tasks. Online phones now come
    first, and a phone gone longer than `device_forget_after_s` is forgotten."""
    from host.devices.virtual.phone import VirtualPhone

    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    app = build_host(settings, planner=ScriptedPlanner([]))
    async with serving(app, virtual, cloud) as fake:
        wifi = [f"10.0.0.{i}:5555" for i in range(300)]
        for serial in wifi:
            virtual.server.add_phone(VirtualPhone(serial))
        await until(lambda: len(app.registry.devices()) == 302, within=60, what="all listed")
        for serial in wifi:
            virtual.unplug(serial)
        await until(
            lambda: sum(d.online for d in app.registry.devices()) == 2,
            within=60,
            what="the Wi-Fi phones are gone",
        )
        # The update that tells of the unplugging: full (256) with no Wi-Fi phone online in it.
        # (Waiting on the length alone read the update sent before the unplug, already 256 long.)
        await fake.wait_for(
            lambda: (
                len(fake.last_devices()) == 256
                and not any(
                    d.serial.startswith("10.") and d.state == types_pb2.DEVICE_STATE_ONLINE
                    for d in fake.last_devices()
                )
            ),
            within=20,
        )
        online = {d.serial for d in fake.last_devices() if d.state == types_pb2.DEVICE_STATE_ONLINE}
        assert online == {"emulator-5554", "emulator-5556"}


async def test_a_phone_gone_longer_than_the_setting_leaves_the_reports(tmp_path: Path) -> None:
    """`AMC_HOST_DEVICE_FORGET_AFTER_S` reaches the registry: a phone gone longer is left out
    of the next device update."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    base = _settings(tmp_path, cloud.port, cloud.pki_dir)
    virtual, settings = start_virtual_phones(base.model_copy(update={"device_forget_after_s": 0.5}))
    app = build_host(settings, planner=ScriptedPlanner([]))
    async with serving(app, virtual, cloud) as fake:
        virtual.unplug("emulator-5554")
        await fake.wait_for(
            lambda: [d.serial for d in fake.last_devices()] == ["emulator-5556"], within=20
        )
        assert app.registry.get("emulator-5554") is None


async def test_a_forgotten_phone_keeps_no_uiautomator2_device(tmp_path: Path) -> None:
    """The uiautomator2 Device that started a phone's server is kept (to stop that server
    when the host exits) after its attempt ends; a phone that then went away for good kept
    it for the life of the host, one per serial on a host where serials come and go. When
    the host forgets the phone, the Device goes too."""
    import gc

    import uiautomator2 as u2

    def devices() -> int:
        gc.collect()
        return sum(isinstance(o, u2.Device) for o in gc.get_objects())

    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    base = _settings(tmp_path, cloud.port, cloud.pki_dir)
    virtual, settings = start_virtual_phones(base.model_copy(update={"device_forget_after_s": 0.5}))
    settings = settings.model_copy(update={"driver": "uiautomator2"})
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}, "open Settings"),
            Step("complete", {"success": True, "reason": "Settings is open"}),
        ]
    )
    app = build_host(settings, planner=planner)
    before = devices()
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", "emulator-5554", "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        assert fake.results[0].status == types_pb2.TASK_STATUS_SUCCEEDED, fake.results[0].summary
        assert devices() > before  # the Device that started the server, kept for the exit
        virtual.unplug("emulator-5554")
        await until(lambda: app.registry.get("emulator-5554") is None, what="forgotten")
        await until(lambda: devices() == before, within=10, what="its Device let go")


async def test_phones_sharing_a_serial_get_their_own_ids_and_each_runs_its_task(
    tmp_path: Path,
) -> None:
    """Two phones with the serial cheap phones ship with: adb lists both and refuses the
    serial as ambiguous. The host announced one phone and every task on it failed as
    "disconnected"; now each has its own id, is driven by its transport id, and the console
    says why the ids are not the serial."""
    from host.devices.virtual.adb_server import ThreadedAdbServer
    from host.devices.virtual.phone import VirtualPhone

    serial = "0123456789ABCDEF"
    phones = [VirtualPhone(serial), VirtualPhone(serial)]
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual = ThreadedAdbServer(phones)
    port = virtual.start()
    settings = _settings(tmp_path, cloud.port, cloud.pki_dir).model_copy(
        update={"device_source": "adb", "adb_port": port}
    )
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}),
            Step("tap", by_text("Display")),
            Step("tap", by_text("Dark theme")),
            Step("complete", {"success": True, "reason": "dark theme is on"}),
        ]
    )
    app = build_host(settings, planner=planner)
    async with serving(app, virtual, cloud) as fake:
        ids = [f"{serial}@t{virtual.server.transport_id(p)}" for p in phones]
        hello = fake.hellos[0]
        assert sorted(d.serial for d in hello.devices) == sorted(ids)
        assert all(d.state == types_pb2.DEVICE_STATE_ONLINE for d in hello.devices)
        await fake.assign("t1", ids[1], "Turn on dark theme")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        assert fake.results[0].status == types_pb2.TASK_STATUS_SUCCEEDED, fake.results[0].summary
        assert [p.state.flag("dark_theme") for p in phones] == [False, True]
        shown = {d["serial"]: d["shared_serial"] for d in app.status()["devices"]}
        assert shown == {ids[0]: True, ids[1]: True}


def test_a_host_whose_retention_pass_hangs_exits_on_sigterm(tmp_path: Path) -> None:
    """A host process (`tests/host/hung_disk_host.py`: `asyncio.run(run_host(...))`, as `amc
    host run`) whose start's retention pass hangs on the disk, holding the timeline's lock (a
    FIFO nobody reads). SIGTERM once it hangs: the process exits, status 0. Before, the pass
    ran in asyncio's pool (which `asyncio.run` and Python join at exit) and the stop waited
    for it without a bound: the hung pass held the exit for as long as it hung (here for
    ever; the 60 s bound ends the test)."""
    exits_on_sigterm(tmp_path, "retention", "pruning")


async def test_a_host_closes_though_an_outbox_write_hangs_on_the_disk(tmp_path: Path) -> None:
    """An outbox write (a step's shipment, in its phone's daemon lane) hangs on the disk
    holding the outbox's lock: it opens a FIFO nobody reads, as a write to a dead NFS mount
    blocks. `HostApp.close`, the last step of a stop, returns: it leaves the outbox's
    connection to the hung write. Before, it waited for the lock for as long as the write
    hung (here for ever; the 60 s bound ends the test)."""
    cloud = await start_fake_cloud(tmp_path / "pki", "h1")
    app = build_host(host_settings(tmp_path, cloud.port, cloud.pki_dir, "h1"))
    outbox = app.outbox
    assert outbox is not None
    fifo = tmp_path / "hung-disk"
    os.mkfifo(fifo)
    hung = threading.Event()

    def write_hung() -> None:
        with outbox._using():
            hung.set()
            with fifo.open("wb"):  # blocks: nobody reads
                pass

    writer = threading.Thread(target=write_hung, daemon=True)
    writer.start()
    closing = threading.Thread(target=app.close, daemon=True)
    try:
        assert hung.wait(30)
        closing.start()
        closing.join(60)
        assert not closing.is_alive(), "closing the host still waits on the hung outbox write"
    finally:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader lets the hung open go
        writer.join(30)
        os.close(fd)
        closing.join(30)
        outbox.close()
        await cloud.server.stop(grace=None)


async def test_a_start_gets_past_a_call_marker_it_cannot_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process died while two model calls were out; one marker's body is corrupt. Before,
    the start's settle parsed every body at once: the corrupt one raised (not a disk fault)
    on every start, and the host restart-looped. Now it is skipped with a warning naming the
    call (not its body), the readable call is kept in the timeline, and both markers are
    released: none is left to trip the next start."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    dead = OutboxStore(settings.resolved_outbox_path)
    good = decision_log_service_pb2.ShippedUnsettledCall(
        host_call_id="call-good", task_id="t0", attempt=1, provider="anthropic", model="m"
    )
    try:
        dead.open_call("call-good", good.SerializeToString())
        dead.open_call("call-bad", b"\x0a\xffsecret-ish bytes")
    finally:
        dead.close()
    with caplog.at_level(logging.WARNING, logger="host.runner"):
        app = build_host(settings, planner=ScriptedPlanner([]))
    async with serving(app, virtual, cloud) as fake:
        hello = fake.hellos[0]
        assert all(d.state == types_pb2.DEVICE_STATE_ONLINE for d in hello.devices), hello
        assert app.store.unsettled_calls("t0", 1)[0] == 1
        assert app.outbox is not None and app.outbox.open_calls() == []
    unreadable = [r.getMessage() for r in caplog.records if "call-bad" in r.getMessage()]
    assert unreadable and all("secret-ish" not in m for m in unreadable), caplog.text


async def test_a_keepalive_faster_than_the_cloud_allows_by_default_is_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A host pinging more often than the cloud's default minimum interval (10 s) loses its
    stream every few seconds (the cloud closes the connection: "too_many_pings"), with only
    the lost streams in its log. Now the start says so in one warning naming both settings
    (the host cannot read the cloud's own value, so it still runs); at 10 s, nothing."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    try:
        base = _settings(tmp_path, cloud.port, cloud.pki_dir)
        for keepalive, said in ((5.0, 1), (10.0, 0)):
            caplog.clear()
            settings = base.model_copy(update={"keepalive_time_s": keepalive})
            with caplog.at_level(logging.WARNING, logger="host.runner"):
                app = build_host(settings, planner=ScriptedPlanner([]))
            app.close()
            named = [
                r.getMessage()
                for r in caplog.records
                if "AMC_HOST_KEEPALIVE_TIME_S" in r.getMessage()
                and "AMC_CLOUD_MIN_CLIENT_PING_INTERVAL_SECONDS" in r.getMessage()
            ]
            assert len(named) == said, caplog.text
    finally:
        await cloud.server.stop(grace=None)
