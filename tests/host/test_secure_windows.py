"""A window with FLAG_SECURE (a banking app, a password screen) is black in every screenshot
while its dump still shows it: through the real adbutils and uiautomator2 clients against the
virtual phone taught such a window."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from PIL import Image, ImageDraw

from host.devices.adb_driver import AdbDriver
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.perception.hierarchy import parse_scene
from host.perception.perceive import Perceiver
from host.perception.secure_capture import blank_capture
from host.planner_client import DirectPlanner
from host.timeline.record import screen_record
from planner.observation import observation_from_scene, scene_from_observation
from planner.planner import Planner
from planner.providers.offline import OfflineProvider
from planner.scene import Scene

SERIAL = "emulator-5554"
SETTINGS = "com.android.settings"


@pytest.fixture
def adb() -> Iterator[tuple[ThreadedAdbServer, VirtualPhone]]:
    phone = VirtualPhone(SERIAL)
    server = ThreadedAdbServer([phone])
    server.start()
    yield server, phone
    server.stop()


def _look(driver: AdbDriver | U2Driver) -> Scene:
    try:
        driver.launch_app(SETTINGS)
        return Perceiver(None, retry_delay_s=0).perceive(driver, with_ocr=False).scene
    finally:
        if isinstance(driver, U2Driver):
            driver._reset()


@pytest.mark.parametrize("driver", [AdbDriver, U2Driver])
async def test_a_secure_window_is_said_to_forbid_capture_and_the_model_is_told(
    adb: tuple[ThreadedAdbServer, VirtualPhone], driver: type[AdbDriver] | type[U2Driver]
) -> None:
    """The screenshot of a FLAG_SECURE window is black, yet nothing said so: the model was
    shown (or told of) a screen with nothing on it and acted blind. The look now sees the
    tree's texts drawn nowhere, marks the observation, the step's record keeps it, and the
    model reads that the app forbids capture and plans from the UI tree."""
    server, phone = adb
    phone.secure_packages = {SETTINGS}
    scene = _look(driver(SERIAL, port=server.port))
    assert scene.elements and not scene.tree_missing
    assert "forbids screen capture" in scene.screenshot_blank
    assert SETTINGS in scene.screenshot_blank
    observation = observation_from_scene(scene)
    assert observation.screenshot_blank == scene.screenshot_blank
    assert screen_record(scene)["screenshot_blank"] == scene.screenshot_blank
    shown = scene_from_observation(observation).to_prompt()
    assert "rely on the elements" in shown["screenshot"]
    decision = await DirectPlanner(Planner(OfflineProvider())).decide("Turn on Wi-Fi", scene, [])
    assert "forbids screen capture" in decision.user_prompt


@pytest.mark.parametrize("dark", [False, True])
def test_a_screen_that_shows_its_texts_is_not_called_blank(
    adb: tuple[ThreadedAdbServer, VirtualPhone], dark: bool
) -> None:
    """Light and dark themes alike: a drawn text is never taken for a blocked capture."""
    server, phone = adb
    phone.state.settings["dark_theme"] = dark
    scene = _look(AdbDriver(SERIAL, port=server.port))
    assert scene.elements
    assert scene.screenshot_blank == ""
    assert "screenshot" not in scene.to_prompt()


def _png(draw_texts: bool) -> bytes:
    """A pure black screen (an AMOLED theme's, or a blacked-out window) with the app's two
    texts drawn white or not at all, and another app's keyboard drawn at the bottom."""
    image = Image.new("RGB", (540, 1200), (0, 0, 0))
    d = ImageDraw.Draw(image)
    if draw_texts:
        d.text((60, 120), "Balance", fill=(255, 255, 255))
        d.text((60, 320), "Transfer", fill=(255, 255, 255))
    d.rectangle((0, 900, 539, 1199), fill=(230, 230, 230))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _bank_scene() -> Scene:
    def node(text: str, bounds: str, package: str = "com.example.bank") -> str:
        return (
            f'<node index="0" text="{text}" resource-id="" class="android.widget.TextView" '
            f'package="{package}" content-desc="" clickable="false" bounds="{bounds}" />'
        )

    xml = (
        '<hierarchy rotation="0"><node index="0" text="" class="android.widget.FrameLayout" '
        'package="com.example.bank" content-desc="" bounds="[0,0][1080,2400]">'
        + node("Balance", "[100,220][700,320]")
        + node("Transfer", "[100,620][700,720]")
        + "</node></hierarchy>"
    )
    return parse_scene(xml, (1080, 2400), "com.example.bank")


@pytest.mark.parametrize("drawn", [True, False])
def test_only_texts_drawn_nowhere_make_a_blank_capture(drawn: bool) -> None:
    """A pure black theme with its texts drawn is a screen; the same screen with the tree's
    texts drawn nowhere is a blacked-out window, whatever else (a keyboard) is drawn. The
    screenshot is half the screen's size, as `screencap` takes it on some phones."""
    scene = _bank_scene()
    found = blank_capture(_png(drawn), (540, 1200), scene)
    assert bool(found) is not drawn
    if found:
        assert found.startswith(
            "black where the UI tree shows 2 texts and labels of com.example.bank"
        )


@pytest.mark.parametrize("secure", [True, False])
def test_a_secure_window_that_gives_no_tree_either_is_said_to_be_unseen(
    adb: tuple[ThreadedAdbServer, VirtualPhone], secure: bool
) -> None:
    """A DRM video player is secure and never idle: no dump comes back, and the screenshot
    is black. The model was told only that the tree was missing and to tap where the screen
    shows the target, on a screen that shows nothing. The look now says the screenshot is
    black too; a screen that shows something is not called blank."""
    server, phone = adb
    if secure:
        phone.secure_packages = {SETTINGS}
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app(SETTINGS)
    phone.glitch_dumps("idle", 2)
    scene = Perceiver(None, retries=2, retry_delay_s=0).perceive(d, with_ocr=False).scene
    assert scene.tree_missing
    if secure:
        assert "black" in scene.screenshot_blank
        assert "forbids screen capture" in scene.screenshot_blank
        assert "screenshot" in scene.to_prompt()
    else:
        assert scene.screenshot_blank == ""
