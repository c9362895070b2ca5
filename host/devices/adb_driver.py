"""A phone driven through an adb server with `adbutils`: plain `adb shell` commands, no agent app.

This is the driver that also drives the virtual phone unchanged, because the virtual phone
speaks the adb server protocol.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from host.devices import adb_transport, screencap
from host.devices.adb_errors import (
    ensure_listed,
    mapped_errors,
    no_server,
    server_reachable,
    services_down,
)
from host.devices.base import (
    DeviceBusy,
    DeviceError,
    DeviceGone,
    KeyName,
    ScreenshotError,
    ScreenState,
    ScreenUnavailable,
)
from host.devices.bridge import BRIDGE_WAIT_S, held, retry_while_held
from host.devices.input_method import COMMAND as INPUT_METHOD_COMMAND
from host.devices.input_method import InputMethodCache
from host.devices.screen_size import ScreenSizeReader
from host.devices.screen_state import (
    SCREEN_STATE_COMMAND,
    SDK_COMMAND,
    has_dismiss_keyguard,
    parse_screen_state,
    parse_sdk,
    unlock_swipe,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_KEYCODES: dict[str, str] = {
    "back": "KEYCODE_BACK",
    "home": "KEYCODE_HOME",
    "enter": "KEYCODE_ENTER",
    "delete": "KEYCODE_DEL",
}
# Echoed after every shell command: its absence means the stream ended before the shell did.
_SHELL_END = "--amc-shell-end--"
#: The longest shell command line one request may carry. adbd before Android 7 takes adb
#: packets of 4096 bytes (MAX_PAYLOAD_V1), and a request's service name (`shell:` + the line
#: + `_SHELL_END`'s echo + a NUL) must fit in one: a longer one cannot be opened (the adb
#: server gives up with "destination oversized" and the connection drops unanswered).
SHELL_LINE_MAX = 4096 - 2 - len(f"shell:; echo {_SHELL_END}")
_INPUT_TEXT = "input text "
_FOCUS_RES = (
    re.compile(r"mCurrentFocus=Window\{[^}]*\s([\w.]+)/([\w.$]+)\}"),
    re.compile(r"mFocusedApp=.*?\s([\w.]+)/([\w.$]+)"),
    re.compile(r"mResumedActivity.*?\s([\w.]+)/([\w.$]+)"),
    re.compile(r"ResumedActivity.*?\s([\w.]+)/([\w.$]+)"),
)
#: The start of one display's block in `dumpsys window` (Android 10 and later).
_DISPLAY_BLOCK_RE = re.compile(r"^\s*Display: mDisplayId=(\d+)\b.*$", re.MULTILINE)
#: Where `dumpsys window` (no section named) starts its snapshot of the last ANR, the line
#: before the snapshot's copy of the display contents, and how every section's header starts.
_LAST_ANR = "WINDOW MANAGER LAST ANR"
_ANR_CONTINUED = "Last ANR continued"
_SECTION = "WINDOW MANAGER "
_PACKAGE_RE = re.compile(r"^[A-Za-z][\w]*(\.[A-Za-z_][\w]*)*$")
_DUMP_DIR = "/data/local/tmp"
# The process name `uiautomator dump` runs under (`ps -A`, `pidof`), and how long stopping a
# stuck one may wait on each call.
_DUMPER = "uiautomator"
#: The pid a dump's shell prints first (`_dump_to`); `\r`: a pty's line end (adb before
#: Android 7).
_PID_LINE = re.compile(rb"^(\d+)\r?\n")
#: How the driver runs the dumper (`_dump_to`; the dump file's path follows): the shell's pid
#: first, then the dumper under it. A test stalls or closes the service by this prefix.
DUMP_COMMAND = f"echo $$; exec {_DUMPER} dump --windows"
#: The same without `--windows`, for Android 4.1-4.2: their DumpCommand takes its first
#: argument for the file (`new File(args[0])`), so it writes (and fails to write, `/` being
#: read-only) a file named `--windows` and still says "dumped to: /--windows".
PLAIN_DUMP_COMMAND = f"echo $$; exec {_DUMPER} dump"
_DUMPED_TO = re.compile(r"dumped to: (\S+)")
_CLEANUP_TIMEOUT_S = 5.0
#: How often a stopped dumper is looked for until it has exited.
_DUMPER_EXIT_POLL_S = 0.05
# Characters the remote shell would interpret in an `input text` argument; each is
# backslash-escaped. `%` is not one of them (a backslash before it does nothing for `input`).
_SHELL_SPECIAL = set("\\'\"`$&|;<>()[]{}*?!~#^")
# Between a literal `%` and a literal `s`: where `input_text` splits its `input text` calls.
_PERCENT_S_SPLIT = re.compile(r"(?<=%)(?=s)")
# What `input` prints when it fails: "Exception occurred while executing 'text':" + a Java
# stack trace (Android 11+), "Error: Unknown keycode: …", a usage text after "Error: Invalid
# arguments…".
_INPUT_FAILED = ("Exception", "Error:")
# What a phone that refuses injected input says (its SecurityException names the permission),
# and what allows it on the makers known to ship that refusal.
_INJECTION_REFUSED = "INJECT_EVENTS"
_INJECTION_REFUSED_HINT = (
    "; the phone refuses injected input: on Xiaomi, Redmi and POCO phones turn on Developer "
    "options > 'USB debugging (Security settings)' (other makers: their equivalent setting)"
)
_EXCEPTION_RE = re.compile(r"\b(?:[a-z]\w*\.)+[A-Z]\w*(?:Exception|Error)\b")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# What `uiautomator dump` prints when the screen is animating or a window is changing, and what
# the shell prints for a dumper that died of a signal (the low-memory killer's SIGKILL, an ART
# runtime abort's SIGABRT): passing states, worth another try (see `DeviceBusy`).
_BUSY_DUMP = ("could not get idle state", "null root node returned by", "Killed", "Aborted")
# What the shell prints alone on a line for a child a signal ended (SIGKILL, SIGABRT, SIGSEGV).
_SIGNAL_DEATHS = frozenset({"Killed", "Aborted", "Segmentation fault"})
# Java exceptions a dumper throws while the window it walks changes under it (a node gone
# between listing and reading it: the NullPointerException in childNafCheck); passing too.
_JAVA_CRASH = ("java.lang.NullPointerException", "java.lang.IllegalStateException")
# What a sync pull of a file that is not there fails with (adbd: "open failed: No such file or
# directory"; older servers word it "does not exist").
#: How a whole dump ends (`--windows`, and a single window's before that option).
_DUMP_ENDS = ("</displays>", "</hierarchy>")
#: Below this much free space in the dump folder an empty, cut or missing dump is the
#: storage's doing (a dump is tens to hundreds of KiB).
_FULL_BELOW_KIB = 1024
#: The largest dump file a look reads (`AdbDriver.dump_max_bytes`). Real dumps are tens of
#: KiB to a few MiB; a larger one (a runaway app's endless list, a corrupt file) was read
#: whole into the memory of the one host process that drives every phone, and parsed, to
#: keep at most `MAX_ELEMENTS` of it.
DUMP_MAX_BYTES = 16 * 1024 * 1024
#: The most `screencap -p` output a look reads (`AdbDriver.screenshot_max_bytes`): a 4K
#: screen's PNG is a few tens of MiB at worst; more is no screenshot, and was kept whole.
SCREENSHOT_MAX_BYTES = 64 * 1024 * 1024
_MISSING_FILE = ("No such file or directory", "does not exist")
# What Android's shell (mksh) says for a command the build does not have; older ones and
# toybox's sh say "not found".
_NOT_FOUND = ("inaccessible or not found", "not found")


def decode_dump(data: bytes) -> str:
    """A dump file's bytes as text: UTF-16 when it starts with a UTF-16 byte order mark, else
    UTF-8 (a UTF-8 byte order mark dropped, undecodable bytes replaced). The XML declaration's
    `encoding` is not trusted: some dumpers write "utf-16" over a UTF-8 body."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    return data.removeprefix(b"\xef\xbb\xbf").decode("utf-8", errors="replace")


def parse_df_free_kib(output: str) -> int | None:
    """The available KiB `df PATH` reports (toybox and busybox: 1K blocks, available in the
    fourth column of the last row), or None when it names none."""
    for line in reversed(output.strip().splitlines()):
        fields = line.split()
        if len(fields) >= 6 and fields[3].isdigit():
            return int(fields[3])
    return None


def dump_failure(serial: str, output: str) -> DeviceError | None:
    """The error a `uiautomator dump` run reported, if any: `DeviceBusy` for the passing kinds.

    Only output saying "dumped to" is a dump (AOSP's DumpCommand prints it last); anything
    else failed. Passing: "ERROR: could not get idle state." / "null root node", a dumper the
    low-memory killer took ("Killed") or its runtime aborted ("Aborted": a fresh process each
    time, so the next one runs), a NullPointerException or IllegalStateException trace,
    and no output at all: AOSP's dumper dies with a NullPointerException in childNafCheck
    when a node vanishes while the screen changes, and that trace goes to logcat, not to the
    shell (seen on ~20% of first dumps on some API 34 emulators). "… already registered!"
    (an IllegalStateException too) means another UiAutomation client holds the accessibility
    bridge: `BridgeHeld`, which the driver waits out for a bounded time (`retry_while_held`).
    No retry brings a build without `uiautomator` ("… inaccessible or not found"), which the
    error says how to drive; other text (a native crash, "Segmentation fault") is not passing
    either. Both are `ScreenUnavailable`: the phone's condition, not the task's, so the
    attempt ends retryable (another phone, or this one mended, can run it) instead of the
    task failing for good."""
    if "dumped to" in output:
        return None
    shown = output.strip()[-300:]
    if any(f"{_DUMPER}: {words}" in output for words in _NOT_FOUND):
        return ScreenUnavailable(
            f"phone {serial} has no `{_DUMPER}` command (its build leaves it out), so the "
            "adbutils driver cannot read its screen: drive it with the uiautomator2 driver "
            "(AMC_HOST_DRIVER=uiautomator2), which brings its own"
        )
    if "already registered" in output:
        return held(serial, "uiautomator dump")
    if not shown:
        return DeviceBusy(
            f"uiautomator dump on {serial} printed nothing (it died midway, most likely "
            "the NullPointerException a node vanishing mid-dump causes; see logcat)"
        )
    message = f"uiautomator dump failed on {serial}: {shown!r}"
    if any(marker in output for marker in (*_BUSY_DUMP, *_JAVA_CRASH)):
        return DeviceBusy(message)
    return ScreenUnavailable(message)


def png_from_screencap(serial: str, data: bytes) -> bytes:
    """The PNG in `screencap -p` output. On a phone with several displays (a foldable's cover
    screen, a cast display) screencap first prints a "[Warning] Multiple displays were found…"
    text on the same stream; the image after it is whole, so it is cut at the PNG signature."""
    start = data.find(_PNG_SIGNATURE)
    if start < 0:
        raise ScreenshotError(f"screencap on {serial} returned no PNG ({data[:40]!r})")
    return data[start:]


def escape_input_text(text: str) -> str:
    """Escape one piece of text for `adb shell input text` (see `input_text_commands`).

    `input text` takes one argument, so spaces are written as `%s` (Android's `input` turns
    every `%s` into a space); tabs and line breaks also become `%s` (as keys they would move
    focus or submit the form instead). The remote shell would interpret quotes, `$`, `&` and
    friends, so each gets a backslash. A literal `%` directly followed by a literal `s` cannot
    be written at all: callers must split the text there (`input_text_commands` does).
    """
    out: list[str] = []
    for ch in text:
        if ch in " \n\r\t":
            out.append("%s")
        elif ch in _SHELL_SPECIAL:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def input_text_commands(text: str, max_line: int = SHELL_LINE_MAX) -> list[str]:
    """The `input text` commands that, run in order, type exactly `text` (tabs and line breaks
    as spaces), each at most `max_line` characters long.

    Android's `input text` (InputShellCommand.sendText) replaces every `%s` in its argument by
    a space and has no escape for a literal `%s`: `\\%s` reaches it as `%s` once the shell drops
    the backslash, and `%%s` types `% `. So text is split between each literal `%` and the `s`
    after it ("a%sb" → `input text a%`, `input text sb`): a `%` at the end of one argument
    has nothing after it to pair with. Spaces next to a `%` stay exact (`% ` → `%%s` → `% `).
    A long text is cut into more commands (see `SHELL_LINE_MAX`); a cut anywhere is safe, as
    each piece is escaped on its own.
    """
    room = max_line - len(_INPUT_TEXT)
    commands: list[str] = []
    for part in _PERCENT_S_SPLIT.split(text):
        piece: list[str] = []
        size = 0
        for ch in part:
            escaped = escape_input_text(ch)
            if size + len(escaped) > room and piece:
                commands.append(_INPUT_TEXT + "".join(piece))
                piece, size = [], 0
            piece.append(escaped)
            size += len(escaped)
        if piece:
            commands.append(_INPUT_TEXT + "".join(piece))
    return commands


def shell_lines(commands: list[str], max_line: int = SHELL_LINE_MAX) -> list[str]:
    """`commands` joined by `&&` (a failure stops the rest) into as few lines of at most
    `max_line` characters as they fit in, in order; one longer command stands alone."""
    lines: list[str] = []
    for cmd in commands:
        if lines and len(lines[-1]) + 4 + len(cmd) <= max_line:
            lines[-1] += " && " + cmd
        else:
            lines.append(cmd)
    return lines


def without_last_anr(dumpsys: str) -> str:
    """`dumpsys window` output without its LAST ANR section: the window manager's state frozen
    when the last "isn't responding" dialog came up, kept for two hours (AOSP's
    saveANRStateLocked), with that moment's `mCurrentFocus` and, after "Last ANR continued",
    a copy of the display contents under their own header. The live sections follow it."""
    start = dumpsys.find(_LAST_ANR)
    if start < 0:
        return dumpsys
    lines = dumpsys[start:].splitlines(keepends=True)
    previous = lines[0]
    for i, line in enumerate(lines[1:], 1):
        if line.startswith(_SECTION) and previous.strip() != _ANR_CONTINUED:
            return dumpsys[:start] + "".join(lines[i:])
        previous = line
    return dumpsys[:start]


def parse_current_window(dumpsys: str, display: int = 0) -> str:
    """The focused window as `package/activity` from `dumpsys window` (or `dumpsys
    activity`) output; "" when it names none.

    From Android 10 `dumpsys window` names the focus of each display in its own block
    (`Display: mDisplayId=N`), and a second display that has focus (a cast or cover screen)
    may be listed first: only the block of `display`, the one the host drives, is read then.
    The focus frozen at the last ANR (`without_last_anr`) is never read.
    """
    dumpsys = without_last_anr(dumpsys)
    blocks = _DISPLAY_BLOCK_RE.split(dumpsys)
    if len(blocks) > 1:
        # [before the first block, id, block, id, block, ...]
        ours = [
            body for n, body in zip(blocks[1::2], blocks[2::2], strict=True) if int(n) == display
        ]
        dumpsys = "".join(ours)
    for pattern in _FOCUS_RES:
        m = pattern.search(dumpsys)
        if m:
            return f"{m.group(1)}/{m.group(2)}"
    return ""


def parse_current_package(dumpsys: str) -> str:
    """The foreground package from `dumpsys window` (or `dumpsys activity`) output."""
    return parse_current_window(dumpsys).partition("/")[0]


def check_package(package: str) -> str:
    """Refuse anything that is not a plain package name, so it cannot smuggle shell syntax."""
    if not _PACKAGE_RE.match(package):
        raise DeviceError(f"not a package name: {package!r}")
    return package


def monkey_launch(package: str) -> str:
    """The command both drivers launch an app with: its launcher activity, found by monkey."""
    return f"monkey -p {check_package(package)} -c android.intent.category.LAUNCHER 1"


def signal_death(serial: str, what: str, output: str) -> DeviceBusy | None:
    """The `DeviceBusy` for a command the shell reports killed by a signal, else None.
    `input` and `monkey` are app_process programs the low-memory killer can take, or whose
    runtime aborts: their output then holds no failure they printed themselves, and read as
    done. Whether the tap, text or launch happened is unknown (an unanswered action)."""
    died = next((ln.strip() for ln in output.splitlines() if ln.strip() in _SIGNAL_DEATHS), "")
    if not died:
        return None
    return DeviceBusy(
        f"{what} on {serial}: the command died ({died!r}) before it said it was done, so "
        "whether it took effect is unknown"
    )


def check_launched(serial: str, package: str, output: str) -> None:
    """Raise `DeviceError` when `monkey_launch` output says nothing was started: for an app
    that is not installed (or has no launcher activity) monkey prints "** No activities found
    to run, monkey aborted." and exits 0 on most builds, so only its words tell."""
    down = services_down(serial, f"launch {package}", output) or signal_death(
        serial, f"launch {package}", output
    )
    if down is not None:
        raise down
    if "No activities found" in output or "monkey aborted" in output.lower():
        raise DeviceError(f"cannot launch {package} on {serial}: {output.strip()!r}")


def _pid(head: bytes | bytearray) -> str | None:
    """The pid a dump's shell printed first (`DUMP_COMMAND`), if it came."""
    found = _PID_LINE.match(head)
    return found[1].decode() if found else None


class AdbDriver:
    """`Driver` over `adbutils`: shell `input`, `uiautomator dump` + sync pull, `screencap -p`."""

    def __init__(
        self,
        serial: str,
        host: str = "127.0.0.1",
        port: int = 5037,
        timeout_s: float = adb_transport.DEFAULT_TIMEOUT_S,
        dump_timeout_s: float | None = None,
        screenshot_timeout_s: float | None = None,
        transport_id: int | None = None,
        bridge_wait_s: float = BRIDGE_WAIT_S,
    ) -> None:
        self._serial = serial
        #: adb's transport id for a phone whose serial another listed phone shares (adb
        #: refuses the serial then: "more than one device"); None: addressed by serial.
        self._tid = transport_id
        self._addr = (host, port)
        #: How long one read may wait for the phone before the call fails as `DeviceBusy`.
        self.timeout_s = timeout_s
        #: The same for `uiautomator dump` and `screencap`, the calls a slow phone needs
        #: longer for (`timeout_s` when not given).
        self.dump_timeout_s = dump_timeout_s or timeout_s
        self.screenshot_timeout_s = screenshot_timeout_s or timeout_s
        #: How long a dump waits for the accessibility bridge another client holds.
        self.bridge_wait_s = bridge_wait_s
        #: The largest dump file read (`DUMP_MAX_BYTES`); a larger one is no tree.
        self.dump_max_bytes = DUMP_MAX_BYTES
        #: The most screencap output read (`SCREENSHOT_MAX_BYTES`); more is no screenshot.
        self.screenshot_max_bytes = SCREENSHOT_MAX_BYTES
        self._client = adb_transport.Client(host=host, port=port)
        self._size = ScreenSizeReader(serial)
        #: `DUMP_COMMAND`, or `PLAIN_DUMP_COMMAND` once the dumper took `--windows` for its
        #: file (`_dump_to`).
        self._dump_command = DUMP_COMMAND
        self._sdk: int | None = None
        self._ime = InputMethodCache(
            serial, lambda: self._shell(INPUT_METHOD_COMMAND, "read input method")
        )

    @property
    def serial(self) -> str:
        return self._serial

    def _server(self, what: str) -> None:
        if not server_reachable(*self._addr):
            raise no_server(self._serial, what, *self._addr)

    def _adb(self, what: str, fn: Callable[[], T]) -> T:
        """`fn()`, an adb request to the phone, its failures checked against adb's device
        list: a phone no longer listed as "device" is `DeviceGone`. One still listed is not:
        a failure that reads like a vanished phone (adbd closing the request unstarted, which
        the adb server reports as "closed", while it restarts or runs out of processes) is
        `DeviceBusy`, tried again like any passing failure, not a phone to report offline."""
        self._server(what)
        try:
            with mapped_errors(self._serial, what):
                return fn()
        except DeviceBusy:
            raise
        except DeviceGone as exc:
            if exc.state:  # adb itself named the state ("device offline", "unauthorized")
                raise
            ensure_listed(self._client, self._addr, self._serial, what, self._tid)
            raise DeviceBusy(
                f"{what} failed on {self._serial}: adb ended the request ({exc.__cause__ or exc}) "
                "while it still lists the phone (its adbd closes requests while it restarts "
                "or is out of processes)"
            ) from exc
        except DeviceError:
            ensure_listed(self._client, self._addr, self._serial, what, self._tid)
            raise

    def _run(
        self,
        service: str,
        what: str,
        timeout_s: float | None = None,
        received: bytearray | None = None,
        limit: int | None = None,
    ) -> bytes:
        """Run an adb service (`shell:…`, `exec-out:…`) on the phone; all it wrote (see
        `_adb` for its failures; `received`, `limit`: `adb_transport.run`)."""
        return self._adb(
            what,
            lambda: adb_transport.run(
                self._client,
                self._serial,
                service,
                timeout_s or self.timeout_s,
                self._tid,
                received,
                limit,
            ),
        )

    def _shell(self, cmd: str, what: str, timeout_s: float | None = None) -> str:
        """Run `cmd` in the phone's shell; its output.

        A phone unplugged or offline for a moment mid-command does not break the stream: the
        adb server closes its sockets cleanly, so what had arrived reads like a command that
        finished (a swipe cut short as a swipe done). `_SHELL_END` is echoed after the
        command, as adbutils' own `shell2` echoes the exit code: output without it is checked
        against adb's device list, and is `DeviceGone` when the phone is no longer listed as
        "device", `DeviceBusy` when it is again (a USB hiccup)."""
        out = self._run(f"shell:{cmd}; echo {_SHELL_END}", what, timeout_s)
        text = out.decode("utf-8", errors="replace")
        body, end, _ = text.rpartition(_SHELL_END)
        if end:
            return body
        ensure_listed(self._client, self._addr, self._serial, what, self._tid)
        raise DeviceBusy(
            f"{what} on {self._serial} was cut short: adb closed the command's stream before "
            "it ended (the phone went offline for a moment and is listed again), so whether "
            "it took effect is unknown"
        )

    def screen_size(self) -> tuple[int, int]:
        """The size in the current rotation (dumps and `input` use it; see
        `ScreenSizeReader.read`)."""
        return self._size.read(self._shell)

    def screenshot_png(self) -> bytes:
        """`screencap -p`'s PNG. One that does not end with its IEND chunk was cut short (the
        phone unplugged mid-transfer: the stream ends cleanly), so adb is asked whether the
        phone is still there before the image is judged."""
        data = screencap.capture(
            self._serial,
            self.screenshot_max_bytes,
            lambda service, limit: self._run(
                service, "screencap", self.screenshot_timeout_s, limit=limit
            ),
            lambda: ensure_listed(self._client, self._addr, self._serial, "screencap", self._tid),
            self._sdk_level(),
        )
        return png_from_screencap(self._serial, data)

    def dump_hierarchy(self) -> str:
        """Every window's tree (`--windows`: app, keyboard, dialogs, system bars), so a
        keyboard or a dialog over the app is seen as one; releases before the option ignore
        it and dump the active window. The file is removed whatever happened: a dumper that
        died midway leaves an empty or cut one behind."""
        remote = f"{_DUMP_DIR}/amc-{uuid.uuid4().hex[:12]}.xml"
        try:
            xml = decode_dump(retry_while_held(lambda: self._dump_to(remote), self.bridge_wait_s))
            if not xml.rstrip().endswith(_DUMP_ENDS):
                self._refuse_if_full()  # empty or cut short: a full phone writes what fits
            return xml
        finally:
            with contextlib.suppress(DeviceError):
                self._shell(f"rm -f {remote}", "remove dump")

    def _dump_to(self, remote: str) -> bytes:
        # The shell prints its pid, then `exec`s the dumper (whose own script `exec`s
        # app_process), which keeps that pid: the one process a stuck dump is ended by. No
        # `_SHELL_END` after it (nothing runs after an `exec`): only output saying "dumped to"
        # is a dump (`dump_failure`), so a stream adb cut short is no dump either.
        head = bytearray()
        try:
            raw = self._run(
                f"shell:{self._dump_command} {remote}",
                "uiautomator dump",
                self.dump_timeout_s,
                received=head,
            )
        except DeviceBusy:
            # Timed out, or ended by adb: the dumper may still run on the phone (adbd does not
            # end it when the client hangs up), holding the accessibility bridge, and the
            # retry would fail with "… already registered!" until it ends.
            self._stop_dumper(_pid(head))
            raise
        out = _PID_LINE.sub(b"", raw, count=1).decode("utf-8", errors="replace")
        if not out.strip():
            # Nothing after the pid: the dumper died (the NullPointerException a node vanishing
            # mid-dump causes), or adb cut the stream short while it ran on.
            self._stop_dumper(_pid(raw))
        failure = dump_failure(self._serial, out)
        if isinstance(failure, DeviceBusy):
            # Empty output from a phone that vanished right after: said as gone, not busy.
            ensure_listed(self._client, self._addr, self._serial, "uiautomator dump", self._tid)
        if failure is not None:
            raise failure
        written = _DUMPED_TO.search(out)
        if (
            written is not None
            and written[1].rpartition("/")[2] == "--windows"
            and self._dump_command == DUMP_COMMAND
        ):
            log.info(
                "%s: its uiautomator takes the first argument for the file (Android 4.1-4.2); "
                "dumping without --windows",
                self._serial,
            )
            self._dump_command = PLAIN_DUMP_COMMAND
            return self._dump_to(remote)
        try:
            return self._adb(
                "pull hierarchy",
                lambda: adb_transport.pull(
                    self._client,
                    self._serial,
                    remote,
                    self.timeout_s,
                    self._tid,
                    limit=self.dump_max_bytes,
                ),
            )
        except adb_transport.TooLarge as exc:
            # Busy, as a dump cut short: the look tries again (the screen may have moved on)
            # and then goes on from the screenshot, this reason given (`Perceiver`).
            raise DeviceBusy(
                f"uiautomator dump on {self._serial} is over the {exc.limit} bytes a look "
                "reads (not read)"
            ) from exc
        except (DeviceGone, DeviceBusy):
            raise
        except DeviceError as exc:
            if any(marker in str(exc) for marker in _MISSING_FILE):
                self._refuse_if_full()
                # "dumped to" but no file: the accessibility window list was still empty
                # (system_server fills it lazily for a new client); a moment later it is not.
                raise DeviceBusy(
                    f"uiautomator dump on {self._serial} wrote no file (no windows listed yet)"
                ) from exc
            raise

    def _refuse_if_full(self) -> None:
        """`DeviceBusy` saying so when the dump folder's storage is full: the dumper still
        reports "dumped to" when its write fails (the IOException goes to logcat), so a full
        phone's dump reads as missing or malformed, and the operator never learnt to free it.
        Busy, so the look retries (space may come back) and then goes on without a tree,
        that reason given. A failed `df` says nothing: the caller's own reason stands."""
        try:
            free = parse_df_free_kib(self._shell(f"df {_DUMP_DIR}", "df"))
        except DeviceGone:
            raise
        except DeviceError as exc:
            log.debug("%s: no free space read: %s", self._serial, exc)
            return
        if free is not None and free < _FULL_BELOW_KIB:
            raise DeviceBusy(
                f"uiautomator dump on {self._serial} could not write its file: the phone's "
                f"storage is full ({free} KiB free in {_DUMP_DIR}); free some space on the phone"
            )

    def _stop_dumper(self, pid: str | None) -> None:
        """End this driver's dumper `pid` while `pidof` still names it a `uiautomator` (a pid
        reused since is left alone), and wait until it has exited; best effort (a failure is
        logged; the retry then says what is wrong). Only that one, as the Node host does
        (examples/node-host/host.js, `stopDumper`): every `uiautomator` was killed before,
        another tool's dump or test run driving the same phone too. No pid (the shell's first
        line never came: adb closed the request unstarted, or the phone never answered):
        none is killed, and a retry that finds the bridge held waits it out
        (`retry_while_held`)."""
        if pid is None:
            log.info("%s: no pid of the uiautomator dump came back: none is stopped", self._serial)
            return
        timeout = min(self.timeout_s, _CLEANUP_TIMEOUT_S)
        try:
            if not self._dumper_runs(pid, timeout):
                return
            self._shell(f"kill {pid}", "stop stuck uiautomator dump", timeout)
            log.info("%s: stopped a stuck uiautomator dump (pid %s)", self._serial, pid)
            # `kill` only sends the signal: the dumper lets go of the bridge when it has exited,
            # and a retry before that fails with "… already registered!".
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self._dumper_runs(pid, timeout):
                time.sleep(_DUMPER_EXIT_POLL_S)
        except DeviceError as exc:
            log.warning("%s: could not stop a stuck uiautomator dump: %s", self._serial, exc)

    def _dumper_runs(self, pid: str, timeout: float) -> bool:
        out = self._shell(f"pidof {_DUMPER}", "find stuck uiautomator dump", timeout)
        return pid in out.split()

    def screen_state(self) -> ScreenState:
        return parse_screen_state(self._shell(SCREEN_STATE_COMMAND, "screen state"))

    def wake(self) -> None:
        self._input("input keyevent KEYCODE_WAKEUP", "wake")

    def dismiss_keyguard(self) -> None:
        """`wm dismiss-keyguard` from Android 8 on; before it MENU, then a swipe up if the
        lock screen is still there (see `DISMISS_KEYGUARD_MIN_SDK`)."""
        if has_dismiss_keyguard(self._sdk_level()):
            self._shell("wm dismiss-keyguard", "dismiss keyguard")
            return
        self._input("input keyevent KEYCODE_MENU", "dismiss keyguard")
        if self.screen_state().locked:
            self.swipe(*unlock_swipe(self.screen_size()))

    def _sdk_level(self) -> int | None:
        """The phone's API level, read once (None when it does not say)."""
        if self._sdk is None:
            self._sdk = parse_sdk(self._shell(SDK_COMMAND, "read API level"))
        return self._sdk

    def tap(self, x: int, y: int) -> None:
        self._input(f"input tap {int(x)} {int(y)}", "tap")

    def long_press(self, x: int, y: int, duration_ms: int = 800) -> None:
        # A swipe that does not move is a long press on every Android version.
        self._input(f"input swipe {x} {y} {x} {y} {int(duration_ms)}", "long press")

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        self._input(
            f"input swipe {int(x1)} {int(y1)} {int(x2)} {int(y2)} {int(duration_ms)}", "swipe"
        )

    def _input(self, cmd: str, what: str, *, quote: bool = True) -> None:
        """Run an `input …` command and raise `DeviceError` when its output reports a failure
        (the exit code of a plain `shell:` is not seen, and `input` printed its exception
        with exit status 0 on older releases). The message quotes the Java exception's line
        (Android 11+ prints "Exception occurred while executing 'tap':" first and the cause
        on the next line), else the first failure line; with `quote=False` only the
        exception's class name: typed text may be a secret and must not reach an error
        message. A phone that refuses injected input gets the setting that allows it."""
        out = self._shell(cmd, what)
        down = services_down(self._serial, what, out)
        if down is not None:
            raise down
        died = signal_death(self._serial, what, out)
        if died is not None:
            raise died
        if not any(marker in out for marker in _INPUT_FAILED):
            return
        lines = out.splitlines()
        m = _EXCEPTION_RE.search(out)
        if quote:
            line = next((ln for ln in lines if _EXCEPTION_RE.search(ln)), None) or next(
                ln for ln in lines if any(k in ln for k in _INPUT_FAILED)
            )
            cause = repr(line.strip()[:200])
        else:
            cause = m.group(0) if m else "an error"
        hint = _INJECTION_REFUSED_HINT if _INJECTION_REFUSED in out else ""
        raise DeviceError(
            f"{what} failed on {self._serial}: Android's input reported {cause}{hint}"
        )

    def input_text(self, text: str) -> None:
        if not text:
            return
        if not text.isascii():
            # `input text` maps characters through the virtual keyboard's key map, which has
            # none for é, ß, CJK, emoji…: it throws and types nothing of the chunk. Refused
            # up front, the text kept out of the message (it may be a secret).
            raise DeviceError(
                f"input text failed on {self._serial}: adb's 'input text' can type ASCII "
                "only and this text has other characters (nothing was typed); use the u2 "
                "driver for it"
            )
        # As few shell round trips as fit adb's request size; `&&` stops at the first `input`
        # that fails, and so does a failed line. The text itself never goes into an error
        # message: it may be a secret.
        for line in shell_lines(input_text_commands(text)):
            self._input(line, "input text", quote=False)

    def press_key(self, key: KeyName) -> None:
        code = _KEYCODES.get(key)
        if code is None:
            raise DeviceError(f"unknown key {key!r}")
        self._input(f"input keyevent {code}", "press key")

    def launch_app(self, package: str) -> None:
        pkg = check_package(package)
        check_launched(self._serial, pkg, self._shell(monkey_launch(pkg), "launch app"))

    def launch_activity(self, component: str) -> None:
        """`am start -n pkg/activity`, for callers that know the exact activity."""
        pkg, _, activity = component.partition("/")
        check_package(pkg)
        if not re.match(r"^[\w.$]+$", activity):
            raise DeviceError(f"not an activity name: {activity!r}")
        out = self._shell(f"am start -n {pkg}/{activity}", "am start")
        if "Error" in out:
            raise DeviceError(f"am start failed on {self._serial}: {out.strip()!r}")

    def terminate_app(self, package: str) -> None:
        self._shell(f"am force-stop {check_package(package)}", "force-stop")

    def current_app(self) -> str:
        return parse_current_package(self._shell("dumpsys window", "dumpsys window"))

    def current_window(self) -> str:
        return parse_current_window(self._shell("dumpsys window", "dumpsys window"))

    def keyboard_package(self) -> str:
        return self._ime.package()
