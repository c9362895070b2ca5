"""Reading `screencap -p` over adb, the one way both drivers read it (each through its own
adb call, so each keeps its own error mapping)."""

from __future__ import annotations

from collections.abc import Callable

from host.devices import adb_transport
from host.devices.base import ScreenshotError

#: The service a screenshot is read through: binary-safe, no pty between.
SERVICE = "exec-out:screencap -p"
#: A whole PNG's last chunk: IEND, empty, and its CRC.
PNG_END = b"IEND\xaeB`\x82"

#: `run(service, limit)`: what the phone wrote for the adb `service`, raising
#: `adb_transport.TooLarge` past `limit` bytes (`adb_transport.run`).
Run = Callable[[str, int], bytes]


def capture(serial: str, limit: int, run: Run, still_listed: Callable[[], None]) -> bytes:
    """`screencap -p`'s output, read through `run`. Output past `limit` is not read
    (`ScreenshotError`): one phone's runaway capture must not sit whole in the memory of the
    process that drives every phone. Output that does not end with a PNG's last chunk was
    cut short (the phone unplugged mid-transfer: the stream ends cleanly), so `still_listed`
    asks adb whether the phone is still there (raising when it is not) before the image is
    judged."""
    try:
        data = run(SERVICE, limit)
    except adb_transport.TooLarge as exc:
        raise ScreenshotError(
            f"screencap on {serial} wrote over the {exc.limit} bytes a look reads (not read)"
        ) from exc
    if not data.endswith(PNG_END):
        still_listed()
    return data
