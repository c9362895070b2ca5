"""The replica's one watch over writes to host streams: a write pending longer than
`lease_write_timeout_seconds` ends its stream "not reading".

A client that stops reading fills its flow-control window, and the cloud's next write to it
then waits for as long as the connection lives. Each write bounded by its own
`asyncio.timeout` cost a timer armed and cancelled on the event loop (about 10 µs a write on
a loaded replica, against some 400 µs of cloud CPU a renewal costs in all): on the renewal
hot path. A write now only notes when it started and which task does it
(`HostSession.write_started`, `HostSession.writer`), and this watch looks at every open
stream once a `period` and cancels a write that has waited past the limit; the write then
ends its stream as the timeout did (`cloud.lease.stream._bounded_write`).
"""

from __future__ import annotations

import logging
import time

from cloud import metrics
from cloud.lease.session import HostSession

log = logging.getLogger(__name__)

#: The longest pause between two looks: a write is ended at most this much past its limit.
MAX_PERIOD_S = 1.0


def period(limit: float) -> float:
    """How often the watch looks, for writes bounded by `limit` seconds: every second, or
    four times within a shorter limit."""
    return min(MAX_PERIOD_S, limit / 4)


class WriteWatch:
    """The streams whose handlers run on this replica, superseded ones included (the
    manager's `sessions` holds only each host's newest: a superseded stream stuck in a write
    is the one that most needs ending)."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._streams: set[HostSession] = set()

    def add(self, session: HostSession) -> None:
        """Watch the writes to `session`'s stream (its handler is serving it)."""
        self._streams.add(session)

    def discard(self, session: HostSession) -> None:
        """The stream's handler ended."""
        self._streams.discard(session)

    async def look(self) -> None:
        """End every write that has waited past the limit (the supervised loop's step)."""
        self.end_overdue(time.monotonic())

    def end_overdue(self, now: float) -> int:
        """Mark each stream whose write began more than `limit` seconds before `now` stuck and
        cancel that write (its stream then ends "not reading"); how many were ended."""
        ended = 0
        for session in self._streams:
            started = session.write_started
            if started is None or now - started <= self.limit or session.stuck:
                continue
            session.stuck = True
            metrics.current().lease_write_timeouts.inc()
            log.warning(
                "host %s reads nothing of its stream; ending it (no write taken in %g s)",
                session.host_id,
                self.limit,
            )
            if session.writer is not None:
                session.writer.cancel()
            ended += 1
        return ended
