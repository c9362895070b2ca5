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


def _key(msg: lease_pb.LeaseRequest) -> _Key | None:
    """The lease (task, attempt) a renewal or result names; None for anything else."""
    kind = msg.WhichOneof("kind")
    if kind == "result":
        return msg.result.task_id, msg.result.attempt
    if kind == "renewal":
        return msg.renewal.task_id, msg.renewal.attempt
    return None


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
        self._queue: asyncio.Queue[lease_pb.LeaseRequest] = asyncio.Queue()
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

    def put(self, msg: lease_pb.LeaseRequest) -> None:
        """Queue `msg` behind what the lane holds; its answer is written when its turn came."""
        key = _key(msg)
        if key is not None:
            self._pending[key] += 1
        self._queue.put_nowait(msg)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

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
            msg = await self._queue.get()
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
