"""A phone driven with `uiautomator2`: its on-device JSON-RPC server does dumps and gestures.

Faster hierarchy dumps than `uiautomator dump` on real phones, and text input that handles
non-ASCII; it needs the u2 server on the phone (pushed and started by the library itself).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import http.client
import io
import json
import logging
import os
import shlex
import socket
import struct
import threading
import traceback
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import adbutils
import uiautomator2 as u2
from adbutils.errors import AdbConnectionError, AdbTimeout
from PIL import Image
from uiautomator2 import exceptions as u2_exceptions

from host.agent.redact import SecretRedactor
from host.devices import adb_restarts, adb_transport, screencap
from host.devices.adb_driver import (
    DUMP_MAX_BYTES,
    SCREENSHOT_MAX_BYTES,
    check_launched,
    check_package,
    monkey_launch,
    parse_current_window,
    png_from_screencap,
)
from host.devices.adb_errors import (
    adb_state,
    ensure_listed,
    gone,
    is_gone,
    is_timeout,
    no_server,
    server_reachable,
    timed_out,
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
from planner.image_read import IMAGE_ERRORS

T = TypeVar("T")
log = logging.getLogger(__name__)
#: uiautomator2 logs every JSON-RPC request with its params (`setText`'s and `setClipboard`'s
#: are the typed text: a password the task types) and every shell command (the AdbKeyboard's
#: broadcast carries the text in base64) at DEBUG: kept out of a host run at DEBUG
#: (AMC_LOG_LEVEL), its warnings still come through.
logging.getLogger("uiautomator2").setLevel(logging.INFO)
#: The most UTF-8 bytes of text one `send_keys` carries. Through the AdbKeyboard IME it is
#: one `am broadcast … --es text <base64>` shell request, and adbd before Android 7 opens
#: none longer than 4096 bytes (see `adb_driver.SHELL_LINE_MAX`): 2048 bytes are 2732 in
#: base64, with room for the command around them.
SEND_KEYS_MAX_BYTES = 2048
#: How deep uiautomator2's server walks each window's tree (its own default is 50; Appium's 70;
#: real apps reach ~90 levels).
MAX_DEPTH = 120
#: uiautomator2's own depth, asked for again when a tree overflows the server's stack at
#: `MAX_DEPTH` (its recursion goes as deep as the tree does).
SAFE_DEPTH = 50
#: What uiautomator2 raises, after restarting a server its own Device started and trying
#: again, for a server that answers but does not work: the driver stops it (`U2Driver._reset`).
_BROKEN_SERVER = (u2_exceptions.UiAutomationNotConnectedError, u2_exceptions.HTTPError)
#: What a server whose heap is exhausted answers every JSON-RPC call with (jsonrpc4j's -32001
#: carrying the error's class): it keeps failing until it restarts.
_OUT_OF_MEMORY = "java.lang.OutOfMemoryError"
#: The class uiautomator2's server runs as (`app_process … com.wetest.uia2.Main`): how its
#: process is told on the phone.
_SERVER_MAIN = "com.wetest.uia2.Main"
#: What decoding the server's screenshot raises for an answer that is no image: no base64
#: text (binascii.Error is a ValueError; TypeError for no text at all) or no image Pillow opens.
_SCREENSHOT_ERRORS: tuple[type[Exception], ...] = (TypeError, *IMAGE_ERRORS)
#: How much of a Java exception's message (or class) an error shows.
_JAVA_MESSAGE_SHOWN = 200
#: How much of an answer that is not HTTP an error shows.
_ANSWER_SHOWN = 100
#: The folder of uiautomator2's own modules, as a traceback names them.
_U2_FILES = f"{os.sep}uiautomator2{os.sep}"
#: uiautomator2's helper app, which holds its keyboard.
_HELPER_APP = "com.github.uiautomator"
#: uiautomator2's keyboard: the AdbKeyboard IME of its helper app.
_ADB_KEYBOARD = "com.github.uiautomator/.AdbKeyboard"


class _HelperMissing(Exception):
    """uiautomator2 would install its helper app (`_Device._setup_ime`), which the driver
    never does."""


class _Device(u2.Device):  # type: ignore[misc]  # uiautomator2 ships no type hints
    """uiautomator2's Device, except that stopping a server it did not start does not wait,
    and points are never taken for fractions of the screen (`pos_rel2abs`).

    On a call its server fails (an HTTP error, UiAutomation lost) the library stops the
    server, starts it and tries once more. Its stop kills only a server its own Device
    started, then polls `/ping` for up to 10 s until the server quits; a server another
    program (or an earlier driver) started never quits that way, so every such call spent
    10 s polling before failing as it would have at once. `U2Driver._call` then names it
    (`_started_elsewhere`) or stops it (`_reset`)."""

    def stop_uiautomator(self, wait: bool = True) -> None:
        if self._process is None:
            return
        super().stop_uiautomator(wait)

    def _setup_ime(self) -> None:
        """Install nothing. uiautomator2's `send_keys`, with no AdbKeyboard on the phone, types
        through the clipboard and, on any failure of that (a ROM that refuses the clipboard to
        the shell user), installs its helper app here and selects its keyboard: an app the
        operator did not allow, installed mid-task. Every install of it goes through here;
        `_translated` says what the operator can do instead."""
        raise _HelperMissing

    @property
    def pos_rel2abs(self) -> Callable[[int, int], tuple[int, int]]:
        """The driver's points are pixels as they are. uiautomator2's own takes a coordinate
        below 1 for a fraction of the screen, so for a 0 (the left or top edge: a swipe down
        from the top opens the shade) it first read the screen's size through adbutils'
        `window_size`, which fails "rotation get failed" on a phone whose `dumpsys display`
        names no rotation (openatx/adbutils#22): every tap or swipe touching an edge failed."""
        return lambda x, y: (x, y)


def _out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is a JSON-RPC error of a server whose heap is exhausted."""
    return (
        isinstance(exc, u2_exceptions.RPCError)
        and bool(exc.args)
        and _OUT_OF_MEMORY in str(exc.args[0])
    )


def _broken(exc: BaseException) -> bool:
    """Whether `exc` says the server answers but does not work, so it must be restarted: it
    lost its UiAutomation, answers HTTP errors, or ran out of memory."""
    return isinstance(exc, _BROKEN_SERVER) or _out_of_memory(exc)


def _rpc_summary(exc: u2_exceptions.RPCError, typed: SecretRedactor) -> str:
    """What a uiautomator2 JSON-RPC error may say: its code and the Java exception's class,
    and its message (the first line of the server's stack trace) bounded and with what the
    call was typing masked (`typed`); never the call's params. A ROM's exception may quote
    what it was asked to type (a password), and the message goes to the cloud (the step's
    outcome, the progress line)."""
    head, *rest = exc.args or ("",)
    if isinstance(head, int) and rest:  # UiObjectNotFoundError(code, java_class, params)
        return f"JSON-RPC error {head}: {_java_said(str(rest[0]), typed)}"
    trace = rest[1] if len(rest) > 1 and isinstance(rest[1], str) else ""
    thrown = trace.strip().partition("\n")[0]
    said = _java_said(str(head), typed)
    return f"{said} ({_java_said(thrown, typed)})" if thrown and thrown not in str(head) else said


def _java_said(line: str, typed: SecretRedactor) -> str:
    """A Java exception's line ("java.lang.Foo: message"): its class whole, its message with
    `typed` masked and cut to `_JAVA_MESSAGE_SHOWN` characters."""
    cls, sep, message = line.partition(": ")
    message = typed.text(message)
    if len(message) > _JAVA_MESSAGE_SHOWN:
        message = message[:_JAVA_MESSAGE_SHOWN] + "…"
    return f"{cls[:_JAVA_MESSAGE_SHOWN]}{sep}{message}"


def _drop_params(exc: BaseException, typed: SecretRedactor) -> None:
    """Cut the params out of every uiautomator2 JSON-RPC error in `exc`'s chain, and the
    command and output out of every adbutils error.

    uiautomator2 raises `RPCUnknownError(summary, params, java_trace)`, and `setText`'s and
    `setClipboard`'s params are the typed text (a password the task types). Whatever prints
    such an error, or a chain holding one (a message, a logged traceback, a span's recorded
    exception; its `send_keys` catches one and tries another way), would carry the text: so
    the error itself is left saying only `_rpc_summary`."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, u2_exceptions.RPCError):
            link.args = (_rpc_summary(link, typed),)
        elif isinstance(link, adbutils.AdbError) and len(link.args) > 1:
            # adbutils' `AdbError("shell output invalid", command, output)` for a shell cut
            # short (uiautomator2 wraps it in `AdbShellError`, which prints it): the
            # AdbKeyboard's broadcast command carries the typed text in base64.
            link.args = link.args[:1]
        link = link.__cause__ or link.__context__


def _failed_check(exc: AssertionError) -> str:
    """What a failed `assert` of uiautomator2's means, by the function it is in; never the
    assertion's own words (an expression's values could be what the task types)."""
    where = next(
        (f for f in reversed(traceback.extract_tb(exc.__traceback__)) if _U2_FILES in f.filename),
        None,
    )
    if where is not None and where.name == "set_input_ime":
        # `assert self.__ime_id in self.__get_ime_list()` (`_input.py`): listed a moment ago.
        return (
            f"uiautomator2's AdbKeyboard ({_ADB_KEYBOARD}) left the phone's input methods as "
            "it was being selected (its app com.github.uiautomator was being removed or "
            "reinstalled); typing again tries anew"
        )
    place = (
        f" ({where.name} at uiautomator2/{where.filename.rpartition(_U2_FILES)[2]}:{where.lineno})"
        if where is not None
        else ""
    )
    return f"uiautomator2 failed a check of its own{place}"


def _not_http(exc: http.client.HTTPException) -> str:
    """What an answer `http.client` could not read says: its error's class and the start of
    what came."""
    return f"its answer was not HTTP ({type(exc).__name__}: {str(exc)[:_ANSWER_SHOWN]})"


@contextmanager
def _mapped(serial: str, what: str, typed: Collection[str] = ()) -> Iterator[None]:
    """Run uiautomator2 calls, a failure raised as the driver's error (`_translated`) once
    uiautomator2's errors in it are cut of their params and of the text the calls type
    (`typed`, `_drop_params`)."""
    try:
        yield
    except BaseException as exc:
        mask = SecretRedactor()
        for text in typed:
            mask.add(text)
        _drop_params(exc, mask)
        with _translated(serial, what):
            raise


@contextmanager
def _translated(serial: str, what: str) -> Iterator[None]:
    """The driver's error for a failed uiautomator2 call (`_mapped`). Whether the connection
    dropped is told by the error's type (a refused or reset connection, an answer cut short),
    never by words in the server's answer: a Java stack trace that says "closed" or "not
    found" came from a server that answered."""
    try:
        yield
    except DeviceError:
        raise
    except (AdbTimeout, TimeoutError) as exc:
        raise timed_out(serial, what, exc) from exc
    except (u2_exceptions.ConnectError, AdbConnectionError) as exc:
        raise gone(serial, what, str(exc)) from exc
    except (json.JSONDecodeError, http.client.IncompleteRead) as exc:
        # An answer cut short: the server died while writing it (the low-memory killer during
        # a big dump). uiautomator2 reads the body in chunks, which end quietly at the cut,
        # and parses what came; like a dropped connection, `U2Driver._call` asks adb.
        raise gone(serial, what, f"its answer was cut short: {exc}") from exc
    except u2_exceptions.AccessibilityServiceAlreadyRegisteredError as exc:
        # Its output is the server's log and a Java stack trace; what matters is who holds
        # the bridge (`U2Driver._d` waits a while for it, as `AdbDriver` does for a dump).
        raise held(serial, f"starting uiautomator2's server ({what})") from exc
    except u2_exceptions.LaunchUiAutomationError as exc:
        # ("server quit unexpectly" | "server not ready", the server's output so far): a ROM
        # it cannot run on (openatx/uiautomator2#1076), a process killer, a phone too slow to
        # start it in 30 s. The phone's condition, not the task's: the attempt ends retryable
        # and the phone's health counts it (`host.devices.health`).
        why, output = (*exc.args, "", "")[:2]
        raise ScreenUnavailable(
            f"uiautomator2's server did not start on {serial} ({what}: {why}; its output: "
            f"{str(output).strip()[-300:]!r}); the next attempt starts it again"
        ) from exc
    except u2_exceptions.UiAutomationNotConnectedError as exc:
        # The server answers, but its UiAutomation is gone (the accessibility service died
        # under it, system_server restarted): every call fails until the server restarts.
        # uiautomator2 restarts only a server its own Device started, so one an earlier
        # driver started stayed broken; `U2Driver._call` stops it.
        raise DeviceBusy(
            f"{what} failed on {serial}: uiautomator2's server on the phone lost its "
            f"UiAutomation connection ({exc}); the next call starts the server again"
        ) from exc
    except u2_exceptions.RPCError as exc:
        if not _out_of_memory(exc):
            raise DeviceError(
                f"{what} failed on {serial}: uiautomator2's server answered {exc}"
            ) from exc
        # A long-running server that leaked its heap (openatx/android-uiautomator-server#64):
        # every call fails until it restarts, which `U2Driver._call` does.
        raise DeviceBusy(
            f"{what} failed on {serial}: uiautomator2's server on the phone ran out of memory "
            f"({str(exc.args[0])[:200]}); the next call starts the server again"
        ) from exc
    except u2_exceptions.HTTPError as exc:
        if isinstance(exc.__cause__, adbutils.AdbError | OSError):
            # "Unable to connect to uiautomator2 server: <adb's refusal>": no connection to
            # the server (`U2Driver._call` asks adb whether the phone is still there).
            raise gone(serial, what, str(exc)) from exc
        # An HTTP error status after uiautomator2's own restart and retry (NanoHTTPD's 500
        # when the server's handler fails, a proxy's 502 before a dead server): the server
        # is broken, and one an earlier driver started is not restarted by uiautomator2.
        raise DeviceBusy(
            f"{what} failed on {serial}: uiautomator2's server on the phone answered "
            f"{exc}; the next call starts the server again"
        ) from exc
    except (adbutils.AdbError, OSError, EOFError) as exc:
        if is_gone(exc):
            raise gone(serial, what, str(exc)) from exc
        raise DeviceError(f"{what} failed on {serial}: {exc}") from exc
    except http.client.HTTPException as exc:
        # No HTTP answer (`BadStatusLine`, `LineTooLong`: the server died writing its status
        # line, another program on its port; `RemoteDisconnected` is a reset connection,
        # above), which uiautomator2 passes on as `http.client` raised it: retried as an
        # answer cut short is. What came is bounded (its bytes are whoever answered's).
        raise gone(serial, what, _not_http(exc)) from exc
    except _HelperMissing as exc:
        # The clipboard failed (the error uiautomator2 caught, cut of its params and the
        # typed text by `_mapped`) and the AdbKeyboard is not on the phone; or the helper app
        # left the phone between two of uiautomator2's looks at its input methods.
        refused = exc.__context__
        why = (
            f"the phone's clipboard did not take the text ({type(refused).__name__}: {refused})"
            if refused is not None
            else f"uiautomator2's helper app ({_HELPER_APP}) left the phone's input methods"
        )
        raise DeviceError(
            f"{what} failed on {serial}: {why}, and typing any other way needs "
            f"uiautomator2's helper app ({_HELPER_APP}, its AdbKeyboard), which amc installs "
            "on no phone by itself: install it once (`python -m uiautomator2 copy-assets`, "
            f"then `adb -s {serial} install assets/app-uiautomator.apk`), or drive the phone "
            "with AMC_HOST_DRIVER=adbutils"
        ) from exc
    except AssertionError as exc:
        # A bare `assert` of uiautomator2's (on what the phone listed a moment before): the
        # step fails and the model hears why, the attempt goes on.
        raise DeviceError(f"{what} failed on {serial}: {_failed_check(exc)}") from exc
    except u2_exceptions.BaseException as exc:
        # uiautomator2's own (`AdbShellError` around adb's error, `AdbBroadcastError` with
        # the AdbKeyboard's answer): busy when the adb error under it is a timeout (as the
        # adb driver's own shell timing out is), gone only when it says so.
        under = exc.__cause__ or exc.__context__
        if under is not None and is_timeout(under):
            raise timed_out(serial, what, under) from exc
        if isinstance(under, adbutils.AdbError | OSError | EOFError) and is_gone(under):
            raise gone(serial, what, str(under)) from exc
        raise DeviceError(f"{what} failed on {serial}: {type(exc).__name__}: {exc}") from exc


class _BoundedDevice(adbutils.AdbDevice):  # type: ignore[misc]
    """The phone as uiautomator2 sees it, every adb request bounded by the driver's timeout.

    adbutils waits 600 s on a shell (uiautomator2's md5sum check of `u2.jar`), for ever on a
    sync push (its push of the jar), and 600 s for the `tcp:` forward's OKAY; uiautomator2 sets
    its `http_timeout` (300 s) on an `HTTPConnection` whose socket comes from here, so it never
    reached the socket. A stuck phone held the connect, or a JSON-RPC call, and the phone's
    lane with it. Here every connection's reads wait `timeout_s` at most; `step` names what
    the device was last asked, so a timeout says where it stuck. The server's launch stream
    is the one exception once its OKAY came: it is silent while the server runs."""

    def __init__(
        self,
        client: adbutils.AdbClient,
        serial: str,
        timeout_s: float,
        transport_id: int | None = None,
    ) -> None:
        super().__init__(client, serial=serial, transport_id=transport_id)
        self._timeout_s = timeout_s
        #: Set for a phone whose serial another listed phone shares (see `AdbDriver`).
        self._tid = transport_id
        self.step = "connect"
        #: The held-open streams of the servers started through this device.
        self.launches: list[adbutils.AdbConnection] = []

    def open_transport(
        self, command: str | None = None, timeout: float | None = None
    ) -> adbutils.AdbConnection:
        """adbutils' own, bounded, and closed when the phone does not take the request (it
        leaves the socket open)."""
        if command:  # before the connection: either refuses an id of an ended adb run
            request = f"{adb_transport.query_prefix(self._serial, self._tid)}:{command}"
        else:
            request = adb_transport.switch_request(self._serial, self._tid)
        conn = _handshake(self._client.make_connection(timeout=self._timeout_s), request)
        try:
            adb_restarts.check(self._serial, self._tid)  # as `adb_transport.transport`
        except BaseException:
            conn.close()
            raise
        return conn

    def open_shell(self, cmdargs: Any) -> adbutils.AdbConnection:
        """adbutils' own, closed when the phone does not take the command."""
        return _handshake(self.open_transport(), f"shell:{_command(cmdargs)}")

    def shell(self, cmdargs: Any, stream: bool = False, **kwargs: Any) -> Any:
        if not stream:
            self.step = f"the shell command '{_program(cmdargs)} …'"
            return super().shell(cmdargs, **{**kwargs, "timeout": self._timeout_s})
        self.step = "the start of uiautomator2's server"
        conn = super().shell(cmdargs, stream=True)
        conn.conn.settimeout(None)
        self.launches.append(conn)
        return conn

    def close_launches(self) -> None:
        """Close the streams of the servers this device started (see `U2Driver._d`)."""
        for conn in self.launches:
            conn.close()
        self.launches.clear()

    @property
    def sync(self) -> Any:
        self.step = _PUSH_STEP
        return _Sync(self)

    def create_connection(self, network: Any, address: int | str) -> socket.socket:
        """A socket to `address` on the phone. A handshake that times out is `DeviceBusy`
        here: uiautomator2 takes an adb error from it for a server not yet up and keeps
        polling."""
        kind = getattr(network, "value", network)
        self.step = f"the {kind}:{address} connection to uiautomator2's server"
        try:
            sock: socket.socket = super().create_connection(network, address)
        except (AdbTimeout, TimeoutError) as exc:
            raise self.stuck(exc) from exc
        sock.settimeout(self._timeout_s)
        return sock

    def stuck(self, exc: BaseException) -> DeviceBusy:
        """The error for a request that got no answer in time, naming the phone and step."""
        return DeviceBusy(
            f"phone {self.serial} did not answer {self.step} within {self._timeout_s:g} s "
            f"({exc}): it is stuck or very slow; it is still listed by adb unless the device "
            "poll says otherwise"
        )


#: What `_BoundedDevice.step` says while a file goes to the phone.
_PUSH_STEP = "a file transfer (sync: push of uiautomator2's jar)"


class _Sync(adbutils.Sync):  # type: ignore[misc]
    """adbutils' file transfers, except that a FAIL reply raises its reason: adbutils' push
    raises AdbError("FAIL") and leaves the reason unread ("write failed: No space left on
    device" from a full phone), so a failed push of uiautomator2's jar said only "FAIL"."""

    @contextmanager
    def _prepare_sync(self, path: str, cmd: str) -> Iterator[Any]:
        with super()._prepare_sync(path, cmd) as conn:
            yield _SyncReplies(conn)


class _SyncReplies:
    """A sync connection whose four-byte replies raise `AdbError` with adbd's reason on FAIL."""

    def __init__(self, conn: adbutils.AdbConnection) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def read_string(self, n: int) -> str:
        reply = str(self._conn.read_string(n))
        if n == 4 and reply == "FAIL":
            size = struct.unpack("<I", self._conn.read_exact(4))[0]
            raise adbutils.AdbError(self._conn.read_string(size))
        return reply


def _not_pushed(serial: str, exc: BaseException) -> ScreenUnavailable:
    """The error for a push of uiautomator2's jar that the phone refused: the server cannot
    run there until it is mended, which a full storage (the usual reason) names."""
    hint = "; free some space on the phone" if "No space left" in str(exc) else ""
    return ScreenUnavailable(
        f"uiautomator2's server could not be put on {serial}: the push of its jar to "
        f"/data/local/tmp failed ({exc}){hint}"
    )


def _handshake(conn: adbutils.AdbConnection, request: str) -> adbutils.AdbConnection:
    """`conn` after the adb server took `request`; closed when it did not."""
    try:
        conn.send_command(request)
        conn.check_okay()
    except BaseException:
        conn.close()
        raise
    return conn


def _take_screenshot(d: Any) -> Any:
    """The server's screenshot (a JPEG in base64); "" when it answered none, or an error of its
    capture: a server built against java.util.Base64 throws NoClassDefFoundError at every
    screenshot on Android 7 (openatx/uiautomator2#1008), and `screencap` still works there.
    A server out of memory is not passed over: it must be restarted (`_mapped`)."""
    try:
        data = d.jsonrpc.takeScreenshot(1, 80)
    except u2_exceptions.RPCError as exc:
        if _out_of_memory(exc):
            raise
        log.info("uiautomator2's takeScreenshot failed (%s); taking screencap", exc.args[:1])
        return ""
    return data or ""


def _send_keys(text: str, d: Any) -> None:
    d.send_keys(text)


def utf8_pieces(text: str, max_bytes: int) -> list[str]:
    """`text` cut between characters into pieces of at most `max_bytes` in UTF-8."""
    pieces: list[str] = []
    start, size = 0, 0
    for i, ch in enumerate(text):
        n = len(ch.encode("utf-8", "surrogatepass"))
        if size + n > max_bytes and i > start:
            pieces.append(text[start:i])
            start, size = i, 0
        size += n
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _command(cmdargs: Any) -> str:
    return cmdargs if isinstance(cmdargs, str) else shlex.join(cmdargs)


def _program(cmdargs: Any) -> str:
    """A shell command's first two words, enough to name it (`toybox md5sum`): the rest
    can be typed text (uiautomator2's keyboard broadcast), which no message may carry."""
    words = cmdargs.split() if isinstance(cmdargs, str) else [str(w) for w in cmdargs]
    return " ".join(words[:2])


#: Per adb server and phone, the uiautomator2 Device whose exit hook is kept: the one that
#: started the server now running (see `_keep_exit_hook`).
_exit_hooks: dict[tuple[str, int, str], Any] = {}
_exit_hooks_lock = threading.Lock()


def _keep_exit_hook(key: tuple[str, int, str], dev: Any) -> None:
    """Bound what uiautomator2's exit hooks keep alive. It registers `stop_uiautomator` with
    atexit for every Device it makes and never removes it, so every Device (one per reset
    after a stuck or dropped call, one per attempt's driver) lived as long as the process.
    Only a Device that started the server (`_process`: the stream of `app_process`) has
    anything to stop at exit; the others' hooks go at once, and a newer server's replaces an
    older one's (whose server no longer answered, or the newer would not have started)."""
    if getattr(dev, "_process", None) is None:
        atexit.unregister(dev.stop_uiautomator)
        return
    with _exit_hooks_lock:
        old = _exit_hooks.get(key)
        _exit_hooks[key] = dev
    if old is not None and old is not dev:
        _release(key, old)


def _release(key: tuple[str, int, str], dev: Any) -> None:
    """Stop the server `dev` started (best effort: one that hangs would keep the port and the
    accessibility bridge from its successor) and drop its exit hook."""
    with contextlib.suppress(Exception):
        dev.stop_uiautomator(wait=False)
    atexit.unregister(dev.stop_uiautomator)
    with _exit_hooks_lock:
        if _exit_hooks.get(key) is dev:
            del _exit_hooks[key]


def release_phone(host: str, port: int, serial: str) -> None:
    """Let go of the Device kept for a phone the host has forgotten (gone for good): its
    server went with it, and a host whose phones come and go under new serials would keep
    one for each."""
    key = (host, port, serial)
    with _exit_hooks_lock:
        owner = _exit_hooks.get(key)
    if owner is not None:
        _release(key, owner)


class U2Driver:
    """`Driver` over `uiautomator2` (connects lazily, so building it never touches the phone)."""

    def __init__(
        self,
        serial: str,
        host: str = "127.0.0.1",
        port: int = 5037,
        rpc_timeout_s: float = adb_transport.DEFAULT_TIMEOUT_S,
        transport_id: int | None = None,
        adb_serial: str | None = None,
        bridge_wait_s: float = BRIDGE_WAIT_S,
    ) -> None:
        self._serial = serial
        #: How long starting the server waits for the accessibility bridge another
        #: UiAutomation client holds.
        self._bridge_wait_s = bridge_wait_s
        #: What adb lists the phone as, and its transport id when that serial is shared
        #: (`serial` is then the host's own id for it; see `DeviceRegistry`).
        self._adb_serial = adb_serial or serial
        self._tid = transport_id
        #: How long one JSON-RPC call may wait for the on-phone server (as the adb driver
        #: waits for a command); a call that runs out is `DeviceBusy`.
        self._rpc_timeout_s = rpc_timeout_s
        #: The most `screencap` output read (`SCREENSHOT_MAX_BYTES`, as the adb driver's):
        #: more is no screenshot, rather than held whole in the host's one process.
        self.screenshot_max_bytes = SCREENSHOT_MAX_BYTES
        #: The largest dump parsed (`DUMP_MAX_BYTES`, as the adb driver's): a larger one is
        #: no tree. uiautomator2's HTTP client has read it whole by then; it is not parsed.
        self.dump_max_bytes = DUMP_MAX_BYTES
        self._adb = adb_transport.Client(host=host, port=port)
        self._addr = (host, port)
        self._key = (host, port, serial)
        self._dev: Any = None
        self._sdk: int | None = None
        self._size = ScreenSizeReader(serial)
        self._ime = InputMethodCache(
            serial, lambda: self._shell(INPUT_METHOD_COMMAND, "read input method")
        )

    @property
    def serial(self) -> str:
        return self._serial

    def _d(self) -> Any:
        if self._dev is None:
            self._dev = retry_while_held(self._connect, self._bridge_wait_s)
            _keep_exit_hook(self._key, self._dev)
        return self._dev

    def _connect(self) -> Any:
        phone = _BoundedDevice(self._adb, self._adb_serial, self._rpc_timeout_s, self._tid)
        with _mapped(self._serial, "connect"):
            try:
                return _Device(phone)
            except BaseException as exc:
                # A server that did not come up keeps the stream of its launch open (its
                # Device, which would close it, was never made): one socket per failed
                # connect.
                phone.close_launches()
                if isinstance(exc, AdbTimeout | TimeoutError):
                    raise phone.stuck(exc) from exc
                in_push = phone.step == _PUSH_STEP and isinstance(exc, adbutils.AdbError)
                if in_push and not is_gone(exc):
                    raise _not_pushed(self._serial, exc) from exc
                raise

    def _call(self, what: str, fn: Callable[[Any], T], typed: Collection[str] = ()) -> T:
        """Run `fn` on the uiautomator2 device, failures mapped to the driver's errors.

        A dropped or refused connection (`http.client.RemoteDisconnected`, a reset) reads the
        same whether the phone vanished or only uiautomator2's server on it died, so adb is
        asked: while it lists the phone as "device" the failure is `DeviceBusy` and the
        connection is forgotten, so the next call connects afresh and starts the server
        again; otherwise it is `DeviceGone`. Any other failure is `DeviceGone` too once adb
        no longer lists the phone. `typed`: the text `fn` types, masked in its errors."""
        if not server_reachable(*self._addr):
            raise no_server(self._serial, what, *self._addr)
        try:
            d = self._d()
            with _mapped(self._serial, what, typed):
                return fn(d)
        except DeviceGone as gone:
            self._reset()
            if adb_state(self._adb, self._addr, self._adb_serial, self._tid) != "device":
                raise
            cause: BaseException | str = gone.__cause__ or gone
            if isinstance(cause, http.client.HTTPException) and not isinstance(
                cause, http.client.IncompleteRead | OSError
            ):
                cause = _not_http(cause)
            raise DeviceBusy(
                f"{what} failed on {self._serial}: uiautomator2's server on the phone dropped "
                f"the connection ({cause}); adb still lists the phone, so the next call "
                "connects again and restarts the server"
            ) from gone
        except DeviceBusy as busy:
            cause = busy.__cause__ or busy
            if _broken(cause) and self._started_elsewhere():
                self._reset()
                raise ScreenUnavailable(
                    f"{what} failed on {self._serial}: uiautomator2's server on the phone was "
                    "started by another program (another amc host, weditor, a uiautomator2 "
                    f"script) and no longer works ({cause}); neither amc nor uiautomator2 "
                    "restarts a server another program started: stop that program, or end "
                    f"the server (`adb -s {self._adb_serial} shell pkill -f "
                    f"{_SERVER_MAIN}`), and the next attempt starts its own"
                ) from busy
            if is_timeout(cause) or _broken(cause):
                self._reset()  # a wedged or broken server: the next call starts it again
            raise
        except DeviceError:
            # A shell command the unplug cut short ends cleanly, and uiautomator2 reads it as
            # "shell output invalid": only adb's device list tells a vanished phone.
            try:
                ensure_listed(self._adb, self._addr, self._adb_serial, what, self._tid)
            except DeviceGone:
                self._reset()
                raise
            raise

    def _started_elsewhere(self) -> bool:
        """Whether the server this driver talks to was started by another program: its
        Device found one answering `/ping` and reused it (it started none), and no driver
        of this host started it either. uiautomator2 stops only a server its own Device
        started, so `_reset` cannot restart this one."""
        if self._dev is None or getattr(self._dev, "_process", None) is not None:
            return False
        with _exit_hooks_lock:
            return self._key not in _exit_hooks

    def _reset(self) -> None:
        """Forget the uiautomator2 device, and stop the phone's server (started by this
        driver's Device or by an earlier driver's), dropping their exit hooks: the next call
        connects afresh. Also when the phone is gone: its server went with it, and a phone
        that never comes back (a serial used once) keeps nothing alive."""
        dev, self._dev = self._dev, None
        with _exit_hooks_lock:
            owner = _exit_hooks.get(self._key)
        for kept in {id(d): d for d in (dev, owner) if d is not None}.values():
            _release(self._key, kept)

    def screen_size(self) -> tuple[int, int]:
        """Read as the adb driver reads it (`ScreenSizeReader`): uiautomator2's
        `window_size()` fails "rotation get failed" on a phone whose `dumpsys display` names
        no rotation, and so did every look at it."""
        return self._size.read(self._shell)

    def _shell(self, cmd: str, what: str) -> str:
        return str(self._call(what, lambda d: d.shell(cmd).output))

    def screenshot_png(self) -> bytes:
        """The server's `takeScreenshot` (a JPEG) as a PNG; when it answers none (Android 4-6,
        a capture SurfaceFlinger failed: openatx/uiautomator2#1027), `screencap` as the adb
        driver takes it. uiautomator2's own fallback goes through adbutils, which first asks
        `dumpsys SurfaceFlinger --display-id` (unknown before Android 10: "No display found")
        and turns a capture it cannot read (a linker warning printed before the PNG, a
        garbled image) into a black image of the screen's size, shown as the screen."""
        answer = self._call("screenshot", _take_screenshot)
        if not answer:
            sdk = self._sdk_level()  # before Android 5.0 through the shell (`screencap`)
            shot = self._call("screencap", lambda d: self._screencap(d, sdk))
            return png_from_screencap(self._serial, shot)
        try:
            jpeg = base64.b64decode(answer)
            with Image.open(io.BytesIO(jpeg)) as img:
                buf = io.BytesIO()
                img.save(buf, format="PNG")
        except _SCREENSHOT_ERRORS as exc:
            raise ScreenshotError(
                f"unreadable screenshot from {self._serial}: {type(exc).__name__}: {exc}"
            ) from exc
        return buf.getvalue()

    def _screencap(self, d: Any, sdk: int | None) -> bytes:
        """`screencap -p`'s output. One that does not end with a PNG's last chunk was cut
        short (the phone unplugged mid-transfer: the stream ends cleanly), so adb is asked
        whether the phone is still there, as the adb driver asks. Output past
        `screenshot_max_bytes` is not read (`ScreenshotError`), as the adb driver's."""
        del d
        return screencap.capture(
            self._serial,
            self.screenshot_max_bytes,
            lambda service, limit: adb_transport.run(
                self._adb, self._adb_serial, service, self._rpc_timeout_s, self._tid, limit=limit
            ),
            lambda: ensure_listed(self._adb, self._addr, self._adb_serial, "screencap", self._tid),
            sdk,
        )

    def dump_hierarchy(self) -> str:
        """Every window's root side by side. uiautomator2 leaves out every node deeper than
        its `max_depth` (default 50, against stack overflows in its server); WebView and React
        Native screens go deeper, so it is asked for `MAX_DEPTH`.

        The server's JSON-RPC method is called directly: uiautomator2's `dump_hierarchy`
        retries an empty answer three times a second apart out of sight of the look's deadline
        (`Perceiver.scene_from_dump` retries, bounded), and fails with a TypeError on a null
        one (a server whose dumper caught an exception it only logs): empty and null are
        `DeviceBusy` here.

        An RPC error is the server's dumper throwing while the screen changes under it (a
        NullPointerException when a node vanishes mid-dump, as in `uiautomator dump`): a
        passing `DeviceBusy` (the server answered, so the phone is there; should it vanish
        before the retry, that call finds out). A stack overflow is not passing (the same tree
        overflows again): the tree is dumped again at `SAFE_DEPTH`, which the server's
        recursion was built for, and one that overflows even there is an error."""

        def dump(d: Any) -> str:
            try:
                try:
                    content = d.jsonrpc.dumpWindowHierarchy(False, MAX_DEPTH)
                except u2_exceptions.RPCStackOverflowError:
                    log.warning(
                        "%s: the tree overflowed uiautomator2's server %d levels down; "
                        "dumped again %d levels deep, the nodes below left out",
                        self._serial,
                        MAX_DEPTH,
                        SAFE_DEPTH,
                    )
                    content = d.jsonrpc.dumpWindowHierarchy(False, SAFE_DEPTH)
            except u2_exceptions.RPCStackOverflowError:
                raise
            except u2_exceptions.RPCError as exc:
                cause = str(exc.args[0] if exc.args else exc)[:300]
                raise DeviceBusy(f"dump hierarchy failed on {self._serial}: {cause}") from exc
            if not content:
                raise DeviceBusy(
                    f"dump hierarchy on {self._serial} gave no hierarchy (uiautomator2's "
                    f"server answered {content!r}: its dumper failed, or the screen never "
                    "settled)"
                )
            xml = str(content)
            if len(xml.encode("utf-8", "replace")) > self.dump_max_bytes:
                # Busy, as the adb driver's: the look tries again, then goes on from the
                # screenshot with this reason (`Perceiver`).
                raise DeviceBusy(
                    f"dump hierarchy on {self._serial} is over the {self.dump_max_bytes} "
                    "bytes a look reads (not parsed)"
                )
            return xml

        return self._call("dump hierarchy", dump)

    def tap(self, x: int, y: int) -> None:
        self._call("tap", lambda d: d.click(x, y))

    def long_press(self, x: int, y: int, duration_ms: int = 800) -> None:
        self._call("long press", lambda d: d.long_click(x, y, duration_ms / 1000))

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        self._call("swipe", lambda d: d.swipe(x1, y1, x2, y2, duration=duration_ms / 1000))

    def input_text(self, text: str) -> None:
        # Exact for any text: send_keys goes through the AdbKeyboard IME (base64 in a broadcast)
        # or the clipboard and a paste, never `input text` with its `%s` rule. A long text
        # goes in pieces, each typed where the last one ended.
        for piece in utf8_pieces(text, SEND_KEYS_MAX_BYTES):
            self._call("input text", functools.partial(_send_keys, piece), (text, piece))
        # send_keys selects uiautomator2's AdbKeyboard when it can: ask again which one is up.
        self._ime.forget()

    def press_key(self, key: KeyName) -> None:
        # Every KeyName is also a uiautomator2 key name ("delete" is UiDevice.pressDelete, i.e.
        # KEYCODE_DEL), so it is passed through unchanged.
        self._call("press key", lambda d: d.press(key))

    def launch_app(self, package: str) -> None:
        """The adb driver's monkey launch, its output checked (uiautomator2's `app_start`
        runs the same command and drops the output, so a missing app looked launched)."""
        cmd = monkey_launch(package)
        out = self._call("launch app", lambda d: d.shell(cmd).output)
        check_launched(self._serial, package, str(out))

    def terminate_app(self, package: str) -> None:
        pkg = check_package(package)
        self._call("terminate app", lambda d: d.app_stop(pkg))

    def current_app(self) -> str:
        return self.current_window().partition("/")[0]

    def current_window(self) -> str:
        """Display 0's focus, read as the adb driver reads it: uiautomator2's `app_current`
        falls back (from Android 10 `dumpsys window windows` names no focus) to `dumpsys
        activity`, which lists the focused display first, so a cast or cover screen's app
        was taken for the phone's."""
        return parse_current_window(self._shell("dumpsys window", "current app"))

    def keyboard_package(self) -> str:
        return self._ime.package()

    def screen_state(self) -> ScreenState:
        out = self._call("screen state", lambda d: d.shell(SCREEN_STATE_COMMAND).output)
        return parse_screen_state(str(out))

    def wake(self) -> None:
        self._call("wake", lambda d: d.screen_on())

    def dismiss_keyguard(self) -> None:
        """As the adbutils driver does it (`AdbDriver.dismiss_keyguard`)."""
        if has_dismiss_keyguard(self._sdk_level()):
            self._call("dismiss keyguard", lambda d: d.shell("wm dismiss-keyguard"))
            return
        self._call("dismiss keyguard", lambda d: d.shell("input keyevent KEYCODE_MENU"))
        if self.screen_state().locked:
            self.swipe(*unlock_swipe(self.screen_size()))

    def _sdk_level(self) -> int | None:
        """The phone's API level, read once (None when it does not say)."""
        if self._sdk is None:
            out = self._call("read API level", lambda d: d.shell(SDK_COMMAND).output)
            self._sdk = parse_sdk(str(out))
        return self._sdk
