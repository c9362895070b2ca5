"""What real phones do to an agent: dumps that fail while the screen animates, a phone that fell
asleep or shows its lock screen. Perception retries the passing failures with a bound and a
clear final error, wakes and unlocks what needs no credential, and stops on what does.

All on the virtual phone, in-process (`VirtualDriver`) and over the real adb protocol
(`AdbDriver` against `ThreadedAdbServer`), so the driver's reading of `uiautomator dump`'s
errors and of `dumpsys` is exercised too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.devices.adb_driver import AdbDriver
from host.devices.base import DeviceBusy, ScreenLocked, ScreenshotError
from host.devices.screen_state import parse_screen_state
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import DumpGlitch, VirtualPhone
from host.devices.virtual.suite import SUITE, snapshot
from host.perception.hierarchy import HierarchyError
from host.perception.perceive import Perceiver
from host.runner import driver_factory
from host.settings import HostSettings
from planner.planner import make_planner
from planner.settings import PlannerSettings
from tests.host.scripted_planner import ScriptedPlanner, Step, by_text


@pytest.fixture
def served() -> Iterator[tuple[VirtualPhone, AdbDriver]]:
    phone = VirtualPhone("troubled-1")
    with ThreadedAdbServer([phone]) as server:
        yield phone, AdbDriver(phone.serial, port=server.port)


def test_idle_state_errors_are_retried_then_reported_clearly() -> None:
    phone = VirtualPhone("glitchy")
    perceiver = Perceiver(None, retries=4, retry_delay_s=0)
    phone.glitch_dumps("idle", 3)
    assert perceiver.perceive(VirtualDriver(phone), with_ocr=False).scene.elements
    phone.glitch_dumps("idle", 4)
    driver = VirtualDriver(phone)
    with pytest.raises(HierarchyError, match=r"after 4 tries: .*could not get idle state"):
        perceiver.scene_from_dump(driver, driver.screen_size(), None)
    # The look itself goes on without the tree, saying why (the phone answered every try).
    phone.glitch_dumps("idle", 4)
    scene = perceiver.perceive(driver, with_ocr=False).scene
    assert not scene.elements and "could not get idle state" in scene.tree_missing


def test_adb_driver_reads_dump_errors_as_passing(served: tuple[VirtualPhone, AdbDriver]) -> None:
    phone, driver = served
    phone.glitch_dumps("idle")
    with pytest.raises(DeviceBusy, match="could not get idle state"):
        driver.dump_hierarchy()
    phone.glitch_dumps("null_root")
    with pytest.raises(DeviceBusy, match="null root node returned by UiTestAutomationBridge"):
        driver.dump_hierarchy()
    phone.glitch_dumps("idle", 2)
    phone.glitch_dumps("empty", 1)
    scene = Perceiver(None, retries=4, retry_delay_s=0).perceive(driver, with_ocr=False).scene
    assert scene.package == "com.android.launcher3"


async def _run_suite_task(
    name: str, phone_driver: tuple[VirtualPhone, object] | None = None, glitch: DumpGlitch = "idle"
) -> bool:
    task = next(t for t in SUITE if t.name == name)
    phone = phone_driver[0] if phone_driver else task.new_phone("glitchy")
    if phone_driver:
        task.setup(phone)
    driver = phone_driver[1] if phone_driver else VirtualDriver(phone)
    phone.glitch_every(3, glitch)  # a third of all dumps fail, as on an animating screen
    before = snapshot(phone)
    loop = AgentLoop(
        driver,  # type: ignore[arg-type]
        make_planner(PlannerSettings(provider="offline")),
        Perceiver(None, retry_delay_s=0),
        None,
        LoopSettings(max_steps=30, settle_delay_s=0, ocr=False),
    )
    outcome = await loop.run(TaskSpec(f"glitchy-{name}", 1, task.goal, phone.serial))
    return outcome.status == "succeeded" and task.verdict(phone, before).passed


@pytest.mark.parametrize(
    "name",
    [
        "dark_theme_on",
        "create_contact_ada",
        "alarm_after_permission_prompt",
        "delete_contact_in_long_list",
        "calc_multiply",
        "note_save_under_keyboard",
    ],
)
async def test_a_glitchy_phone_finishes_its_tasks(name: str) -> None:
    assert await _run_suite_task(name)


async def test_a_glitchy_phone_over_adb_finishes_its_task(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    assert await _run_suite_task("wifi_off", served)


async def test_a_phone_whose_dumper_aborts_now_and_then_finishes_its_task(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    """A dumper the runtime aborts (the shell prints "Aborted", exit 134) failed the task
    for good at the look it hit ("DeviceError: uiautomator dump failed on …: 'Aborted'"):
    it dies of a signal as one the low-memory killer takes ("Killed") does, and is retried."""
    assert await _run_suite_task("wifi_off", served, glitch="aborted")


def test_a_sleeping_phone_is_woken_and_a_swipe_lock_dismissed(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    phone, driver = served
    phone.sleep()
    assert not phone.awake
    Perceiver(None, retry_delay_s=0).perceive(driver, with_ocr=False)
    assert phone.awake
    phone.set_screen_lock("swipe")
    phone.sleep()
    assert phone.locked
    scene = Perceiver(None, retry_delay_s=0).perceive(driver, with_ocr=False).scene
    assert (phone.awake, phone.locked) == (True, False)
    assert scene.package == "com.android.launcher3"


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
@pytest.mark.parametrize("menu_unlocks", [True, False])
def test_a_swipe_lock_on_a_phone_before_android_8_is_dismissed(
    driver: str, menu_unlocks: bool
) -> None:
    """`wm dismiss-keyguard` came with Android 8 (API 26): on an older phone `wm` printed its
    usage and "Error: unknown command", the lock screen stayed, and every task on the phone
    failed with "still shows its lock screen after dismissing it". Below API 26 the drivers
    now press MENU, then swipe up if the lock screen is still there (on builds where MENU
    does not unlock)."""
    from host.devices.u2_driver import U2Driver

    phone = VirtualPhone("old-1")
    phone.sdk = 25  # Android 7.1
    phone.menu_unlocks = menu_unlocks
    with ThreadedAdbServer([phone]) as server:
        d: AdbDriver | U2Driver
        if driver == "adbutils":
            d = AdbDriver(phone.serial, port=server.port)
        else:
            d = U2Driver(phone.serial, port=server.port)
        try:
            assert "unknown command 'dismiss-keyguard'" in AdbDriver(
                phone.serial, port=server.port
            )._shell("wm dismiss-keyguard 2>&1", "old wm")
            phone.set_screen_lock("swipe")
            phone.sleep()
            scene = Perceiver(None, retry_delay_s=0).perceive(d, with_ocr=False).scene
            assert (phone.awake, phone.locked) == (True, False)
            assert scene.package == "com.android.launcher3"
            phone.set_screen_lock("pin", "2580")  # a credential is still never guessed
            phone.sleep()
            with pytest.raises(ScreenLocked, match="needs a PIN"):
                Perceiver(None, retry_delay_s=0).perceive(d, with_ocr=False)
            assert phone.locked
        finally:
            if isinstance(d, U2Driver):
                d._reset()


@pytest.mark.parametrize("over_adb", [False, True])
def test_a_secure_lock_screen_is_a_clear_failure_never_a_guess(
    served: tuple[VirtualPhone, AdbDriver], over_adb: bool
) -> None:
    phone, adb_driver = served
    phone.set_screen_lock("pin", "2580")
    phone.sleep()
    driver = adb_driver if over_adb else VirtualDriver(phone)
    with pytest.raises(ScreenLocked, match="needs a PIN, pattern or password"):
        Perceiver(None, retry_delay_s=0).perceive(driver, with_ocr=False)
    assert phone.awake and phone.locked  # woken, not unlocked: nothing was typed


async def test_the_agent_loop_fails_a_task_on_a_secure_lock_with_the_reason() -> None:
    """The attempt fails saying to unlock the phone by hand, and ends retryable with the phone
    counted as unreadable (`host.devices.health`): it ended failed for good and the phone
    stayed in work, so every task sent to a phone left locked failed for good the same way,
    while another phone could have run it; now a phone left locked is kept out of work after
    a few attempts until a probe finds it unlocked."""
    phone = VirtualPhone("locked")
    phone.set_screen_lock("pin", "2580")
    phone.sleep()
    loop = AgentLoop(
        VirtualDriver(phone),
        make_planner(PlannerSettings(provider="offline")),
        Perceiver(None, retry_delay_s=0),
        None,
        LoopSettings(max_steps=5, settle_delay_s=0, ocr=False),
    )
    outcome = await loop.run(TaskSpec("locked-1", 1, "Turn on dark theme", phone.serial))
    assert outcome.status == "failed"
    assert "needs a PIN, pattern or password" in outcome.summary
    assert "unlock the phone by hand" in outcome.summary
    assert outcome.retryable
    assert "needs a PIN, pattern or password" in outcome.unreadable
    assert not phone.state.flag("dark_theme")


def test_screen_state_in_each_form_android_prints_it() -> None:
    old = "  mWakefulness=Awake\n    mShowingLockscreen=true mShowingDream=false\n"
    assert parse_screen_state(old).locked
    asleep = "  mWakefulness=Asleep\n"
    assert not parse_screen_state(asleep).awake
    dozing = "  getWakefulnessLocked()=Dozing\n"
    assert not parse_screen_state(dozing).awake
    delegate = (
        "    KeyguardServiceDelegate\n      showing=true\n      showingAndNotOccluded=false\n"
        "      occluded=true\n      secure=true\n"
    )
    assert not parse_screen_state(delegate).locked  # an app shows over the lock screen
    trusted = (
        "    KeyguardServiceDelegate\n      showing=true\n      showingAndNotOccluded=true\n"
        "      secure=true\n      KeyguardStateMonitor\n        mIsShowing=true\n"
        "        mTrusted=true\n"
    )
    state = parse_screen_state(trusted)
    assert state.locked and not state.secure  # a trust agent keeps it open: a swipe will do
    assert parse_screen_state("") == parse_screen_state("nothing about locks here")
    assert parse_screen_state("").awake and not parse_screen_state("").locked


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
def test_a_stuck_phone_fails_its_look_within_the_looks_deadline(driver: str) -> None:
    """A dump that timed out was retried as a passing glitch, five times: each try took the
    driver's whole timeout (30 s), so one look at a phone whose dumps never return held its
    step for 150 s. No try now starts that could not end within the look's deadline (one as
    long as the longest so far): the look fails after the one try that fits, saying why."""
    from host.devices.u2_driver import U2Driver

    phone = VirtualPhone("stuck-1")
    with ThreadedAdbServer([phone]) as server:
        d: AdbDriver | U2Driver
        if driver == "adbutils":
            d = AdbDriver(phone.serial, port=server.port, timeout_s=0.5)
            phone.hang_dumps(600.0, count=5)
        else:
            d = U2Driver(phone.serial, port=server.port, rpc_timeout_s=0.5)
            d.screen_size()  # its server is up: the dump is what hangs
            phone.hang_u2_agent(600.0, calls=5)
        size = d.screen_size()
        # The first try takes the 0.5 s timeout at least: a second could not end by 0.9 s.
        perceiver = Perceiver(None, retries=5, retry_delay_s=0, deadline_s=0.9)
        with pytest.raises(HierarchyError) as raised:
            perceiver.scene_from_dump(d, size, None)
    message = str(raised.value)
    assert "after 1 try" in message and "timed out" in message, message
    assert "0.9 s one look may take" in message, message


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
def test_a_window_that_gives_no_tree_is_not_dumped_again_until_another_is_in_front(
    driver: str,
) -> None:
    """A window whose dumps all fail with the phone's own answer cost every look its bounded
    tries (up to the look's deadline) at every step of the attempt, and the step waited each
    time. The perceiver now remembers the window per phone: the next looks go straight to
    the screenshot (the model still told the tree is missing), and a window of another app
    is dumped again."""
    from host.devices.u2_driver import U2Driver

    phone = VirtualPhone("treeless-1")
    with ThreadedAdbServer([phone]) as server:
        d: AdbDriver | U2Driver
        if driver == "adbutils":
            d = AdbDriver(phone.serial, port=server.port)
        else:
            d = U2Driver(phone.serial, port=server.port)
        try:
            d.launch_app("com.android.settings")
            perceiver = Perceiver(None, retries=3, retry_delay_s=0)
            phone.glitch_every(1, "idle")  # this window never goes idle
            before = phone.dumps_taken
            first = perceiver.perceive(d, with_ocr=False).scene
            assert "after 3 tries" in first.tree_missing and not first.elements
            taken = phone.dumps_taken  # 3, or 9 through uiautomator2 (it retries too)
            assert taken >= before + 3
            again = perceiver.perceive(d, with_ocr=False)
            assert phone.dumps_taken == taken  # not asked again
            assert "stays in front" in again.scene.tree_missing and again.screenshot_png
            assert again.scene.package == "com.android.settings"
            phone.glitch_every(0)
            d.launch_app("com.android.contacts")
            other = perceiver.perceive(d, with_ocr=False).scene
            assert phone.dumps_taken == taken + 1
            assert other.elements and not other.tree_missing
            d.launch_app("com.android.settings")  # back: forgotten when the window changed
            assert perceiver.perceive(d, with_ocr=False).scene.elements
        finally:
            if isinstance(d, U2Driver):
                d._reset()


def test_a_window_without_a_tree_is_asked_again_after_a_few_looks() -> None:
    """Remembered forever while its window stayed in front, a screen that settled (a video
    paused, a dialog closed) never got its tree back: the model planned from screenshots for
    the rest of the attempt. After `TREELESS_LOOKS` looks straight to the screenshot, the next
    look dumps again and, the screen now idle, has its tree."""
    from host.perception.perceive import TREELESS_LOOKS

    phone = VirtualPhone("treeless-2")
    with ThreadedAdbServer([phone]) as server:
        d = AdbDriver(phone.serial, port=server.port)
        d.launch_app("com.android.settings")
        perceiver = Perceiver(None, retries=2, retry_delay_s=0)
        phone.glitch_every(1, "idle")
        assert perceiver.perceive(d, with_ocr=False).scene.tree_missing
        taken = phone.dumps_taken
        phone.glitch_every(0)  # the screen settles; the window stays the same
        for _ in range(TREELESS_LOOKS):
            assert perceiver.perceive(d, with_ocr=False).scene.tree_missing
        assert phone.dumps_taken == taken
        settled = perceiver.perceive(d, with_ocr=False).scene
        assert settled.elements and not settled.tree_missing
        assert phone.dumps_taken == taken + 1


async def test_a_phone_still_booting_ends_its_attempt_retryable(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    """adb lists a phone as soon as its adbd starts, well before a booting phone's (or a
    restarting system_server's) services are up, so the host can be given a task for it
    then. `wm size` answered "cmd: Can't find service: window", read as a screen size that
    cannot be parsed: a plain DeviceError that ended the task failed for good. It is now a busy
    phone: the attempt ends retryable, saying why."""
    phone, driver = served
    phone.system_server_down = True
    loop = AgentLoop(
        driver,
        make_planner(PlannerSettings(provider="offline")),
        Perceiver(None, retry_delay_s=0),
        None,
        LoopSettings(max_steps=3, settle_delay_s=0, ocr=False),
    )
    outcome = await loop.run(TaskSpec("booting", 1, "Turn on dark theme", phone.serial))
    assert (outcome.status, outcome.retryable) == ("failed", True), outcome.summary
    assert "still booting" in outcome.summary


async def test_a_phone_whose_dumper_always_crashes_ends_the_attempt_retryable(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    """A dump no retry mends (a dumper that crashes natively, "Segmentation fault") was a plain
    DeviceError: the attempt ended failed for good ("DeviceError: uiautomator dump failed on
    …"), as if the task could never be done. It is the phone's condition: the attempt ends
    retryable, saying the phone cannot show its screen and why."""
    phone, driver = served
    phone.glitch_every(1, "segfault")
    loop = AgentLoop(
        driver,
        make_planner(PlannerSettings(provider="offline")),
        Perceiver(None, retry_delay_s=0),
        None,
        LoopSettings(max_steps=3, settle_delay_s=0, ocr=False),
    )
    outcome = await loop.run(TaskSpec("segv", 1, "Turn on dark theme", phone.serial))
    assert (outcome.status, outcome.retryable) == ("failed", True), outcome.summary
    assert "cannot show its screen" in outcome.summary
    assert "Segmentation fault" in outcome.summary


def test_input_while_the_system_services_are_down_is_not_reported_done(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    """While system_server is not running (a phone still booting, system_server restarting
    after a crash) `input` prints "cmd: Can't find service: input" and `monkey` "** Error:
    Unable to connect to activity manager…": nothing happens, yet both exit quietly enough
    that every tap, swipe, key, text and launch was reported done (the step's record and the
    model's history said so). Each is now a busy phone, saying why."""
    phone, driver = served
    phone.system_server_down = True
    actions: dict[str, Callable[[], None]] = {
        "tap": lambda: driver.tap(10, 10),
        "swipe": lambda: driver.swipe(500, 1500, 500, 500),
        "press key": lambda: driver.press_key("back"),
        "input text": lambda: driver.input_text("hello"),
        "launch com.android.settings": lambda: driver.launch_app("com.android.settings"),
    }
    for what, act in actions.items():
        with pytest.raises(DeviceBusy, match=f"^{what} failed on .*still booting"):
            act()
    phone.system_server_down = False
    driver.launch_app("com.android.settings")
    assert phone.current_package() == "com.android.settings"


async def test_a_phone_whose_bridge_another_client_keeps_ends_the_attempt_retryable(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    """A phone whose accessibility bridge another tool keeps (Appium, weditor, another
    host's uiautomator2 server) ended the task failed for good, as if the task were at
    fault: after the bounded wait the attempt now ends retryable, naming the holder, so the
    task runs again once the phone (or another) is free."""
    phone, driver = served
    driver.bridge_wait_s = 0
    phone.glitch_every(1, "bridge_taken")
    loop = AgentLoop(
        driver,
        make_planner(PlannerSettings(provider="offline")),
        Perceiver(None, retry_delay_s=0),
        None,
        LoopSettings(max_steps=3, settle_delay_s=0, ocr=False),
    )
    outcome = await loop.run(TaskSpec("held-bridge", 1, "Turn on dark theme", phone.serial))
    assert (outcome.status, outcome.retryable) == ("failed", True)
    assert "another UiAutomation client" in outcome.summary


async def test_a_screen_that_turns_off_while_the_model_thinks_is_woken_before_the_tap(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    """A phone's screen times out (15-30 s on many phones, and a swipe lock comes back) while
    a slow model call decides the step: the tap then went to a dark screen, which drops it,
    and the step (and its model call) was lost, the next look waking the phone on a screen
    unchanged. The screen is now made ready (woken, a swipe lock dismissed) before every
    gesture, so the tap lands in the step that planned it."""
    phone, driver = served
    phone.set_screen_lock("swipe")
    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": "com.android.settings"}),
            Step("tap", by_text("Display"), before=phone.sleep),
            Step("tap", by_text("Dark theme")),
            Step("complete", {"success": True, "reason": "dark theme is on"}),
        ]
    )
    loop = AgentLoop(
        driver,
        planner,
        Perceiver(None, retry_delay_s=0),
        None,
        LoopSettings(max_steps=6, settle_delay_s=0, ocr=False),
    )
    outcome = await loop.run(TaskSpec("dozing", 1, "Turn on dark theme", phone.serial))
    assert outcome.status == "succeeded", outcome.summary
    assert phone.state.settings["dark_theme"] is True
    assert len(planner.seen) == 4


def test_a_dump_over_the_size_a_look_reads_is_no_tree_not_read_whole(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    """A dump file larger than a look reads (a runaway list, a corrupt file) was pulled whole
    into the one host process that drives every phone, then parsed. It is now refused as
    soon as the pull learns its size (busy: the look tries again, then goes on from the
    screenshot with the reason), and the phone takes the next look as before."""
    _, driver = served
    whole = driver.dump_hierarchy()
    driver.dump_max_bytes = len(whole.encode()) // 2
    with pytest.raises(DeviceBusy, match=rf"over the {driver.dump_max_bytes} bytes a look reads"):
        driver.dump_hierarchy()
    scene = Perceiver(None, retries=2, retry_delay_s=0).perceive(driver, with_ocr=False).scene
    assert not scene.elements and "over the" in scene.tree_missing
    driver.dump_max_bytes = len(whole.encode())
    assert driver.dump_hierarchy() == whole


def test_screencap_output_over_the_size_a_look_reads_is_no_screenshot(
    served: tuple[VirtualPhone, AdbDriver],
) -> None:
    """`screencap` output was read whole however much the phone wrote. Past the most a look
    reads it is a `ScreenshotError` naming that size (the request closed), and the next
    screenshot under the size is read as before."""
    _, driver = served
    whole = driver.screenshot_png()
    driver.screenshot_max_bytes = len(whole) // 2
    with pytest.raises(ScreenshotError, match=rf"over the {len(whole) // 2} bytes a look reads"):
        driver.screenshot_png()
    driver.screenshot_max_bytes = len(whole)
    assert driver.screenshot_png() == whole


@pytest.mark.parametrize("word", ["Killed", "Aborted", "Segmentation fault"])
def test_an_input_command_that_dies_of_a_signal_is_no_tap_done(
    served: tuple[VirtualPhone, AdbDriver], word: str
) -> None:
    """`input` is a Java program (app_process) the low-memory killer can take, or whose
    runtime can abort: the shell prints "Killed" (exit 137) and nothing was injected, or no
    one knows what was. The driver read no failure in that output and reported the tap done,
    so the step's record and the model heard of a tap that never happened. Now it is
    unanswered (`DeviceBusy`: whether it took effect is unknown), and the next tap lands."""
    phone, driver = served
    phone.command_deaths["input"] = [word]
    with pytest.raises(DeviceBusy, match=rf"tap .*{word}.*whether it took effect is unknown"):
        driver.tap(100, 200)
    assert phone.taps == []
    driver.tap(100, 200)
    assert phone.taps == [(100, 200)]


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
def test_a_launch_whose_monkey_dies_of_a_signal_is_no_launch_done(driver: str) -> None:
    """`monkey` (the launcher both drivers start apps with) is an app_process too: killed,
    the shell prints "Killed" and no app was started, yet the launch was recorded done.
    Now it is unanswered, and the next launch starts the app."""
    phone = VirtualPhone("troubled-2")
    with ThreadedAdbServer([phone]) as server:
        made = driver_factory(HostSettings(adb_port=server.port, driver=driver))(phone.serial)
        try:
            phone.command_deaths["monkey"] = ["Killed"]
            with pytest.raises(DeviceBusy, match=r"Killed.*whether it took effect is unknown"):
                made.launch_app("com.android.settings")
            assert made.current_app() != "com.android.settings"
            made.launch_app("com.android.settings")
            assert made.current_app() == "com.android.settings"
        finally:
            if isinstance(made, U2Driver):
                made._reset()
