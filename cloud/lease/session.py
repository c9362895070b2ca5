"""One connected host as this replica sees it: its outbox (what the cloud pushes unasked) and
which of its phones are busy."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.store.leases import HeldLease

_ONLINE = types_pb2.DEVICE_STATE_ONLINE


@dataclass(slots=True)
class Closing:
    """Why the stream is being ended by the server."""

    code: grpc.StatusCode
    message: str


@dataclass(eq=False)
class HostSession:
    """State of one open Lease stream.

    `busy` is a hint of the phones with a live attempt, kept in step with the store by claims,
    results, sweeps and a periodic resync; the store's unique index is the real guard. Change
    it through `mark_busy`, `mark_free` and `set_busy`: they count the changes a resync must
    not undo.
    """

    host_id: str
    planner_transport: int
    #: The host agent's run that opened this stream (`HostHello.process_id`; "" if unknown).
    process_id: str = ""
    #: Serial of the client certificate the stream was opened with (for revocations).
    serial: str | None = None
    devices: dict[str, int] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    #: Changes to `busy` so far. A resync reads the store without holding up claims and
    #: results; it applies what it read only if nothing changed meanwhile: a claim committed
    #: or a lease ended during the read was otherwise undone (a busy phone offered to a claim
    #: that could only fail, which in a burst of hellos held idle hosts back a pass; or a free
    #: phone left idle until the next resync).
    busy_changes: int = 0
    stream_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    outbox: asyncio.Queue[lease_pb.LeaseResponse | Closing] = field(default_factory=asyncio.Queue)
    #: Held around each write: the reader answers and the outbox's pushes share the stream.
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dispatch_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dispatch_pending: bool = False
    #: Phones offered to a claim whose outcome is unknown (the database failed mid-commit): a
    #: live attempt found on them later was never sent and is sent then.
    unsure_serials: set[str] = field(default_factory=set)
    #: Leases sent down this stream that may still be live: released if this stream's process
    #: is superseded (its successor does not hold them).
    granted: set[HeldLease] = field(default_factory=set)
    #: Fresh assignments queued for this stream and not yet handed to gRPC (in the outbox, or
    #: taken off it by the handler and waiting for the write lock): no host can run them, so a
    #: stream that ends, or is superseded, first releases them unused (`take_unsent`).
    unsent: set[HeldLease] = field(default_factory=set)
    #: The flow ids each (task, attempt) sent down this stream was handed (read once for an
    #: attempt resumed on it): a direct host's renewal reads the flows' status only for an
    #: attempt that has some, so the renewals of all the others cost no read.
    handed_flows: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)
    #: True once the hello is in the store (the hosts row names this stream).
    recorded: bool = False
    #: True once `open()` settled the hello's leases (resumed, refused, a restarted process's
    #: predecessor's released) and marked their phones busy: only then may a dispatch claim
    #: work for the host. Between `recorded` and this, every phone looked idle, and a pass
    #: claimed the next attempt of a lapsed task the hello was about to resume on that phone.
    settled: bool = False
    closed: bool = False
    #: A write to this stream waited its limit (`lease_write_timeout_seconds`): the client
    #: stopped reading, nothing more is written and the stream ends UNAVAILABLE "not reading".
    stuck: bool = False
    #: When the write under way began (`time.monotonic()`; None between writes) and the task
    #: doing it: the replica's write watch (`cloud.lease.write_watch`) cancels a write pending
    #: past `lease_write_timeout_seconds`, which ends the stream "not reading".
    write_started: float | None = None
    writer: asyncio.Task[Any] | None = None
    #: When the host last sent anything on this stream. In memory only: the frozen-host hold
    #: reads it (`LeaseManager._on_revoke`); the fleet shows a connected host as seen at its
    #: replica's last vouch, and the host row's `last_seen_at` is written at the stream's open
    #: and end, not every heartbeat (migration 0032).
    last_seen: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    #: Set (a `time.monotonic()` bound) when a lease of this host ran out while its stream
    #: stayed open. A frozen process (SIGSTOP, a stalled VM, a closed laptop lid) keeps its
    #: stream until the keepalive gives up, and every task handed to it meanwhile would burn an
    #: attempt: no new work until the host sends anything (`heard`), or until the stream has
    #: outlived the keepalive window since (a frozen process answers no pings, so a stream
    #: still open then belongs to a live, merely quiet host).
    unheard_until: float | None = None
    #: The host said it is stopping (`HostStopping`): none of its phones is offered work
    #: again on this stream. Else the task its stopped attempt hands back went straight back
    #: to the same host (its phone is idle again), which would refuse it.
    stopping: bool = False

    def mark_busy(self, serial: str) -> None:
        """A phone got a live attempt."""
        self.busy.add(serial)
        self.busy_changes += 1

    def mark_free(self, serials: Iterable[str]) -> None:
        """These phones' attempts ended."""
        self.busy.difference_update(serials)
        self.busy_changes += 1

    def set_busy(self, serials: set[str]) -> None:
        """The phones with a live attempt, as the store said at a hello."""
        self.busy = serials
        self.busy_changes += 1

    def lapsed(self, window: float) -> None:
        """A lease of this host ran out on its open stream: hold new work for `window` seconds
        or until the host is heard from."""
        self.unheard_until = time.monotonic() + window

    def heard(self) -> bool:
        """The host sent something; True if that ends a hold (`lapsed`)."""
        held, self.unheard_until = self.unheard_until is not None, None
        return held

    def unheard(self) -> bool:
        """Whether new work is held back from this host (`lapsed`, not yet heard from)."""
        if self.unheard_until is not None and time.monotonic() >= self.unheard_until:
            self.unheard_until = None
        return self.unheard_until is not None

    def set_devices(self, devices: list[types_pb2.Device]) -> None:
        """Replace the phone list."""
        self.devices = {d.serial: int(d.state) for d in devices}

    def idle_serials(self) -> list[str]:
        """Online phones without a live attempt, in a stable order."""
        if self.stopping:
            return []
        return sorted(
            s
            for s, state in self.devices.items()
            if state == types_pb2.DEVICE_STATE_ONLINE and s not in self.busy
        )

    def has_idle(self) -> bool:
        """Whether any phone is idle (`idle_serials` without the list: the dispatcher asks it of
        every session of the replica on every pass; a plain loop: over 10,000 sessions with no
        idle phone 3 ms, against 6 ms as a generator expression)."""
        if self.stopping:
            return False
        busy = self.busy
        for serial, state in self.devices.items():
            if state == _ONLINE and serial not in busy:
                return True
        return False

    def send(self, message: lease_pb.LeaseResponse) -> None:
        """Push a message to the host (dropped once the stream is closing); answers to the host's
        own messages are written by the stream's reader, not queued here."""
        if not self.closed:
            if message.WhichOneof("kind") == "assignment" and not message.assignment.resumed:
                a = message.assignment  # a resumed one is the host's own: it runs it anyway
                self.unsent.add(HeldLease(a.task_id, a.attempt, a.lease_id))
            self.outbox.put_nowait(message)

    def take_unsent(self) -> set[HeldLease]:
        """The fresh assignments never handed to gRPC (`unsent`), taken: none of them is
        written after this (`cloud.lease.stream._bounded_write`), and they leave `granted`."""
        taken, self.unsent = self.unsent, set()
        self.granted -= taken
        return taken

    def supersede(self, message: str) -> None:
        """Tell the host a newer process took its place, then end the stream (ABORTED)."""
        self.send(lease_pb.LeaseResponse(superseded=lease_pb.Superseded(message=message)))
        self.close(grpc.StatusCode.ABORTED, message)

    def close(self, code: grpc.StatusCode, message: str) -> None:
        """End the stream with `code` after what is already queued."""
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(Closing(code, message))
