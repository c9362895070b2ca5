"""An unhealthy phone (`host.devices.health`) goes back to work only once a whole look at it
works, shows as the cloud hears it, and is forgotten with the phone.

`run_host`'s parts end to end: virtual phones behind the virtual adb server, the adbutils
driver, the lease stream over mTLS to the in-test LeaseService (lease_fake.py).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest

from amc.v1 import types_pb2
from host.devices.adb_driver import AdbDriver
from host.runner import build_host, start_virtual_phones
from host.settings import HostSettings
from tests.host.lease_fake import host_settings, serving, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner, Step
from tests.support.waiting import until

HOST_ID = "h1"
SERIAL = "emulator-5554"
STILL = "is still unreadable"
AGAIN = "can be read again"


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


def _probes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "host.runner" and (STILL in r.getMessage() or AGAIN in r.getMessage())
    ]


@pytest.mark.parametrize("trouble", ["dark", "garbage"])
async def test_a_probe_repeats_the_look_that_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, trouble: str
) -> None:
    """A phone whose display stayed off, or whose screenshots were no image, was marked
    unhealthy, then probed with one dump: the dump parsed, the phone was put back to work
    and burnt the next attempts the same way, for good. The probe now takes the whole look
    (wake, screenshot, dump), so the phone stays out while its screen cannot be seen, and
    comes back once it can. Meanwhile `HostApp.status()` said it was online (adb lists it
    so) while the cloud was told OFFLINE: it now says offline, and why."""
    caplog.set_level(logging.INFO, logger="host.runner")
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    phone = virtual.server.phones[SERIAL]
    if trouble == "dark":
        phone.stays_dark = True
        phone.sleep()
    else:
        phone.garble_screenshots("garbage", count=10_000)
    app = build_host(settings, planner=_planner())
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", SERIAL, "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        assert fake.results[0].retryable, fake.results[0].summary
        info = app.registry.get(SERIAL)
        assert info is not None and info.unhealthy, info
        await fake.wait_for(
            lambda: fake.reported_states(SERIAL)[-1:] == [types_pb2.DEVICE_STATE_OFFLINE]
        )
        (shown,) = [d for d in app.status()["devices"] if d["serial"] == SERIAL]
        assert shown["online"] is False, shown
        words = "did not wake up" if trouble == "dark" else "unreadable screenshot"
        assert "is unhealthy" in shown["unhealthy"] and words in shown["unhealthy"], shown

        await until(lambda: bool(_probes(caplog)), within=30, what="a probe of the phone")
        assert STILL in _probes(caplog)[0], _probes(caplog)
        info = app.registry.get(SERIAL)
        assert info is not None and info.unhealthy, info

        if trouble == "dark":
            phone.stays_dark = False  # mended: the next probe wakes it and reads it

            def back() -> bool:
                info = app.registry.get(SERIAL)
                return info is not None and not info.unhealthy

            await until(back, within=30, what="the mended phone back at work")
            await fake.wait_for(
                lambda: fake.reported_states(SERIAL)[-1:] == [types_pb2.DEVICE_STATE_ONLINE]
            )
            (shown,) = [d for d in app.status()["devices"] if d["serial"] == SERIAL]
            assert shown["online"] is True and shown["unhealthy"] == "", shown


async def test_a_probe_wants_the_ui_tree_not_only_the_screenshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A look whose dumps all fail ("could not get idle state") goes on from the screenshot
    in an attempt, and passed the probe the same way: a phone marked unhealthy was put back to
    work while its dumper still failed every time. The probe wants the tree: the phone stays
    out until a dump works again, and the reason the cloud hears says what the probe found
    (before, only what the attempt that marked it said: its dark display)."""
    caplog.set_level(logging.INFO, logger="host.runner")
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True
    phone.sleep()
    app = build_host(settings, planner=_planner())
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", SERIAL, "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        info = app.registry.get(SERIAL)
        assert info is not None and info.unhealthy, info
        phone.glitch_every(1, "idle")  # its screen is seen again, its dumper fails every time
        phone.stays_dark = False
        await until(
            lambda: sum("gives no UI tree" in p for p in _probes(caplog)) >= 2,
            within=30,
            what="two probes refused for the missing tree",
        )
        assert not any(AGAIN in p for p in _probes(caplog)), _probes(caplog)
        info = app.registry.get(SERIAL)
        assert info is not None and "its last probe failed" in info.unhealthy, info
        assert "gives no UI tree" in info.unhealthy, info
        await fake.wait_for(
            lambda: any(
                d.serial == SERIAL and "gives no UI tree" in d.reason for d in fake.last_devices()
            )
        )
        phone.glitch_every(0)  # the dumper mended

        def back() -> bool:
            info = app.registry.get(SERIAL)
            return info is not None and not info.unhealthy

        await until(back, within=30, what="the phone back at work once a dump works")


async def test_a_phone_left_on_a_screen_without_a_tree_is_probed_from_home(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A phone marked unhealthy (its display stayed dark), then mended, but left on an app
    whose screen never goes idle (a game, a video, a Flutter app): every dump there fails.
    The probe looked at that app each time and refused the missing tree, and nothing moved
    the phone off it: it stayed out of work for good. The probe now presses HOME before its
    look: the launcher gives a tree, and the phone is back at work."""
    caplog.set_level(logging.INFO, logger="host.runner")
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True
    phone.sleep()
    app = build_host(settings, planner=_planner())
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", SERIAL, "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        info = app.registry.get(SERIAL)
        assert info is not None and info.unhealthy, info
        game = "com.android.calculator2"
        phone.never_idle = {game}
        assert phone.launch(game) and phone.current_package() == game
        phone.stays_dark = False

        def back() -> bool:
            info = app.registry.get(SERIAL)
            return info is not None and not info.unhealthy

        await until(
            lambda: back() or sum("gives no UI tree" in p for p in _probes(caplog)) >= 2,
            within=30,
            what="the phone back at work, or two probes refused for the missing tree",
        )
        assert back(), _probes(caplog)
        assert phone.current_package() != game


async def test_a_forgotten_unhealthy_phone_is_no_longer_probed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A phone the registry forgot while unhealthy kept its health mark (and the registry its
    reason): the host probed it, and logged it unreadable, every `probe_s` for as long as it
    ran, and the phone came back, should it, still marked. Both go with the phone now."""
    caplog.set_level(logging.INFO, logger="host.runner")
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(
        _settings(tmp_path, cloud.port, cloud.pki_dir, device_forget_after_s=0.5)
    )
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True
    phone.sleep()
    app = build_host(settings, planner=_planner())
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", SERIAL, "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        assert app.health.of(SERIAL) is not None
        virtual.unplug(SERIAL)
        await until(lambda: app.registry.get(SERIAL) is None, within=30, what="phone forgotten")
        assert app.health.of(SERIAL) is None
        assert SERIAL not in app.health.due()

        virtual.replug(SERIAL)  # back after being forgotten: a phone like any new one

        def listed() -> bool:
            return app.registry.get(SERIAL) is not None

        await until(listed, within=30, what="the phone listed again")
        info = app.registry.get(SERIAL)
        assert info is not None and info.unhealthy == "", info


async def test_a_phone_whose_taps_hang_is_kept_out_until_a_key_press_is_answered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A phone whose actions time out (adbd sits on every `input` request: the fault hook
    `stall_service`) while its screen reads fine: each timed-out tap was a failed step, the
    model tapped again into the same hang until the step limit ended the attempt FAILED for
    good, and a phone marked unhealthy for such a call was cleared by the first look. Now
    two unanswered actions in a row end the attempt retryable, the phone is marked unhealthy
    for its actions, and its probe presses a key after the look: it stays out while `input`
    hangs and comes back once the phone answers."""
    caplog.set_level(logging.INFO, logger="host.runner")
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(
        _settings(tmp_path, cloud.port, cloud.pki_dir, max_steps=6)
    )
    phone = virtual.server.phones[SERIAL]
    # Two taps of the attempt, then the first probe's key press; the second probe's is answered.
    phone.stall_service("shell:input", 3600, count=3)
    taps = ScriptedPlanner([Step("tap", {"x": 540, "y": 1200}, "tap the middle")] * 6)

    def driver(serial: str) -> AdbDriver:
        """Short calls (`input`, `dumpsys`) time out in 3 s, not 30 (three hung calls are
        waited out: most of the test's time); looks keep 30 s."""
        return AdbDriver(
            serial,
            settings.adb_host,
            settings.adb_port,
            timeout_s=3.0,
            dump_timeout_s=30.0,
            screenshot_timeout_s=30.0,
        )

    app = build_host(settings, planner=taps, make_driver=driver)
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", SERIAL, "Tap the middle")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        result = fake.results[0]
        assert result.retryable and "did not answer its actions" in result.summary, result
        info = app.registry.get(SERIAL)
        assert info is not None and "its actions got no answer" in info.unhealthy, info

        await until(lambda: bool(_probes(caplog)), within=30, what="a probe of the phone")
        assert STILL in _probes(caplog)[0], _probes(caplog)  # the look passed, the key hung

        def back() -> bool:
            info = app.registry.get(SERIAL)
            return info is not None and not info.unhealthy

        await until(back, within=30, what="the phone back at work once it answers")
        assert AGAIN in _probes(caplog)[-1], _probes(caplog)


async def test_a_tree_read_between_hung_taps_does_not_reset_their_streak(
    tmp_path: Path,
) -> None:
    """Only an action that asks the phone something moves the unanswered-actions streak. A
    tree read (`get_ui_tree`) asks it nothing, yet reset the streak: a model alternating a
    tap that hangs with a tree read never reached `ACTIONS_UNANSWERED`, the attempt ran to
    its step limit and ended FAILED for good, and the phone was never marked. Now tap (hung),
    tree read, tap (hung) ends the attempt retryable and marks the phone for its actions."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(
        _settings(tmp_path, cloud.port, cloud.pki_dir, max_steps=6)
    )
    phone = virtual.server.phones[SERIAL]
    phone.stall_service("shell:input", 3600, count=2)  # the two taps of the attempt
    tap = Step("tap", {"x": 540, "y": 1200}, "tap the middle")
    taps = ScriptedPlanner([tap, Step("get_ui_tree")] * 3)

    def driver(serial: str) -> AdbDriver:
        """Short calls (`input`, `dumpsys`) time out in 2 s; looks keep 30 s."""
        return AdbDriver(
            serial,
            settings.adb_host,
            settings.adb_port,
            timeout_s=2.0,
            dump_timeout_s=30.0,
            screenshot_timeout_s=30.0,
        )

    app = build_host(settings, planner=taps, make_driver=driver)
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", SERIAL, "Tap the middle")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        result = fake.results[0]
        assert result.retryable and "did not answer its actions" in result.summary, result
        assert len(taps.seen) == 3, len(taps.seen)  # tap, tree read, tap: then it ended
        info = app.registry.get(SERIAL)
        assert info is not None and "its actions got no answer" in info.unhealthy, info


async def test_an_unhealthy_mark_outlives_a_restart_and_the_phone_is_probed_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Marks lived in memory only: a host restarted with a phone that still could not be
    read reported it ONLINE at once, and it burnt another `limit` attempts. The mark is kept
    in the timeline database: the restarted host reports the phone OFFLINE, saying why, from
    its first report, probes it at once, and puts it back to work once a look works (the
    kept mark then gone)."""
    caplog.set_level(logging.INFO, logger="host.runner")
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True
    phone.sleep()
    app = build_host(settings, planner=_planner())
    async with serving(app, virtual, cloud) as fake:
        await fake.assign("t1", SERIAL, "Open Settings")
        await fake.wait_for(lambda: len(fake.results) == 1, within=60)
        assert app.health.of(SERIAL) is not None
    caplog.clear()

    # The same host (same data folder) again, its phone still dark.
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(_settings(tmp_path, cloud.port, cloud.pki_dir))
    phone = virtual.server.phones[SERIAL]
    phone.stays_dark = True
    phone.sleep()
    app = build_host(settings, planner=_planner())
    async with serving(app, virtual, cloud) as fake:

        def reports() -> list[types_pb2.Device]:
            said = [*fake.hellos[-1:]]
            updates = [r.device_update for r in fake.received]
            phones = [
                *(d for h in said for d in h.devices),
                *(d for u in updates for d in u.devices),
            ]
            return [d for d in phones if d.serial == SERIAL]

        await fake.wait_for(lambda: bool(reports()))
        first = reports()[0]
        assert first.state == types_pb2.DEVICE_STATE_OFFLINE, first
        assert "did not wake up" in first.reason, first
        await until(lambda: bool(_probes(caplog)), within=30, what="a probe of the phone")
        assert STILL in _probes(caplog)[0], _probes(caplog)

        phone.stays_dark = False

        def back() -> bool:
            info = app.registry.get(SERIAL)
            return info is not None and not info.unhealthy

        await until(back, within=30, what="the mended phone back at work")
        await until(
            lambda: not app.store.unhealthy_phones(timedelta(days=36500)),
            within=10,
            what="the kept mark dropped",
        )
