"""Translate adb client failures into the driver interface's two errors.

A phone that vanished (unplugged, emulator killed, adb server gone) must become `DeviceGone` so
the task on it fails with a clear reason while other phones carry on; everything else stays a
`DeviceError`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import adbutils
from adbutils.errors import AdbConnectionError, AdbTimeout

from host.devices.base import DeviceError, DeviceGone

T = TypeVar("T")

_GONE_MARKERS = (
    "not found",
    "offline",
    "no devices",
    "device unauthorized",
    "connection reset",
    "connection refused",
    "broken pipe",
    "closed",
)


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


def is_gone(exc: BaseException) -> bool:
    """True when `exc` means the phone (or its adb server) is no longer reachable."""
    if isinstance(exc, AdbConnectionError | AdbTimeout):
        return True
    if isinstance(exc, ConnectionError | socket.timeout | BrokenPipeError | EOFError):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _GONE_MARKERS)


@contextmanager
def mapped_errors(serial: str, what: str) -> Iterator[None]:
    """Run an adb call, raising `DeviceGone` / `DeviceError` that name the phone and the call."""
    try:
        yield
    except DeviceError:
        raise
    except (adbutils.AdbError, OSError, EOFError) as exc:
        if is_gone(exc):
            raise DeviceGone(f"phone {serial} disconnected ({what}: {exc})") from exc
        raise DeviceError(f"{what} failed on {serial}: {exc}") from exc


def call(serial: str, what: str, fn: Callable[[], T]) -> T:
    """Functional form of `mapped_errors`."""
    with mapped_errors(serial, what):
        return fn()
