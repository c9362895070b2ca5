"""The one small interface every phone driver implements.

Drivers are synchronous (adbutils and uiautomator2 are); the agent loop runs each call in a
worker thread so one host drives several phones at once without blocking its event loop.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

# "delete" is backspace (KEYCODE_DEL): it erases the character before the cursor.
KeyName = Literal["back", "home", "enter", "delete"]


class DeviceError(Exception):
    """A driver call failed but the phone is still there (bad dump, command error)."""


class DeviceGone(DeviceError):
    """The phone disconnected. The task on it fails; the phone is reported offline."""


@runtime_checkable
class Driver(Protocol):
    """Everything the agent loop does to a phone."""

    @property
    def serial(self) -> str: ...

    def screen_size(self) -> tuple[int, int]:
        """Physical (width, height) in pixels."""
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
