"""The screen's size in its current rotation, read the same way by both drivers.

`wm size` gives the natural (portrait) size, `dumpsys display` the rotation. adbutils'
`window_size()` (what uiautomator2 answers with) takes the first `orientation=` in
`dumpsys display` and fails ("rotation get failed", openatx/adbutils#22) on builds whose dump
names none; here `dumpsys input`'s `SurfaceOrientation` is asked next, then upright is taken
with one warning. A build without `wm` is measured by the default display's viewport in
`dumpsys display`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from host.devices.adb_errors import services_down
from host.devices.base import DeviceError

log = logging.getLogger(__name__)

_SIZE_RE = re.compile(r"(Override|Physical) size:\s*(\d+)x(\d+)")
# The default display's viewport in `dumpsys display` (its `orientation=` is the surface
# rotation, 0-3); any `orientation=N` when no viewport names display 0 (what adbutils reads).
_ROTATION_RES = (
    re.compile(r"DisplayViewport\{[^}]*?displayId=0\b[^}]*?\borientation=([0-3])\b"),
    re.compile(r"\borientation=([0-3])\b"),
)
_SURFACE_ORIENTATION_RE = re.compile(r"SurfaceOrientation:\s*([0-3])\b")
# The default display's logical area in its current rotation (the size `wm size` overrides).
_VIEWPORT_SIZE_RE = re.compile(
    r"DisplayViewport\{[^}]*?displayId=0\b[^}]*?\blogicalFrame=Rect\(0, 0 - (\d+), (\d+)\)"
)
# Between `wm size`'s and `dumpsys display`'s output in `SIZE_COMMAND`'s one shell call.
_SIZE_SPLIT = "--amc-wm-size-end--"
SIZE_COMMAND = f"wm size; echo {_SIZE_SPLIT}; dumpsys display"

#: Runs one shell command on the phone (the command, what it is for) and returns its output.
Shell = Callable[[str, str], str]


def parse_wm_size(output: str) -> tuple[int, int]:
    """`wm size` output → (width, height); the override size wins over the physical size."""
    sizes = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in _SIZE_RE.finditer(output)}
    size = sizes.get("Override") or sizes.get("Physical")
    if size is None:
        raise DeviceError(f"cannot read screen size from {output!r}")
    return size


def parse_viewport_size(dumpsys_display: str) -> tuple[int, int] | None:
    """The default display's size in its current rotation from `dumpsys display` (its
    viewport's logical frame); None when it names none."""
    m = _VIEWPORT_SIZE_RE.search(dumpsys_display)
    size = (int(m.group(1)), int(m.group(2))) if m else None
    return size if size is not None and min(size) > 0 else None


def parse_rotation(dumpsys_display: str) -> int | None:
    """The default display's rotation (0-3 quarter turns; 1 and 3 are landscape) from
    `dumpsys display`; None when it does not say."""
    for pattern in _ROTATION_RES:
        m = pattern.search(dumpsys_display)
        if m:
            return int(m.group(1))
    return None


def parse_surface_orientation(dumpsys_input: str) -> int | None:
    """The rotation from `dumpsys input` ("SurfaceOrientation: 1"), the older source; None
    when it does not say."""
    m = _SURFACE_ORIENTATION_RE.search(dumpsys_input)
    return int(m.group(1)) if m else None


def current_size(natural: tuple[int, int], rotation: int) -> tuple[int, int]:
    """The screen size in the current rotation: `wm size` always gives the natural one."""
    width, height = natural
    return (height, width) if rotation % 2 else (width, height)


class ScreenSizeReader:
    """Reads one phone's size in its current rotation (see `read`), remembering what it last
    saw so that a change of resolution and an unknown rotation are each logged once."""

    def __init__(self, serial: str) -> None:
        self._serial = serial
        self._natural: tuple[int, int] | None = None
        self._rotation_unknown = False
        self._no_wm_said = False

    def read(self, shell: Shell) -> tuple[int, int]:
        """The natural size from `wm size` swapped while the phone is in landscape.

        Both are asked every time, in one shell round trip: a phone turns whenever its user
        or an app wants, and its resolution can change while the host runs (a maker's
        resolution setting, `wm size WxH` or `wm size reset`). `wm size` is a cheap binder
        call next to the dump each look makes, and no cheaper sign catches every change: the
        dump's bounds only show a screen that grew, and the screenshot's pixel size differs
        from the dump's for good before Android 12 (physical vs override size)."""
        wm_size, _, display = shell(SIZE_COMMAND, "wm size").partition(_SIZE_SPLIT)
        down = services_down(self._serial, "wm size", wm_size)
        if down is not None:
            raise down
        try:
            natural = parse_wm_size(wm_size)
        except DeviceError:
            return self._without_wm(wm_size, display)
        if self._natural is not None and natural != self._natural:
            log.info(
                "%s: screen size changed from %dx%d to %dx%d",
                self._serial,
                *self._natural,
                *natural,
            )
        self._natural = natural
        rotation = parse_rotation(display)
        if rotation is None:
            rotation = parse_surface_orientation(shell("dumpsys input", "dumpsys input"))
        if rotation is None:
            # A phone that says neither is taken as upright: a landscape screen then loses
            # what lies past the natural width; said once.
            if not self._rotation_unknown:
                log.warning(
                    "%s: neither 'dumpsys display' nor 'dumpsys input' says the rotation; "
                    "taking the screen as upright",
                    self._serial,
                )
                self._rotation_unknown = True
            rotation = 0
        return current_size(natural, rotation)

    def _without_wm(self, wm_size: str, display: str) -> tuple[int, int]:
        """The size on a phone whose `wm size` gives none (a build that ships no `wm`:
        "/system/bin/sh: wm: not found"): the default display's viewport in `dumpsys
        display`, already in the current rotation; said once. Else an error saying what both
        commands printed."""
        size = parse_viewport_size(display)
        if size is None:
            raise DeviceError(
                f"cannot read the screen size of {self._serial}: 'wm size' printed "
                f"{wm_size.strip()[:200]!r} and 'dumpsys display' names no viewport of the "
                f"default display ({display.strip()[:200]!r})"
            )
        if not self._no_wm_said:
            log.warning(
                "%s: 'wm size' gave no size (%r); the size is read from 'dumpsys display'",
                self._serial,
                wm_size.strip()[:200],
            )
            self._no_wm_said = True
        return size
