"""A simulated Android phone: apps with back stacks, system windows, touch and key input, screen
and dump.

The phone is plain, synchronous and thread-safe (one lock): the adb server calls it from worker
threads, the in-process driver from the agent's threads, and tests set it up directly.

What is on screen is a stack of windows (`Surface`s), as a real WindowManager keeps them: the
app; a permission dialog over it; the keyboard; the status and navigation bars; the
notification shade; an "isn't responding" dialog; the lock screen. Touches go to the topmost
window under the finger (a modal one takes them all), the screenshot paints them bottom to top,
and the dumps report them the way `uiautomator dump`, `uiautomator dump --windows` and
uiautomator2 do. Tests throw interruptions at any step (`show_permission_prompt`, `show_anr`,
`show_toast`, `open_shade`, `interrupt_after`).
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from PIL import Image

from host.devices.virtual import hierarchy, keyboard, render, system_ui
from host.devices.virtual.apps.base import App
from host.devices.virtual.apps.calculator import CalculatorApp
from host.devices.virtual.apps.clock import ClockApp
from host.devices.virtual.apps.contacts import ContactsApp
from host.devices.virtual.apps.launcher import LAUNCHER_PACKAGE, Launcher
from host.devices.virtual.apps.notes import NotesApp
from host.devices.virtual.apps.settings import SettingsApp
from host.devices.virtual.apps.stub import dock_apps
from host.devices.virtual.files import VirtualFs
from host.devices.virtual.keys import KEYCODES, typed_char
from host.devices.virtual.layout import Node, contains, finalize, hit_test, scroller_at
from host.devices.virtual.logbuffer import LogBuffer
from host.devices.virtual.processes import ProcessTable, Spawned
from host.devices.virtual.state import Page, PhoneState, permission_key
from host.devices.virtual.strings import Strings
from host.devices.virtual.system_ui import Prompt
from host.devices.virtual.widgets import STATUS_BAR_H, Geometry, window

LONG_PRESS_MS = 500
FONT_SCALES = {"Small": 0.85, "Default": 1.0, "Large": 1.15, "Largest": 1.3}
TOAST_S = 2.0
TOUCH_SLOP = 24

DumpGlitch = Literal[
    "empty",
    "idle",
    "null_root",
    "no_windows",
    "rootless_window",
    "killed",
    "aborted",
    "segfault",
    "bridge_taken",
    "npe",
]
ScreenLock = Literal["none", "swipe", "pin"]
#: The states `adb devices` lists a plugged-in phone under (see `VirtualPhone.set_adb_state`).
AdbState = Literal[
    "device", "unauthorized", "offline", "authorizing", "connecting", "no permissions"
]
#: How a screenshot comes out unreadable (see `VirtualPhone.garble_screenshots`).
GarbledShot = Literal["empty", "garbage", "huge"]


class IdleStateError(Exception):
    """The hierarchy could not be dumped because the screen never settled."""


class NullRootError(Exception):
    """The hierarchy could not be dumped: no window had a root node (a window was changing)."""


class NoWindowsError(Exception):
    """`uiautomator dump --windows` found an empty window list (system_server fills it lazily
    right after a client asks for interactive windows): AOSP's dumper then writes no file at
    all, yet the command still prints "dumped to"."""


#: What the shell prints for a child a signal ended, and its exit status (128 + the signal).
SIGNAL_EXITS = {"Killed": 137, "Aborted": 134, "Segmentation fault": 139}


class DumpKilled(Exception):
    """The dumping process died of a signal: the shell prints what it was ("Killed", the
    low-memory killer's SIGKILL; "Aborted", an ART runtime abort's SIGABRT; "Segmentation
    fault", a native crash's SIGSEGV)."""

    def __init__(self, word: str = "Killed") -> None:
        super().__init__(word)
        self.word = word
        self.code = SIGNAL_EXITS[word]


class BridgeTaken(Exception):
    """Another UiAutomation client (a uiautomator2 server, Appium) holds the accessibility
    bridge: `uiautomator dump` dies with "IllegalStateException: UiAutomationService …
    already registered!"."""


# What AOSP's dumper throws when a node vanishes between listing a parent's children and
# reading one of them while the screen changes (AccessibilityNodeInfoDumper.childNafCheck).
#: What uiautomator2's agent sends as a JSON-RPC error's `data` once its UiAutomation is gone
#: (openatx/uiautomator2#797).
AUTOMATION_LOST_TRACE = (
    "java.lang.IllegalStateException: UiAutomation not connected!\n"
    "\tat android.app.UiAutomation.throwIfNotConnectedLocked(UiAutomation.java:1198)\n"
    "\tat android.app.UiAutomation.getServiceInfo(UiAutomation.java:495)\n"
    "\tat com.github.uiautomator.stub.AutomatorServiceImpl.dumpWindowHierarchy"
    "(AutomatorServiceImpl.java:295)\n"
)
#: What uiautomator2's agent sends as a JSON-RPC error's `data` once its heap is exhausted
#: (openatx/android-uiautomator-server#64, openatx/uiautomator2#1052).
OUT_OF_MEMORY_TRACE = (
    "java.lang.OutOfMemoryError: Failed to allocate a 3145712 byte allocation with 1181776 "
    "free bytes and 1154KB until OOM, target footprint 268435456, growth limit 268435456\n"
    "\tat dalvik.system.VMRuntime.newUnpaddedArray(Native Method)\n"
    "\tat android.app.UiAutomation.getServiceInfo(UiAutomation.java:806)\n"
)
DUMP_NPE_TRACE = (
    "java.lang.NullPointerException: Attempt to invoke virtual method "
    "'java.lang.CharSequence android.view.accessibility.AccessibilityNodeInfo"
    ".getContentDescription()' on a null object reference\n"
    "\tat com.android.uiautomator.core.AccessibilityNodeInfoDumper.childNafCheck"
    "(AccessibilityNodeInfoDumper.java:200)\n"
    "\tat com.android.uiautomator.core.AccessibilityNodeInfoDumper.dumpNodeRec"
    "(AccessibilityNodeInfoDumper.java:104)\n"
    "\tat com.android.commands.uiautomator.DumpCommand.run(DumpCommand.java:110)\n"
)


class DumpCrashed(Exception):
    """The dumper died with a NullPointerException midway (a node vanished while the screen
    changed): `uiautomator dump` prints nothing (the trace goes to logcat) and leaves the file
    it had opened empty; uiautomator2's agent answers a JSON-RPC error carrying the trace."""


class TcpService(Protocol):
    """A server running on the phone (such as the uiautomator2 agent), reached over `tcp:PORT`."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None: ...


@dataclass
class Surface:
    """One window on the screen, as WindowManager and accessibility report it."""

    kind: Literal[
        "app", "dialog", "keyboard", "status_bar", "shade", "navigation_bar", "anr", "keyguard"
    ]
    package: str
    title: str
    type: str  # AccessibilityWindowInfo type
    layer: int
    root: Node
    modal: bool
    window_id: int
    activity: str = ""
    focused: bool = False
    #: The window has FLAG_SECURE (a banking app, a password screen): screenshots show it
    #: black while accessibility (and so every dump) still reports its views.
    secure: bool = False


@dataclass
class _Pending:
    """An interruption to throw after some more input events (`interrupt_after`)."""

    remaining: int
    action: Callable[[], None] = field(repr=False)


class VirtualPhone:
    """One phone. `state` holds everything a task checker looks at."""

    def __init__(
        self,
        serial: str,
        width: int = 1080,
        height: int = 2400,
        model: str = "amc virtual phone",
        *,
        locale: str = "en-US",
        launcher: str = LAUNCHER_PACKAGE,
        permission_package: str = system_ui.PERMISSION_CONTROLLER,
    ) -> None:
        self._serial = serial
        #: Who shows runtime permission prompts: AOSP's permission controller, or a maker's
        #: own (MIUI: "com.lbe.security.miui"), with the same `permission_allow…` ids.
        self.permission_package = permission_package
        #: The display's natural (portrait) size in use, what `wm size` reports in any
        #: rotation: the panel's own (`physical_size`) unless an override is set
        #: (`set_display_size`, `wm size WxH`, a maker's resolution setting).
        self.natural_width = width
        self.natural_height = height
        #: The panel's own size (`wm size`'s "Physical size").
        self.physical_size = (width, height)
        #: `screencap` captures at the physical size rather than the override size, as
        #: before Android 12 (the image then is larger than the dump's coordinates).
        self.screencap_physical = False
        #: `screencap` returns the image in the natural orientation while the phone is in
        #: landscape (seen on some builds): its aspect then disagrees with the dump's.
        self.screencap_unrotated = False
        #: Surface rotation, 0-3 (quarter turns): 1 and 3 are landscape (`rotate`).
        self.rotation = 0
        #: The rotation the phone turns to as the next dump begins (`turn_at_next_dump`).
        self._turn_at_dump: int | None = None
        #: A second display is attached (a foldable's cover screen, a cast display):
        #: `screencap` without `-d` then warns first, on the same stream as the image,
        #: `uiautomator dump --windows` lists its window under `<display id="2">`, and
        #: uiautomator2's agent dumps its root beside the others with `display-id="2"`.
        self.multi_display = False
        #: The dumper writes `&`, `<` and `"` in texts unescaped, as some ROMs' and apps' own
        #: dumpers do: the dump is then not well-formed XML.
        self.unescaped_dumps = False
        #: Bytes left on /data (None: plenty). A full phone's `uiautomator dump` still says
        #: "dumped to" (AOSP's dumper logs the IOException and reports anyway), its file cut
        #: at what fitted, possibly empty; `df` reports what is left.
        self.storage_left: int | None = None
        #: system_server is not running (the phone is still booting, or system_server
        #: restarts after a crash) while adbd already answers: `wm`, `input`, `am`, `pm`,
        #: `settings`, `cmd` and `dumpsys` find no binder service ("cmd: Can't find
        #: service: window"), `monkey` no activity manager; `sys.boot_completed` is unset.
        self.system_server_down = False
        #: `dumpsys display` names the rotation (`orientation=N` in its viewport); False as
        #: on builds whose dump leaves it out (openatx/adbutils#22): `dumpsys input`'s
        #: `SurfaceOrientation` still says it.
        self.display_dump_orientation = True
        #: uiautomator2's `takeScreenshot` answers null (its library then falls back to
        #: `screencap`), as on Android 4-6 (openatx/uiautomator2#1027).
        self.u2_screenshot_null = False
        #: A text uiautomator2's `takeScreenshot` answers in place of a JPEG's base64 (a
        #: server whose encoder failed partway); None for the real answer.
        self.u2_screenshot_text: str | None = None
        #: A Java exception uiautomator2's `takeScreenshot` fails with, answered as a JSON-RPC
        #: error ("java.lang.NoClassDefFoundError": a server built against java.util.Base64 on
        #: a phone older than Android 8, openatx/uiautomator2#1008); "" for none.
        self.u2_screenshot_error = ""
        #: What uiautomator2's server prints as it dies right after it starts (the exit code 1
        #: follows): a ROM whose runtime it cannot run on (a Java trace ending in "Caused
        #: by: java.lang.UnsatisfiedLinkError…", openatx/uiautomator2#1076); "" for none.
        self.u2_launch_crash = ""
        #: The deepest tree uiautomator2's `dumpWindowHierarchy` walks before its recursion
        #: overflows the server's stack (jsonrpc4j's -32001 "java.lang.StackOverflowError",
        #: openatx/uiautomator2#691); None: no limit.
        self.u2_stack_levels: int | None = None
        #: How many more of uiautomator2's `dumpWindowHierarchy` calls answer null, as a server
        #: does whose dumper caught an exception it only logs (older openatx servers end
        #: with `return null`).
        self.u2_dump_nulls = 0
        #: uiautomator2 JSON-RPC methods whose server-side call throws, by method name: the
        #: Java exception's class and message (see `fail_u2_call`).
        self.u2_call_failures: dict[str, tuple[str, str]] = {}
        #: uiautomator2's AdbKeyboard is selected but its service is not running (killed by a
        #: maker's battery saver), so no receiver takes its broadcasts: `am broadcast` ends
        #: "Broadcast completed: result=0" and uiautomator2 falls back to `setText`.
        self.adb_keyboard_unbound = False
        #: When set, uiautomator2's helper app (`com.github.uiautomator`, its AdbKeyboard) is
        #: uninstalled right after this many more `ime list` answers, as adbutils'
        #: `install(..., uninstall=True)` (uiautomator2's `_setup_ime`, run by another
        #: program) removes it before it puts it back: the list read next lacks the
        #: AdbKeyboard the one before named.
        self.helper_uninstalled_after_ime_lists = 0
        #: A line the dynamic linker prints before `screencap`'s output, on the same stream
        #: as the image ("WARNING: linker: …" on ROMs of Android 5-6 whose libraries it
        #: complains about); "" for none.
        self.screencap_linker_warning = ""
        #: MIUI's runtime prints a FileNotFoundException for theme_compatibility.xml as
        #: `uiautomator` starts, before the tool's own output on the same stream (Xiaomi,
        #: Redmi, POCO): a dump to /dev/tty then has a Java stack trace (with `<init>` and
        #: `<clinit>` in it) before its XML.
        self.miui_theme_trace = False
        #: The phone refuses injected input (Xiaomi, Redmi, POCO with "USB debugging
        #: (Security settings)" off; some vivo and Honor builds): every `input` event fails
        #: with a SecurityException naming INJECT_EVENTS, as Android 11+ prints it.
        self.refuse_injected_input = False
        #: The next runs of a shell command (by name: "input", "monkey") die of a signal
        #: before they do anything (the low-memory killer takes the app_process, its runtime
        #: aborts): the shell prints the signal's word ("Killed", "Aborted", "Segmentation
        #: fault"), one run per word, and exits 128 + the signal.
        self.command_deaths: dict[str, list[str]] = {}
        #: Every tap the phone took, in order (whether or not it hit anything): a test tells
        #: by it which of two phones an input reached.
        self.taps: list[tuple[int, int]] = []
        #: The largest adb packet its adbd takes (agreed in the connection's CNXN): 1 MiB on
        #: current releases, 4096 bytes (MAX_PAYLOAD_V1) on adbd before Android 7. A device
        #: service whose name (`shell:CMD` with its NUL) does not fit cannot be opened: the
        #: adb server gives up on the request ("destination oversized") and the client's
        #: connection drops unanswered.
        self.adbd_max_payload = 1024 * 1024
        #: Its adbd predates Android 5.0 (set `sdk` below 21 with it): it knows no `exec:` /
        #: `exec-out:` service (nor `shell,v2:`), which it closes unopened, so the adb
        #: server answers the client "closed"; and `shell:` runs the command on a pty, whose
        #: line discipline writes every "\n" of the output as "\r\n" (binary output too).
        self.old_adbd = False
        #: The USB port `adb devices -l` names the phone on (`usb:1-1.2`, as adb on Linux
        #: and macOS does: usb_linux.cpp, usb_osx.cpp); "" names none (an emulator, adb over
        #: Wi-Fi, Windows hosts, whose usb_windows.cpp gives no device path).
        self.usb_port = ""
        #: The MENU key dismisses a swipe lock screen (AOSP's default); False as on builds
        #: whose maker set config_disableMenuKeyInLockScreen: only a swipe up does then.
        self.menu_unlocks = True
        #: Packages whose app windows have FLAG_SECURE (banking apps, password managers):
        #: `screencap`, uiautomator2's `takeScreenshot` and `framebuffer:` show those windows
        #: black, as SurfaceFlinger does for a capture without the secure-capture permission;
        #: the status bar, keyboard and navigation bar above them are drawn as usual. Dumps
        #: are unchanged: accessibility still reports the window's views.
        self.secure_packages: set[str] = set()
        #: The keyboard floats (Gboard's and Samsung Keyboard's floating mode): a narrower
        #: window in the middle of the screen, the app in reach below and beside it.
        self.floating_keyboard = False
        self.model = model
        self.sdk = 34
        self.release = "14"
        self.strings = Strings(locale)
        self.state = PhoneState()
        self.files = VirtualFs()
        self.log = LogBuffer()
        self.processes = ProcessTable()
        self._lock = threading.RLock()
        self._online = True
        self._adb_state: AdbState = "device"
        self._gone = threading.Event()
        self._listeners: list[Callable[[VirtualPhone], None]] = []
        apps: list[App] = [
            SettingsApp(model),
            ContactsApp(),
            ClockApp(),
            CalculatorApp(),
            NotesApp(),
        ]
        dock = dock_apps()
        self.apps: dict[str, App] = {app.package: app for app in [*apps, *dock]}
        self.launcher = Launcher(apps, dock, package=launcher)
        self.launcher_package = launcher
        self.apps[launcher] = self.launcher
        self._stacks: dict[str, list[Page]] = {launcher: [self.launcher.root()]}
        self._foreground = launcher
        # System plumbing that task checkers never look at:
        self.tcp_services: dict[int, TcpService] = {}  # on-device servers, reached via tcp:PORT
        self.installed: set[str] = set()  # packages installed at run time (e.g. an IME)
        #: Shell commands this build leaves out (some makers' images ship no `uiautomator`):
        #: the shell answers "not found" for them.
        self.missing_commands: set[str] = set()
        self.extra_settings: dict[str, str] = {}  # "namespace/key" -> value for `settings`
        self.clipboard = ""
        self.traversed_text: str | None = None
        self._dump_glitches: list[DumpGlitch] = []
        self._glitch_every: tuple[int, DumpGlitch] | None = None
        self._dumps = 0
        #: Hierarchy dumps asked of the phone so far, in any form (failed ones too).
        self.dumps_taken = 0
        #: `GET /ping`s its uiautomator2 agents answered so far (how often a client looked
        #: whether the server is up, or waited for it to go).
        self.u2_pings = 0
        #: Queued agent deaths (see `crash_u2_agent`): True for one midway through its answer.
        self._u2_crashes: list[bool] = []
        self._u2_hangs: list[float] = []
        self._u2_garbles: list[bytes] = []
        #: Bumped by `lose_u2_automation`: an agent started under an older value has lost
        #: its UiAutomation connection.
        self.u2_automation_epoch = 0
        #: Bumped by `exhaust_u2_memory`: an agent started under an older value is out of heap.
        self.u2_memory_epoch = 0
        #: On-phone servers that answer every call with an HTTP error (`break_u2_agent`).
        self._broken_services: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        self._dump_hangs: list[float] = []
        self._exec_head_delays: list[float] = []
        self._service_stalls: list[tuple[str, float]] = []
        self._service_closes: list[str] = []
        #: The `uiautomator dump` process running right now, if one hangs (`hang_dumps`).
        self.dumper: Spawned | None = None
        #: Apps whose screen never goes idle (a game, a video, a Flutter app that keeps
        #: animating): every dump while one is in front fails "could not get idle state".
        self.never_idle: set[str] = set()
        # System UI state:
        self.keyboard_up = False
        #: The on-screen keyboard's input method id (package/service): AOSP's LatinIME, or
        #: e.g. "com.baidu.input_mi/.ImeService" to present it under a package that no
        #: keyboard hint names, as Baidu's, WeChat's or LG's keyboards are.
        self.keyboard_ime = keyboard.IME
        self.shade: Literal["", "notifications", "quick_settings"] = ""
        self.prompts: list[Prompt] = []
        #: The window that had the focus when the last "isn't responding" dialog came up
        #: (`pkg/activity`), or None: `dumpsys window` opens with that moment's frozen focus
        #: (its LAST ANR section) for hours after the dialog went.
        self.last_anr_focus: str | None = None
        self._toast: tuple[str, float] | None = None
        self.last_toast: str | None = None
        self.awake = True
        #: The display stays off whatever wakes it (a broken panel or backlight, a proximity
        #: sensor covered in a pocket or a holder): `dumpsys power` keeps saying Asleep.
        self.stays_dark = False
        #: What the next screenshots come out as instead of the screen (`garble_screenshots`).
        self._garbled_shots: list[GarbledShot] = []
        self.screen_lock: ScreenLock = "none"
        self.lock_pin = ""
        self.locked = False
        self.bouncer = False
        self._pin_typed = ""
        self._pending: list[_Pending] = []
        self.log.write("I", "ActivityManager", "System now ready", pid=1100)

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

    @property
    def adb_state(self) -> AdbState:
        """What `adb devices` lists the plugged-in phone as."""
        return self._adb_state

    def set_adb_state(self, state: AdbState) -> None:
        """ "unauthorized": USB debugging was not allowed for this computer (the phone's "Allow
        USB debugging?" prompt unanswered, or its authorizations revoked); "offline": its adbd
        does not answer (a bad cable or hub, a phone still booting); "authorizing" and
        "connecting": the moments after it is plugged in (adb trying its keys, the phone's
        adbd not answering yet); "no permissions": the adb server may not open the phone's
        USB device (Linux without a udev rule for it). Any of them: the phone stays in `adb
        devices` under that state, its open connections drop, and every request for it fails
        with the adb server's words ("device unauthorized.\n…", "device offline", "device
        still authorizing", "insufficient permissions for device…"). "device" makes it usable
        again."""
        with self._lock:
            if self._adb_state == state:
                return
            self._adb_state = state
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
        """Factory state: default settings, no user data, every app closed, home screen shown,
        no dialog, shade or keyboard up, screen on, unlocked and upright."""
        with self._lock:
            self.state = PhoneState()
            self._stacks = {self.launcher_package: [self.launcher.root()]}
            self._foreground = self.launcher_package
            self.keyboard_up = False
            self.shade = ""
            self.prompts = []
            self._toast = None
            self.awake = True
            self.locked = self.bouncer = False
            self._pending = []
            self.rotation = 0

    # --- what is on screen -------------------------------------------------------------------

    @property
    def width(self) -> int:
        """Width in the current rotation: what dumps, screenshots and `input` use."""
        return self.natural_height if self.rotation % 2 else self.natural_width

    @property
    def height(self) -> int:
        """Height in the current rotation."""
        return self.natural_width if self.rotation % 2 else self.natural_height

    def rotate(self, rotation: int) -> None:
        """Turn the phone (0-3 quarter turns, 1 and 3 landscape), as a user holding it sideways
        with auto-rotate on: apps lay out again at the rotated size; dumps say
        `rotation="N"` with rotated bounds; screenshots and `input` coordinates are rotated;
        `wm size` still reports the natural size, as on a real phone."""
        if rotation not in (0, 1, 2, 3):
            raise ValueError(f"rotation must be 0-3, not {rotation!r}")
        with self._lock:
            self.rotation = rotation

    def turn_at_next_dump(self, rotation: int) -> None:
        """Turn the phone (see `rotate`) as the next hierarchy dump begins, as a phone whose
        app asks for landscape (a video, a game, the camera) turns while it is read: what a
        reader asked before the dump (the screen size, a screenshot) is the old orientation,
        the dump the new one."""
        if rotation not in (0, 1, 2, 3):
            raise ValueError(f"rotation must be 0-3, not {rotation!r}")
        with self._lock:
            self._turn_at_dump = rotation

    @property
    def override_size(self) -> tuple[int, int] | None:
        """The natural size `wm size WxH` set, None when the physical size is in use."""
        size = (self.natural_width, self.natural_height)
        return None if size == self.physical_size else size

    def set_display_size(self, size: tuple[int, int] | None) -> None:
        """`wm size WxH` (a maker's resolution setting does the same); None is `wm size
        reset`. Apps lay out again at the new size, dumps, screenshots and `input` use it."""
        width, height = size or self.physical_size
        if width <= 0 or height <= 0:
            raise ValueError(f"bad display size {size!r}")
        with self._lock:
            self.natural_width, self.natural_height = width, height

    @property
    def geometry(self) -> Geometry:
        return Geometry(self.width, self.height)

    @property
    def locale(self) -> str:
        return self.strings.locale

    def current_package(self) -> str:
        """The foreground app's package (the task on top, under any dialog or shade)."""
        with self._lock:
            return self._foreground

    def focused_package(self) -> str:
        """The package of the window that has input focus (what `dumpsys window` names as
        mCurrentFocus): a dialog's, the shade's or the lock screen's when one is up."""
        with self._lock:
            return next(s for s in self.surfaces() if s.focused).package

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
        """The foreground app's window, laid out (the tree its screenshot and dump come from)."""
        with self._lock:
            app = self.apps[self._foreground]
            nodes = app.build(self, self.current_page(), self.geometry)
            return finalize(window(self.geometry, nodes, compose=app.compose()))

    @property
    def keyboard_package(self) -> str:
        """The package the on-screen keyboard's window is in (`keyboard_ime`'s)."""
        return self.keyboard_ime.partition("/")[0]

    @property
    def input_method(self) -> str:
        """The selected input method id (`settings get secure default_input_method`): the
        one `ime set` or `settings put` chose, else the on-screen keyboard's."""
        return self.extra_settings.get("secure/default_input_method", self.keyboard_ime)

    def keyboard_shown(self) -> bool:
        """The keyboard is up: asked for, a field focused, nothing modal over the app."""
        with self._lock:
            return (
                self.keyboard_up
                and self.current_page().focus is not None
                and not self.prompts
                and not self.shade
                and not self.locked
            )

    def surfaces(self) -> list[Surface]:
        """Every window on screen, bottom first; the topmost focusable one has the focus."""
        with self._lock:
            geo = self.geometry
            tr = self.strings.tr
            app = self.apps[self._foreground]
            out = [
                Surface(
                    "app",
                    self._foreground,
                    tr(app.label),
                    "TYPE_APPLICATION",
                    1,
                    self.screen(),
                    False,
                    100 + len(self._stacks.get(self._foreground, [])),
                    activity=app.activity_for(self.current_page()),
                    secure=self._foreground in self.secure_packages,
                )
            ]
            for prompt in self.prompts:
                if prompt.kind == "permission":
                    out.append(
                        Surface(
                            "dialog",
                            prompt.package,
                            prompt.package,
                            "TYPE_APPLICATION",
                            2,
                            finalize(system_ui.prompt_window(geo, prompt, self.strings)),
                            True,
                            140,
                            activity=(
                                "com.android.permissioncontroller.permission.ui."
                                "GrantPermissionsActivity"
                            ),
                        )
                    )
            if self.keyboard_shown():
                out.append(
                    Surface(
                        "keyboard",
                        self.keyboard_package,
                        "Android Keyboard (AOSP)",
                        "TYPE_INPUT_METHOD",
                        3,
                        finalize(
                            keyboard.build(
                                geo,
                                self.strings.language,
                                self._key_press,
                                self.keyboard_package,
                                floating=self.floating_keyboard,
                            )
                        ),
                        False,
                        160,
                    )
                )
            out.append(
                Surface(
                    "status_bar",
                    system_ui.SYSTEM_UI,
                    "StatusBar",
                    "TYPE_SYSTEM",
                    4,
                    finalize(system_ui.status_bar(geo, self.state, self.strings)),
                    False,
                    2,
                )
            )
            if self.shade:
                out.append(
                    Surface(
                        "shade",
                        system_ui.SYSTEM_UI,
                        "NotificationShade",
                        "TYPE_SYSTEM",
                        5,
                        finalize(
                            system_ui.notification_shade(
                                geo,
                                self.state,
                                self.strings,
                                expanded=self.shade == "quick_settings",
                                toggle=self._tile_action,
                                open_settings=self._open_settings_from_shade,
                            )
                        ),
                        True,
                        4,
                    )
                )
            out.append(
                Surface(
                    "navigation_bar",
                    system_ui.SYSTEM_UI,
                    "NavigationBar0",
                    "TYPE_SYSTEM",
                    6,
                    finalize(
                        system_ui.navigation_bar(
                            geo,
                            self.strings,
                            lambda: self._press(4),
                            lambda: self._press(3),
                        )
                    ),
                    False,
                    3,
                )
            )
            for prompt in self.prompts:
                if prompt.kind == "anr":
                    out.append(
                        Surface(
                            "anr",
                            prompt.package,
                            prompt.package,
                            "TYPE_SYSTEM",
                            7,
                            finalize(system_ui.prompt_window(geo, prompt, self.strings)),
                            True,
                            180,
                        )
                    )
            if self.locked:
                out.append(
                    Surface(
                        "keyguard",
                        system_ui.SYSTEM_UI,
                        "NotificationShade",
                        "TYPE_SYSTEM",
                        8,
                        finalize(system_ui.lock_screen(geo, self.strings, bouncer=self.bouncer)),
                        True,
                        4,
                    )
                )
            focusable = [s for s in out if s.kind in ("app", "dialog", "shade", "anr", "keyguard")]
            focusable[-1].focused = True
            return out

    def toast_text(self) -> str | None:
        """The toast on screen now, if one is."""
        with self._lock:
            if self._toast is None:
                return None
            text, until = self._toast
            if time.monotonic() >= until:
                self._toast = None
                return None
            return text

    def screencap_image(self) -> Image.Image:
        """What `screencap` captures: the screen, at the physical size when
        `screencap_physical` is set, in the natural orientation when `screencap_unrotated`."""
        with self._lock:
            img = self.screenshot()
            size = self._screencap_size()
            return img.resize(size) if size != img.size else img

    def screencap_png(self) -> bytes:
        """`screencap_image` as PNG (`screencap -p`), encoded once per screen shown."""
        with self._lock:
            return render.screen_png(self.surfaces(), size=self._screencap_size(), **self._look())

    def _screencap_size(self) -> tuple[int, int]:
        width, height = self.width, self.height
        if self.screencap_physical and self.override_size is not None:
            pw, ph = self.physical_size
            width, height = (ph, pw) if self.rotation % 2 else (pw, ph)
        if self.screencap_unrotated and self.rotation % 2:
            width, height = height, width
        return width, height

    def _look(self) -> render.ScreenLook:
        """Everything the screen's pixels depend on besides its windows."""
        return {
            "width": self.width,
            "height": self.height,
            "dark": self.state.flag("dark_theme"),
            "text_scale": FONT_SCALES.get(str(self.state.settings.get("font_size")), 1.0),
            "toast": self.toast_text() if not self.locked else None,
            "awake": self.awake,
        }

    def screenshot(self) -> Image.Image:
        with self._lock:
            return render.render_screen(self.surfaces(), **self._look())

    def screenshot_png(self) -> bytes:
        """The screen as PNG, encoded once per screen shown (`render.screen_png`)."""
        with self._lock:
            return render.screen_png(self.surfaces(), **self._look())

    def garble_screenshots(self, kind: GarbledShot, count: int = 1) -> None:
        """Make the next `count` screenshots (`screencap`, uiautomator2's `takeScreenshot`)
        unreadable, as some phones return them (a protected display, a wedged SurfaceFlinger,
        a GPU driver fault): "empty" gives no bytes at all, "garbage" bytes that frame like an
        image (PNG's signature and end chunk; JPEG's markers) with noise between, "huge" a
        header that declares 60000x60000 pixels (noise read as its size) and no pixels."""
        with self._lock:
            self._garbled_shots.extend([kind] * count)

    def take_garbled_shot(self, png: bool) -> bytes | None:
        """This screenshot's bytes when it is garbled (see `garble_screenshots`), else None."""
        with self._lock:
            if not self._garbled_shots:
                return None
            kind = self._garbled_shots.pop(0)
        if kind == "empty":
            return b""
        if kind == "huge":
            if png:
                header = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
                ihdr = b"IHDR" + header
                chunk = struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))
                return b"\x89PNG\r\n\x1a\n" + chunk + b"\x00\x00\x00\x00IEND\xaeB`\x82"
            sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, 60000, 60000, 3)
            return b"\xff\xd8" + sof + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01\xff\xd9"
        noise = bytes((i * 37 + 11) % 256 for i in range(4096))
        if png:
            return b"\x89PNG\r\n\x1a\n" + noise + b"\x00\x00\x00\x00IEND\xaeB`\x82"
        return b"\xff\xd8\xff\xe0" + noise + b"\xff\xd9"

    def _next_glitch(self) -> DumpGlitch | None:
        if self._turn_at_dump is not None:
            self.rotation, self._turn_at_dump = self._turn_at_dump, None
        self._dumps += 1
        self.dumps_taken += 1
        if self._dump_glitches:
            return self._dump_glitches.pop(0)
        if self._glitch_every is not None and self._dumps % self._glitch_every[0] == 0:
            return self._glitch_every[1]
        return None

    def _check_glitch(self, windows: bool = False) -> str | DumpGlitch | None:
        """Raise the queued dump failure, or return the empty dump or (for `windows`) the
        "rootless_window" state for the caller to write; None when this dump goes through."""
        glitch = self._next_glitch()
        if glitch == "idle" or self._foreground in self.never_idle:
            raise IdleStateError("could not get idle state")
        if glitch == "killed":
            raise DumpKilled("Killed")
        if glitch == "aborted":
            raise DumpKilled("Aborted")
        if glitch == "segfault":
            raise DumpKilled("Segmentation fault")
        if glitch == "bridge_taken":
            raise BridgeTaken("UiAutomationService already registered")
        if glitch == "npe":
            self.log.write("E", "AndroidRuntime", "FATAL EXCEPTION: main\n" + DUMP_NPE_TRACE)
            raise DumpCrashed(DUMP_NPE_TRACE.splitlines()[0])
        if glitch == "no_windows" and windows:
            raise NoWindowsError("no windows listed")
        if glitch == "rootless_window" and windows:
            return glitch
        if glitch in ("null_root", "no_windows", "rootless_window"):
            # Without --windows the dumper only asks for the active window's root: null.
            raise NullRootError("null root node returned by UiTestAutomationBridge")
        if glitch == "empty":
            return hierarchy.XML_HEADER + '<hierarchy rotation="0" />'
        return None

    def dump_hierarchy(self) -> str:
        """What `uiautomator dump` writes: the focused window's tree (or a queued glitch, see
        `glitch_dumps`)."""
        with self._lock:
            return self._check_glitch() or self._escaped(
                hierarchy.dump_active(self.surfaces(), self.rotation)
            )

    def dump_windows(self) -> str:
        """What `uiautomator dump --windows` writes: every window, topmost first, with its type
        and layer."""
        with self._lock:
            glitch = self._check_glitch(windows=True)
            if glitch is not None and glitch != "rootless_window":
                return glitch
            return self._escaped(
                hierarchy.dump_windows(
                    self.surfaces(),
                    self.rotation,
                    rootless_focus=glitch == "rootless_window",
                    hung=frozenset(p.app_package for p in self.prompts if p.kind == "anr"),
                    second_display=self.multi_display,
                )
            )

    def dump_window_roots(self, max_depth: int | None = None) -> str:
        """What uiautomator2's agent answers: every window's root side by side in one
        `<hierarchy>`, the focused one first, cut `max_depth` levels down when given."""
        with self._lock:
            return self._check_glitch() or self._escaped(
                hierarchy.dump_roots(
                    self.surfaces(),
                    self.rotation,
                    max_depth,
                    sdk=self.sdk,
                    second_display=(self.width, self.height) if self.multi_display else None,
                )
            )

    def _escaped(self, xml: str) -> str:
        """`xml` as this phone's dumper writes it (see `unescaped_dumps`)."""
        if not self.unescaped_dumps:
            return xml
        return xml.replace("&lt;", "<").replace("&quot;", '"').replace("&amp;", "&")

    def glitch_dumps(self, kind: DumpGlitch, count: int = 1) -> None:
        """Make the next `count` dumps fail the way real ones do while the screen settles:
        "empty" gives `<hierarchy rotation="0" />`, "idle" fails with "could not get idle
        state", "null_root" with "null root node returned by UiTestAutomationBridge".
        `uiautomator dump --windows` also knows "no_windows" (an empty window list: "dumped
        to" printed, no file written) and "rootless_window" (the focused window's `<window>`
        comes without its `<hierarchy>`: its root is null while it changes); the other dump
        forms report both as a null root. "killed" (the shell prints "Killed"), "aborted"
        (the runtime aborted: "Aborted"), "segfault" (a native crash: "Segmentation fault") and
        "bridge_taken" (another UiAutomation client holds the bridge: "… already
        registered!") fail any `uiautomator dump`. "npe" is the dumper's NullPointerException
        in childNafCheck (a node vanished mid-dump): `uiautomator dump` prints nothing and
        leaves an empty file, the trace goes to logcat, and uiautomator2's agent answers a
        JSON-RPC error with it. For testing whoever reads the dumps."""
        with self._lock:
            self._dump_glitches.extend([kind] * count)

    def glitch_every(self, n: int, kind: DumpGlitch = "idle") -> None:
        """From now on every `n`-th dump fails with `kind` (n=3: a third of all dumps), as
        on a phone whose screen keeps animating. `n=0` stops it."""
        with self._lock:
            self._glitch_every = (n, kind) if n > 0 else None
            self._dumps = 0

    def hang_dumps(self, seconds: float, count: int = 1) -> None:
        """Make the next `count` `uiautomator dump` runs hang for `seconds` before they dump,
        as on a phone whose screen never goes idle. The dumper is a process of its own
        (`uiautomator` in `ps -A`, ended by `kill PID`): it keeps running, holding the
        accessibility bridge, after the adb client that started it hung up, so another dump
        meanwhile fails with "… already registered!"."""
        with self._lock:
            self._dump_hangs.extend([seconds] * count)

    def take_dump_hang(self) -> float | None:
        """How long this `uiautomator dump` hangs (see `hang_dumps`), None when it does not."""
        with self._lock:
            return self._dump_hangs.pop(0) if self._dump_hangs else None

    def delay_exec_heads(self, seconds: float, count: int = 1) -> None:
        """Make what the next `count` shells print before an `exec` (`echo $$; exec …`: the
        pid a caller kills the program by) reach the adb client `seconds` late, as from a
        busy adbd or over a slow cable, while the program `exec`ed already runs. A client
        that hangs up meanwhile gets none of it; the program runs on (see `hang_dumps`)."""
        with self._lock:
            self._exec_head_delays.extend([seconds] * count)

    def take_exec_head_delay(self) -> float | None:
        """How late this shell's output before its `exec` reaches the client (see
        `delay_exec_heads`), None when it is not late."""
        with self._lock:
            return self._exec_head_delays.pop(0) if self._exec_head_delays else None

    def crash_u2_agent(self, calls: int = 1, mid_answer: bool = False) -> None:
        """Make the uiautomator2 agent die during each of the next `calls` JSON-RPC calls: it
        closes the connection unanswered and its process ends, as when the on-phone server
        crashes or is killed mid-call (the library raises `http.client.RemoteDisconnected`,
        openatx/uiautomator2#1120). `mid_answer`: it dies after its answer's headers and part
        of its body (the low-memory killer taking it while it writes a big dump), so the
        answer ends short of its Content-Length. adb still lists the phone."""
        with self._lock:
            self._u2_crashes.extend([mid_answer] * calls)

    def garble_u2_agent(self, head: bytes, calls: int = 1) -> None:
        """Make the uiautomator2 agent answer each of the next `calls` JSON-RPC calls with
        `head` instead of an HTTP answer, then close the connection (a server that dies while
        it writes its status line, another program listening on the server's port): what
        Python's `http.client` cannot read raises its own errors (`BadStatusLine`,
        `LineTooLong`), which uiautomator2 passes on as they are. adb still lists the phone."""
        with self._lock:
            self._u2_garbles.extend([head] * calls)

    def take_u2_garble(self) -> bytes | None:
        """What this JSON-RPC call is answered with instead of HTTP (see `garble_u2_agent`),
        None when it is answered."""
        with self._lock:
            return self._u2_garbles.pop(0) if self._u2_garbles else None

    def hang_u2_agent(self, seconds: float, calls: int = 1) -> None:
        """Make the uiautomator2 agent sit on each of the next `calls` JSON-RPC calls for
        `seconds` before it answers, as a wedged on-phone server does (a UiAutomation call
        stuck in system_server): the connection stays open and silent. adb still lists the
        phone."""
        with self._lock:
            self._u2_hangs.extend([seconds] * calls)

    def break_u2_agent(self, status: int = 500) -> None:
        """Make the running uiautomator2 agent answer every JSON-RPC call with HTTP `status`
        (NanoHTTPD's "500 Internal Server Error" when the server's handler itself fails; a
        proxy's 502 in front of a dead server) until its process is restarted, while `/ping`
        still answers; an agent started afterwards works. adb still lists the phone."""
        with self._lock:
            for service in self.tcp_services.values():
                self._broken_services[service] = status

    def u2_http_failure(self, service: object) -> int | None:
        """The HTTP status a broken agent answers JSON-RPC calls with (`break_u2_agent`)."""
        with self._lock:
            return self._broken_services.get(service)

    def lose_u2_automation(self) -> None:
        """Make the running uiautomator2 agent lose its UiAutomation connection (the
        accessibility service died under it, system_server restarted, another client took the
        bridge): it keeps answering `/ping`, and every JSON-RPC call fails with jsonrpc4j's
        -32001 "java.lang.IllegalStateException: UiAutomation not connected!" until its
        process is restarted; an agent started afterwards works. adb still lists the phone."""
        with self._lock:
            self.u2_automation_epoch += 1

    def exhaust_u2_memory(self) -> None:
        """Make the running uiautomator2 agent run out of heap (a long-running server that
        leaks): it keeps answering `/ping`, and every JSON-RPC call fails with jsonrpc4j's
        -32001 "java.lang.OutOfMemoryError" until its process is restarted; an agent started
        afterwards works. adb still lists the phone."""
        with self._lock:
            self.u2_memory_epoch += 1

    def take_u2_hang(self) -> float | None:
        """How long this JSON-RPC call hangs (see `hang_u2_agent`), None when it does not."""
        with self._lock:
            return self._u2_hangs.pop(0) if self._u2_hangs else None

    def stall_service(self, prefix: str, seconds: float, count: int = 1) -> None:
        """Make the phone's adbd sit silent for `seconds` on each of the next `count`
        requests for a device service starting with `prefix` (`"shell:toybox md5sum"`,
        `"sync:"`, `"tcp:9008"`) before it answers, as a stuck phone does (adbd or its
        storage wedged): the client's request is taken and no OKAY comes. A client that
        hangs up meanwhile ends the wait. adb still lists the phone."""
        with self._lock:
            self._service_stalls.extend([(prefix, seconds)] * count)

    def take_service_stall(self, service: str) -> float | None:
        """How long adbd sits on this request (see `stall_service`), None when it does not."""
        with self._lock:
            for i, (prefix, seconds) in enumerate(self._service_stalls):
                if service.startswith(prefix):
                    del self._service_stalls[i]
                    return seconds
        return None

    def close_service(self, prefix: str, count: int = 1) -> None:
        """Make the phone's adbd close each of the next `count` requests for a device service
        starting with `prefix` before it starts it, as a real one does while it cannot start
        the service (restarting, out of processes): the adb server answers `FAIL` "closed"
        (`adb` prints "error: closed"). adb still lists the phone."""
        with self._lock:
            self._service_closes.extend([prefix] * count)

    def take_service_close(self, service: str) -> bool:
        """Whether adbd closes this request unstarted (see `close_service`)."""
        with self._lock:
            for i, prefix in enumerate(self._service_closes):
                if service.startswith(prefix):
                    del self._service_closes[i]
                    return True
        return False

    def fail_u2_call(self, method: str, exception: str, message: str) -> None:
        """Make every later uiautomator2 JSON-RPC call of `method` throw `exception` with
        `message` on the phone (a ROM that refuses the clipboard to the shell user:
        "java.lang.SecurityException: Package android does not belong to 2000",
        openatx/uiautomator2#1029). The agent answers as the real one's jsonrpc4j error
        resolver does (`u2_agent.java_error`)."""
        with self._lock:
            self.u2_call_failures[method] = (exception, message)

    def take_u2_dump_null(self) -> bool:
        """Whether this `dumpWindowHierarchy` answers null (see `u2_dump_nulls`)."""
        with self._lock:
            if self.u2_dump_nulls <= 0:
                return False
            self.u2_dump_nulls -= 1
            return True

    def take_u2_crash(self) -> Literal["", "unanswered", "mid_answer"]:
        """Whether and how the agent dies during this call (see `crash_u2_agent`): ""
        when it does not."""
        with self._lock:
            if not self._u2_crashes:
                return ""
            return "mid_answer" if self._u2_crashes.pop(0) else "unanswered"

    def find(self, text: str) -> Node | None:
        """The first node on screen (topmost window first) whose text or content-desc is
        `text` (for scripts and tests)."""
        with self._lock:
            for surface in reversed(self.surfaces()):
                for node in surface.root.walk():
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
            self.keyboard_up = app.keyboard_on_open(page)

    def pop(self) -> None:
        with self._lock:
            self.keyboard_up = False
            stack = self._stacks[self._foreground]
            if len(stack) > 1:
                stack.pop()
            elif self._foreground != self.launcher_package:
                # Android 12+: Back on a task's root activity moves the task behind the home screen.
                self._foreground = self.launcher_package

    def replace(self, name: str, /, **params: str) -> None:
        with self._lock:
            self._stacks[self._foreground].pop()
            self.push(name, **params)

    def go_home(self) -> None:
        with self._lock:
            self.keyboard_up = False
            self.shade = ""
            self.prompts = [p for p in self.prompts if p.kind != "permission"]
            self._foreground = self.launcher_package

    def launch(self, package: str) -> bool:
        """Start an app from its launcher entry: resume its task, or start it fresh."""
        with self._lock:
            app = self.apps.get(package)
            if app is None:
                return False
            fresh = package not in self._stacks
            if fresh:
                root = app.root()
                root.focus = app.first_focus(root)
                self._stacks[package] = [root]
            self._foreground = package
            self.keyboard_up = False
            self.shade = ""
            self.log.write(
                "I",
                "ActivityTaskManager",
                f"START u0 {{act=android.intent.action.MAIN cat=[android.intent.category."
                f"LAUNCHER] flg=0x10200000 cmp={package}/{app.activity}}}",
            )
            if fresh:
                self._ask_permissions(app)
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
            self.keyboard_up = app.keyboard_on_open(page)
            return True

    def force_stop(self, package: str) -> None:
        with self._lock:
            if package == self.launcher_package or package not in self.apps:
                return
            self._stacks.pop(package, None)
            self.processes.app_stopped(package)
            self.prompts = [p for p in self.prompts if p.app_package != package]
            if self._foreground == package:
                self._foreground = self.launcher_package
                self.keyboard_up = False

    def running_packages(self) -> list[str]:
        with self._lock:
            return list(self._stacks)

    # --- interruptions -----------------------------------------------------------------------

    def show_permission_prompt(
        self, package: str, permission: str = "android.permission.POST_NOTIFICATIONS"
    ) -> None:
        """A runtime permission prompt from `package` over whatever is on screen. Allow grants
        it, Don't allow (or Back) denies it; either way `state.permissions` records it."""
        with self._lock:
            app = self.apps.get(package)
            label = self.strings.tr(app.label) if app else package
            prompt = Prompt(
                "permission", package, label, permission, permission_package=self.permission_package
            )
            key = permission_key(package, permission)

            def answer(value: str) -> Callable[[], None]:
                def done() -> None:
                    self.state.permissions[key] = value
                    self._remove_prompt(prompt)

                return done

            prompt.answers = {"allow": answer("granted"), "deny": answer("denied")}
            self.prompts.append(prompt)
            self.keyboard_up = False

    def show_anr(self, package: str = system_ui.SYSTEM_UI, label: str = "System UI") -> None:
        """ "<label> isn't responding" with Close app and Wait. Wait dismisses it; Close app
        restarts the system UI (shade and keyboard go away) or force-stops an app. While it
        is up the app is hung: `uiautomator dump --windows` lists its window without a tree."""
        with self._lock:
            prompt = Prompt("anr", package, label)
            self.last_anr_focus = f"{self.current_package()}/{self.current_activity()}"

            def close() -> None:
                self._remove_prompt(prompt)
                if package == system_ui.SYSTEM_UI:
                    self.shade = ""
                    self.keyboard_up = False
                else:
                    self.force_stop(package)

            prompt.answers = {"close": close, "wait": lambda: self._remove_prompt(prompt)}
            self.prompts.append(prompt)
            self.keyboard_up = False
            self.log.write("E", "ActivityManager", f"ANR in {package}", pid=1100)

    def _remove_prompt(self, prompt: Prompt) -> None:
        if prompt in self.prompts:
            self.prompts.remove(prompt)

    def show_toast(self, text: str, seconds: float = TOAST_S) -> None:
        """A toast for `seconds` (drawn over everything, never in a hierarchy dump; its text
        reaches uiautomator2's `last_toast`)."""
        with self._lock:
            self._toast = (text, time.monotonic() + seconds)
            self.last_toast = text

    def open_shade(self, quick_settings: bool = False) -> None:
        """Pull the notification shade down (or quick settings all the way)."""
        with self._lock:
            if self.locked:
                return
            self.shade = "quick_settings" if quick_settings else "notifications"
            self.keyboard_up = False

    def close_shade(self) -> None:
        with self._lock:
            self.shade = ""

    def interrupt_after(self, events: int, action: Callable[[], None]) -> None:
        """Run `action` (e.g. `lambda: phone.show_anr()`) right after the `events`-th input
        event from now: a tap, swipe, key or text. For throwing interruptions mid-task."""
        with self._lock:
            self._pending.append(_Pending(max(1, events), action))

    def _ask_permissions(self, app: App) -> None:
        for permission in app.runtime_permissions():
            if permission_key(app.package, permission) not in self.state.permissions:
                self.show_permission_prompt(app.package, permission)
                return

    def _tile_action(self, key: str) -> Callable[[], None]:
        def toggle() -> None:
            self.state.settings[key] = not self.state.flag(key)

        return toggle

    def _open_settings_from_shade(self) -> None:
        self.shade = ""
        self.launch("com.android.settings")

    # --- power and lock ----------------------------------------------------------------------

    def set_screen_lock(self, kind: ScreenLock, pin: str = "") -> None:
        """The lock the phone shows when it sleeps: none, a swipe, or a PIN (secure)."""
        with self._lock:
            self.screen_lock = kind
            self.lock_pin = pin if kind == "pin" else ""

    def sleep(self) -> None:
        """Turn the screen off (and lock it, if a screen lock is set)."""
        with self._lock:
            self.awake = False
            self.keyboard_up = False
            self.shade = ""
            if self.screen_lock != "none":
                self.locked = True
                self.bouncer = False

    def wake(self) -> None:
        with self._lock:
            self.awake = not self.stays_dark

    def dismiss_keyguard(self) -> None:
        """`wm dismiss-keyguard`: a swipe lock goes away; a PIN lock shows its PIN pad."""
        with self._lock:
            if not self.locked:
                return
            if self.screen_lock == "pin":
                self.bouncer = True
            else:
                self.locked = False

    def _unlock_attempt(self) -> None:
        if self._pin_typed == self.lock_pin and self.lock_pin:
            self.locked = self.bouncer = False
        self._pin_typed = ""

    # --- input -------------------------------------------------------------------------------

    def _input_done(self) -> None:
        """After every input event: pages settle, pending interruptions come due."""
        app = self.apps[self._foreground]
        app.settle(self, self.current_page())
        due = []
        for pending in list(self._pending):
            pending.remaining -= 1
            if pending.remaining <= 0:
                self._pending.remove(pending)
                due.append(pending.action)
        for action in due:
            action()

    def _surface_at(self, x: int, y: int) -> Surface | None:
        for surface in reversed(self.surfaces()):
            if contains(surface.root.bounds, x, y) or surface.modal:
                return surface
        return None

    def tap(self, x: int, y: int) -> None:
        with self._lock:
            self.taps.append((x, y))
            if self.awake:
                self._tap(x, y)
            self._input_done()

    def _tap(self, x: int, y: int) -> None:
        surface = self._surface_at(x, y)
        if surface is None:
            return
        node = hit_test(surface.root, x, y)
        if node is None or node.on_click is None:
            return
        node.on_click()
        if surface.kind == "app" and node.role == "edit":
            self.keyboard_up = True

    def long_press(self, x: int, y: int) -> None:
        """Like Android: a long-clickable view gets the long click; any other view under the
        finger gets an ordinary click when the finger lifts."""
        with self._lock:
            if self.awake:
                surface = self._surface_at(x, y)
                node = hit_test(surface.root, x, y, long_press=True) if surface else None
                if node is not None and node.on_long_click is not None:
                    node.on_long_click()
                else:
                    self._tap(x, y)
            self._input_done()

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        """A drag: pulls the shade down from the status bar, unlocks a swiped lock screen,
        spins a picker or scrolls the list under its start point; one that does not move is a
        tap (a long press if it lasts). The caller waits `duration_ms` (the shell's `input
        swipe` does); the phone applies the drag at once."""
        with self._lock:
            if self.awake:
                self._swipe(x1, y1, x2, y2, duration_ms)
            self._input_done()

    def _swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int) -> None:
        if abs(x2 - x1) < TOUCH_SLOP and abs(y2 - y1) < TOUCH_SLOP:
            if duration_ms >= LONG_PRESS_MS:
                surface = self._surface_at(x1, y1)
                node = hit_test(surface.root, x1, y1, long_press=True) if surface else None
                if node is not None and node.on_long_click is not None:
                    node.on_long_click()
                    return
            self._tap(x1, y1)
            return
        if abs(y2 - y1) < abs(x2 - x1):
            return  # horizontal drags move nothing on these screens
        down = y2 > y1
        if self.locked:
            if not down and not self.bouncer:
                self.dismiss_keyguard()
            return
        if self.shade:
            if down:
                self.shade = "quick_settings"
            else:
                self.shade = ""
            return
        if down and y1 < STATUS_BAR_H:
            self.open_shade()
            return
        surface = self._surface_at(x1, y1)
        if surface is None or surface.kind != "app":
            return
        lst = scroller_at(surface.root, x1, y1)
        if lst is None:
            return
        if lst.on_scroll is not None:
            lst.on_scroll(y1 - y2)
            return
        if not lst.scroll_key:
            return
        page = self.current_page()
        viewport = lst.frame[3] - lst.frame[1]
        limit = max(0, lst.content_height - viewport)
        current = page.scroll.get(lst.scroll_key, 0)
        page.scroll[lst.scroll_key] = min(max(current + (y1 - y2), 0), limit)

    def input_text(self, text: str) -> None:
        """Type into the focused field; with no field focused the keystrokes go nowhere."""
        with self._lock:
            self._type(text)
            self._input_done()

    def _type(self, text: str) -> None:
        if self.locked:
            if self.bouncer:
                self._pin_typed += text
            return
        if self.prompts or self.shade:
            return  # a dialog or the shade has focus: it has no field to type into
        page = self.current_page()
        if page.focus is None:
            return
        current = "" if page.select_all else page.fields.get(page.focus, "")
        page.select_all = False
        page.fields[page.focus] = current + text
        page.error = ""

    def _key_press(self, value: str) -> None:
        """A key of the on-screen keyboard."""
        if value == "del":
            self._press(67)
        elif value == "enter":
            self._press(66)
        elif value:
            self._type(value)

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
            self._press(code)
            self._input_done()
            return True

    def _press(self, code: int) -> None:
        if code in (26, 223, 224):  # POWER toggles, SLEEP, WAKEUP
            if code == 224 or (code == 26 and not self.awake):
                self.wake()
            else:
                self.sleep()
            return
        if not self.awake:
            return
        if self.locked:
            if code == 4 and self.bouncer:
                self.bouncer = False
            elif code == 66 and self.bouncer:
                self._unlock_attempt()
            elif code == 82 and self.screen_lock == "swipe" and self.menu_unlocks:
                self.locked = False
            return
        page = self.current_page()
        if code == 4:
            if self.prompts:
                # The "isn't responding" dialog sits above a permission prompt.
                top = next((p for p in reversed(self.prompts) if p.kind == "anr"), self.prompts[-1])
                top.answers.get("deny" if top.kind == "permission" else "wait", lambda: None)()
            elif self.shade:
                self.shade = ""
            elif self.keyboard_shown():
                self.keyboard_up = False
            else:
                self.pop()
        elif code == 3:
            self.go_home()
        elif code == 187:
            self.shade = ""
        elif self.prompts or self.shade:
            return
        elif code in (66, 61):
            app = self.apps[self._foreground]
            order = app.field_order(page)
            if page.focus in order:
                i = order.index(page.focus)
                page.focus = order[i + 1] if i + 1 < len(order) else page.focus
                page.select_all = False
        elif code == 67:
            if page.focus is not None:
                page.fields[page.focus] = page.fields.get(page.focus, "")[:-1]
                page.select_all = False
        else:
            ch = typed_char(code)
            if ch:
                self._type(ch)


def _keycode(key: str | int) -> int | None:
    if isinstance(key, int):
        return key
    key = key.strip()
    if key.isdigit():
        return int(key)
    name = key.upper().removeprefix("KEYCODE_")
    return KEYCODES.get(name)
