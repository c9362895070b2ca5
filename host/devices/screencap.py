"""Reading `screencap -p` over adb, the one way both drivers read it (each through its own
adb call, so each keeps its own error mapping).

`exec-out:` came with Android 5.0's adbd; an older one closes the request unopened (adb
answers "closed"), and such a phone had no screenshot at all. There the capture goes through
`shell:`, whose pty writes every "\n" of the PNG as "\r\n" (`undo_pty`)."""

from __future__ import annotations

from collections.abc import Callable

from host.devices import adb_transport
from host.devices.base import ScreenshotError

#: The service a screenshot is read through: binary-safe, no pty between.
SERVICE = "exec-out:screencap -p"
#: Before `EXEC_MIN_SDK`: through the shell, on a pty.
SHELL_SERVICE = "shell:screencap -p"
#: Android 5.0 (API 21): adbd's `exec:` / `exec-out:` services (system/core/adb/services.cpp;
#: an older adbd's service_to_fd knows no such name and closes the request).
EXEC_MIN_SDK = 21
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: The signature after a pty's ONLCR: each "\n" written as "\r\n".
_PTY_SIGNATURE = _PNG_SIGNATURE.replace(b"\n", b"\r\n")
#: A whole PNG's last chunk: IEND, empty, and its CRC.
PNG_END = b"IEND\xaeB`\x82"

#: `run(service, limit)`: what the phone wrote for the adb `service`, raising
#: `adb_transport.TooLarge` past `limit` bytes (`adb_transport.run`).
Run = Callable[[str, int], bytes]


def service(sdk: int | None) -> str:
    """The adb service a phone at API level `sdk` is captured through (an unknown level is
    taken as new)."""
    return SHELL_SERVICE if sdk is not None and sdk < EXEC_MIN_SDK else SERVICE


def undo_pty(data: bytes) -> bytes:
    """A PNG read through a pty, as `screencap -p` wrote it: the line discipline wrote each
    "\n" as "\r\n", and every "\r\n" in the output is such a pair (an "\r\n" of the PNG's
    own came out "\r\r\n"). The PNG may follow text printed on the same pty (a linker's
    warning, cut off later by `png_from_screencap`): the translation is undone from the
    translated signature on, wherever it is. Output whose first signature shows no such
    translation (a shell without a pty) is left as it is."""
    start = data.find(_PTY_SIGNATURE)
    plain = data.find(_PNG_SIGNATURE)
    if start < 0 or 0 <= plain < start:
        return data
    return data[:start] + data[start:].replace(b"\r\n", b"\n")


def capture(
    serial: str,
    limit: int,
    run: Run,
    still_listed: Callable[[], None],
    sdk: int | None = None,
) -> bytes:
    """`screencap -p`'s output, read through `run` (the service for API level `sdk`, and a
    PNG through the shell's pty given back as written). Output past `limit` is not read
    (`ScreenshotError`): one phone's runaway capture must not sit whole in the memory of the
    process that drives every phone. Output that does not end with a PNG's last chunk was
    cut short (the phone unplugged mid-transfer: the stream ends cleanly), so `still_listed`
    asks adb whether the phone is still there (raising when it is not) before the image is
    judged."""
    through = service(sdk)
    try:
        data = run(through, limit)
    except adb_transport.TooLarge as exc:
        raise ScreenshotError(
            f"screencap on {serial} wrote over the {exc.limit} bytes a look reads (not read)"
        ) from exc
    if through == SHELL_SERVICE:
        data = undo_pty(data)
    if not data.endswith(PNG_END):
        still_listed()
    return data
