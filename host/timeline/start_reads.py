"""The reads a host makes of its data folder before it connects, bounded in time.

A host reads at start what its previous process left (the results the cloud never answered,
the outbox's backlog) before it dials the cloud. On a disk that hangs (a dead NFS mount, a
dying SSD: a read that never returns) an unbounded read kept the host from ever connecting,
and from stopping: SIGTERM set the stop while the start still waited. A read that has not
returned within `START_READ_S` now lets the host start paused, as a full disk pauses it
(`host.timeline.data_folder`, decision 0082): its phones OFFLINE with why, in its log and both
consoles, no work taken until a probe write works. The read goes on in its daemon thread
(holding no exit); once it returns, what it read is used late (`late`), and the pause stays
at least until then (`DataFolder.owe`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from host.devices.lanes import Lane
from host.timeline.data_folder import DataFolder

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a host waits at start for one read of its data folder before it starts paused.
#: A read of a working disk takes milliseconds; one a busy disk slows takes seconds.
START_READ_S = 10.0


async def read_at_start(
    read: Callable[[], T],
    what: str,
    *,
    refused: Callable[[str], None],
    folder: DataFolder | None,
    late: Callable[[T], None] | None = None,
    doing: str = "reading",
) -> T | None:
    """`read()` in a daemon thread of its own, waited for at most `START_READ_S`; its error
    is raised. None when it did not return in time: `refused(reason)` pauses the host (as a
    write the disk refused does), `folder` owes the end of the read (the host takes no work
    before it returned), and `late(result)` is called on the loop once it does. `doing`: the
    word for it in what the host says ("settling" for a start's writes)."""
    lane = Lane("", name="start-read")
    job: Future[T] = lane.submit(read)
    lane.shutdown(wait=False)  # the thread ends after the read
    waited = asyncio.wrap_future(job)
    done, _ = await asyncio.wait({waited}, timeout=START_READ_S)
    if done:
        return waited.result()
    log.error("%s %s did not return within %g s: the host starts paused", doing, what,
              START_READ_S)  # fmt: skip
    if folder is not None:
        folder.owe(job.exception)  # blocks the probe until the read returned, error or not
    refused(f"{doing} {what} did not return within {START_READ_S:g} s: the disk hangs")
    waited.add_done_callback(lambda _: _late(waited, f"{doing} {what}", late))
    return None


def _late(waited: asyncio.Future[T], what: str, late: Callable[[T], None] | None) -> None:
    if waited.cancelled():
        return
    if (exc := waited.exception()) is not None:
        log.error("%s failed after the host started", what, exc_info=exc)
        return
    log.warning("%s returned after the host started", what)
    if late is not None:
        late(waited.result())
