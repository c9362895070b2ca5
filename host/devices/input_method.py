"""Which on-screen keyboard (input method) a phone has selected, asked once a minute.

uiautomator2's dump carries no window type, so a keyboard there is known only by its package.
Package-name hints ("inputmethod", "keyboard", "gboard"…) miss many real keyboards (Baidu's
`com.baidu.input_mi`, WeChat's `com.tencent.wetype`, `com.lge.ime`, OpenWnn…); the phone itself
says which one is selected: `settings get secure default_input_method` prints its id,
`package/service` (e.g. `com.baidu.input_mi/.ImeService`), or "null" when none is set.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from host.devices.base import DeviceError, DeviceGone

log = logging.getLogger(__name__)

COMMAND = "settings get secure default_input_method"
#: How long an answer is trusted: people rarely switch keyboards, and a keyboard switched in
#: between only means its window is known by the hints alone until the next read.
REFRESH_S = 60.0
_ID_RE = re.compile(r"^([A-Za-z][\w]*(?:\.[A-Za-z_][\w]*)+)/[\w.$]+$")


def parse_input_method(output: str) -> str:
    """The package of a `default_input_method` id; "" for "null", nothing or anything else
    (a warning, an error text) rather than a guess."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    m = _ID_RE.match(lines[-1]) if lines else None
    return m.group(1) if m else ""


class InputMethodCache:
    """One phone's selected keyboard package, read through `read` (the raw setting output) at
    most once per `refresh_s`. A read that fails is remembered as "" for as long (perception
    then falls back to the package hints; a phone that cannot answer is not asked every step)
    except when the phone is gone: that is raised, as every other call would."""

    def __init__(
        self,
        serial: str,
        read: Callable[[], str],
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._serial = serial
        self._read = read
        self._refresh_s = refresh_s
        self._clock = clock
        self._value = ""
        self._at: float | None = None

    def package(self) -> str:
        now = self._clock()
        if self._at is None or now - self._at >= self._refresh_s:
            try:
                self._value = parse_input_method(self._read())
            except DeviceGone:
                raise
            except DeviceError as exc:
                log.debug("%s: cannot read the selected keyboard: %s", self._serial, exc)
                self._value = ""
            self._at = now
        return self._value

    def forget(self) -> None:
        """Ask again next time (the keyboard was just switched)."""
        self._at = None
