"""Host settings (env names, derived paths), retention at start, dump retries, u2 error mapping."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from uiautomator2 import exceptions as u2_exceptions

from host.devices.base import DeviceError, DeviceGone
from host.devices.u2_driver import _mapped
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.hierarchy import HierarchyError
from host.perception.perceive import Perceiver
from host.runner import build_host, serve_host
from host.settings import HostSettings
from host.timeline.store import TimelineStore
from tests.host.scripted_planner import ScriptedPlanner
from tests.support.processes import free_port
from tests.support.waiting import until


def test_env_prefix_and_legacy_db_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMC_HOST_MAX_STEPS", "12")
    monkeypatch.setenv("HOST_AGENT_TASK_PROGRESS_DB_PATH", str(tmp_path / "legacy" / "tp.sqlite3"))
    s = HostSettings()
    assert s.max_steps == 12
    assert s.resolved_db_path == tmp_path / "legacy" / "tp.sqlite3"
    assert s.resolved_artifact_dir == tmp_path / "legacy" / "artifacts"
    assert (s.retention_max_tasks, s.retention_max_age_days) == (50, 7.0)


def test_cert_paths_follow_the_pki_layout(tmp_path: Path) -> None:
    s = HostSettings(certs_dir=tmp_path, host_id="h7", data_dir=tmp_path / "d")
    assert s.ca_cert == tmp_path / "ca.pem"
    assert s.client_cert == tmp_path / "host-h7.pem"
    assert s.client_key == tmp_path / "host-h7.key"
    assert s.resolved_db_path == tmp_path / "d" / "task_progress.sqlite3"


async def test_retention_at_start_runs_beside_the_host_not_before_it(tmp_path: Path) -> None:
    """`build_host` pruned old tasks (rows and files) before the host dialled the cloud: with
    many files to delete, a host restarted after a kill sent the results its previous
    process kept (naming their leases) only minutes later. The pass runs once it serves."""
    settings = HostSettings(data_dir=tmp_path, retention_max_tasks=3, ocr_enabled=False, adb_port=1)
    store = TimelineStore(settings.resolved_db_path, settings.resolved_artifact_dir)
    now = datetime.now(UTC)
    for i in range(5):
        store.start_task(f"t{i}", 1, "g", "s", now=now - timedelta(minutes=5 - i))
        store.save_screenshot(f"t{i}", 1, "a.png", b"x")
        store.finish_task(f"t{i}", 1, "succeeded", "ok", now=now - timedelta(minutes=5 - i))
    store.close()
    app = build_host(  # a cloud nobody answers at: the host serves on without it
        settings,
        planner=ScriptedPlanner([]),  # never asked: no task runs
        channel_factory=lambda: grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}"),
    )
    assert len(app.store.list_tasks()) == 5
    stop = asyncio.Event()
    serving = asyncio.create_task(serve_host(app, stop))
    try:
        await until(
            lambda: [t.task_id for t in app.store.list_tasks()] == ["t4", "t3", "t2"],
            what="the retention pass at start",
        )
        assert app.store.artifacts.task_dirs() == ["t2-a1", "t3-a1", "t4-a1"]
    finally:
        stop.set()
        await serving


class FlakyDumps(VirtualDriver):
    """A real virtual phone whose first dumps come back empty, as a settling screen's do."""

    def __init__(self, phone: VirtualPhone, empty: int) -> None:
        super().__init__(phone)
        self.empty = empty
        self.calls = 0

    def dump_hierarchy(self) -> str:
        self.calls += 1
        if self.calls <= self.empty:
            return '<?xml version="1.0" encoding="UTF-8"?><hierarchy rotation="0" />'
        return super().dump_hierarchy()


def test_empty_dumps_are_retried_then_reported() -> None:
    phone = VirtualPhone("emulator-5554")
    perceiver = Perceiver(None, retries=3, retry_delay_s=0)
    ok = FlakyDumps(phone, empty=2)
    assert perceiver.perceive(ok, with_ocr=False).scene.elements
    assert ok.calls == 3
    bad = FlakyDumps(phone, empty=5)
    with pytest.raises(HierarchyError, match="emulator-5554 after 3 tries"):
        perceiver.scene_from_dump(bad, bad.screen_size(), None)


def test_u2_errors_map_to_device_errors() -> None:
    with pytest.raises(DeviceGone, match="phone p1 disconnected"), _mapped("p1", "tap"):
        raise u2_exceptions.ConnectError("adb connection lost")
    with pytest.raises(DeviceError) as err, _mapped("p1", "dump"):
        raise u2_exceptions.HierarchyEmptyError("empty")
    assert not isinstance(err.value, DeviceGone)


async def test_a_bad_after_dump_does_not_end_the_task(tmp_path: Path) -> None:
    from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
    from tests.host.scripted_planner import ScriptedPlanner, Step

    class BadAfterFirstAction(FlakyDumps):
        """Good dump, then 3 empty ones (the after capture of step 1), then good again."""

        def dump_hierarchy(self) -> str:
            self.calls += 1
            if 2 <= self.calls <= 4:
                return "<hierarchy rotation='0' />"
            return VirtualDriver.dump_hierarchy(self)

    phone = VirtualPhone("emulator-5554")
    store = TimelineStore(tmp_path / "t.sqlite3", tmp_path / "a")
    planner = ScriptedPlanner(
        [
            Step("press_key", {"key": "home"}),
            Step("complete", {"success": True, "reason": "done"}),
        ]
    )
    loop = AgentLoop(
        BadAfterFirstAction(phone, empty=0),
        planner,
        Perceiver(None, retries=3, retry_delay_s=0),
        store,
        LoopSettings(settle_delay_s=0, ocr=False),
    )
    outcome = await loop.run(TaskSpec("t", 1, "g", "emulator-5554"))
    assert outcome.status == "succeeded"
    first = store.steps("t", 1)[0]
    assert "after_error" in first.result
    assert first.after_screenshot_path  # the image is still kept
    store.close()


def test_slow_phones_get_longer_driver_timeouts_from_the_host_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drivers' timeouts were constants (30 s): an operator whose phones need longer
    for a dump or a screenshot (or shorter, to give up on a stuck one sooner) could not say
    so. `AMC_HOST_DUMP_TIMEOUT_S`, `…_SCREENSHOT_TIMEOUT_S` and `…_U2_RPC_TIMEOUT_S` now
    reach the drivers the host makes; here each is set short and a phone that hangs on that
    call gives up after it. (The threads' joins are a safety net for the test run only.)"""
    import threading
    from collections.abc import Callable

    from host.devices.base import DeviceBusy
    from host.devices.virtual.adb_server import ThreadedAdbServer
    from host.runner import driver_factory

    def gives_up(call: Callable[[], object]) -> BaseException | None:
        raised: list[BaseException] = []

        def run() -> None:
            try:
                call()
            except BaseException as exc:
                raised.append(exc)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(15)
        return None if worker.is_alive() else raised[0]

    monkeypatch.setenv("AMC_HOST_DUMP_TIMEOUT_S", "0.5")
    monkeypatch.setenv("AMC_HOST_SCREENSHOT_TIMEOUT_S", "0.5")
    monkeypatch.setenv("AMC_HOST_U2_RPC_TIMEOUT_S", "0.5")
    phone = VirtualPhone("slow-1")
    with ThreadedAdbServer([phone]) as server:
        settings = HostSettings(adb_port=server.port)
        adb = driver_factory(settings)(phone.serial)
        phone.hang_dumps(600.0)
        assert isinstance(gives_up(adb.dump_hierarchy), DeviceBusy)
        phone.stall_service("exec-out:screencap", 600.0)
        assert isinstance(gives_up(adb.screenshot_png), DeviceBusy)
        u2 = driver_factory(settings.model_copy(update={"driver": "uiautomator2"}))(phone.serial)
        u2.screen_size()
        phone.hang_u2_agent(600.0)
        assert isinstance(gives_up(u2.dump_hierarchy), DeviceBusy)


def test_the_adbutils_driver_s_short_calls_take_their_timeout_from_the_host_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The adbutils driver's other calls (a tap, typed text, the shell checks) waited a fixed
    30 s for a silent phone, whatever the operator set. `AMC_HOST_ADB_CALL_TIMEOUT_S` now
    reaches the drivers the host makes: set short, a tap on a phone whose adbd sits silent
    gives up after it, naming the call. (The thread's join is a safety net for the test run
    only: before, the tap waited the stall's 60 s out, past it.)"""
    import threading

    from host.devices.base import DeviceBusy
    from host.devices.virtual.adb_server import ThreadedAdbServer
    from host.runner import driver_factory

    monkeypatch.setenv("AMC_HOST_ADB_CALL_TIMEOUT_S", "0.5")
    phone = VirtualPhone("slow-2")
    with ThreadedAdbServer([phone]) as server:
        adb = driver_factory(HostSettings(adb_port=server.port))(phone.serial)
        raised: list[BaseException] = []

        def tap() -> None:
            try:
                adb.tap(10, 10)
            except BaseException as exc:
                raised.append(exc)

        phone.stall_service("shell:input tap", 60.0)
        worker = threading.Thread(target=tap, daemon=True)
        worker.start()
        worker.join(15)
        assert not worker.is_alive(), "the tap still waits on the silent phone"
        (error,) = raised
        assert isinstance(error, DeviceBusy) and "tap" in str(error), error
