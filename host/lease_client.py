"""The host's one bidirectional `LeaseService.Lease` stream.

Host → cloud: a hello (phones, agent version, planner transport, assignments still held), then
renewals (each with the latest progress), results and device updates. Cloud → host:
assignments, renewals, revocations, result acks. The client:

- never touches a phone before the cloud assigned a task to it;
- renews each lease at a third of its length and, rate-limited, whenever progress changes;
- stops a task within one step of `Revoked`;
- keeps each result until the cloud acknowledges it (or says another attempt holds the task),
  resending it after a reconnect, after a retryable rejection and every `RESULT_RESEND_S`
  without an answer; a result whose lease ran out meanwhile is still sent (the cloud accepts
  it as late while no other attempt has started), so finished work is not run again;
- keeps each result on disk too (`ResultKeeper`, the outbox's file) from the moment the attempt
  ends: a process started after one that died with results unanswered names their leases in
  its hello (else the cloud releases them and runs the tasks again) and sends them; so does a
  process whose stream was down when its attempt ended (else a lease that lapsed meanwhile
  leaves its task to be handed out again before the result arrives); a result the cloud
  refuses is dropped, with a log line, not sent again;
- pauses a task whose lease ran out by its own clock with no renewal answered, whether its
  stream is gone or only silent (a dead link its keepalive has not noticed yet): the cloud
  may hand the task on at that moment, so the attempt does nothing more on its phone (the
  action under way ends, as a stop lets it) and asks no model (`host.agent.lease_pause`). But
  a cloud that was down gives live leases a new term when it starts again, and resumes those a
  hello names: once the cloud confirms the lease (a renewal answered, the hello's resume) the
  attempt continues where it was, its steps done kept. Refused (revoked: expired, superseded,
  a refusal at the hello), it stops as any revoked attempt does, an expiry answered with a
  retryable result; a deadline or a host stop ends a paused attempt as it ends a running one;
- starts an assignment for a phone whose previous attempt is still stopping (revoked, within
  one step of its end) once that attempt has stopped, instead of refusing it;
- reconnects with capped exponential backoff and full jitter, re-announcing what it holds;
- says which run of the agent it is (`HostHello.process_id`, new for every process), so the
  cloud can release a dead predecessor's leases at once;
- hands its work back when it is stopped (SIGTERM, SIGINT): it tells the cloud it takes no
  new assignment (`HostStopping`), stops each attempt within one step (one whose step is stuck
  on its phone past `stop_grace_s` is handed back without it), sends each a retryable result
  ("stopped: the host stopped") so the cloud queues the task for another host at once,
  waits up to `stop_grace_s` for the acknowledgements, then closes its side of the stream; what
  is left unanswered is kept on disk for the next start. `stop_now` (a second signal) cuts the
  waits short;
- stops for good, without reconnecting, when the cloud says a newer process of this host took
  its place (`Superseded`): two processes with one certificate would otherwise take the stream
  from each other in turns;
- stops at once (`HostRefused`, naming the cloud's reason) when the stream ends
  UNAUTHENTICATED (its certificate or host id revoked), PERMISSION_DENIED (the certificate
  carries no host identity) or FAILED_PRECONDITION (the first message was not a hello): the
  same certificate is refused the same way on every try, so a host retrying it looked alive
  to its supervisor while it did nothing (decision 0084);
- stops at once (`NotACloud`, naming the address and the answer) when the stream ends
  UNIMPLEMENTED: what answered is not an amc cloud, and no reconnect makes it one;
- reports phones going offline and coming back as device updates.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import grpc
from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import DecodeError

from amc.v1 import lease_service_pb2, lease_service_pb2_grpc, types_pb2
from cloud.cert_validity import CertificateInvalid, cloud_refused
from host import metrics
from host.agent.loop import TaskOutcome, TaskSpec
from host.agent.progress import ProgressHolder, ProgressSnapshot, truncate
from host.agent.stop_signal import HOST_STOPPED, PHONE_LOST, REVOKED, StopSignal
from host.cloud_channel import CertificateMissing, CertificatesHung, CertificatesUnreadable
from host.devices.lanes import Lane
from host.devices.registry import DeviceInfo, reported
from host.not_connecting import NotConnecting
from host.timeline.data_folder import DataFolder
from host.timeline.start_reads import read_at_start
from host.timeline.storage_faults import storage_fault, storage_summary
from planner.budget import Budget, FleetDay
from planner.convert import usage_from_proto

log = logging.getLogger(__name__)

RunTask = Callable[[TaskSpec, ProgressHolder, asyncio.Event], Awaitable[TaskOutcome]]
#: Told each attempt's outcome once its result (if any) is kept: the host's timeline records the
#: end then, so it never says an attempt ended whose result a kill could still lose. Called in
#: a daemon thread of its own (`LeaseClient._record_end`), not awaited: on the loop, a write
#: hung on the disk (or waiting for the timeline's lock behind one) stalled every lease's
#: renewals; awaited, the cloud's answer could come before the attempt's task was done, and
#: the attempt was never forgotten.
AttemptEnded = Callable[[TaskSpec, TaskOutcome], None]
Key = tuple[str, int]
#: A new channel to the cloud for each connection attempt, made at once or awaited (the
#: runner's `cloud_channel.connect` reads the certificate files off the event loop).
ChannelFactory = Callable[[], grpc.aio.Channel | Awaitable[grpc.aio.Channel]]

DEFAULT_LEASE_S = 60.0
#: A result the cloud answered with a retryable UNAVAILABLE rejection goes again after this long.
RESEND_AFTER_UNAVAILABLE_S = 1.0
#: A result neither acknowledged nor refused goes again after this long (a message lost with a
#: stream the host has not yet noticed is dead, an answer lost on the way back).
RESULT_RESEND_S = 5.0
#: `RunningTask.revoke_reason` of an attempt paused because its lease ran out by the host's own
#: clock while the cloud could not be reached, then stopped by the cloud's expiry revoke.
EXPIRED_LOCALLY = "LEASE_EXPIRED_LOCALLY"
#: The retryable result such an attempt ends with.
UNREACHABLE_SUMMARY = "stopped: the lease ran out while the cloud was unreachable"
#: The retryable result of an attempt stopped because the cloud said its lease is not live.
LEASE_NOT_LIVE_SUMMARY = "stopped: the cloud said the lease is no longer live"
#: The retryable result of an attempt this host stopped because it is stopping itself.
HOST_STOPPED_SUMMARY = f"stopped: {HOST_STOPPED}"


def phone_lost_summary(serial: str, grace_s: float) -> str:
    """The retryable result of an attempt whose phone left adb and was not back within
    `grace_s` (`LeaseClientConfig.phone_lost_grace_s`)."""
    return f"phone lost: {serial} was not back in adb within {grace_s:.15g} s of leaving it"


#: How many times an attempt's phone may leave adb and come back within the grace before its
#: next leave ends the attempt at once (docs/decisions/0087-phone-drops-bound.md): each blip
#: is waited out, but a phone on a failing cable or hub that drops every minute held its
#: task for good, every step at risk of landing on a half-connected phone.
MAX_PHONE_DROPS = 3


def phone_unsteady_summary(serial: str, drops: int) -> str:
    """The retryable result of an attempt whose phone left adb more than `MAX_PHONE_DROPS`
    times, each time back within the grace."""
    return (
        f"phone unsteady: {serial} left adb {drops} times during this attempt (the host waits "
        f"out {MAX_PHONE_DROPS}); check its cable, hub or Wi-Fi link"
    )


def adb_down_summary(serial: str, grace_s: float, reason: str) -> str:
    """The retryable result of an attempt whose phone was out of sight for `grace_s` because
    the adb server did not answer (`DeviceInfo.adb_down`; `reason` says which server and what
    to do): the fault is the server's, and every attempt of the host ends so, not "phone
    lost" N times over."""
    return f"adb server unreachable: {serial} was out of sight for {grace_s:.15g} s: {reason}"


#: How long a stopping client waits for its disk writes (`_write`: results kept and dropped,
#: attempts' ends): one hung on the disk is left to its daemon thread (a restart ends the row
#: from the kept result, or marks it interrupted), as the host's other background writes are
#: (`host.runner`).
END_WRITES_STOP_S = 2.0


#: How a Lease stream ends when no reconnect with this process's certificate can help
#: (lease_service.proto): the host stops (`HostRefused`), as the Node host does (host.js `FINAL`).
REFUSED_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)


#: Of those, the refusals of the certificate itself: when the files hold another certificate
#: than the refused one (issued again, then the old one revoked: rotating it), the host
#: reconnects with that one (`LeaseClient.replaced`), as the Node host does.
IDENTITY_REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})

#: Says, when the certificate files hold another certificate than the last channel presented,
#: what changed ("serial OLD -> NEW"), else None (`cloud_channel.LeaseDialer.replaced`).
CertificateReplaced = Callable[[], Awaitable[str | None]]


class HostRefused(Exception):
    """The cloud refused this host's identity on the Lease stream (REFUSED_CODES): a revoked
    certificate or host id, or a certificate without a host identity. Only an operator can
    change that (a new certificate, `amc certs unrevoke`), so the host stops saying so, with a
    non-zero exit a supervisor and an operator see, rather than retrying for ever
    (decision 0084)."""


class NotACloud(Exception):
    """What answered at the cloud's address ended the Lease stream UNIMPLEMENTED: it serves no
    LeaseService (another gRPC server, an HTTP/2 proxy's 404). No reconnect makes it a cloud,
    so the host stops at once saying so, rather than retrying for ever with backoff."""


def not_a_cloud(address: str, details: str, setting: str = "AMC_HOST_CLOUD_ADDRESS") -> str:
    """What both hosts say when that happens (examples/node-host/host.js, `notACloud`, with its
    own setting's name)."""
    return (
        f"{address} is not an amc cloud: it answered the Lease stream UNIMPLEMENTED "
        f"({details}); check {setting}"
    )


class ResultKeeper(Protocol):
    """Where results wait for the cloud's answer across a restart (an `OutboxStore` fits)."""

    def keep_result(self, task_id: str, attempt: int, device_serial: str, body: bytes) -> None: ...

    def drop_result(self, task_id: str, attempt: int) -> None: ...

    def held_results(self) -> list[tuple[str, bytes]]: ...


class DeviceSource(Protocol):
    """Where the lease client learns the host's phones (a `DeviceRegistry` fits)."""

    def devices(self) -> list[DeviceInfo]: ...

    def add_listener(self, listener: Callable[[DeviceInfo, str], None]) -> None: ...


@dataclass(slots=True)
class RunningTask:
    """One assignment this host holds, from Assignment to acknowledged result."""

    spec: TaskSpec
    progress: ProgressHolder
    cancel: StopSignal
    lease_s: float
    expires_mono: float
    #: Renew at least this often (the assignment's renew_interval; a third of the lease).
    renew_s: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[TaskOutcome] | None = None
    renewer: asyncio.Task[None] | None = None
    revoked: types_pb2.TaskStatus.ValueType | None = None
    revoke_reason: str = ""
    revoke_message: str = ""
    last_renewal_mono: float = 0.0
    #: When each renewal sent on this stream and not answered yet left (monotonic, oldest
    #: first): the cloud answers one lease's renewals in order on one stream, so a `Renewed`
    #: answers the oldest, and its term is counted from that send, not from when the answer
    #: is read. An answer read late (a buffering link, a slow cloud send queue) would
    #: otherwise carry the lease past the cloud's own expiry, and resume a paused attempt on
    #: a lease the cloud swept meanwhile. Under-estimates by at most the round trip.
    renewals_out: deque[float] = field(default_factory=deque)
    outcome: TaskOutcome | None = None
    #: The previous attempt on this phone, still stopping when this one was assigned.
    after: asyncio.Task[TaskOutcome] | None = None
    #: Why it was stopped PHONE_LOST (`LeaseClient._phone_lost`): its retryable result.
    lost_summary: str = ""
    #: How many times its phone left adb while it ran (`LeaseClient._phone_seen`).
    phone_drops: int = 0

    @property
    def key(self) -> Key:
        return (self.spec.task_id, self.spec.attempt)


@dataclass(frozen=True, slots=True)
class LeaseClientConfig:
    agent_version: str = "amc-host/0.1.0"
    planner_transport: types_pb2.PlannerTransport.ValueType = types_pb2.PLANNER_TRANSPORT_DIRECT
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 30.0
    progress_renew_min_interval_s: float = 1.0
    #: This run of the agent (`HostHello.process_id`); empty: a fresh random one per client.
    process_id: str = ""
    #: A stopping host waits at most this long for its attempts to stop, then as long for the
    #: cloud to acknowledge its results.
    stop_grace_s: float = 5.0
    #: How long a running attempt's phone may be gone from adb before the attempt ends "phone
    #: lost" (`HostSettings.phone_lost_grace_s`).
    phone_lost_grace_s: float = 60.0
    #: Where the channel dials (`HostSettings.cloud_address`), named when it is not a cloud.
    cloud_address: str = ""


def backoff_delay(
    attempt: int, initial: float, cap: float, rng: random.Random, lease_left: float | None = None
) -> float:
    """Full jitter: uniform in [0, min(cap, initial * 2**attempt)], at least 50 ms.

    `lease_left`: seconds until the soonest expiry of a lease this host holds. The ceiling is
    then at most half of it: a replica restart takes its hosts' streams down for a few seconds,
    after which a host that had doubled its backoff to 8 or 16 s would sleep through the rest
    of its lease and stop its task (`_renew_loop`), though the cloud was back and kept the
    lease (bench/replica_restart.py)."""
    ceiling = min(cap, initial * (2 ** min(attempt, 30)))
    if lease_left is not None:
        ceiling = min(ceiling, max(0.0, lease_left) / 2)
    return max(0.05, rng.uniform(0, ceiling))


def _duration_s(d: duration_pb2.Duration, default: float) -> float:
    seconds = d.ToTimedelta().total_seconds()
    return float(seconds) if seconds > 0 else default


def _heard(fleet_day: FleetDay, said: lease_service_pb2.FleetDay) -> None:
    """The cloud's word on the fleet's day (an assignment's or a renewal's), for the attempt's
    direct planner to check before its next model call."""
    caps = Budget(said.caps.max_tokens, said.caps.max_cost_usd)
    fleet_day.heard(caps, said.day, usage_from_proto(said.spent))


def _task_deadline(a: lease_service_pb2.Assignment) -> float | None:
    """The task's deadline on this host's monotonic clock (`TaskSpec.deadline`): the time left
    the cloud sent (`deadline_remaining`) from now, so neither a host whose clock runs ahead of
    the cloud's nor one whose clock steps while the task runs stops waiting for the planner
    early (or waits past the deadline); a cloud from before the field sends only the
    timestamp, read against this host's wall clock once, here."""
    if a.HasField("deadline_remaining"):
        return time.monotonic() + a.deadline_remaining.ToTimedelta().total_seconds()
    if a.HasField("deadline"):
        left = a.deadline.ToDatetime(tzinfo=UTC) - datetime.now(UTC)
        return time.monotonic() + left.total_seconds()
    return None


def _mono_expiry(
    ts: timestamp_pb2.Timestamp,
    lease_s: float,
    remaining: duration_pb2.Duration | None = None,
    since: float | None = None,
) -> float:
    """The lease's end as a monotonic deadline (immune to wall-clock steps on the host).

    From the time left the cloud sent (`lease_remaining`), counted from `since`: when the
    message it answers left this host (`RunningTask.renewals_out`, the hello's send), or now
    when no send is on record. The cloud counted it from a moment after that send, so the
    end is never later than the cloud's. It does not
    depend on this host's wall clock agreeing with the cloud's. A host whose clock ran ahead
    by more than a lease would otherwise see every lease as over when it arrived, and stop its
    task at the first renewal that could not be sent (a cloud restart, a network blip). A
    cloud from before the field sends only the timestamp, read against this host's clock."""
    if remaining is not None:
        start = time.monotonic() if since is None else since
        return start + remaining.ToTimedelta().total_seconds()
    if ts.seconds:
        left = (ts.ToDatetime(tzinfo=UTC) - datetime.now(UTC)).total_seconds()
        return time.monotonic() + left
    return time.monotonic() + lease_s


def _finished(result: lease_service_pb2.TaskResult, revoked: lease_service_pb2.Revoked) -> str:
    """Why a kept result answered Revoked FINISHED is let go, for `_let_go`: "" when the task
    is where the result left it (the result got there, its ack did not), else the conflict.
    A cloud from before `Revoked.task_status` names the attempt's recorded status only in the
    message ("attempt ended SUCCEEDED", `cloud.store.leases.fence.classify_sync`)."""
    if revoked.task_status == types_pb2.TASK_STATUS_UNSPECIFIED:
        recorded = revoked.message.removeprefix("attempt ended ").strip()
        same = f"TASK_STATUS_{recorded}" == types_pb2.TaskStatus.Name(result.status)
    else:  # a retryable failure leaves its task queued for the next attempt
        same = revoked.task_status == result.status or (
            result.retryable and revoked.task_status == types_pb2.TASK_STATUS_QUEUED
        )
    return "" if same else f"recorded another end for its attempt ({revoked.message})"


def _revoke_reason_name(reason: int) -> str:
    """The reason's name, or its number when a newer cloud sends one this host does not know:
    the lease is gone either way, so it is a plain revoke (`RevokeReason.Name` would raise and
    end the stream, and the task would run on under a lease the cloud took back)."""
    if reason in lease_service_pb2.RevokeReason.values():
        return lease_service_pb2.RevokeReason.Name(reason)  # type: ignore[arg-type]
    return f"REVOKE_REASON_{reason}"


class LeaseClient:
    """Keeps the Lease stream up and runs the tasks the cloud assigns."""

    def __init__(
        self,
        channel_factory: ChannelFactory,
        devices: DeviceSource,
        run_task: RunTask,
        config: LeaseClientConfig | None = None,
        rng: random.Random | None = None,
        results: ResultKeeper | None = None,
        ended: AttemptEnded | None = None,
        data_folder: DataFolder | None = None,
        replaced: CertificateReplaced | None = None,
    ) -> None:
        self._channel_factory = channel_factory
        #: Whether a refused certificate has a successor in the files (`IDENTITY_REFUSED`).
        self._replaced = replaced
        #: Whether the host can write its data folder: while it cannot, it takes no work.
        self.data_folder = data_folder
        self._ended = ended
        #: Attempts whose end the data folder refused to record, to record once it takes writes.
        self._unrecorded_ends: list[tuple[TaskSpec, TaskOutcome]] = []
        #: How many times `writable_again` ran: a write refused before it but reported after
        #: it (its lane finished it while the probe succeeded) is tried again at once, not left
        #: for the next probe with the host marked unwritable meanwhile.
        self._writable_epoch = 0
        #: The thread this client writes the disk in (`_write`: results kept and dropped, the
        #: attempts' ends), made on first use and let go when `run` ends: a daemon, so a write
        #: hung on the disk holds neither the loop nor the exit; one thread, so the writes go
        #: in order (a result kept before its attempt's end is recorded, dropped after it was
        #: kept) and those behind a hung one wait in its queue.
        self._disk_lane: Lane | None = None
        #: The writes under way or queued: a stopping client waits for them at most
        #: `END_WRITES_STOP_S`.
        self._writing: set[asyncio.Future[None]] = set()
        #: Results sent but not kept on disk (the keep failed), with their phones: kept once a
        #: write to the data folder works again, if the cloud has not answered them by then.
        self._unkept: dict[Key, str] = {}
        self._devices = devices
        self._run_task = run_task
        self.config = config or LeaseClientConfig()
        self._rng = rng or random.Random()
        self._tasks: dict[Key, RunningTask] = {}
        self._outbox: dict[Key, lease_service_pb2.LeaseRequest] = {}
        self._results = results
        #: Results a previous process of this host kept, with their phones: their leases are
        #: named in the hello until the cloud answered them.
        self._inherited: dict[Key, str] = {}
        #: The host is stopping: it starts no new attempt.
        self._stopping = False
        #: Set by `stop_now`: a stopping host waits no longer (for its attempts, for answers).
        self._hurry = asyncio.Event()
        #: Set whenever a result is answered (a stopping host waits for its outbox to empty).
        self._answered = asyncio.Event()
        #: Results sent once more after the cloud said their lease expired (a late result is
        #: accepted when no other attempt started; a second "expired" means it was not).
        self._late_tried: set[Key] = set()
        self._queue: asyncio.Queue[lease_service_pb2.LeaseRequest | None] | None = None
        #: The attempts the current stream's hello named, and when it left (monotonic): the
        #: term of the assignment that resumes one is counted from there (`_mono_expiry`).
        self._hello_sent: dict[Key, float] = {}
        self._welcomed = asyncio.Event()
        self._resend_pending = False
        #: Whether the cloud's "cannot take it just now" (UNAVAILABLE) was logged since it last
        #: renewed a lease: an outage of its database rejects every renewal, one line says so.
        self._unavailable_said = False
        #: The timers that send results again (one per held result, one for "all, soon"):
        #: cancelled when `run` ends, so a stopped host keeps nothing on the loop.
        self._resend_timers: dict[Key | None, asyncio.TimerHandle] = {}
        #: Renewers of forgotten attempts, cancelled but maybe not ended yet: shutdown waits
        #: for them too, so a stopped host leaves no task behind.
        self._renewers_ending: set[asyncio.Task[None]] = set()
        self.host_id: str | None = None
        self.process_id = self.config.process_id or uuid.uuid4().hex
        self.connects = 0
        #: Set once a channel was made for the stream (its certificate files read and found
        #: usable): a file missing after that is waited for, not a setting to fix (exit 2),
        #: and the outbox starts sending (`host.runner.serve_host`).
        self.dialed = asyncio.Event()
        #: What the host says while its certificate files keep it from connecting.
        self._not_connecting = NotConnecting()
        self.last_error: str | None = None
        #: Why this process was superseded by a newer one of the same host (then it stops).
        self.superseded: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The outbox backlog the hello carries (kept current by whoever reports it).
        self.backlog: types_pb2.OutboxBacklog | None = None
        #: Called on every Welcome (the cloud is reachable again: the outbox retries now).
        self.on_welcome: list[Callable[[], None]] = []
        #: Phones of running attempts gone from adb: the timer that ends those attempts once
        #: `phone_lost_grace_s` passed with the phone still gone (`_phone_seen`).
        self._lost_timers: dict[str, asyncio.TimerHandle] = {}
        devices.add_listener(self._on_device_change)

    # --- what the console and tests read ---
    @property
    def connected(self) -> bool:
        return self._welcomed.is_set()

    def running(self) -> list[tuple[TaskSpec, ProgressSnapshot]]:
        return [
            (rt.spec, rt.progress.snapshot())
            for rt in self._tasks.values()
            if rt.task is not None and not rt.task.done()
        ]

    def pending_results(self) -> list[Key]:
        return list(self._outbox)

    async def wait_connected(self) -> None:
        await self._welcomed.wait()

    def stop_now(self) -> None:
        """Stop without waiting (a second SIGINT/SIGTERM): running attempts are cancelled and
        unanswered results stay on disk for the next start, their tasks waiting for their
        leases or for that start."""
        self._hurry.set()

    # --- main loop ---
    async def run(self, stop: asyncio.Event) -> None:
        """Connect, serve, reconnect until `stop` is set; then stop every task."""
        self._loop = asyncio.get_running_loop()
        await self._inherit_results()
        failures = 0
        try:
            while not stop.is_set():
                welcomed_before = self.connects
                refused = unusable = False
                unreadable = ""  # "hung" or "unreadable": files whose reading hung or failed
                missing: Path | None = None
                not_cloud = ""
                try:
                    await self._session(stop)
                except grpc.aio.AioRpcError as exc:
                    # A cloud certificate refused here (expired while the cloud ran) is named.
                    self.last_error = cloud_refused(exc.details() or "") or (
                        f"{exc.code().name}: {exc.details()}"
                    )
                    refused = exc.code() in REFUSED_CODES
                    if exc.code() in IDENTITY_REFUSED and await self._certificate_replaced():
                        refused = False  # reconnects, with the new certificate
                    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                        not_cloud = not_a_cloud(self.config.cloud_address, exc.details() or "")
                    elif not self.superseded and not refused:
                        log.warning("lease stream lost: %s", self.last_error)
                except (CertificatesHung, CertificatesUnreadable) as exc:
                    # Its files hang on their disk or cannot be read: said once per problem
                    # (`NotConnecting`), as files gone bad are; tried again with the backoff.
                    self.last_error = str(exc)
                    unreadable = "hung" if isinstance(exc, CertificatesHung) else "unreadable"
                except (OSError, ConnectionError) as exc:
                    self.last_error = str(exc)
                    log.warning("lease stream lost: %s", exc)
                except CertificateInvalid as exc:  # checked before each connection attempt
                    self.last_error = str(exc)
                    unusable = True
                except CertificateMissing as exc:
                    # Deleted and copied in again, a folder replaced by a tool: once the host
                    # connected with its files, it waits for them (it stopped with 2). One
                    # not there at its start is a setting to fix (exit 2).
                    if not self.dialed.is_set() or exc.path is None:
                        raise
                    self.last_error = f"{exc.path} is missing"
                    missing = exc.path
                if not (unusable or missing or unreadable):
                    self._not_connecting.passed()
                if not stop.is_set():
                    metrics.reconnects.inc()
                self._welcomed.clear()
                if stop.is_set():
                    break
                if self.superseded:
                    log.error(
                        "stopping: %s. Another process uses this host's certificate; this one "
                        "does not reconnect (its tasks stop, their leases were released)",
                        self.superseded,
                    )
                    break
                if not_cloud:
                    self.last_error = not_cloud
                    raise NotACloud(not_cloud)
                if refused:
                    raise HostRefused(f"the cloud refused this host: {self.last_error}")
                failures = 0 if self.connects > welcomed_before else failures + 1
                delay = backoff_delay(
                    failures,
                    self.config.reconnect_initial_s,
                    self.config.reconnect_max_s,
                    self._rng,
                    self._lease_left(),
                )
                if unusable:  # a new certificate in its files is used at the next attempt
                    delay = self.config.reconnect_max_s
                    if said := self._not_connecting.said(self.last_error or ""):
                        log.error(
                            "%s: %s (the cloud would refuse it); install a new one "
                            "(`amc certs host DIR HOST_ID`). Checking again in %.0f s",
                            said, self.last_error, delay,
                        )  # fmt: skip
                elif missing and (said := self._not_connecting.said(self.last_error or "")):
                    log.error(
                        "%s: %s; put it back (copied in under another name, then "
                        "renamed into place with `mv`). Checking again in %.1f s",
                        said, self.last_error, delay,
                    )  # fmt: skip
                elif unreadable and (
                    said := self._not_connecting.said(self.last_error or "", unreadable)
                ):
                    log.warning("%s: %s; reconnecting in %.1f s", said, self.last_error, delay)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
        finally:
            self._welcomed.clear()
            await self._shutdown_tasks()
            for timer in [*self._resend_timers.values(), *self._lost_timers.values()]:
                timer.cancel()
            self._resend_timers.clear()
            self._lost_timers.clear()
            self._resend_pending = False
            await self._let_writes_go()

    async def _certificate_replaced(self) -> bool:
        """Whether the cloud's refusal of this host's certificate is to be met by connecting
        with the one its files now hold (said, with both serials); False when they hold the
        refused one (the refusal is final, `HostRefused`)."""
        if self._replaced is None:
            return False
        changed = await self._replaced()
        if changed is None:
            return False
        log.warning(
            "the cloud refused the certificate this host connected with (%s); its files hold "
            "another one (%s): connecting with it", self.last_error, changed,
        )  # fmt: skip
        return True

    async def _let_writes_go(self) -> None:
        """Let the disk writes finish, for at most `END_WRITES_STOP_S` (`stop_now` too: on a
        disk that works they take milliseconds), then the thread go: a write hung on the disk
        is left there (the process is ending)."""
        if self._writing:
            await asyncio.wait(list(self._writing), timeout=END_WRITES_STOP_S)
        if self._writing:
            log.warning("%d write(s) of results or attempt ends still wait on the disk: the "
                        "host stops without them (a restart ends an attempt from its kept "
                        "result; a result not kept is lost, decision 0082)",
                        len(self._writing))  # fmt: skip
        lane, self._disk_lane = self._disk_lane, None
        if lane is not None:
            lane.shutdown(wait=False, cancel_futures=True)

    def _lease_left(self) -> float | None:
        """Seconds until the soonest expiry of a lease still held (None: none held), the
        reconnect backoff's bound (`backoff_delay`: at most half of it). A paused attempt's
        lease has run out already; it counts as a whole lease (`lease_s`): the backoff stays
        under half a lease while any attempt waits for the cloud's word, which only a
        connection brings, so a cloud back after a long outage is heard within half a lease,
        not after a backoff doubled up to its cap (30 s by default)."""
        now = time.monotonic()
        left = [
            rt.lease_s if rt.cancel.lease.paused else rt.expires_mono - now
            for rt in self._tasks.values()
            if rt.revoked is None and rt.task is not None and not rt.task.done()
        ]
        return min(left) if left else None

    async def _session(self, stop: asyncio.Event) -> None:
        made = self._channel_factory()
        channel = await made if inspect.isawaitable(made) else made
        self.dialed.set()
        queue: asyncio.Queue[lease_service_pb2.LeaseRequest | None] = asyncio.Queue()
        stopper: asyncio.Task[None] | None = None
        try:
            stub = lease_service_pb2_grpc.LeaseServiceStub(channel)
            hello = self._hello()
            sent = time.monotonic()
            self._hello_sent = {(h.task_id, h.attempt): sent for h in hello.held_assignments}
            for rt in self._tasks.values():
                rt.renewals_out.clear()  # a new stream: the old one's answers never come
            await queue.put(lease_service_pb2.LeaseRequest(hello=hello))

            async def requests() -> AsyncIterator[lease_service_pb2.LeaseRequest]:
                while True:
                    item = await queue.get()
                    if item is None:
                        return
                    yield item

            call = stub.Lease(requests())

            async def stop_when_asked() -> None:
                await stop.wait()
                if self._welcomed.is_set():
                    await self._hand_back()
                    queue.put_nowait(None)  # our side is done: the cloud ends the stream (OK)
                    ended = asyncio.ensure_future(call.code())
                    try:
                        await self._within([ended], 1.0)
                    finally:
                        ended.cancel()
                call.cancel()

            stopper = asyncio.create_task(stop_when_asked())
            self._queue = queue
            async for response in call:
                self._handle(response)
        except asyncio.CancelledError:
            if stop.is_set():
                return
            raise
        finally:
            self._queue = None
            self._welcomed.clear()
            queue.put_nowait(None)
            if stopper is not None:
                stopper.cancel()
            await channel.close(grace=None)

    # --- sending ---
    def _send(self, request: lease_service_pb2.LeaseRequest) -> bool:
        if self._queue is None or not self._welcomed.is_set():
            return False
        self._queue.put_nowait(request)
        return True

    def _hello(self) -> lease_service_pb2.HostHello:
        held = [
            lease_service_pb2.HeldAssignment(
                task_id=rt.spec.task_id,
                attempt=rt.spec.attempt,
                lease_id=rt.spec.lease_id,
                device_serial=rt.spec.device_serial,
            )
            for rt in self._tasks.values()
            if rt.task is not None and not rt.task.done() and rt.revoked is None
        ]
        # Results not answered yet, a previous process's or this one's: unnamed, a previous
        # process's leases would be released, and a lease that lapsed while the stream was
        # down would leave its requeued task to the hello's own dispatch, before the results
        # that follow the hello arrive (the task ran again). Named, the cloud keeps such a
        # lease, or gives a lapsed one a new term while no other attempt started. Not named:
        # a result that answers a revoke or is retryable (nothing to keep a lease for), and a
        # refused assignment's (no attempt of it ran here).
        held += [
            lease_service_pb2.HeldAssignment(
                task_id=request.result.task_id,
                attempt=request.result.attempt,
                lease_id=request.result.lease_id,
                device_serial=serial,
            )
            for key, request in self._outbox.items()
            if (serial := self._result_phone(key, request.result))
        ]
        hello = lease_service_pb2.HostHello(
            devices=self._reported(),
            agent_version=self.config.agent_version,
            planner_transport=self.config.planner_transport,
            held_assignments=held,
            process_id=self.process_id,
        )
        if self.backlog is not None:
            hello.outbox.CopyFrom(self.backlog)
        return hello

    def _result_phone(self, key: Key, result: lease_service_pb2.TaskResult) -> str:
        """The phone of an unanswered result whose lease the hello names ("" for none)."""
        if key in self._inherited:
            return self._inherited[key]
        rt = self._tasks.get(key)
        if rt is None or rt.revoked is not None or result.retryable:
            return ""
        return rt.spec.device_serial

    def report_outbox(self, backlog: types_pb2.OutboxBacklog) -> None:
        """Tell the cloud the outbox backlog now (dropped while disconnected: the next hello
        carries the latest)."""
        self.backlog = backlog
        self._send(lease_service_pb2.LeaseRequest(outbox=backlog))

    def _reported(self) -> list[types_pb2.Device]:
        """The phones as the cloud hears them: every one OFFLINE while the data folder cannot
        be written (`host.timeline.data_folder`), so the cloud offers this host no task."""
        phones = reported(self._devices.devices())
        why = self.data_folder.unwritable if self.data_folder is not None else ""
        return [(replace(d, unhealthy=d.unhealthy or why) if why else d).to_proto() for d in phones]

    def _on_device_change(self, info: DeviceInfo, kind: str) -> None:
        """Registry listener (any thread): send the whole phone list, and watch a running
        attempt's phone that left adb (`_phone_seen`)."""
        self.report_devices()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._phone_seen, info.serial, info.online, info.adb_down)

    def _running_on(self, serial: str) -> list[RunningTask]:
        return [
            rt
            for rt in self._tasks.values()
            if rt.spec.device_serial == serial
            and rt.revoked is None
            and rt.task is not None
            and not rt.task.done()
        ]

    def _phone_seen(self, serial: str, online: bool, server_down: bool = False) -> None:
        """A phone's new state (on the loop). Gone from adb (or not online there) while an
        attempt runs on it: the attempt ends "phone lost" unless the phone is back within
        `phone_lost_grace_s` (a USB blip ends nothing), or at once when the phone has left
        more than `MAX_PHONE_DROPS` times during the attempt. An attempt that calls its phone
        meanwhile ends as it did (its driver raises `DeviceGone`); one waiting for its
        planner kept its lease renewed for as long as the wait lasted, its task held on a
        phone long gone instead of running elsewhere. Out of sight because the adb server
        does not answer (`server_down`) is no drop of the phone's: every phone leaves at once,
        and "phone unsteady" sent the operator to a sound cable; that grace is waited out as
        any other, and ends "adb server unreachable" (`_phone_lost`)."""
        timer = self._lost_timers.get(serial)
        if online:
            if timer is not None:
                timer.cancel()
                del self._lost_timers[serial]
                log.info("phone %s is back in adb within the grace: its attempt goes on", serial)
            return
        running = self._running_on(serial) if timer is None else []
        for rt in running if not server_down else []:
            rt.phone_drops += 1
        unsteady = [rt for rt in running if rt.phone_drops > MAX_PHONE_DROPS]
        for rt in unsteady:
            rt.lost_summary = phone_unsteady_summary(serial, rt.phone_drops)
            log.warning("task %s/%d: %s", *rt.key, rt.lost_summary)
            rt.cancel.stop(PHONE_LOST)
        if len(unsteady) == len(running):
            return
        grace = self.config.phone_lost_grace_s
        log.warning(
            "phone %s left adb while an attempt runs on it: the attempt ends if it is not back"
            " within %g s",
            serial,
            grace,
        )
        loop = asyncio.get_running_loop()
        self._lost_timers[serial] = loop.call_later(grace, self._phone_lost, serial)

    def _phone_lost(self, serial: str) -> None:
        """The grace of a phone that left adb ended: its attempts stop, each answered "phone
        lost" (retryable: `_execute`), unless it is back (online) after all."""
        self._lost_timers.pop(serial, None)
        info = next((d for d in self._devices.devices() if d.serial == serial), None)
        if info is not None and info.online:
            return
        grace = self.config.phone_lost_grace_s
        summary = (
            adb_down_summary(serial, grace, info.adb_reason)
            if info is not None and info.adb_down
            else phone_lost_summary(serial, grace)
        )
        for rt in self._running_on(serial):
            log.warning("task %s/%d: %s", *rt.key, summary)
            rt.lost_summary = summary
            rt.cancel.stop(PHONE_LOST)

    def report_devices(self) -> None:
        """Send the whole phone list now (from any thread; dropped while disconnected: the
        next hello carries it)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def send() -> None:
            update = lease_service_pb2.DeviceUpdate(devices=self._reported())
            self._send(lease_service_pb2.LeaseRequest(device_update=update))

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            send()
        else:
            loop.call_soon_threadsafe(send)

    # --- receiving ---
    def _handle(self, response: lease_service_pb2.LeaseResponse) -> None:
        kind = response.WhichOneof("kind")
        if kind == "welcome":
            self._on_welcome(response.welcome)
        elif kind == "assignment":
            self._on_assignment(response.assignment)
        elif kind == "renewed":
            r = response.renewed
            if self._unavailable_said:
                self._unavailable_said = False
                log.info("the cloud takes messages again")
            rt = self._tasks.get((r.task_id, r.attempt))
            metrics.renewals.labels(outcome="acked").inc()
            if rt is not None and rt.spec.lease_id == r.lease_id:
                sent = rt.renewals_out.popleft() if rt.renewals_out else None
                rt.expires_mono = _mono_expiry(
                    r.lease_expires_at,
                    rt.lease_s,
                    r.lease_remaining if r.HasField("lease_remaining") else None,
                    sent,
                )
                if r.HasField("fleet_day"):
                    _heard(rt.spec.fleet_day, r.fleet_day)
                rt.spec.withdrawn_flows.update(r.withdrawn_flows)
                self._confirmed(rt)
        elif kind == "revoked":
            metrics.renewals.labels(outcome="revoked").inc()
            self._on_revoked(response.revoked)
        elif kind == "result_ack":
            a = response.result_ack
            if a.late:
                log.info("result of %s/%d accepted late (its lease had run out)",
                         a.task_id, a.attempt)  # fmt: skip
            self._let_go((a.task_id, a.attempt))
        elif kind == "superseded":
            self.superseded = response.superseded.message or "superseded by a newer process"
        elif kind == "rejected":
            rj = response.rejected
            self._renewal_refused(rj.task_id)
            if rj.code == grpc.StatusCode.UNAVAILABLE.value[0]:
                # The cloud could not process it just now (its database is down, say): keep
                # the results and send them again shortly; renewals repeat on their own. Said
                # once per outage, as a warning: nothing is lost, and every renewal of every
                # attempt is rejected until it is over.
                if not self._unavailable_said:
                    self._unavailable_said = True
                    log.warning("the cloud cannot take messages just now (%s): results are "
                                "kept and sent again, renewals go on", rj.message)  # fmt: skip
                else:
                    log.debug("cloud rejected a message (code %s): %s", rj.code, rj.message)
                self._schedule_resend()
                return
            log.error("cloud rejected a message (code %s): %s", rj.code, rj.message)
            # A result the cloud cannot use would be resent forever; drop it.
            if rj.task_id:
                for key in [k for k in self._outbox if k[0] == rj.task_id]:
                    self._let_go(key, f"rejected it (code {rj.code}): {rj.message}")

    def _renewal_refused(self, task_id: str) -> None:
        """A rejection naming `task_id` answered its oldest renewal out, when no result of
        that task waits here (it could answer that) and one attempt of it has renewals out:
        left in `renewals_out`, every later answer would be matched with an ever older send
        (a cloud whose database was down rejects many), its lease counted too short for good.
        Ambiguous, the entry stays: an under-estimate, never an over-estimate."""
        if not task_id or any(k[0] == task_id for k in self._outbox):
            return
        out = [rt for rt in self._tasks.values() if rt.spec.task_id == task_id and rt.renewals_out]
        if len(out) == 1:
            out[0].renewals_out.popleft()

    def _schedule_resend(self) -> None:
        """Send every unacknowledged result again in `RESEND_AFTER_UNAVAILABLE_S` (once)."""
        if self._loop is None or self._resend_pending:
            return
        self._resend_pending = True

        def resend() -> None:
            self._resend_pending = False
            self._resend_timers.pop(None, None)
            for request in list(self._outbox.values()):
                self._send(request)

        self._resend_timers[None] = self._loop.call_later(RESEND_AFTER_UNAVAILABLE_S, resend)

    def _on_welcome(self, welcome: lease_service_pb2.Welcome) -> None:
        self.host_id = welcome.host_id
        self.connects += 1
        self.last_error = None
        if line := self._not_connecting.back(again=self.connects > 1):
            log.warning("%s", line)
        self._welcomed.set()
        for request in list(self._outbox.values()):
            self._send(request)
        for rt in self._tasks.values():
            rt.changed.set()  # renew promptly on the new stream
        for listener in self.on_welcome:
            listener()

    def _on_assignment(self, a: lease_service_pb2.Assignment) -> None:
        key = (a.task_id, a.attempt)
        if key in self._inherited:
            # A lease the hello named for its result (a previous process ended the attempt):
            # the result follows; the task is not run again.
            log.info("lease of %s/%d kept for its result, which follows", *key)
            return
        lease_s = _duration_s(a.lease_duration, DEFAULT_LEASE_S)
        left = a.lease_remaining if a.HasField("lease_remaining") else None
        existing = self._tasks.get(key)
        if existing is not None:
            # A re-confirmation after a reconnect (or a duplicate): keep running, take the lease
            # and the deadline (from this host's now: its clock may have stepped meanwhile).
            existing.spec.deadline = _task_deadline(a)
            since = self._hello_sent.pop(key, None)  # the resume of an attempt the hello named
            existing.expires_mono = _mono_expiry(a.lease_expires_at, lease_s, left, since)
            existing.lease_s = lease_s
            existing.renew_s = _duration_s(a.renew_interval, lease_s / 3)
            existing.changed.set()
            self._confirmed(existing)
            return
        deadline = _task_deadline(a)
        flows = tuple([a.flow] if a.HasField("flow") else []) + tuple(a.alternatives)
        spec = TaskSpec(
            a.task_id,
            a.attempt,
            a.goal,
            a.device_serial,
            a.lease_id,
            deadline,
            secrets=dict(a.secrets),
            flows=flows,
            budget=Budget(a.budget.max_tokens, a.budget.max_cost_usd),
            spent=usage_from_proto(a.spent),
        )
        if a.HasField("fleet_day"):
            _heard(spec.fleet_day, a.fleet_day)
        refusal, problem = self._cannot_run(a.device_serial)
        if problem:
            # Not the task's fault, and nothing ran: the cloud queues it again without counting
            # the attempt (the phone's state was news to it, e.g. right after a reconnect);
            # `retryable` for a cloud from before refusals.
            log.warning("assignment %s on %s refused: %s", a.task_id, a.device_serial, problem)
            self._queue_result(
                spec,
                types_pb2.TASK_STATUS_FAILED,
                problem,
                ProgressSnapshot(),
                retryable=True,
                refusal=refusal,
            )
            return
        rt = RunningTask(
            spec=spec,
            progress=ProgressHolder(),
            cancel=StopSignal(),
            lease_s=lease_s,
            expires_mono=_mono_expiry(a.lease_expires_at, lease_s, left),
            renew_s=_duration_s(a.renew_interval, lease_s / 3),
            after=self._stopping_on(a.device_serial),
        )
        loop = asyncio.get_running_loop()

        def on_progress(_: ProgressSnapshot) -> None:
            loop.call_soon_threadsafe(rt.changed.set)

        rt.progress.add_listener(on_progress)
        self._tasks[key] = rt
        rt.task = asyncio.create_task(self._execute(rt), name=f"task-{a.task_id}-{a.attempt}")
        rt.task.add_done_callback(lambda _: rt.changed.set())  # wake the renewer to exit
        rt.renewer = asyncio.create_task(self._renew_loop(rt), name=f"renew-{a.task_id}")

    @staticmethod
    def _confirmed(rt: RunningTask) -> None:
        """The cloud confirmed the lease live: a paused attempt continues (`_renew_loop`). Not
        on an answer that leaves no time on the lease (it would act past its end at once)."""
        if rt.cancel.lease.paused and rt.revoked is None and rt.expires_mono > time.monotonic():
            log.warning("lease of %s/%d confirmed by the cloud: the attempt continues", *rt.key)
            rt.cancel.lease.resume()

    def _cannot_run(self, serial: str) -> tuple[lease_service_pb2.AssignmentRefusal.ValueType, str]:
        """Why an assignment on `serial` cannot start here (the refusal and its words), or
        (UNSPECIFIED, "") when it can."""
        if self._stopping:  # sent before the cloud read our HostStopping
            return lease_service_pb2.ASSIGNMENT_REFUSAL_HOST_STOPPING, "the host is stopping"
        if self.data_folder is not None and (why := self.data_folder.unwritable):
            return lease_service_pb2.ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE, why
        info = next((d for d in self._devices.devices() if d.serial == serial), None)
        if info is None:
            return (
                lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_NOT_ATTACHED,
                f"phone {serial} is not attached to this host",
            )
        if info.unhealthy:
            return lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_UNHEALTHY, info.unhealthy
        if not info.online:
            return lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_OFFLINE, f"phone {serial} is offline"
        busy = any(
            rt.spec.device_serial == serial
            and rt.task is not None
            and not rt.task.done()
            and not rt.cancel.is_set()
            for rt in self._tasks.values()
        )
        if busy:
            return (
                lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_BUSY,
                f"phone {serial} is busy with another task",
            )
        return lease_service_pb2.ASSIGNMENT_REFUSAL_UNSPECIFIED, ""

    def _stopping_on(self, serial: str) -> asyncio.Task[TaskOutcome] | None:
        """The attempt still stopping on this phone (told to stop, not yet stopped), if any."""
        return next(
            (
                rt.task
                for rt in self._tasks.values()
                if rt.spec.device_serial == serial
                and rt.task is not None
                and not rt.task.done()
                and rt.cancel.is_set()
            ),
            None,
        )

    def _on_revoked(self, r: lease_service_pb2.Revoked) -> None:
        key = (r.task_id, r.attempt)
        if r.reason not in lease_service_pb2.RevokeReason.values():
            log.warning("revoke of %s/%d with reason %d, unknown to this host: a plain revoke",
                        r.task_id, r.attempt, r.reason)  # fmt: skip
        rt = self._tasks.get(key)
        if rt is not None and rt.spec.lease_id == r.lease_id:
            rt.revoked = types_pb2.TASK_STATUS_CANCELLED
            # An attempt this host paused by its own clock (`_renew_loop`) that the cloud's
            # expiry stops ends with the retryable result a lease run out by the host's clock
            # sends: that result is what tells the cloud this host is back. Without it the
            # attempt ended with no result (a host let go after a freeze reads its clock's
            # expiry and the cloud's at once), and the cloud, having heard nothing from the
            # host, held new work back from it for the rest of its keepalive window (40 s by
            # default, `HostSession.lapsed`): an idle phone, for a race the host lost or won.
            expired = r.reason == lease_service_pb2.REVOKE_REASON_EXPIRED
            if expired and (rt.cancel.lease.paused or rt.revoke_reason == EXPIRED_LOCALLY):
                rt.revoke_reason = EXPIRED_LOCALLY
            else:
                rt.revoke_reason = _revoke_reason_name(r.reason)
            rt.revoke_message = r.message
            rt.cancel.stop(REVOKED)
        pending = self._outbox.get(key)
        if (
            pending is not None
            and r.reason == lease_service_pb2.REVOKE_REASON_EXPIRED
            and pending.result.status != types_pb2.TASK_STATUS_CANCELLED
            and key not in self._late_tried
        ):
            # The lease ran out while the result waited (the cloud or its database was away):
            # the cloud still takes it as late unless another attempt has started. Once.
            self._late_tried.add(key)
            self._send(pending)
            return
        if pending is not None and r.reason == lease_service_pb2.REVOKE_REASON_FINISHED:
            self._let_go(key, _finished(pending.result, r))
            return
        # The lease is gone and the result, if any, will not be accepted.
        reason = _revoke_reason_name(r.reason)
        self._let_go(key, f"refused it ({reason}: {r.message})" if pending is not None else None)

    def _let_go(self, key: Key, refused: str | None = None) -> None:
        """Forget a result: the cloud took it, or `refused` it (said why, for the log; "" when
        the cloud already has it: its ack was lost)."""
        request = self._outbox.pop(key, None)
        self._answered.set()
        self._late_tried.discard(key)
        self._inherited.pop(key, None)
        if request is not None:
            if refused == "":
                log.info("result of %s/%d: the cloud already has it (its ack was lost)", *key)
            elif refused is not None:
                log.warning("result of %s/%d dropped: the cloud %s", *key, refused)
            if self._results is not None:
                self._write(functools.partial(self._results.drop_result, *key),
                            functools.partial(self._dropped, key))  # fmt: skip
        self._forget_if_done(key)

    @staticmethod
    def _dropped(key: Key, job: asyncio.Future[None]) -> None:
        if not job.cancelled() and (exc := job.exception()) is not None:
            # Kept on disk: the next process sends it, and is answered.
            log.error("could not forget the result of %s/%d", *key, exc_info=exc)

    def _forget_if_done(self, key: Key) -> None:
        rt = self._tasks.get(key)
        if rt is not None and rt.task is not None and rt.task.done() and key not in self._outbox:
            self._tasks.pop(key, None)
            renewer, rt.renewer = rt.renewer, None
            if renewer is not None:
                # It may still be in its pause between renewals; nothing is left to renew, and
                # once forgotten here, shutdown finds it only among the ending ones. (Not kept
                # on `rt`: its CancelledError holds its frame, which holds `rt`, a cycle.)
                renewer.cancel()
                self._renewers_ending.add(renewer)
                renewer.add_done_callback(self._renewers_ending.discard)

    # --- per task ---
    async def _execute(self, rt: RunningTask) -> TaskOutcome:
        if rt.after is not None:  # the phone's previous attempt stops within one step
            await asyncio.wait([rt.after])
            rt.after = None
        try:
            outcome = await self._run_task(rt.spec, rt.progress, rt.cancel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the runner should not raise; never let it kill the client
            # A refused permission counts only for a file in the data folders (none known:
            # never): `host.timeline.storage_faults`.
            folders = self.data_folder.folders if self.data_folder is not None else ()
            disk = storage_fault(exc, folders)
            if disk is not None:  # its timeline could not be written: the host's disk, retryable
                log.error("task %s: this host cannot write its data folder: %s", rt.spec.task_id,
                          disk)  # fmt: skip
                summary = storage_summary(self.host_id or "", disk)
                outcome = TaskOutcome(
                    "failed", truncate(summary, 2000), 0, retryable=True, storage=disk
                )
            else:
                log.exception("task %s crashed", rt.spec.task_id)
                outcome = TaskOutcome("failed", truncate(f"host error: {exc}", 2000), 0)
        # Before the result: the cloud hears the phones OFFLINE first, so it does not hand the
        # task straight back to this host.
        self.disk_refused(outcome.storage)
        rt.outcome = outcome
        if outcome.lease_lost and rt.revoked is None:
            # The cloud said the lease is not live: it ended (or will end) this attempt itself.
            # One case keeps the lease live until its host answers: an operator cancelling the
            # task (its revoke not heard yet, the stream was down). A retryable result ends it
            # at once then: the cloud requeues a retryable attempt, and a task with a cancel
            # pending is cancelled instead. Retryable, not CANCELLED, because the host does not
            # know why: a replica whose clock runs ahead of the lease's may have answered, and
            # a task nobody cancelled must run again, not end. Any other case refuses the
            # result, and it is not sent again.
            log.info("task %s/%d stopped: its lease is no longer live", *rt.key)
            self._queue_result(
                rt.spec,
                types_pb2.TASK_STATUS_FAILED,
                LEASE_NOT_LIVE_SUMMARY,
                rt.progress.snapshot(),
                retryable=True,
            )
        elif rt.revoke_reason == EXPIRED_LOCALLY:
            # Paused by this host's own clock while the cloud was unreachable, then stopped by
            # the cloud's expiry: said now, the task's next attempt starts at once (finished
            # work is sent as is).
            stopped = outcome.status == "cancelled"
            self._queue_result(
                rt.spec,
                types_pb2.TASK_STATUS_FAILED if stopped else outcome.proto_status,
                UNREACHABLE_SUMMARY if stopped else outcome.summary,
                rt.progress.snapshot(),
                retryable=stopped or outcome.retryable,
                replay=outcome.replay,
            )
        elif rt.revoked is not None:
            # The cloud already took the lease back; it may still like a CANCELLED ack.
            if rt.revoke_reason == "REVOKE_REASON_CANCELLED":
                # The operator's reason (the cloud records it whatever we send; say the same).
                self._queue_result(
                    rt.spec,
                    types_pb2.TASK_STATUS_CANCELLED,
                    rt.revoke_message or outcome.summary,
                    rt.progress.snapshot(),
                )
        elif rt.cancel.reason == PHONE_LOST and outcome.status == "cancelled":
            # Its phone left adb for longer than the grace: retryable, so the cloud releases
            # the lease and queues the task for a phone that is there (this one is reported
            # OFFLINE), as for a phone that vanished under a step.
            summary = rt.lost_summary or phone_lost_summary(
                rt.spec.device_serial, self.config.phone_lost_grace_s
            )
            outcome = TaskOutcome(
                "failed", summary, outcome.steps, retryable=True, device_gone=True
            )
            rt.outcome = outcome
            self._queue_result(
                rt.spec,
                types_pb2.TASK_STATUS_FAILED,
                summary,
                rt.progress.snapshot(),
                retryable=True,
            )
        elif rt.cancel.reason == HOST_STOPPED and outcome.status == "cancelled":
            # This host stopped it: retryable (CANCELLED would end the task), so the cloud
            # queues the task for another host at once instead of when the lease runs out. Not
            # when superseded: the lease went with the stream, the result would be refused.
            if not self.superseded:
                self._queue_result(
                    rt.spec,
                    types_pb2.TASK_STATUS_FAILED,
                    HOST_STOPPED_SUMMARY,
                    rt.progress.snapshot(),
                    retryable=True,
                )
        else:
            self._queue_result(
                rt.spec,
                outcome.proto_status,
                outcome.summary,
                rt.progress.snapshot(),
                retryable=outcome.retryable,
                replay=outcome.replay,
            )
        self._record_end(rt.spec, outcome)
        self._forget_if_done(rt.key)
        return outcome

    def _write(
        self, write: Callable[[], None], done: Callable[[asyncio.Future[None]], None]
    ) -> None:
        """`write()` in `_disk_lane`, not awaited (on the loop): a write (or its wait for its
        store's lock) may hang on the disk, and on the loop it stalled every lease's renewals
        and the answers to revocations with it. `done(job)` is called on the loop after."""
        if self._disk_lane is None:
            self._disk_lane = Lane("", name="lease-writes")
        job = asyncio.get_running_loop().run_in_executor(self._disk_lane, write)
        self._writing.add(job)
        job.add_done_callback(self._writing.discard)
        job.add_done_callback(done)

    def _record_end(self, spec: TaskSpec, outcome: TaskOutcome) -> None:
        """Tell the timeline the attempt ended (`_write`: after its result was kept). One the
        data folder refused is kept and tried again once a write there works
        (`writable_again`): else its row said "running" until the host restarted, a ghost
        attempt on the host's console."""
        if self._ended is None:
            return
        self._write(
            functools.partial(self._ended, spec, outcome),
            functools.partial(self._end_recorded, spec, outcome, self._writable_epoch),
        )

    def _end_recorded(
        self, spec: TaskSpec, outcome: TaskOutcome, epoch: int, job: asyncio.Future[None]
    ) -> None:
        """An end write finished (on the loop): one the disk refused waits for
        `writable_again`, or is tried again now when that ran since it was queued."""
        if job.cancelled() or (exc := job.exception()) is None:
            return
        reason = storage_fault(exc)
        if reason and epoch != self._writable_epoch:
            self._record_end(spec, outcome)
            return
        # The timeline's word is not worth the result: logged, the result went already.
        log.error("could not record the end of %s/%d", spec.task_id, spec.attempt,
                  exc_info=exc)  # fmt: skip
        if reason and self.data_folder is not None:
            self._unrecorded_ends.append((spec, outcome))
        self.disk_refused(reason)

    def writable_again(self) -> None:
        """The data folder took a probe write (the host's probe, `host.runner`): keep the
        unanswered results and record the ends it refused, then tell the cloud the phones
        (ONLINE unless that failed again)."""
        self._writable_epoch += 1
        unkept, self._unkept = self._unkept, {}
        for key, serial in unkept.items():
            request = self._outbox.get(key)
            if request is not None:  # not answered yet
                self._keep_result(serial, request.result)
        ends, self._unrecorded_ends = self._unrecorded_ends, []
        for spec, outcome in ends:
            self._record_end(spec, outcome)
        self.report_devices()

    def disk_refused(self, reason: str | None, where: Path | None = None) -> None:
        """A write to the data folder failed (`reason`: what the disk said; None or "" for
        another failure; `where`: the file or folder refused, when known): the host takes no
        work until a probe write there succeeds. From any thread (the stores report their own
        writes' faults from their worker threads)."""
        if not reason or self.data_folder is None:
            return
        words = self.data_folder.failed(self.host_id or "", reason, where)
        if words:
            log.error("%s", words)
            self.report_devices()

    def _queue_result(
        self,
        spec: TaskSpec,
        status: types_pb2.TaskStatus.ValueType,
        summary: str,
        progress: ProgressSnapshot,
        *,
        retryable: bool = False,
        refusal: lease_service_pb2.AssignmentRefusal.ValueType = (
            lease_service_pb2.ASSIGNMENT_REFUSAL_UNSPECIFIED
        ),
        replay: types_pb2.FlowReplayReport | None = None,
    ) -> None:
        result = lease_service_pb2.TaskResult(
            task_id=spec.task_id,
            attempt=spec.attempt,
            lease_id=spec.lease_id,
            status=status,
            summary=truncate(summary, 2000),
            final_progress=progress.to_proto(),
            retryable=retryable,
            refusal=refusal,
            replay=replay,
        )
        self._keep_result(spec.device_serial, result)
        self._hold(lease_service_pb2.LeaseRequest(result=result))

    def _keep_result(self, serial: str, result: lease_service_pb2.TaskResult) -> None:
        """Keep a result on disk until the cloud answers it (`_write`: the result is sent
        meanwhile). One the disk refuses is still sent from memory, and kept once a write
        there works (`writable_again`): else a host restarted after that, before the cloud
        answered, lost it (decision 0082)."""
        if self._results is None:
            return
        keep = functools.partial(
            self._results.keep_result,
            result.task_id,
            result.attempt,
            serial,
            result.SerializeToString(),
        )
        key = (result.task_id, result.attempt)
        self._write(keep, functools.partial(self._kept, key, serial, self._writable_epoch))

    def _kept(self, key: Key, serial: str, epoch: int, job: asyncio.Future[None]) -> None:
        """A result's keep finished (on the loop): one the disk refused waits for
        `writable_again`, or is tried again now when that ran since it was queued."""
        if job.cancelled():
            return
        if (exc := job.exception()) is None:
            self._unkept.pop(key, None)
            return
        if storage_fault(exc) and epoch != self._writable_epoch:
            if (request := self._outbox.get(key)) is not None:  # not answered yet
                self._keep_result(serial, request.result)
            return
        log.error("could not keep the result of %s/%d on disk", *key, exc_info=exc)
        self._unkept[key] = serial
        self.disk_refused(storage_fault(exc))

    def _hold(self, request: lease_service_pb2.LeaseRequest) -> None:
        """Send a result now and until the cloud answers it."""
        key = (request.result.task_id, request.result.attempt)
        self._outbox[key] = request
        self._send(request)
        self._resend_later(key, request)

    def _resend_later(self, key: Key, request: lease_service_pb2.LeaseRequest) -> None:
        if self._loop is None:
            return
        previous = self._resend_timers.pop(key, None)
        if previous is not None:
            previous.cancel()
        self._resend_timers[key] = self._loop.call_later(
            RESULT_RESEND_S, self._resend_unanswered, key, request
        )

    async def _inherit_results(self) -> None:
        """Take over the results a previous process of this host kept and the cloud never
        answered: sent on the first stream, their leases named in its hello. A read hung on
        the disk lets the host connect paused (`read_at_start`) and sends them once it
        returns."""
        if self._results is None:
            return
        try:
            held = await read_at_start(
                self._results.held_results,
                "the results the previous process kept",
                refused=self.disk_refused,
                folder=self.data_folder,
                late=self._take_over,
            )
        except Exception:
            log.exception("could not read the results kept by the previous process")
            return
        if held is not None:
            self._take_over(held)

    def _take_over(self, held: list[tuple[str, bytes]]) -> None:
        """Send the results the previous process kept (`_inherit_results`): at start, or late,
        once a read hung on the disk at start returned."""
        for serial, body in held:
            try:
                result = lease_service_pb2.TaskResult.FromString(body)
            except DecodeError:  # a file damaged on disk: nothing to send
                log.error("a result kept by the previous process cannot be read; skipped")
                continue
            request = lease_service_pb2.LeaseRequest(result=result)
            key = (request.result.task_id, request.result.attempt)
            if key in self._outbox:
                continue
            self._inherited[key] = serial
            self._hold(request)
        if self._inherited:
            log.info(
                "%d result(s) the previous process kept for the cloud are sent now",
                len(self._inherited),
            )

    def _resend_unanswered(self, key: Key, request: lease_service_pb2.LeaseRequest) -> None:
        """Send a result again while it is neither acknowledged nor refused (every
        `RESULT_RESEND_S`, until the outbox no longer holds it)."""
        if self._outbox.get(key) is not request:
            if key not in self._outbox:  # answered (a newer request keeps its own timer)
                self._resend_timers.pop(key, None)
            return
        self._send(request)
        self._resend_later(key, request)

    @staticmethod
    def _interval(rt: RunningTask) -> float:
        """The assignment's renew interval (a third of its lease), never below 0.1 s."""
        return max(0.1, rt.renew_s or rt.lease_s / 3)

    async def _renew_loop(self, rt: RunningTask) -> None:
        """Renew at a third of the lease, and soon after each progress change (at most 1/s)."""
        assert rt.task is not None
        next_due = time.monotonic() + self._interval(rt)
        while not rt.task.done():
            timeout = max(0.0, next_due - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await rt.changed.wait()
            if rt.task.done():
                return
            if rt.changed.is_set():
                rt.changed.clear()
                gap = self.config.progress_renew_min_interval_s - (
                    time.monotonic() - rt.last_renewal_mono
                )
                if gap > 0:
                    await asyncio.sleep(gap)
                    if rt.task.done():
                        return
            now = time.monotonic()
            pause = rt.cancel.lease
            if rt.revoked is not None:
                next_due = now + 0.5  # stopping; the cloud no longer holds this lease
                continue
            if now >= rt.expires_mono and not rt.cancel.is_set() and not pause.paused:
                # No renewal answered in time: the cloud sweeps the lease now and may hand the
                # task to another phone, so this one does nothing more on its phone, whether
                # the stream is gone or only silent (a grace past the expiry, 2 s plus a
                # keepalive while a dead link looked open, let both phones run the task at
                # once). Paused, not stopped: a cloud that was down gives the lease a new term.
                log.warning("lease of %s/%d ran out with no renewal answered: the attempt "
                            "pauses until the cloud confirms it", *rt.key)  # fmt: skip
                pause.pause()
            if self._send(self._renewal(rt)):
                metrics.renewals.labels(outcome="sent").inc()
                rt.last_renewal_mono = now
                rt.renewals_out.append(now)
                next_due = now + self._interval(rt)
            else:
                next_due = now + 0.5
            # Paused, renewals go on at the renew interval (an answer resumes the attempt, a
            # revoke stops it), not faster: a cloud just back hears every paused host of the
            # fleet at once, and the welcome renews at once anyway. Not at the lease's end,
            # which has passed.
            if not pause.paused:
                next_due = min(next_due, rt.expires_mono)

    @staticmethod
    def _renewal(rt: RunningTask) -> lease_service_pb2.LeaseRequest:
        return lease_service_pb2.LeaseRequest(
            renewal=lease_service_pb2.LeaseRenewal(
                task_id=rt.spec.task_id,
                attempt=rt.spec.attempt,
                lease_id=rt.spec.lease_id,
                progress=rt.progress.snapshot().to_proto(),
            )
        )

    async def _hand_back(self) -> None:
        """Host shutdown with the cloud reachable: no new work, every attempt stopped and its
        result answered (or `stop_grace_s` passed), so that other hosts take the tasks now
        rather than when the leases run out."""
        self._stopping = True
        self._send(lease_service_pb2.LeaseRequest(stopping=lease_service_pb2.HostStopping()))
        running = sum(
            1 for rt in self._tasks.values() if rt.task is not None and not rt.task.done()
        )
        if running:
            log.info("stopping: handing %d attempt(s) back to the cloud "
                     "(a second SIGINT/SIGTERM stops at once)", running)  # fmt: skip
        await self._shutdown_tasks()
        if self._outbox and self._welcomed.is_set():
            log.info("waiting up to %.0f s for the cloud to answer %d result(s)",
                     self.config.stop_grace_s, len(self._outbox))  # fmt: skip
        deadline = time.monotonic() + self.config.stop_grace_s
        while self._outbox and self._welcomed.is_set() and not self._hurry.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._answered.clear()
            answered = asyncio.ensure_future(self._answered.wait())
            try:
                await self._within([answered], left)
            finally:
                answered.cancel()
        if self._outbox:
            lost = sum(1 for key in self._outbox if key in self._unkept)
            log.warning("stopping with %d result(s) the cloud has not answered: kept on disk "
                        "and sent by the next start, but for %d the disk refused (lost: the "
                        "cloud ends those attempts when their leases run out)",
                        len(self._outbox), lost)  # fmt: skip

    async def _within(self, aws: Iterable[asyncio.Future[Any]], seconds: float) -> None:
        """Wait until all of `aws` are done, `seconds` passed or `stop_now` was called (what
        is still pending then is left to the caller)."""
        hurry = asyncio.ensure_future(self._hurry.wait())
        pending: set[asyncio.Future[Any]] = set(aws)
        end = time.monotonic() + seconds
        try:
            while pending and not hurry.done() and (left := end - time.monotonic()) > 0:
                _, pending = await asyncio.wait(
                    pending | {hurry}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(hurry)
        finally:
            hurry.cancel()

    async def _shutdown_tasks(self) -> None:
        """Host shutdown: stop every task (each ends with a retryable result, `_execute`).

        An attempt whose step is still stuck on its phone after `stop_grace_s` (a look at a
        screen that never idles, a gesture adbd sits on: each driver call may take 30 s and
        more) is handed back without it: waiting for it held a stopped host for 30 s, then
        cancelled the attempt with no result, and its task waited for its lease."""
        self._stopping = True
        for rt in self._tasks.values():
            rt.cancel.stop(HOST_STOPPED)
        pending = [t for rt in self._tasks.values() for t in (rt.task, rt.renewer) if t]
        pending += self._renewers_ending
        if pending:
            await self._within(pending, self.config.stop_grace_s)
        stuck = [rt for rt in self._tasks.values() if rt.task is not None and not rt.task.done()]
        for rt in stuck:
            if not self._hurry.is_set() and rt.revoked is None and not self.superseded:
                log.warning("task %s/%d: its step did not end within %.0f s; handed back "
                            "without it", *rt.key, self.config.stop_grace_s)  # fmt: skip
                self._queue_result(
                    rt.spec,
                    types_pb2.TASK_STATUS_FAILED,
                    HOST_STOPPED_SUMMARY,
                    rt.progress.snapshot(),
                    retryable=True,
                )
        for t in pending:
            if not t.done():
                t.cancel()
