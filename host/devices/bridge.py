"""Waiting for the phone's accessibility bridge while another UiAutomation client holds it.

Android lets one UiAutomation client connect at a time; every other one dies with
"UiAutomationService … already registered!" (`uiautomator dump`, uiautomator2's server,
Appium, weditor). Most holders are short-lived (another tool's dump, or its session ending),
so both drivers try again for a bounded time before giving up. Neither stops the holder: it
belongs to another program, and uiautomator2 itself does not either (it raises
AccessibilityServiceAlreadyRegisteredError and leaves the other client running).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from host.devices.base import BridgeHeld

T = TypeVar("T")

#: How long a driver keeps trying while another client holds the bridge.
BRIDGE_WAIT_S = 10.0
#: How often it tries meanwhile.
_POLL_S = 0.5


def held(serial: str, what: str) -> BridgeHeld:
    """The error for one try that found the bridge held."""
    return BridgeHeld(
        f"{what} failed on {serial}: another UiAutomation client (a running `uiautomator "
        "dump`, Appium, weditor, a uiautomator2 server another program or host started) "
        "holds the accessibility bridge on this phone"
    )


def retry_while_held(attempt: Callable[[], T], wait_s: float = BRIDGE_WAIT_S) -> T:
    """`attempt()`, tried again while it raises `BridgeHeld`, for `wait_s` at most; then the
    last `BridgeHeld`, saying how long it persisted and what to do."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return attempt()
        except BridgeHeld as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BridgeHeld(
                    f"{exc}, and still did after {wait_s:g} s: stop that tool on the phone "
                    "(amc does not stop another program's client) and the task's next "
                    "attempt can run"
                ) from exc
            time.sleep(min(_POLL_S, left))
