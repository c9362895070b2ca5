"""One look at the phone: screenshot + hierarchy (retried while the screen settles) → Scene."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from PIL import Image

from host.devices.base import DeviceError, DeviceGone, Driver
from host.perception.fusion import fuse_ocr
from host.perception.hierarchy import HierarchyError, parse_scene
from host.perception.ocr import OcrPool
from planner.scene import Scene


class ScreenshotError(DeviceError):
    """The phone's screenshot is not a readable image (truncated, garbage, absurdly large)."""


#: What Pillow raises on a corrupt, truncated or oversized image.
_IMAGE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


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
        retries: int = 3,
        retry_delay_s: float = 0.5,
        ocr_min_confidence: float = 70.0,
    ) -> None:
        self.ocr = ocr
        self.retries = max(1, retries)
        self.retry_delay_s = retry_delay_s
        self.ocr_min_confidence = ocr_min_confidence

    def scene_from_dump(
        self, driver: Driver, size: tuple[int, int], package: str | None
    ) -> tuple[Scene, str]:
        """Dump and parse, retrying empty or malformed dumps, then a `HierarchyError`."""
        last: HierarchyError | None = None
        for attempt in range(self.retries):
            xml = driver.dump_hierarchy()
            try:
                return parse_scene(xml, size, package or None), xml
            except HierarchyError as exc:
                last = exc
                if attempt + 1 < self.retries:
                    time.sleep(self.retry_delay_s)
        raise HierarchyError(
            f"no usable hierarchy from {driver.serial} after {self.retries} tries: {last}"
        )

    def perceive(self, driver: Driver, with_ocr: bool = True) -> Observation:
        t0 = time.perf_counter()
        png = driver.screenshot_png()
        t1 = time.perf_counter()
        size = driver.screen_size()
        try:
            package = driver.current_app()
        except DeviceGone:
            raise
        except DeviceError:
            package = ""
        scene, xml = self.scene_from_dump(driver, size, package)
        t2 = time.perf_counter()
        timings = {"screenshot_s": t1 - t0, "hierarchy_s": t2 - t1}
        if with_ocr and self.ocr is not None:
            try:
                observations = self.ocr.read(png)
            except _IMAGE_ERRORS as exc:
                raise ScreenshotError(
                    f"unreadable screenshot from {driver.serial} ({len(png)} bytes): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            scene = fuse_ocr(scene, observations, self.ocr_min_confidence)
            timings["ocr_s"] = time.perf_counter() - t2
        return Observation(scene=scene, screenshot_png=png, hierarchy_xml=xml, timings=timings)
