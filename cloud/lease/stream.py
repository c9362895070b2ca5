"""LeaseService.Lease: one bidirectional stream per host, identity from the client certificate
(only hosts get here: `cloud.authz`).

Two tasks per stream, and a third once the host sends a result; no thread. The reader
validates and handles each host message in order and writes its answer itself (a renewal's
`Renewed` goes out from the task that read the renewal, with no hand-off through a queue), but
for results: those go to the stream's result lane (`result_lane.py`), recorded one at a time in
the order they came, with the renewals of their own leases behind them, so a result waiting
for a row held elsewhere holds up no renewal of the host's other leases. The handler's own task
drains the session's outbox, where the dispatcher, revocations and shutdown put what the cloud
pushes unasked. All write under the session's write lock (gRPC takes one message at a time).
The host hears the Welcome and what its hello settled before any answer, the answers to its
renewals and results each in the order it sent them (a result's ack may come after the
answer to a later renewal of another lease), and each push after everything decided before it.
A message that does not parse (`wire.Malformed`) or fails a check is answered with `Rejected`
and the stream stays up.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time

import grpc
from google.protobuf.message import Message

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import lease_service_pb2_grpc
from cloud import authz, metrics, wire
from cloud.boundary import status_for
from cloud.lease import messages, validate
from cloud.lease.manager import LeaseManager
from cloud.lease.result_lane import ResultKey, ResultLane, result_key
from cloud.lease.session import Closing, HostSession
from cloud.store import errors
from cloud.store.leases import HeldLease
from cloud.store.lock_waits import RowHeld
from telemetry import logs

log = logging.getLogger(__name__)


async def _finish(task: asyncio.Task[None] | None) -> None:
    """Cancel `task` and wait until it has ended (it may hold the write lock)."""
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _task_id(msg: Message | None) -> str:
    """The task id a renewal or result names (`Rejected.task_id`, so a host with several in
    flight knows which one was refused), also from what could be read of a malformed one."""
    kind = msg.WhichOneof("kind") if msg is not None else None
    if kind not in ("renewal", "result"):
        return ""
    task_id: str | bytes = getattr(msg, kind).task_id
    return task_id.decode("utf-8", "replace") if isinstance(task_id, bytes) else task_id


def not_reading(limit: float) -> str:
    """The status details of a stream ended because its client stopped reading (`_write`)."""
    return f"not reading: a message waited {limit:g} s to be sent; reconnect and read the stream"


class Write(enum.Enum):
    """What became of a write to a host's stream (`_bounded_write`)."""

    SENT = enum.auto()
    #: Not handed to gRPC: an earlier write had already waited its limit.
    UNSENT = enum.auto()
    #: Handed to gRPC, which did not take it in time: it may still reach the host.
    TIMED_OUT = enum.auto()
    #: An assignment taken back before it was handed to gRPC (`HostSession.take_unsent`: its
    #: stream was superseded and it is released unused); the stream goes on ending as it was.
    WITHDRAWN = enum.auto()


async def _bounded_write(
    session: HostSession,
    context: grpc.aio.ServicerContext[lease_pb.LeaseRequest, lease_pb.LeaseResponse],
    reply: lease_pb.LeaseResponse,
    fresh: HeldLease | None = None,
) -> Write:
    """Write `reply` under the session's write lock; anything but SENT means the stream is
    closing UNAVAILABLE "not reading". A client that stops reading fills its flow-control
    window, and the write then waits for as long as the connection lives (30 minutes at
    most) while it holds the write lock: the supersede or revocation that must end the stream
    queued behind it and the host's session stayed pinned. So the write notes when it began
    and which task does it, and the replica's write watch (`cloud.lease.write_watch`) cancels
    one pending past `lease_write_timeout_seconds` (a timer per write cost the renewal hot
    path ~10 µs). The lock is only ever held for one bounded write, so waiting for it needs
    no bound of its own. `fresh` names the fresh assignment `reply` is: from here it counts as
    handed to gRPC, unless it was taken back meanwhile (WITHDRAWN)."""
    async with session.write_lock:
        if session.stuck:  # gRPC still holds the message that timed out: no other may follow
            return Write.UNSENT
        if fresh is not None:
            if fresh not in session.unsent:
                return Write.WITHDRAWN
            session.unsent.discard(fresh)
        session.writer = asyncio.current_task()
        session.write_started = time.monotonic()
        try:
            await context.write(reply)
        except asyncio.CancelledError:
            # The watch's cancel (it marked the stream stuck first) ends the write, as a
            # timeout did; any other cancel (the stream ending, the replica stopping) goes on.
            writer = session.writer
            if not session.stuck or writer is None or writer.uncancel() > 0:
                raise
            return Write.TIMED_OUT
        finally:
            session.write_started = None
            session.writer = None
    return Write.SENT


async def _write(
    session: HostSession,
    context: grpc.aio.ServicerContext[lease_pb.LeaseRequest, lease_pb.LeaseResponse],
    reply: lease_pb.LeaseResponse,
    limit: float,
) -> None:
    """Answer on the stream unless it is ending (the reader, the result lane and the outbox's
    pushes share the stream: `_bounded_write`). A write not taken in time ends the stream:
    the handler, woken by the closing, ends it UNAVAILABLE "not reading"."""
    if session.closed:
        return
    if await _bounded_write(session, context, reply) is not Write.SENT:
        session.close(grpc.StatusCode.UNAVAILABLE, not_reading(limit))
        raise NotReading(not_reading(limit))


async def _abandon(
    context: grpc.aio.ServicerContext[lease_pb.LeaseRequest, lease_pb.LeaseResponse],
    details: str,
    limit: float,
) -> None:
    """End a stream whose client reads nothing (`_bounded_write`). Its status goes out behind
    the message gRPC still holds, so sending it waits like any write: `limit` seconds at most,
    then the handler returns anyway (gRPC then drops the call, and a client that reads again
    sees it cancelled) rather than hold the handler, and the host's stream slot, for as long
    as the connection lasts."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(limit):
            await context.abort(grpc.StatusCode.UNAVAILABLE, details)


def _fresh(item: lease_pb.LeaseResponse) -> HeldLease | None:
    """The lease `item` grants if it is a fresh assignment (a resumed one is the host's own:
    it still runs it, whatever reaches it; `HostSession.unsent`)."""
    if item.WhichOneof("kind") == "assignment" and not item.assignment.resumed:
        a = item.assignment
        return HeldLease(a.task_id, a.attempt, a.lease_id)
    return None


class NotReading(Exception):
    """A write to the host was not taken in time (`_bounded_write`): the stream is ending."""


def _malformed(msg: wire.Malformed) -> lease_pb.LeaseResponse:
    return messages.rejected(msg.problem, _task_id(msg.partial))


class LeaseServicer(lease_service_pb2_grpc.LeaseServiceServicer):
    """Serves the host streams of this replica."""

    def __init__(self, manager: LeaseManager) -> None:
        self._manager = manager

    async def Lease(  # type: ignore[override]
        self,
        request_iterator: object,
        context: grpc.aio.ServicerContext[lease_pb.LeaseRequest, lease_pb.LeaseResponse],
    ) -> None:
        host_id = authz.caller().name
        self._manager.stream_started()
        streams = metrics.current().lease_streams
        streams.inc()
        try:
            with logs.bound(host_id=host_id):
                await self._serve(host_id, context)
        finally:
            streams.dec()
            self._manager.stream_finished()

    async def _serve(
        self,
        host_id: str,
        context: grpc.aio.ServicerContext[lease_pb.LeaseRequest, lease_pb.LeaseResponse],
    ) -> None:
        hello = await self._await_hello(context)
        if hello is None:
            return
        refusing = self._manager.refusing  # the replica is stopping; nothing awaits until
        if refusing is not None:  # `open()` registers the session, which a stop then ends
            await context.abort(refusing.code, refusing.message)
            return
        session = await self._manager.open(host_id, hello, authz.caller_serial())
        self._manager.write_watch.add(session)  # until `LeaseManager.closed`
        held: set[ResultKey] = set()  # results told UNAVAILABLE for a held row, warned once
        limit = self._manager.settings.lease_write_timeout_seconds
        lane = ResultLane(
            lambda msg: self._answer(session, msg, held),
            lambda reply: _write(session, context, reply, limit),
            f"lease-results-{host_id}",
        )
        reader: asyncio.Task[None] | None = None
        try:
            while True:
                # What the hello settled (Welcome, resumed and refused leases) goes out before
                # the reader starts answering.
                if reader is None and session.outbox.empty():
                    reader = asyncio.create_task(
                        self._read(session, context, lane), name=f"lease-read-{host_id}"
                    )
                item = await session.outbox.get()
                if not isinstance(item, Closing):
                    if session.stuck:  # a write already waited its limit: nothing more goes out
                        continue  # (a fresh assignment stays in `session.unsent`)
                    written = await _bounded_write(session, context, item, _fresh(item))
                    if written in (Write.SENT, Write.WITHDRAWN):
                        continue
                    # Write.UNSENT: a fresh assignment stays in `session.unsent`, handed back
                    # below. Write.TIMED_OUT: gRPC holds the message and may still deliver it
                    # (the host may read again before the stream ends): it is not handed
                    # back, its lease runs out if the host never got it.
                    session.closed = True  # nothing more is queued for this stream
                    item = Closing(grpc.StatusCode.UNAVAILABLE, not_reading(limit))
                # Ending: what is still queued will not be sent either.
                self._hand_back(session)
                await _finish(reader)  # no answer half-written under the status
                await lane.close()
                if session.stuck:  # whatever else it was closing for, this is why it ends
                    await _abandon(context, not_reading(limit), limit)
                elif item.code != grpc.StatusCode.OK:
                    await context.abort(item.code, item.message)
                return
        finally:
            # Also when the handler was cancelled (the host cancelled its call, the replica
            # stopped) with pushes still queued.
            self._hand_back(session)
            await _finish(reader)
            await lane.close()
            await self._manager.closed(session)

    def _hand_back(self, session: HostSession) -> None:
        """Release the fresh assignments that never reached gRPC (`HostSession.unsent`): no
        host runs them. Left to their leases, the tasks stayed ASSIGNED until those ran out
        (30 s by default, up to an hour) and each such attempt counted against the task's
        max_attempts, as for work a host lost."""
        unsent = session.take_unsent()
        if unsent:
            self._manager.hand_back(session, unsent)

    async def _await_hello(
        self, context: grpc.aio.ServicerContext[lease_pb.LeaseRequest, lease_pb.LeaseResponse]
    ) -> lease_pb.HostHello | None:
        """The stream's valid hello, or None once it ended without one. A stream still without
        one after `hello_timeout_seconds` (silent, or sending only what is refused) ends
        DEADLINE_EXCEEDED: it held a handler and a stream slot for as long as the client liked,
        and the status tells a host to reconnect (FAILED_PRECONDITION says its first message
        was wrong, which a silent client's was not)."""
        limit = self._manager.settings.hello_timeout_seconds
        try:
            async with asyncio.timeout(limit):
                return await self._read_hello(context)
        except TimeoutError:
            metrics.current().hello_timeouts.inc()
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no hello within {limit:g} s of opening the stream; send HostHello first",
            )
            return None

    async def _read_hello(
        self, context: grpc.aio.ServicerContext[lease_pb.LeaseRequest, lease_pb.LeaseResponse]
    ) -> lease_pb.HostHello | None:
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return None
            if isinstance(msg, wire.Malformed):
                await context.write(_malformed(msg))
                continue
            assert isinstance(msg, lease_pb.LeaseRequest)
            if msg.WhichOneof("kind") != "hello":
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, "the first message must be a hello"
                )
                return None
            problem = validate.hello(msg.hello)
            if problem is None:
                return msg.hello
            await context.write(messages.rejected(problem))

    async def _read(
        self,
        session: HostSession,
        context: grpc.aio.ServicerContext[lease_pb.LeaseRequest, lease_pb.LeaseResponse],
        lane: ResultLane,
    ) -> None:
        manager = self._manager
        limit = manager.settings.lease_write_timeout_seconds
        try:
            while True:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    await lane.drain()  # what the host sent before its end is answered
                    break
                manager.touch(session)
                if isinstance(msg, wire.Malformed):
                    reply: lease_pb.LeaseResponse | None = _malformed(msg)
                else:
                    assert isinstance(msg, lease_pb.LeaseRequest)
                    if lane.wants(msg):  # a result, or a renewal behind its lease's result
                        await lane.put(msg)  # a full lane: read nothing more until it has room
                        continue
                    reply = await self._answer(session, msg)
                if reply is not None:
                    await _write(session, context, reply, limit)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the transport broke
            log.debug("stream of %s ended: %s", session.host_id, exc)
        # End of the host's side: finish the writer too.
        session.close(grpc.StatusCode.OK, "")

    async def _answer(
        self,
        session: HostSession,
        msg: lease_pb.LeaseRequest,
        held: set[ResultKey] | None = None,
    ) -> lease_pb.LeaseResponse | None:
        """`_handle`, a failure answered in-stream: the boundary's mapping, UNAVAILABLE (the
        database is down, or a row the message needs is held elsewhere: the host sends it
        again) or INTERNAL, never the driver's text. `held`: the results already warned about
        as waiting for a held row, on this stream; the host sends such a result again every
        few seconds, and each copy warned again filled the log while the lock lasted (once per
        result until it is answered otherwise: acknowledged, refused, or failed for another
        reason, after which a hold of its rows again is warned about again)."""
        rkey = result_key(msg)
        try:
            reply = await self._handle(session, msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, RowHeld):  # said in full, no traceback: nothing failed here
                again = held is not None and rkey is not None and rkey in held
                if held is not None and rkey is not None:
                    held.add(rkey)
                log.log(
                    logging.DEBUG if again else logging.WARNING,
                    "a message from %s waits: %s",
                    session.host_id,
                    exc,
                )
            else:
                if held is not None and rkey is not None:
                    held.discard(rkey)  # answered otherwise: a later hold is a new episode
                errors.report(log, "handling a message from %s failed", exc, session.host_id)
            code, message = status_for(exc)
            return lease_pb.LeaseResponse(
                rejected=lease_pb.Rejected(
                    code=code.value[0], message=message, task_id=_task_id(msg)
                )
            )
        if held is not None and rkey is not None:
            held.discard(rkey)  # answered: a later hold of its rows is a new episode
        return reply

    async def _handle(
        self, session: HostSession, msg: lease_pb.LeaseRequest
    ) -> lease_pb.LeaseResponse | None:
        """The answer to one host message (None: it needs none)."""
        kind = msg.WhichOneof("kind")
        manager = self._manager
        if kind == "renewal":
            problem = validate.renewal(msg.renewal)
            if problem:
                return messages.rejected(problem, msg.renewal.task_id)
            return await manager.renew(session, msg.renewal)
        if kind == "result":
            problem = validate.result(msg.result)
            if problem:
                return messages.rejected(problem, msg.result.task_id)
            with logs.bound(task_id=msg.result.task_id, attempt=msg.result.attempt):
                return await manager.result(session, msg.result)
        if kind == "device_update":
            problem = validate.device_update(msg.device_update)
            if problem:
                return messages.rejected(problem)
            await manager.device_update(session, msg.device_update)
            return None
        if kind == "outbox":
            await manager.outbox(session, msg.outbox)
            return None
        if kind == "stopping":
            manager.stopping(session)
            return None
        if kind == "hello":
            return lease_pb.LeaseResponse(
                rejected=lease_pb.Rejected(
                    code=grpc.StatusCode.FAILED_PRECONDITION.value[0],
                    message="hello: only the first message may be a hello",
                )
            )
        return messages.rejected(
            "kind: exactly one of hello, renewal, result, device_update, outbox, stopping"
        )
