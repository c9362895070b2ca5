"""The few adb server requests the adbutils driver needs, with sockets closed on every path.

adbutils' own `shell`/`sync` leave the socket open when selecting the phone fails (the phone just
vanished), which leaks a file descriptor per failed call on a long-running host. These helpers
use adbutils' connection object but own its lifetime.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager

import adbutils
from adbutils import AdbClient
from adbutils._adb import AdbConnection
from adbutils.errors import AdbConnectionError

from host.devices import adb_restarts

DEFAULT_TIMEOUT_S = 30.0
_CONNECT_TIMEOUT_S = 3.0


class _Connection(AdbConnection):  # type: ignore[misc]
    """adbutils' connection without its rescue: when no adb server answers, adbutils runs `adb
    start-server` (a daemon the operator did not ask for, on the default port whatever port
    the host was given) and leaves the refused socket open. The host checks for the server
    itself and calls a phone gone when there is none (`adb_errors`)."""

    def __init__(self, host: str, port: int, timeout: float | None) -> None:
        self._address = (host, port)
        self._timeout = timeout
        super().__init__(host, port)

    def _safe_connect(self) -> socket.socket:
        try:
            # closes its socket when the connection fails; 3 s to connect, as adbutils allows
            sock = socket.create_connection(self._address, timeout=_CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise AdbConnectionError(f"connect to adb server failed: {exc}") from exc
        sock.settimeout(self._timeout)  # None: blocking, as adbutils leaves it
        return sock


class Client(AdbClient):  # type: ignore[misc]
    """`AdbClient` whose connections never start an adb server nor leak a refused socket.

    `timeout_s` bounds every read of a connection whose caller named no timeout of its own
    (adbutils' `list()` names none): an adb server can accept a request and never answer it
    (its USB thread stuck on a bad cable or hub), and a read without a timeout then blocks
    its thread for good. None keeps adbutils' blocking reads."""

    def __init__(self, host: str, port: int, timeout_s: float | None = None) -> None:
        super().__init__(host=host, port=port)
        self.timeout_s = timeout_s

    def make_connection(self, timeout: float | None = None) -> AdbConnection:
        return _Connection(self.host, self.port, timeout or self.timeout_s)


def switch_request(serial: str, transport_id: int | None = None) -> str:
    """The request that switches a connection to one phone: by `transport_id` when given
    (phones sharing a serial, where adb refuses `host:transport:SERIAL` with "more than one
    device"), else by serial. A transport id read in an adb server run that has ended is
    refused (`adb_restarts.Renumbered`): it may name another phone now."""
    adb_restarts.check(serial, transport_id)
    if transport_id is not None:
        return f"host:transport-id:{transport_id}"
    return f"host:transport:{serial}"


def query_prefix(serial: str, transport_id: int | None = None) -> str:
    """The prefix of a one-shot question about one phone (`…:get-state`), addressed as
    `switch_request` addresses it (and refuses as it does)."""
    adb_restarts.check(serial, transport_id)
    if transport_id is not None:
        return f"host-transport-id:{transport_id}"
    return f"host-serial:{serial}"


@contextmanager
def transport(
    client: AdbClient, serial: str, timeout: float, transport_id: int | None = None
) -> Iterator[AdbConnection]:
    """A connection switched to the phone (see `switch_request`), closed however the block
    ends. The adb server's run is checked again once the switch is answered: a server that
    restarted between the first check and the connection was already gone when the new one
    answered, so its end is seen now, before the phone is asked anything."""
    conn = client.make_connection(timeout=timeout)
    try:
        conn.send_command(switch_request(serial, transport_id))
        conn.check_okay()
        adb_restarts.check(serial, transport_id)
        yield conn
    finally:
        conn.close()


def state(
    client: AdbClient,
    serial: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    transport_id: int | None = None,
) -> str:
    """`host-serial:SERIAL:get-state`: what the adb server lists the phone as ("device",
    "offline", "unauthorized"…); `AdbError` ("device '…' not found") when it is not listed."""
    conn = client.make_connection(timeout=timeout)
    try:
        conn.send_command(f"{query_prefix(serial, transport_id)}:get-state")
        conn.check_okay()
        return str(conn.read_string_block())
    finally:
        conn.close()


class TooLarge(Exception):
    """What `pull` or `run` was asked to read (a file, a command's output) is larger than
    the caller takes (`limit`)."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(f"{path}: larger than {limit} bytes")
        self.limit = limit


def run(
    client: AdbClient,
    serial: str,
    service: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    transport_id: int | None = None,
    received: bytearray | None = None,
    limit: int | None = None,
) -> bytes:
    """`shell:CMD` or `exec-out:CMD`: everything the phone writes until it closes the stream.
    `received`, when given, gets the bytes as they arrive, so what came before a timeout is
    kept (the pid a dumper's shell printed first: `AdbDriver.dump_hierarchy`); adbutils'
    reads wait for 4 KiB or the end, and lose what they had on a timeout. `limit`: `TooLarge`
    once the phone wrote more (the request closed), as `pull`'s."""
    with transport(client, serial, timeout, transport_id) as conn:
        conn.send_command(service)
        conn.check_okay()
        if received is None and limit is None:
            data = conn.read_until_close(encoding=None)
        else:
            into = bytearray() if received is None else received
            while chunk := conn.conn.recv(65536):
                into += chunk
                if limit is not None and len(into) > limit:
                    raise TooLarge(service, limit)
            data = bytes(into)
    assert isinstance(data, bytes)
    return data


def pull(
    client: AdbClient,
    serial: str,
    path: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    transport_id: int | None = None,
    limit: int | None = None,
) -> bytes:
    """Read one file over the sync protocol (`RECV` → `DATA`… `DONE`, or `FAIL`). `limit`:
    `TooLarge` as soon as the file is known to be larger (a chunk announcing more counts
    before it is read), so a runaway file never sits whole in the host's memory: the host
    drives several phones in one process, and one phone's file must not starve the others."""
    encoded = path.encode("utf-8")
    chunks: list[bytes] = []
    total = 0
    with transport(client, serial, timeout, transport_id) as conn:
        conn.send_command("sync:")
        conn.check_okay()
        conn.send(b"RECV" + struct.pack("<I", len(encoded)) + encoded)
        while True:
            head = conn.read_exact(8)
            kind, size = head[:4], struct.unpack("<I", head[4:])[0]
            if kind == b"DATA":
                total += size
                if limit is not None and total > limit:
                    raise TooLarge(path, limit)
                chunks.append(conn.read_exact(size))
            elif kind == b"DONE":
                break
            elif kind == b"FAIL":
                message = conn.read_exact(size).decode("utf-8", "replace")
                raise adbutils.AdbError(f"pull {path}: {message}")
            else:
                raise adbutils.AdbError(f"pull {path}: unexpected sync reply {kind!r}")
    return b"".join(chunks)
