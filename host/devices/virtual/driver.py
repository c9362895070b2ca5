"""`Driver` over a VirtualPhone in the same process: no sockets, the fastest way to run tasks.

It behaves like the adb drivers where it matters to the agent loop: an unplugged phone raises
`DeviceGone`, and unknown apps or keys raise `DeviceError`.
"""

from __future__ import annotations

from host.devices.base import DeviceBusy, DeviceError, DeviceGone, KeyName, ScreenState
from host.devices.input_method import parse_input_method
from host.devices.virtual.phone import (
    BridgeTaken,
    DumpCrashed,
    DumpKilled,
    IdleStateError,
    NoWindowsError,
    NullRootError,
    VirtualPhone,
)

_KEYS: dict[str, str] = {
    "back": "KEYCODE_BACK",
    "home": "KEYCODE_HOME",
    "enter": "KEYCODE_ENTER",
    "delete": "KEYCODE_DEL",
}


class VirtualDriver:
    """Drives one `VirtualPhone` directly."""

    def __init__(self, phone: VirtualPhone) -> None:
        self._phone = phone

    @property
    def phone(self) -> VirtualPhone:
        return self._phone

    @property
    def serial(self) -> str:
        return self._phone.serial

    def _check(self) -> VirtualPhone:
        if not self._phone.online:
            raise DeviceGone(f"virtual phone {self._phone.serial} is unplugged")
        return self._phone

    def screen_size(self) -> tuple[int, int]:
        phone = self._check()
        return phone.width, phone.height

    def screenshot_png(self) -> bytes:
        return self._check().screenshot_png()

    def dump_hierarchy(self) -> str:
        """Every window, as the adb driver's `uiautomator dump --windows` gets them."""
        try:
            return self._check().dump_windows()
        except (IdleStateError, NullRootError, NoWindowsError, DumpKilled, DumpCrashed) as exc:
            raise DeviceBusy(f"uiautomator dump failed on {self.serial}: {exc}") from exc
        except BridgeTaken as exc:
            raise DeviceError(f"uiautomator dump failed on {self.serial}: {exc}") from exc

    def screen_state(self) -> ScreenState:
        phone = self._check()
        return ScreenState(
            awake=phone.awake,
            locked=phone.locked,
            secure=phone.locked and phone.screen_lock == "pin",
        )

    def wake(self) -> None:
        self._check().wake()

    def dismiss_keyguard(self) -> None:
        self._check().dismiss_keyguard()

    def tap(self, x: int, y: int) -> None:
        self._check().tap(int(x), int(y))

    def long_press(self, x: int, y: int, duration_ms: int = 800) -> None:
        self._check().swipe(int(x), int(y), int(x), int(y), int(duration_ms))

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        self._check().swipe(int(x1), int(y1), int(x2), int(y2), int(duration_ms))

    def input_text(self, text: str) -> None:
        self._check().input_text(text)

    def press_key(self, key: KeyName) -> None:
        code = _KEYS.get(key)
        if code is None:
            raise DeviceError(f"unknown key {key!r}")
        self._check().press_key(code)

    def launch_app(self, package: str) -> None:
        if not self._check().launch(package):
            raise DeviceError(f"cannot launch {package} on {self.serial}: no such app")

    def terminate_app(self, package: str) -> None:
        self._check().force_stop(package)

    def current_app(self) -> str:
        return self._check().current_package()

    def keyboard_package(self) -> str:
        return parse_input_method(self._check().input_method)
