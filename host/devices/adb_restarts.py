"""Noticing that the adb server restarted, so a transport id read before is not trusted after.

Phones sharing one serial are addressed by adb's transport id (`adb_transport.switch_request`).
An adb server numbers its transports from 1 as it finds the phones; `adb kill-server` and a new
server (an operator's, an IDE's, another tool's `adb start-server`) number them again, in the
order the new server happens to find them. A driver still holding "transport 1, phone A" then
taps whichever phone is transport 1 now. The device list cannot tell: after the restart it lists
the same serials under the same ids. What does tell is the adb server's connection itself: a
`host:track-devices` connection held open ends when that server's process ends, and a
non-blocking read of it says so at once, with no request to the server.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import weakref

from host.devices.base import DeviceGone

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S = 3.0
_TRACK = b"host:track-devices"
#: TCP keepalive of the idle watch connection (`_keep_alive`): a dead one is known within
#: about 30 s of going quiet.
_KEEPALIVE_IDLE_S = 15
_KEEPALIVE_INTERVAL_S = 5
_KEEPALIVE_COUNT = 3


class ServerWatch:
    """Counts the runs of the adb server at one address: `run()` is the same number while the
    server that answered before is still the one running."""

    def __init__(self, host: str, port: int) -> None:
        self._addr = (host, port)
        self._lock = threading.Lock()
        #: The watched connection, in a box the finalizer holds: dropped in a garbage cycle
        #: (a registry's), the socket is not among the garbage, and is closed, not warned of.
        self._box: list[socket.socket | None] = [None]
        weakref.finalize(self, _close, self._box)
        self._runs = 0
        #: No connection was held when a run was last asked for (none made yet, or it could
        #: not be made): a server restart then went unseen, so the next connection made
        #: counts a new run.
        self._unwatched = True
        self._made = False  # a connection was ever made: the first one starts run 0
        self._refusal_logged = False

    def run(self) -> int:
        """The current run's number: one more than before once the watched server's
        connection ended (it stopped; a new one may answer now). No server: the number of the
        last one, and the next server that answers counts as a new run."""
        with self._lock:
            return self._look()[0]

    def watched_run(self) -> int | None:
        """`run()`, or None while no connection to the server is held (it could not be made,
        or the server refused to be watched): a restart in such a time would go unseen, so
        a transport id read then is no run's."""
        with self._lock:
            run, live = self._look()
            return run if live else None

    def close(self) -> None:
        """Drop the watched connection; what happens until the next one is unseen, so that
        one counts a new run."""
        with self._lock:
            _close(self._box)
            self._unwatched = True

    def _look(self) -> tuple[int, bool]:
        sock = self._box[0]
        if sock is not None and _ended(sock):
            _close(self._box)
            self._runs += 1
            self._unwatched = False  # counted: the server ended while watched
        if self._box[0] is None:
            self._box[0] = self._track()
            if self._box[0] is not None:
                # The first connection starts run 0; one made after a time unwatched (a
                # connect that timed out, a refusal) may be to a server that replaced the
                # one before without being seen: the ids of that one are not trusted.
                if self._unwatched and self._made:
                    self._runs += 1
                self._made = True
        self._unwatched = self._box[0] is None
        return self._runs, not self._unwatched

    def _track(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(self._addr, timeout=_CONNECT_TIMEOUT_S)
        except OSError:
            return None
        try:
            sock.sendall(b"%04x" % len(_TRACK) + _TRACK)
            reply = b""
            while len(reply) < 4 and (chunk := sock.recv(4 - len(reply))):
                reply += chunk
        except OSError:
            reply = b""
        if reply != b"OKAY":
            sock.close()
            if reply == b"FAIL" and not self._refusal_logged:
                self._refusal_logged = True
                log.warning(
                    "the adb server at %s:%d refused %s: the host cannot see it restart, so "
                    "it lists no phones while unwatched (phones sharing a serial would be "
                    "told apart by transport ids a new server may have handed to their twin)",
                    *self._addr,
                    _TRACK.decode(),
                )
            return None
        _keep_alive(sock)
        sock.setblocking(False)  # read only to drain device lists and see its end
        return sock


def _keep_alive(sock: socket.socket) -> None:
    """Have the kernel probe the idle watch connection. The adb server sends nothing on it
    while no phone changes, so a remote server's connection (`ANDROID_ADB_SERVER_HOST`, an
    SSH tunnel) whose NAT or firewall entry was silently dropped looked alive for good: the
    server's restart then sent its end to no one, and ids of the run before were trusted.
    Probed, such a connection errors within about `_KEEPALIVE_IDLE_S` + `_KEEPALIVE_COUNT` x
    `_KEEPALIVE_INTERVAL_S` seconds, and the next look counts a new run."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # Linux and macOS name the idle time differently; a system without these options (or
    # one refusing them: older Windows) keeps its default timing (probes after two hours).
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    for option, value in (
        (idle, _KEEPALIVE_IDLE_S),
        (getattr(socket, "TCP_KEEPINTVL", None), _KEEPALIVE_INTERVAL_S),
        (getattr(socket, "TCP_KEEPCNT", None), _KEEPALIVE_COUNT),
    ):
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _close(box: list[socket.socket | None]) -> None:
    sock, box[0] = box[0], None
    if sock is not None:
        sock.close()


def _ended(sock: socket.socket) -> bool:
    """Whether the server closed the watched connection; the device lists it sent since the
    last look are read and dropped (only the connection's end matters here)."""
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


#: Held by the registries and transport ids that use them: a watch no one holds is dropped
#: with its connection (a process that meets many adb servers, a test run, keeps none).
_watches: weakref.WeakValueDictionary[tuple[str, int], ServerWatch] = weakref.WeakValueDictionary()
_watches_lock = threading.Lock()


def watch(host: str, port: int) -> ServerWatch:
    """The process's one watch of the adb server at host:port (the registry and every driver
    compare their runs against the same count, so hold it as long as the ids it numbers)."""
    with _watches_lock:
        found = _watches.get((host, port))
        if found is None:
            found = _watches[(host, port)] = ServerWatch(host, port)
        return found


class TransportId(int):
    """A transport id together with the adb server run it was read in: `adb_transport`
    refuses to send a request through it once that run ended (`check`)."""

    watch: ServerWatch
    run: int

    def __new__(cls, value: int, server: ServerWatch, run: int) -> TransportId:
        self = super().__new__(cls, value)
        self.watch = server
        self.run = run
        return self


#: `DeviceGone.state` of a phone whose transport id the adb server may have given another
#: phone (the registry reports it OFFLINE with `RENUMBERED_REASON` until it lists it again).
RENUMBERED = "renumbered"


class Renumbered(DeviceGone):
    """The adb server restarted since the phone's transport id was read: the id may name
    another phone now, so nothing is sent through it."""

    def __init__(self, serial: str, transport_id: int) -> None:
        super().__init__(
            f"phone {serial}: the adb server restarted since it was found as transport "
            f"{transport_id}, and a new adb server numbers its phones afresh (the id may now "
            "be another phone with the same serial): nothing was sent; the phone is found "
            "again at the next device poll",
            RENUMBERED,
        )


def check(serial: str, transport_id: int | None) -> None:
    """`Renumbered` unless `transport_id` (a `TransportId`) was read in the adb server's
    current run, watched now (unwatched, a restart would go unseen); a plain int (or None) is
    the caller's own and not checked."""
    if (
        isinstance(transport_id, TransportId)
        and transport_id.watch.watched_run() != transport_id.run
    ):
        raise Renumbered(serial, int(transport_id))
