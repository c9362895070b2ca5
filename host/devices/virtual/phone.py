"""A simulated Android phone: apps with back stacks, touch and key input, screen and dump.

The phone is plain, synchronous and thread-safe (one lock): the adb server calls it from worker
threads, the in-process driver from the agent's threads, and tests set it up directly.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Literal, Protocol

from PIL import Image

from host.devices.virtual import hierarchy, render
from host.devices.virtual.apps.base import App
from host.devices.virtual.apps.calculator import CalculatorApp
from host.devices.virtual.apps.clock import ClockApp
from host.devices.virtual.apps.contacts import ContactsApp
from host.devices.virtual.apps.launcher import LAUNCHER_PACKAGE, Launcher
from host.devices.virtual.apps.settings import SettingsApp
from host.devices.virtual.files import VirtualFs
from host.devices.virtual.keys import KEYCODES, typed_char
from host.devices.virtual.layout import Node, finalize, hit_test, scroller_at
from host.devices.virtual.state import Page, PhoneState
from host.devices.virtual.widgets import NAV_BAR_H, STATUS_BAR_H, Geometry, window

LONG_PRESS_MS = 500
FONT_SCALES = {"Small": 0.85, "Default": 1.0, "Large": 1.15, "Largest": 1.3}


DumpGlitch = Literal["empty", "idle"]


class IdleStateError(Exception):
    """The hierarchy could not be dumped because the screen never settled."""


class TcpService(Protocol):
    """A server running on the phone (such as the uiautomator2 agent), reached over `tcp:PORT`."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None: ...


TOUCH_SLOP = 24


class VirtualPhone:
    """One phone. `state` holds everything a task checker looks at."""

    def __init__(
        self, serial: str, width: int = 1080, height: int = 2400, model: str = "amc virtual phone"
    ) -> None:
        self._serial = serial
        self.width = width
        self.height = height
        self.model = model
        self.sdk = 34
        self.release = "14"
        self.state = PhoneState()
        self.files = VirtualFs()
        self._lock = threading.RLock()
        self._online = True
        self._gone = threading.Event()
        self._listeners: list[Callable[[VirtualPhone], None]] = []
        apps: list[App] = [SettingsApp(model), ContactsApp(), ClockApp(), CalculatorApp()]
        self.apps: dict[str, App] = {app.package: app for app in apps}
        self.launcher = Launcher(apps)
        self.apps[LAUNCHER_PACKAGE] = self.launcher
        self._stacks: dict[str, list[Page]] = {LAUNCHER_PACKAGE: [self.launcher.root()]}
        self._foreground = LAUNCHER_PACKAGE
        # System plumbing that task checkers never look at:
        self.tcp_services: dict[int, TcpService] = {}  # on-device servers, reached via tcp:PORT
        self.installed: set[str] = set()  # packages installed at run time (e.g. an IME)
        self.extra_settings: dict[str, str] = {}  # "namespace/key" -> value for `settings`
        self.clipboard = ""
        self._dump_glitches: list[DumpGlitch] = []

    # --- identity and connection -------------------------------------------------------------

    @property
    def serial(self) -> str:
        return self._serial

    @property
    def online(self) -> bool:
        return self._online

    def unplug(self) -> None:
        """Pull the cable: adb loses the phone and open connections to it drop."""
        self._set_online(False)

    def replug(self) -> None:
        """Plug the cable back in: the phone reappears to adb (with a new transport id)."""
        self._set_online(True)

    def _set_online(self, online: bool) -> None:
        with self._lock:
            if self._online == online:
                return
            self._online = online
            if online:
                self._gone.clear()
            else:
                self._gone.set()
            listeners = list(self._listeners)
        for listener in listeners:
            listener(self)

    def add_cable_listener(self, listener: Callable[[VirtualPhone], None]) -> None:
        """Call `listener(phone)` whenever the phone is unplugged or plugged back in."""
        with self._lock:
            self._listeners.append(listener)

    def remove_cable_listener(self, listener: Callable[[VirtualPhone], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def wait_unplugged(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking early (True) if the phone is unplugged."""
        return self._gone.wait(timeout)

    def reset(self) -> None:
        """Factory state: default settings, no user data, every app closed, home screen shown."""
        with self._lock:
            self.state = PhoneState()
            self._stacks = {LAUNCHER_PACKAGE: [self.launcher.root()]}
            self._foreground = LAUNCHER_PACKAGE

    # --- what is on screen -------------------------------------------------------------------

    @property
    def geometry(self) -> Geometry:
        return Geometry(self.width, self.height)

    def current_package(self) -> str:
        with self._lock:
            return self._foreground

    def current_page(self) -> Page:
        with self._lock:
            return self._stacks[self._foreground][-1]

    def current_activity(self) -> str:
        """Full activity class of the foreground page, as `dumpsys window` names it."""
        with self._lock:
            return self.apps[self._foreground].activity_for(self.current_page())

    def page_stack(self, package: str | None = None) -> list[str]:
        """Page names on an app's back stack (foreground app by default), bottom first."""
        with self._lock:
            return [p.name for p in self._stacks.get(package or self._foreground, [])]

    def screen(self) -> Node:
        """Lay out the current screen: the one tree both the screenshot and the dump come from."""
        with self._lock:
            app = self.apps[self._foreground]
            nodes = app.build(self, self.current_page(), self.geometry)
            return finalize(window(self.geometry, nodes))

    def screenshot(self) -> Image.Image:
        with self._lock:
            root = self.screen()
            return render.render(
                root,
                self.width,
                self.height,
                dark=self.state.flag("dark_theme"),
                clock="12:30",
                battery=self.state.battery_level,
                text_scale=FONT_SCALES.get(str(self.state.settings.get("font_size")), 1.0),
            )

    def screenshot_png(self) -> bytes:
        return render.png_bytes(self.screenshot())

    def dump_hierarchy(self) -> str:
        """The uiautomator XML of the screen, or a queued glitch (see `glitch_dumps`)."""
        with self._lock:
            glitch = self._dump_glitches.pop(0) if self._dump_glitches else None
            if glitch == "idle":
                raise IdleStateError("could not get idle state")
            if glitch == "empty":
                return hierarchy.XML_HEADER + '<hierarchy rotation="0" />'
            return hierarchy.dump_xml(self.screen(), self._foreground)

    def glitch_dumps(self, kind: DumpGlitch, count: int = 1) -> None:
        """Make the next `count` dumps fail the way real ones do while the screen settles:
        "empty" gives `<hierarchy rotation="0" />`, "idle" fails with "could not get idle
        state". For testing the retry logic of whoever reads the dumps."""
        with self._lock:
            self._dump_glitches.extend([kind] * count)

    def find(self, text: str) -> Node | None:
        """The first visible node whose text or content-desc is `text` (for scripts and tests)."""
        for node in self.screen().walk():
            if text in (node.text, node.content_desc):
                return node
        return None

    # --- navigation (also what apps call, see apps.base.PhoneApi) -----------------------------

    def push(self, name: str, /, **params: str) -> None:
        with self._lock:
            app = self.apps[self._foreground]
            page = Page(name, dict(params))
            page.focus = app.first_focus(page)
            self._stacks[self._foreground].append(page)

    def pop(self) -> None:
        with self._lock:
            stack = self._stacks[self._foreground]
            if len(stack) > 1:
                stack.pop()
            elif self._foreground != LAUNCHER_PACKAGE:
                # Android 12+: Back on a task's root activity moves the task behind the home screen.
                self._foreground = LAUNCHER_PACKAGE

    def replace(self, name: str, /, **params: str) -> None:
        with self._lock:
            self._stacks[self._foreground].pop()
            self.push(name, **params)

    def go_home(self) -> None:
        with self._lock:
            self._foreground = LAUNCHER_PACKAGE

    def launch(self, package: str) -> bool:
        """Start an app from its launcher entry: resume its task, or start it fresh."""
        with self._lock:
            app = self.apps.get(package)
            if app is None:
                return False
            if package not in self._stacks:
                root = app.root()
                root.focus = app.first_focus(root)
                self._stacks[package] = [root]
            self._foreground = package
            return True

    def start_activity(self, package: str, activity: str) -> bool:
        """`am start -n`: open the page an activity shows, on top of the app's task."""
        with self._lock:
            app = self.apps.get(package)
            page = app.page_for_activity(activity) if app else None
            if app is None or page is None:
                return False
            stack = self._stacks.get(package)
            if stack is None or page.name == stack[0].name:
                if page.name == app.root().name:
                    return self.launch(package)
                self._stacks[package] = [page]
            else:
                stack.append(page)
            page.focus = app.first_focus(page)
            self._foreground = package
            return True

    def force_stop(self, package: str) -> None:
        with self._lock:
            if package == LAUNCHER_PACKAGE or package not in self.apps:
                return
            self._stacks.pop(package, None)
            if self._foreground == package:
                self._foreground = LAUNCHER_PACKAGE

    def running_packages(self) -> list[str]:
        with self._lock:
            return list(self._stacks)

    # --- input -------------------------------------------------------------------------------

    def tap(self, x: int, y: int) -> None:
        with self._lock:
            if y >= self.height - NAV_BAR_H:
                third = x * 3 // self.width
                if third == 0:
                    self.pop()
                elif third == 1:
                    self.go_home()
                return
            if y < STATUS_BAR_H:
                return
            node = hit_test(self.screen(), x, y)
            if node is not None and node.on_click is not None:
                node.on_click()

    def long_press(self, x: int, y: int) -> None:
        """Like Android: a long-clickable view gets the long click; any other view under the
        finger gets an ordinary click when the finger lifts."""
        with self._lock:
            node = hit_test(self.screen(), x, y, long_press=True)
            if node is not None and node.on_long_click is not None:
                node.on_long_click()
            else:
                self.tap(x, y)

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        """A drag: scrolls the list under its start point; one that does not move is a tap."""
        with self._lock:
            if abs(x2 - x1) < TOUCH_SLOP and abs(y2 - y1) < TOUCH_SLOP:
                if duration_ms >= LONG_PRESS_MS:
                    self.long_press(x1, y1)
                else:
                    self.tap(x1, y1)
                return
            if abs(y2 - y1) < abs(x2 - x1):
                return  # horizontal drags move nothing on these screens
            root = self.screen()
            lst = scroller_at(root, x1, y1)
            if lst is None or not lst.scroll_key:
                return
            page = self.current_page()
            viewport = lst.frame[3] - lst.frame[1]
            limit = max(0, lst.content_height - viewport)
            current = page.scroll.get(lst.scroll_key, 0)
            page.scroll[lst.scroll_key] = min(max(current + (y1 - y2), 0), limit)

    def input_text(self, text: str) -> None:
        """Type into the focused field; with no field focused the keystrokes go nowhere."""
        with self._lock:
            page = self.current_page()
            if page.focus is None:
                return
            page.fields[page.focus] = page.fields.get(page.focus, "") + text
            page.error = ""

    def clear_text(self) -> None:
        """Empty the focused field (what an IME's clear action does)."""
        with self._lock:
            page = self.current_page()
            if page.focus is not None:
                page.fields[page.focus] = ""

    def press_key(self, key: str | int) -> bool:
        """Press a key by KEYCODE_ name, bare name or number; False if the key is unknown."""
        with self._lock:
            code = _keycode(key)
            if code is None:
                return False
            page = self.current_page()
            if code == 4:
                self.pop()
            elif code == 3:
                self.go_home()
            elif code in (66, 61):
                app = self.apps[self._foreground]
                order = app.field_order(page)
                if page.focus in order:
                    i = order.index(page.focus)
                    page.focus = order[i + 1] if i + 1 < len(order) else page.focus
            elif code == 67:
                if page.focus is not None:
                    page.fields[page.focus] = page.fields.get(page.focus, "")[:-1]
            else:
                ch = typed_char(code)
                if ch:
                    self.input_text(ch)
            return True


def _keycode(key: str | int) -> int | None:
    if isinstance(key, int):
        return key
    key = key.strip()
    if key.isdigit():
        return int(key)
    name = key.upper().removeprefix("KEYCODE_")
    return KEYCODES.get(name)
