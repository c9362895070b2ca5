"""A stream's results, recorded off its reader: one at a time, in the order they came.

A result locks its attempt's and its task's rows. Recorded on the stream's reader, a row held
elsewhere (an operator's `SELECT ... FOR UPDATE` left open in psql) held up every message
behind the result: the renewals of the host's other leases went unanswered until those ran
out too. Here each stream has a lane of its own, and its reader hands it the results and goes
on answering renewals.

Invariants the lane keeps (and `cloud.lease.stream` relies on):

- One stream's results are recorded one at a time, in the order the host sent them.
- A renewal of a lease (task, attempt) with a result in the lane goes into the lane behind
  that result: the fence sees the result first (the renewal is refused, the attempt having
  ended), as it did when the reader recorded results itself. Renewals of other leases do not
  wait for the lane.
- Every message handed to the lane gets one answer: its ack, its refusal, or, when a row it
  needs stayed held past its bounded wait (`RowHeld`), the retryable UNAVAILABLE rejection
  on which the host sends its unacknowledged results again (`RESEND_AFTER_UNAVAILABLE_S`).
  The answer goes out while the stream is open; when it ended first, the host sends its
  unacknowledged results again on its next stream.
- No result is lost nor recorded twice: one that timed out wrote nothing (its transaction
  rolled back), one cancelled with its stream either committed or wrote nothing, and the
  store answers a result it already recorded for (task, attempt, lease) as a duplicate.
- The lane is bounded (`LANE_LIMIT` messages): a full lane makes the reader wait before it
  reads on, so gRPC's flow control slows the host's sends, as it did when the reader recorded
  results itself. Unbounded, a host that sent results and never read their answers filled the
  replica's memory. Renewals of the host's other leases queue behind a full lane only for a
  host that floods results (a host sends one result per attempt, and again only unanswered).
- A result sent again while a copy of it (task, attempt, lease) still waits in the lane joins
  that copy (the newer one is recorded, one answer covers both): while rows are held, the
  host's resends (`RESEND_AFTER_UNAVAILABLE_S` after each UNAVAILABLE, each unanswered result
  every `RESULT_RESEND_S`) grew the lane by a copy each, and a result whose rows were free
  waited behind minutes of copies. The lane holds at most one waiting copy per result.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable

from amc.v1 import lease_service_pb2 as lease_pb

log = logging.getLogger(__name__)

_Key = tuple[str, int]
#: A result's identity: a copy of it sent again names the same (task, attempt, lease).
ResultKey = tuple[str, int, str]

#: Messages a lane holds before its stream's reader waits (small: each is one host's result
#: or renewal, answered in turn; a host needs about one per lease it holds).
LANE_LIMIT = 32


def _key(msg: lease_pb.LeaseRequest) -> _Key | None:
    """The lease (task, attempt) a renewal or result names; None for anything else."""
    kind = msg.WhichOneof("kind")
    if kind == "result":
        return msg.result.task_id, msg.result.attempt
    if kind == "renewal":
        return msg.renewal.task_id, msg.renewal.attempt
    return None


def result_key(msg: lease_pb.LeaseRequest) -> ResultKey | None:
    """The result (task, attempt, lease) `msg` carries; None for anything else."""
    if msg.WhichOneof("kind") != "result":
        return None
    return msg.result.task_id, msg.result.attempt, msg.result.lease_id


class _Entry:
    """One place in the lane: the message answered there (a result's newest copy)."""

    __slots__ = ("msg",)

    def __init__(self, msg: lease_pb.LeaseRequest) -> None:
        self.msg = msg


class ResultLane:
    """The results of one stream (and the renewals queued behind them), answered in order by
    a task of their own (started with the first result, ended by `close`)."""

    def __init__(
        self,
        answer: Callable[[lease_pb.LeaseRequest], Awaitable[lease_pb.LeaseResponse | None]],
        write: Callable[[lease_pb.LeaseResponse], Awaitable[None]],
        name: str,
    ) -> None:
        """`answer(msg)` is the stream's answer to one message (it never raises: a failure is
        answered as a rejection); `write(reply)` sends it on the stream."""
        self._answer = answer
        self._write = write
        self._name = name
        self._queue: asyncio.Queue[_Entry] = asyncio.Queue(maxsize=LANE_LIMIT)
        #: Results waiting in the lane (not yet being recorded), by identity: a copy sent
        #: again joins its place.
        self._waiting: dict[ResultKey, _Entry] = {}
        #: Messages in the lane per lease, recorded or waiting: a renewal of such a lease
        #: queues behind them.
        self._pending: collections.Counter[_Key] = collections.Counter()
        self._task: asyncio.Task[None] | None = None

    def wants(self, msg: lease_pb.LeaseRequest) -> bool:
        """Whether `msg` goes into the lane: a result, or a renewal of a lease whose result
        is in it."""
        kind = msg.WhichOneof("kind")
        if kind == "result":
            return True
        key = _key(msg)
        return kind == "renewal" and key is not None and self._pending[key] > 0

    async def put(self, msg: lease_pb.LeaseRequest) -> None:
        """Queue `msg` behind what the lane holds; its answer is written when its turn came. A
        copy of a result still waiting joins it; a full lane is waited on (the reader reads
        nothing meanwhile: the host's sends are slowed by gRPC's flow control)."""
        rkey = result_key(msg)
        if rkey is not None and (entry := self._waiting.get(rkey)) is not None:
            entry.msg = msg
            return
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)
        entry = _Entry(msg)
        await self._queue.put(entry)
        if rkey is not None:
            self._waiting[rkey] = entry
        key = _key(msg)
        if key is not None:
            self._pending[key] += 1

    def __len__(self) -> int:
        """Messages waiting in the lane (the one being answered not counted)."""
        return self._queue.qsize()

    async def drain(self) -> None:
        """Wait until everything queued has been answered (the host half-closed the stream:
        results it sent before are answered before the stream ends)."""
        await self._queue.join()

    async def close(self) -> None:
        """Stop answering (the stream ended): a result being recorded is cancelled (its
        transaction commits whole or not at all), the rest are left for the host to send
        again on its next stream."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        while True:
            entry = await self._queue.get()
            msg = entry.msg
            rkey = result_key(msg)
            if rkey is not None and self._waiting.get(rkey) is entry:
                del self._waiting[rkey]  # being recorded: a copy sent from now on queues anew
            try:
                reply = await self._answer(msg)
                if reply is not None:
                    try:
                        await self._write(reply)
                    except Exception as exc:  # the transport broke: the reader ends the stream
                        log.debug("%s: an answer was not written: %s", self._name, exc)
            finally:
                key = _key(msg)
                if key is not None:
                    self._pending[key] -= 1
                    if self._pending[key] <= 0:
                        del self._pending[key]
                self._queue.task_done()
