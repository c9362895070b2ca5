"""Translate adb client failures into the driver interface's two errors.

A phone that vanished (unplugged, emulator killed, adb server gone) must become `DeviceGone` so
the task on it fails with a clear reason while other phones carry on; a call that timed out is
`DeviceBusy` (a slow phone is not a gone one); everything else stays a `DeviceError`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import adbutils
from adbutils.errors import AdbConnectionError, AdbTimeout

from host.devices import adb_transport
from host.devices.base import DeviceBusy, DeviceError, DeviceGone

T = TypeVar("T")

_GONE_MARKERS = (
    "not found",
    "offline",
    "no devices",
    "insufficient permissions for device",
    "device unauthorized",
    "connection reset",
    "connection refused",
    "broken pipe",
    "closed",
)


#: `DeviceGone.state` of a phone adb refused by serial because another listed phone has the
#: same one ("more than one device").
SHARED_SERIAL = "shared serial"
#: `DeviceGone.state` of a phone no adb server answered for (`adb_state`, a driver's check):
#: the server, not the phone's cable, is what the operator must see to.
NO_ADB_SERVER = "no adb server"


def no_adb_server_reason(host: str, port: int) -> str:
    """Why a phone is out of sight while the adb server does not answer
    (`registry.DeviceInfo.adb_down`): the server, not a phone, is what the operator must see
    to."""
    return (
        f"the adb server at {host}:{port} does not answer (start it with "
        f"{start_server_hint(host, port)}, or mend the link to it): its phones are out of "
        "sight, not known gone"
    )


def start_server_hint(host: str, port: int) -> str:
    """The command that starts the adb server at host:port: plain `adb start-server` starts
    one on 5037 only, and on the machine it runs on."""
    command = "`adb start-server`" if port == 5037 else f"`adb -P {port} start-server`"
    local = host in ("127.0.0.1", "localhost", "::1")
    return command if local else f"{command} on {host}"


#: States adb lists a phone under that no command gets through: the words its server refuses
#: a request for such a phone with (adb's acquire_one_transport), and what the operator does.
_STATES = {
    "unauthorized": (
        "device unauthorized",
        "USB debugging on it is not allowed for this computer: unlock the phone and accept "
        "its 'Allow USB debugging?' prompt (tick 'Always allow from this computer'; "
        "replugging the cable brings the prompt back)",
    ),
    "offline": (
        "device offline",
        "its adb daemon does not answer: replug the cable (or try another cable or USB "
        "port), or turn USB debugging off and on again on the phone",
    ),
    # The states a phone passes through as it is plugged in: adb tries its keys with the
    # phone ("authorizing"), or waits for the phone's adbd to answer ("connecting").
    "authorizing": (
        "device still authorizing",
        "adb is still checking its key with the phone (just plugged in, or its 'Allow USB "
        "debugging?' prompt just answered): wait a few seconds; if it stays so, unlock the "
        "phone and accept that prompt",
    ),
    "connecting": (
        "device still connecting",
        "its adb daemon has not answered yet (just plugged in, or rebooting): wait a few "
        "seconds; if it stays so, replug the cable (or try another cable or USB port)",
    ),
    # Linux only: the adb server's user may not open the phone's USB device. adb lists it
    # as "no permissions (…); see [URL]" (adbutils, splitting the line at spaces, reads
    # "no"), and refuses every request for it in these words.
    "no permissions": (
        "insufficient permissions for device",
        "adb has no permission for this USB device: add a udev rule for the phone's USB "
        'vendor id (a line like SUBSYSTEM=="usb", ATTR{idVendor}=="18d1", MODE="0660", '
        'GROUP="plugdev" in /etc/udev/rules.d/51-android.rules, or the distribution\'s '
        "android-sdk-platform-tools-common package; then `sudo udevadm control "
        "--reload-rules` and replug the phone) or run adb as a user in the plugdev group "
        "(then `adb kill-server`)",
    ),
    # Not a state adb lists: its refusal of a serial two listed phones share (adb's
    # acquire_one_transport), met by a driver that addressed its phone by serial when another
    # phone with it was plugged in. The phone is there; no request by serial reaches it.
    SHARED_SERIAL: (
        "more than one device",
        "another phone with the same serial was plugged in, and adb refuses a serial two "
        "phones share: the host tells them apart by transport id (or USB port) from its next "
        "device poll; give the phones their own serials to avoid this",
    ),
    # Not a state either: no adb server answered (`adb_state`, a driver's `_server` check).
    NO_ADB_SERVER: (
        NO_ADB_SERVER,
        "the host's adb server does not answer: start it with `adb start-server`, or mend "
        "the link to it (the phone may well be plugged in still)",
    ),
}
#: How a message names a phone in each state ("phone X is unauthorized in adb").
_SAID = {
    "no permissions": "without permission to its USB device",
    SHARED_SERIAL: "no longer the only phone with its serial",
    NO_ADB_SERVER: "out of sight",
}


def listed_state(text: str) -> str:
    """The state ("unauthorized", "offline", "authorizing", "connecting", "no permissions")
    an adb server's refusal names, else ""."""
    lowered = text.lower()
    return next((state for state, (words, _) in _STATES.items() if words in lowered), "")


def gone(serial: str, what: str, detail: str, state: str = "") -> DeviceGone:
    """The `DeviceGone` for a phone adb no longer reaches: one adb still lists as
    unauthorized or offline (`state`, else read from `detail`) says so and what fixes it,
    not "disconnected", which sends the operator to the cable."""
    state = state if state in _STATES else listed_state(detail)
    if state:
        said = _SAID.get(state, state)
        return DeviceGone(
            f"phone {serial} is {said} in adb ({what}): {_STATES[state][1]}, then run the "
            "task again",
            state,
        )
    return DeviceGone(f"phone {serial} disconnected ({what}: {detail})")


def no_server(serial: str, what: str, host: str, port: int) -> DeviceGone:
    """The `DeviceGone` of a call no adb server answered: it names the server and how to
    start it (`NO_ADB_SERVER`, so the attempt's summary says so and the registry marks the
    phone `adb_down`), not "disconnected", which sent the operator to a sound cable."""
    return DeviceGone(
        f"phone {serial} is out of sight ({what}: no adb server): "
        f"{no_adb_server_reason(host, port)}",
        NO_ADB_SERVER,
    )


def state_fix(state: str) -> str:
    """What the operator does about a phone adb lists in `state` (one of `_STATES`), "" for
    a state with nothing to do: the reason a phone the host reports takes no work
    (`host.devices.registry`)."""
    return _STATES[state][1] if state in _STATES else ""


def server_reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether an adb server listens at host:port.

    Checked before each adbutils call because adbutils, finding no server, runs
    `adb start-server` itself — on the default port 5037, whatever port was asked for — which
    would leave a stray daemon behind a host that drives a virtual adb server.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def is_timeout(exc: BaseException) -> bool:
    """A read (or connect) that waited longer than the socket timeout. The phone is most
    likely still there and busy (a system_server ANR, a huge `dumpsys`, a `uiautomator dump`
    that spent its idle wait): not a disconnection. Whether it is gone is the device registry's
    poll's call."""
    return isinstance(exc, AdbTimeout | TimeoutError)


def is_gone(exc: BaseException) -> bool:
    """True when `exc` means the phone (or its adb server) is no longer reachable."""
    if is_timeout(exc):
        return False
    if isinstance(exc, AdbConnectionError):
        return True
    if isinstance(exc, ConnectionError | BrokenPipeError | EOFError):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _GONE_MARKERS)


def adb_state(
    client: adbutils.AdbClient,
    addr: tuple[str, int],
    serial: str,
    transport_id: int | None = None,
) -> str:
    """What the adb server lists `serial` as ("device" when usable), or why it cannot say
    ("no adb server", "not listed: …"). Asked when a call failed in a way that does not tell
    a dying dumper or on-phone server from a vanished phone (empty output, a dropped stream)."""
    if not server_reachable(*addr):
        return NO_ADB_SERVER
    try:
        return adb_transport.state(client, serial, timeout=5.0, transport_id=transport_id)
    except (adbutils.AdbError, OSError, EOFError) as exc:
        # The server refuses get-state for a phone it lists as unauthorized or offline.
        return listed_state(str(exc)) or f"not listed: {exc}"


def ensure_listed(
    client: adbutils.AdbClient,
    addr: tuple[str, int],
    serial: str,
    what: str,
    transport_id: int | None = None,
) -> None:
    """Raise `DeviceGone` unless adb still lists the phone as "device". Checked before a
    failure is retried as passing (`DeviceBusy`), so a phone that vanished is not retried as
    a busy one."""
    listed = adb_state(client, addr, serial, transport_id)
    if listed != "device":
        raise gone(serial, what, f"adb lists it as {listed!r}", listed)


#: What Android's command line tools print while system_server is not running (a phone still
#: booting, system_server restarting after a crash): `wm`, `input`, `am` (`cmd SERVICE`) and
#: `dumpsys` find no binder service, `monkey` no activity manager. adb lists a phone as soon as
#: its adbd runs, well before.
_SERVICES_DOWN = ("Can't find service", "Unable to connect to activity manager")


def services_down(serial: str, what: str, output: str) -> DeviceBusy | None:
    """The `DeviceBusy` for a command whose output says the phone's system services are not
    running, else None: nothing it asked for happened, and a minute later it would."""
    line = next(
        (ln.strip() for ln in output.splitlines() if any(m in ln for m in _SERVICES_DOWN)), ""
    )
    if not line:
        return None
    return DeviceBusy(
        f"{what} failed on {serial}: the phone's system services are not running "
        f"({line[:200]!r}): it is still booting, or its system_server is restarting"
    )


def timed_out(serial: str, what: str, exc: BaseException) -> DeviceBusy:
    """The error for a call that timed out: `DeviceBusy`, naming the timeout."""
    return DeviceBusy(
        f"{what} on {serial} timed out ({exc}): the phone is slow or busy; "
        "it is still listed by adb unless the device poll says otherwise"
    )


@contextmanager
def mapped_errors(serial: str, what: str) -> Iterator[None]:
    """Run an adb call, raising `DeviceGone` / `DeviceError` that name the phone and the call."""
    try:
        yield
    except DeviceError:
        raise
    except (adbutils.AdbError, OSError, EOFError) as exc:
        if is_timeout(exc):
            raise timed_out(serial, what, exc) from exc
        if is_gone(exc):
            raise gone(serial, what, str(exc)) from exc
        raise DeviceError(f"{what} failed on {serial}: {exc}") from exc


def call(serial: str, what: str, fn: Callable[[], T]) -> T:
    """Functional form of `mapped_errors`."""
    with mapped_errors(serial, what):
        return fn()
