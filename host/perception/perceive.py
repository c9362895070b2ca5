"""One look at the phone: a ready screen, a screenshot, a hierarchy (retried while the screen
settles) → Scene.

Real phones glitch: `uiautomator dump` says "could not get idle state" while something animates
or returns an empty tree while a window changes. Those are retried a bounded number of times
with a growing pause. When the phone answered every try with such a failure, the window gives no
tree at all (a secure window, a screen that never goes idle): the look goes on without one
(`NoUiTree`, `Scene.tree_missing`). When tries went unanswered (a stuck phone), the look fails
with the last reason. A phone that fell asleep is woken; a
swipe lock screen is dismissed; a lock screen that needs a credential ends the attempt (retryable,
counted against the phone) with a `ScreenLocked` error a person can act on (amc never guesses a
PIN).
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass, field, replace

from PIL import Image

from host import metrics
from host.devices.adb_errors import is_timeout
from host.devices.base import (
    DeviceBusy,
    DeviceError,
    DeviceGone,
    Driver,
    ScreenControl,
    ScreenLocked,
    ScreenshotError,
    ScreenUnavailable,
    WindowInfo,
)
from host.perception.fusion import fuse_ocr, same_aspect, to_screen_space
from host.perception.hierarchy import HierarchyError, ScreenTurned, parse_scene
from host.perception.ocr import OcrPool
from host.perception.secure_capture import blank_capture
from planner.image_read import IMAGE_ERRORS
from planner.scene import Scene

log = logging.getLogger(__name__)


class NoUiTree(HierarchyError):
    """Every dump of a look failed, each with the phone's own answer (uiautomator's "could not
    get idle state", a null root, an empty or broken tree), none by going unanswered: the
    window gives no tree (a secure window, a screen that never goes idle), on any phone and at
    any attempt. The look goes on without one (`Perceiver.perceive`)."""


def _tries(n: int) -> str:
    return "1 try" if n == 1 else f"{n} tries"


#: Looks that go straight to the screenshot after a window gave no UI tree, before the next
#: look asks it for one again (an unchanged screen then pays the bounded tries every
#: `TREELESS_LOOKS + 1` steps instead of every step).
TREELESS_LOOKS = 3


@dataclass(slots=True)
class Observation:
    """What one perception produced, with its timings (seconds) for the timeline."""

    scene: Scene
    screenshot_png: bytes
    hierarchy_xml: str
    timings: dict[str, float] = field(default_factory=dict)


class Perceiver:
    """Builds Scenes from a driver. Synchronous: the agent loop runs it in a worker thread."""

    def __init__(
        self,
        ocr: OcrPool | None = None,
        retries: int = 5,
        retry_delay_s: float = 0.5,
        ocr_min_confidence: float = 70.0,
        deadline_s: float = 45.0,
    ) -> None:
        self.ocr = ocr
        self.retries = max(1, retries)
        self.retry_delay_s = retry_delay_s
        self.ocr_min_confidence = ocr_min_confidence
        #: How long one look's dump tries may take together (see `scene_from_dump`).
        self.deadline_s = deadline_s
        #: Per phone, the window (`package/activity`) whose look gave no UI tree, why, and how
        #: many more looks may skip the dump: the next looks at it go straight to the
        #: screenshot instead of paying the bounded tries again at every step. Forgotten once
        #: another window is in front, and after `TREELESS_LOOKS` looks, so a screen of the
        #: same window that settled (a video paused, a secure dialog closed) gets its tree back.
        self._treeless: dict[str, tuple[str, str, int]] = {}

    def scene_from_dump(
        self,
        driver: Driver,
        size: tuple[int, int],
        package: str | None,
        ime_package: str = "",
    ) -> tuple[Scene, str]:
        """Dump and parse, retrying passing glitches (`DeviceBusy`: an idle-state error, a null
        root, a timeout; `HierarchyError`: an empty or malformed dump) up to `retries` times
        with a growing pause, then a `HierarchyError` naming the tries and the last reason.

        The tries together stay within `deadline_s`: another starts only when one as long as
        the longest so far would still end inside it. A dump that timed out took the driver's
        whole timeout (30 s) and the next most likely does too; five of them held a step on a
        stuck phone for 150 s."""
        start = time.monotonic()
        longest = 0.0
        last: DeviceError | None = None
        # Whether every try failed with an answer of the phone's (`NoUiTree`), none by
        # timing out (a stuck phone: a plain `HierarchyError`).
        answered = True
        for tries in range(1, self.retries + 1):
            began = time.monotonic()
            try:
                xml = driver.dump_hierarchy()
                return parse_scene(xml, size, package or None, ime_package), xml
            except ScreenTurned:
                raise  # another dump with the same size would not help (`perceive`)
            except (HierarchyError, DeviceBusy) as exc:
                metrics.device_error(exc)
                last = exc
                answered = answered and not is_timeout(exc.__cause__ or exc)
            now = time.monotonic()
            longest = max(longest, now - began)
            if tries == self.retries:
                break
            pause = self.retry_delay_s * tries
            if now + pause + longest - start > self.deadline_s:
                raise (NoUiTree if answered else HierarchyError)(
                    f"no usable hierarchy from {driver.serial} after {_tries(tries)} in "
                    f"{now - start:.0f} s (another could not end within the "
                    f"{self.deadline_s:g} s one look may take): {last}"
                )
            time.sleep(pause)
        raise (NoUiTree if answered else HierarchyError)(
            f"no usable hierarchy from {driver.serial} after {_tries(self.retries)}: {last}"
        )

    @staticmethod
    def keyboard_package(driver: Driver) -> str:
        """The phone's selected keyboard, or "" (the package hints then decide alone) when
        reading it fails in any way but the phone being gone: a keyboard setting is never
        worth a failed look at the screen."""
        try:
            return driver.keyboard_package()
        except DeviceGone:
            raise
        except Exception as exc:
            log.debug("%s: no keyboard package: %s", driver.serial, exc)
            return ""

    @staticmethod
    def ready_screen(driver: Driver) -> None:
        """Wake a sleeping phone and dismiss a lock screen that needs no credential; refuse one
        that does (`ScreenLocked`). Drivers without `ScreenControl` are taken as they are."""
        if not isinstance(driver, ScreenControl):
            return
        state = driver.screen_state()
        if not state.awake:
            driver.wake()
            state = driver.screen_state()
            if not state.awake:
                raise ScreenUnavailable(
                    f"phone {driver.serial} did not wake up: its display stayed off after the "
                    "wake-up key (a broken display or backlight, a covered proximity sensor)"
                )
        if not state.locked:
            return
        if state.secure:
            raise ScreenLocked(
                f"phone {driver.serial} shows a lock screen that needs a PIN, pattern or "
                "password; amc does not unlock it: unlock the phone by hand (or remove its "
                "screen lock) and run the task again"
            )
        driver.dismiss_keyguard()
        state = driver.screen_state()
        if state.locked:
            raise ScreenLocked(
                f"phone {driver.serial} still shows its lock screen after dismissing it"
            )

    @staticmethod
    def image_size(serial: str, png: bytes) -> tuple[int, int]:
        """The screenshot's pixel size, once its header and chunks check out (no decoding):
        noise framed as an image passed every look unread without OCR, reached the timeline
        and the model as a screenshot, and the task went on blind."""
        try:
            with Image.open(io.BytesIO(png)) as image:
                size = image.size
                image.verify()
        except IMAGE_ERRORS as exc:
            raise ScreenshotError(
                f"unreadable screenshot from {serial} ({len(png)} bytes): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return size

    def probe(self, driver: Driver, act: bool = False) -> None:
        """Whether an unhealthy phone (`host.devices.health`) can be read again: the look an
        attempt takes (waking it, a screenshot that decodes, a dump that parses), without OCR,
        or the error that stopped it. The whole look, not the step that failed: what failed
        cannot be told from the error's class (a `ScreenUnavailable` comes from a display that
        stays off, a screenshot that is no image, and a dumper that crashes; a `DeviceBusy`
        from any call that timed out), and a probe of one dump put a phone whose display or
        screenshots had failed back to work, to fail its next attempts the same way. `act`:
        the phone's actions went unanswered (`host.devices.health.Part`), which a look does
        not try, so a key press follows it through the path taps take (`input`): the wake-up
        key, which changes nothing on the awake phone a look leaves. A look without a UI tree
        passed the probe (an attempt goes on from the screenshot alone, `NoUiTree`), and a
        window remembered as tree-less was not even dumped: a phone whose dumper fails was put
        back to work on the word of its screenshot. The probe dumps, and wants the tree.

        A window that never gives one (a game, a Flutter app, a video that never lets the
        screen idle) kept the phone out for good while it stayed in front, and nothing moved
        it: the probe presses HOME (once the phone is awake and unlocked) before its look, so
        it judges the phone's dumper on the launcher, not the app the last attempt left."""
        self._treeless.pop(driver.serial, None)
        self.ready_screen(driver)
        driver.press_key("home")
        seen = self.perceive(driver, with_ocr=False)
        if seen.scene.tree_missing:
            raise ScreenUnavailable(
                f"phone {driver.serial} gives no UI tree, on its home screen too: "
                f"{seen.scene.tree_missing}"
            )
        if act and isinstance(driver, ScreenControl):
            driver.wake()

    def perceive(self, driver: Driver, with_ocr: bool = True) -> Observation:
        self.ready_screen(driver)
        t0 = time.perf_counter()
        png = driver.screenshot_png()
        image_size = self.image_size(driver.serial, png)
        t1 = time.perf_counter()
        size = driver.screen_size()
        window = ""
        try:
            if isinstance(driver, WindowInfo):
                window = driver.current_window()
                package = window.partition("/")[0]
            else:
                package = driver.current_app()
        except DeviceGone:
            raise
        except DeviceError:
            package = ""
        known = self._treeless.get(driver.serial)
        if known is not None and window and known[0] == window and known[2] > 0:
            self._treeless[driver.serial] = (known[0], known[1], known[2] - 1)
            scene, xml = Scene([], package, "", *size, tree_missing=known[1]), ""
        else:
            self._treeless.pop(driver.serial, None)
            try:
                ime = self.keyboard_package(driver)
                try:
                    scene, xml = self.scene_from_dump(driver, size, package, ime)
                except ScreenTurned as turned:
                    # The size and the screenshot are of the orientation before the turn: both
                    # are taken again, and the dump (the newest read) is laid out at the new
                    # size instead of being clipped to the old one. A second turn within the
                    # look fails it (a HierarchyError: the attempt ends retryable).
                    log.info("%s: %s; reading the size and the screenshot again", driver.serial,
                             turned)  # fmt: skip
                    size = driver.screen_size()
                    png = driver.screenshot_png()
                    image_size = self.image_size(driver.serial, png)
                    xml = turned.xml
                    scene = parse_scene(xml, size, package or None, ime)
            except NoUiTree as exc:
                # Ending the attempt (retryable) spent every attempt the task had on the same
                # window, on any phone: the step goes on from the screenshot (and its OCR
                # text), the model told that the tree is missing, and may still reach the
                # goal or say why it cannot.
                log.warning("%s: going on without a UI tree: %s", driver.serial, exc)
                why = str(exc)
                scene, xml = Scene([], package, "", *size, tree_missing=why), ""
                if window:
                    self._treeless[driver.serial] = (
                        window,
                        f"{why}; not asked again for {TREELESS_LOOKS} looks"
                        f" while {window} stays in front",
                        TREELESS_LOOKS,
                    )
        if window.startswith(f"{scene.package}/"):
            # The app's own activity (a settings page's SubSettings says more than the package);
            # not a covering window's, whose package the scene names instead.
            scene = replace(scene, activity=window)
        if scene.elements or scene.tree_missing:
            try:
                blank = blank_capture(png, image_size, scene)
            except IMAGE_ERRORS as exc:
                raise ScreenshotError(
                    f"unreadable screenshot from {driver.serial} ({len(png)} bytes): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if blank:
                log.info("%s: the screenshot is blank: %s", driver.serial, blank)
                scene = replace(scene, screenshot_blank=blank)
        t2 = time.perf_counter()
        timings = {"screenshot_s": t1 - t0, "hierarchy_s": t2 - t1}
        if with_ocr and self.ocr is not None:
            try:
                # A screenshot turned against the dump (a rotation the two saw at different
                # moments, a build that captures unrotated): its boxes would land elsewhere,
                # so it is not read at all.
                placed = (
                    to_screen_space(self.ocr.read(png), image_size, size)
                    if same_aspect(image_size, size)
                    else None
                )
            except IMAGE_ERRORS as exc:
                raise ScreenshotError(
                    f"unreadable screenshot from {driver.serial} ({len(png)} bytes): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if placed is None:
                log.warning(
                    "%s: screenshot is %dx%d but the screen is %dx%d (another aspect ratio); "
                    "OCR text left out of this look",
                    driver.serial,
                    *image_size,
                    *size,
                )
            else:
                scene = fuse_ocr(scene, placed, self.ocr_min_confidence)
            timings["ocr_s"] = time.perf_counter() - t2
        return Observation(scene=scene, screenshot_png=png, hierarchy_xml=xml, timings=timings)
