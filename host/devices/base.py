"""The one small interface every phone driver implements.

Drivers are synchronous (adbutils and uiautomator2 are); the agent loop runs each call in a
worker thread of the phone's own (`host.devices.lanes`), so one host drives several phones at
once without blocking its event loop, and a stuck phone holds only its own thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

# "delete" is backspace (KEYCODE_DEL): it erases the character before the cursor.
KeyName = Literal["back", "home", "enter", "delete"]


class DeviceError(Exception):
    """A driver call failed but the phone is still there (bad dump, command error)."""


class DeviceGone(DeviceError):
    """The phone disconnected, or adb lists it in a state no command gets through (`state`).
    The task on it fails (retryable); the phone is reported as adb lists it."""

    def __init__(self, message: str, state: str = "") -> None:
        super().__init__(message)
        #: What adb still lists the phone as ("unauthorized", "offline"): each needs its own
        #: fix from the operator, which the message says; "" when adb does not list it.
        self.state = state


class DeviceBusy(DeviceError):
    """The phone answered with a passing glitch: `uiautomator dump` printing "ERROR: could not
    get idle state." while the screen animates, or "ERROR: null root node returned by
    UiTestAutomationBridge." while a window changes. The same call a moment later usually works,
    so readers retry it (a bounded number of times)."""


class ScreenUnavailable(DeviceError):
    """The phone answers, but its screen cannot be seen: its display stays off after a wake,
    its screenshots are no readable image, or a lock screen needs a credential (`ScreenLocked`).
    A condition of the phone, not of the task: the attempt ends retryable, and another phone
    (or this one, mended) can run the task."""


class BridgeHeld(ScreenUnavailable):
    """Another UiAutomation client holds the phone's accessibility bridge, so its screen
    cannot be read (`host.devices.bridge`). Usually passing, so drivers wait a bounded time
    first; then the attempt ends retryable, as for any screen the phone cannot show."""


class ScreenshotError(ScreenUnavailable):
    """The phone's screenshot is not a readable image (empty, truncated, garbage, absurdly
    large)."""


class ScreenLocked(ScreenUnavailable):
    """The phone shows a lock screen amc must not pass: one that needs a PIN, pattern or
    password. A person has to unlock it (or remove the lock); amc never guesses a credential.
    The phone's condition, not the task's: the attempt ends retryable (another phone can run
    it), and a phone left locked is kept out of work until a probe finds it unlocked."""


@dataclass(frozen=True, slots=True)
class ScreenState:
    """Whether the display is on and whether a lock screen (keyguard) is in the way."""

    awake: bool
    locked: bool
    #: Unlocking needs a credential (PIN, pattern, password, SIM PIN); False for a swipe lock
    #: or one a trust agent keeps open.
    secure: bool = False


@runtime_checkable
class ScreenControl(Protocol):
    """What a driver offers to get a sleeping or swipe-locked phone ready for a task."""

    def screen_state(self) -> ScreenState: ...

    def wake(self) -> None:
        """Turn the display on (KEYCODE_WAKEUP: a no-op when it is already on)."""
        ...

    def dismiss_keyguard(self) -> None:
        """Dismiss a lock screen that needs no credential (`wm dismiss-keyguard`; before
        Android 8, which lacks it, MENU and then a swipe up)."""
        ...


@runtime_checkable
class WindowInfo(Protocol):
    """What a driver offers to tell one window from another (`Perceiver` remembers a window
    that gives no UI tree, and asks again only once another is in front)."""

    def current_window(self) -> str:
        """The focused window as `package/activity` (the package alone, or "", when the phone
        does not say)."""
        ...


@runtime_checkable
class Driver(Protocol):
    """Everything the agent loop does to a phone."""

    @property
    def serial(self) -> str: ...

    def screen_size(self) -> tuple[int, int]:
        """(width, height) in pixels in the current rotation: the coordinate space of the
        hierarchy dump and of `tap`/`swipe` (swapped from the natural size in landscape)."""
        ...

    def screenshot_png(self) -> bytes: ...

    def dump_hierarchy(self) -> str:
        """The uiautomator hierarchy XML of the current screen."""
        ...

    def tap(self, x: int, y: int) -> None: ...

    def long_press(self, x: int, y: int, duration_ms: int = 800) -> None: ...

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None: ...

    def input_text(self, text: str) -> None:
        """Type into the focused field."""
        ...

    def press_key(self, key: KeyName) -> None: ...

    def launch_app(self, package: str) -> None: ...

    def terminate_app(self, package: str) -> None: ...

    def current_app(self) -> str:
        """Package name of the foreground app."""
        ...

    def keyboard_package(self) -> str:
        """Package of the selected on-screen keyboard (input method), "" when unknown: its
        window is the keyboard even when no package hint says so and the dump has no window
        types (uiautomator2's). May be a minute old."""
        ...
