"""Sends the outbox in the background: oldest first, with backoff and jitter, never in a step.

Items go strictly in the order they were written (a screenshot after the decision it belongs
to; a decision's outcome after the decision), in batches of one kind. A failure that may pass
(the cloud is down or busy: UNAVAILABLE, DEADLINE_EXCEEDED, …) keeps the batch at the head and
waits — tenacity's full-jitter exponential backoff, cut short when the lease stream reconnects
(`retry_now`) — so the backlog goes as soon as the cloud is back. So does a refusal of the host
itself (UNAUTHENTICATED: its certificate revoked, until that is lifted or a new certificate is
installed). A refusal for good (the cloud says the item can never be taken: INVALID_ARGUMENT,
FAILED_PRECONDITION, …) marks the item refused and moves on, as does an item too big for any
message (`MAX_ITEM_BYTES`), and so does a batch the cloud keeps failing on (INTERNAL or
UNKNOWN: a bug of the cloud's on what it carries, or a proxy that cannot take it) once it
failed so `GIVE_UP_TRIES` times over at least `GIVE_UP_S` (counted with the items in the store,
the first failure's wall-clock time too: a restart does not start the count afresh) — it would
otherwise hold every item behind it for good. A cloud that takes a batch but refuses some of
its items alone (`ShipDecisionsResponse.refused`) has them marked refused, the rest sent. A
refused batch is split so one bad item does not take its neighbours down with it (each of its
items is given the same chance again). Every item carries its own id, so a batch the cloud
took but whose answer was lost is simply taken again without effect.

A cloud older than a kind of item may refuse it for what it lacks: a cloud from before
`ShipDecisionsRequest.failed_calls` reads a request carrying only them as one with no entries
("entries: at least one", `PREDATES`). Such a batch is neither refused (its spending would be
lost for good, though the upgraded cloud would take it) nor tried again and again: it is set
aside, out of the way of the items after it, and brought back in line whenever the lease
stream is welcomed again (`cloud_back`: an upgrade restarts the cloud) and at the sender's
start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_random_exponential

from cloud.cert_validity import CertificateInvalid
from host.cloud_channel import MAX_MESSAGE_BYTES, AnotherHostsCertificate, CertificateMissing
from host.devices.lanes import Lane
from host.not_connecting import problem_key
from host.outbox.kinds import FAILED_CALLS, KINDS, UNSETTLED, Kind
from host.outbox.store import OutboxItem, OutboxStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Codes after which the same request may succeed later.
TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        # The caller refused, not the item: a revoked certificate (lifted again, or replaced
        # by a new one and a restart) is accepted later, and the items with it.
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
#: Codes that may also be the cloud failing on this very request, not the cloud being away or
#: busy: waited out, but only `GIVE_UP_TRIES` times over `GIVE_UP_S` (both must be reached).
SUSPECT = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
GIVE_UP_TRIES = 10
GIVE_UP_S = 600.0
HEAD = 200
#: What a cloud from before an item kind answers to a request of that kind alone: (kind, code,
#: the exact words). Clouds before `failed_calls` checked only for entries, and clouds before
#: `unsettled_calls` for entries or failed_calls.
PREDATES = frozenset(
    {
        (FAILED_CALLS, grpc.StatusCode.INVALID_ARGUMENT, "entries: at least one"),
        (UNSETTLED, grpc.StatusCode.INVALID_ARGUMENT, "entries: at least one"),
        (UNSETTLED, grpc.StatusCode.INVALID_ARGUMENT, "entries: at least one (or failed_calls)"),
    }
)
#: An item whose request is bigger than a message may be (less room for the request around a
#: shipped decision) is never sent: gRPC refuses it with RESOURCE_EXHAUSTED, a code otherwise
#: waited out, and it would hold every item after it for ever.
MAX_ITEM_BYTES = MAX_MESSAGE_BYTES - 4096


#: What opening the channel may raise that a later try may not (`OutboxSender._open`).
_UNOPENED = (OSError, CertificateMissing, CertificateInvalid, AnotherHostsCertificate)


class _Stopped(Exception):
    """The host is stopping: leave the batch where it is (it is durable)."""


def transient(exc: BaseException) -> bool:
    """Whether the same request may work later."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in TRANSIENT
    return not isinstance(exc, DecodeError | ValueError)


def _suspect(exc: BaseException | None) -> bool:
    """Whether the failure may be the cloud's bug on what the batch carries (`SUSPECT`)."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in SUSPECT


def _predates(kind: str, exc: BaseException) -> bool:
    """Whether a cloud older than this kind of item refused it for what it lacks (`PREDATES`)."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return False
    return (kind, exc.code(), exc.details()) in PREDATES


def _describe(
    exc: BaseException, explain: Callable[[grpc.aio.AioRpcError], str] | None = None
) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return explain(exc) if explain else f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


def batch_of(items: Sequence[OutboxItem], kinds: dict[str, Kind]) -> list[OutboxItem]:
    """The head run of one kind, within that kind's item and byte limits (at least one item)."""
    kind = kinds[items[0].kind]
    batch = [items[0]]
    size = len(items[0].body)
    for item in items[1:]:
        if item.kind != kind.name or len(batch) >= kind.batch_items:
            break
        if size + len(item.body) > kind.batch_bytes:
            break
        batch.append(item)
        size += len(item.body)
    return batch


class OutboxSender:
    """One background task per host: drains the outbox to the cloud."""

    def __init__(
        self,
        store: OutboxStore,
        channel_factory: Callable[[], Any],
        *,
        kinds: dict[str, Kind] | None = None,
        initial_s: float = 0.5,
        max_s: float = 30.0,
        give_up_tries: int = GIVE_UP_TRIES,
        give_up_s: float = GIVE_UP_S,
        lane: Executor | None = None,
        explain: Callable[[grpc.aio.AioRpcError], str] | None = None,
        follow: bool = False,
    ) -> None:
        self.store = store
        #: The factory hands the channel to use now (`cloud_channel.ChannelOnce`: made again
        #: from a certificate issued again while the host runs, the old one closed by it once
        #: its calls end): asked again before each try of each batch, as a batch refused
        #: for a certificate revoked while it was in flight would otherwise be tried on the
        #: revoked certificate's channel forever.
        self._follow = follow
        #: What a failed call says (`host.cloud_channel.failure`: whose certificate, when a
        #: handshake failed on one; the channel is opened once and outlives the certificate).
        self._explain = explain
        #: Where the store is read and written (`use`): a daemon thread (`Lane`), not asyncio's
        #: default pool, whose threads `asyncio.run` and Python join at exit: a read hung on
        #: the disk there held a stopped host's exit for as long as it hung. One given is its
        #: owner's to shut down; without one the sender makes its own and lets it go when
        #: `run` ends.
        self._own_lane = lane is None
        self.lane: Executor = Lane("", name="outbox-sender") if lane is None else lane
        self._channel_factory = channel_factory
        self._kinds = kinds or KINDS
        self._initial_s = initial_s
        self._max_s = max_s
        self._give_up_tries = give_up_tries
        self._give_up_s = give_up_s
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Something was written (set from any thread through `notify`).
        self.wake = asyncio.Event()
        #: Try the waiting batch now (the lease stream just reconnected: the cloud is back).
        self.retry_now = asyncio.Event()
        #: Bring the items set aside for an older cloud back in line (at start; `cloud_back`).
        self._bring_back = True
        #: The backlog changed (written, sent or refused): whoever reports it looks again.
        self.changed = asyncio.Event()
        self.last_error: str | None = None
        store.add_listener(self.notify)

    def cloud_back(self) -> None:
        """The lease stream was welcomed (again): the cloud may have been upgraded since it
        could not take some items (`PREDATES`), and a waiting batch may go now."""
        self._bring_back = True
        self.retry_now.set()
        self.wake.set()

    def notify(self) -> None:
        """An item was written (any thread): wake the sender, tell the backlog reporter."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def wake() -> None:
            self.wake.set()
            self.changed.set()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            wake()
        else:
            loop.call_soon_threadsafe(wake)

    async def use(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)`, a use of the store, in `lane`."""
        return await asyncio.get_running_loop().run_in_executor(
            self.lane, functools.partial(call, *args)
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Send until `stop`; what is left stays in the store for the next start."""
        self._loop = asyncio.get_running_loop()
        self.changed.set()
        channel: Any = None
        try:
            channel = await self._open(stop)
            while not stop.is_set():
                self.wake.clear()
                if self._bring_back:
                    self._bring_back = False
                    back = await self.use(self.store.bring_back)
                    if back:
                        log.info(
                            "outbox: %d item(s) set aside for an older cloud tried again", back
                        )
                items = await self.use(self.store.head, HEAD)
                if not items:
                    await self._idle(stop)
                    continue
                if items[0].kind not in self._kinds:  # a newer host wrote it (a downgrade)
                    await self._refuse(items[0], "not a kind this host ships (a newer host's)")
                    continue
                if len(items[0].body) > MAX_ITEM_BYTES:  # alone in its batch (`batch_of`)
                    mib = MAX_MESSAGE_BYTES // (1024 * 1024)
                    why = f"{len(items[0].body)} bytes, more than a message may have ({mib} MiB)"
                    await self._refuse(items[0], why)
                    continue
                if self._follow:
                    channel = await self._open(stop)
                await self._deliver(channel, batch_of(items, self._kinds), stop)
        except _Stopped:
            return
        finally:
            if self._own_lane:  # a use hung on the disk is left to its daemon thread
                self.lane.shutdown(wait=False, cancel_futures=True)
            if channel is not None:
                await channel.close(grace=None)

    async def _open(self, stop: asyncio.Event) -> Any:
        """The channel from the factory, made at once or awaited (`cloud_channel.ChannelOnce`:
        the certificate files read off the event loop). One that cannot be opened yet is the
        sender's last error and is tried again with its backoff (cut short when the lease
        stream is welcomed again): the files hang on their disk (an OSError), or hold a
        certificate the cloud would refuse, none, or another host's (being issued again, or
        copied in: the lease stream says so, and stops the host if it must). Only an OSError
        was caught: any other ended the sender's task, silently, and the results it kept
        waited on the disk until the host was restarted. Each problem is logged when it
        changes (`problem_key`: its kind and file), not at every try. `_Stopped` when the
        host stops meanwhile."""
        wait, said = self._initial_s, None
        while True:
            try:
                made = self._channel_factory()
                channel = await made if inspect.isawaitable(made) else made
            except _UNOPENED as exc:
                self.last_error = _describe(exc)
                if problem_key(exc) != said:  # its kind and file: its words may hold a clock
                    said = problem_key(exc)
                    log.warning(
                        "outbox: no channel to the cloud yet: %s (tried again with backoff)",
                        self.last_error,
                    )
            else:
                if said is not None:
                    self.last_error = None
                    log.info("outbox: a channel to the cloud is open again")
                return channel
            await self._pause(stop)(wait)
            wait = min(wait * 2, self._max_s)

    async def _idle(self, stop: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in (self.wake, stop)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def _pause(self, stop: asyncio.Event) -> Callable[[float], Any]:
        """tenacity's sleep: wait `seconds`, less when the cloud is back, raise when stopping."""

        async def pause(seconds: float) -> None:
            self.retry_now.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (stop, self.retry_now)]
            try:
                await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if stop.is_set():
                raise _Stopped

        return pause

    async def _refuse(self, item: OutboxItem, reason: str) -> None:
        """Set `item` aside for good (kept, marked refused, never sent again)."""
        log.warning("outbox: %s %s refused: %s", item.kind, item.item_id, reason)
        await self.use(self.store.refused, item.seq, reason)
        self.changed.set()

    async def _deliver(self, channel: Any, batch: list[OutboxItem], stop: asyncio.Event) -> None:
        kind = self._kinds[batch[0].kind]
        seqs = [i.seq for i in batch]
        # The batch's SUSPECT failures so far and the first one's time, as the store keeps
        # them with its head item (the one in every try of it), before a restart too.
        suspect = batch[0].suspect
        since = batch[0].suspect_since
        last = since

        async def note_failure(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            self.last_error = _describe(exc, self._explain) if exc else "unknown"
            log.info(
                "outbox: %d %s item(s) not sent yet (try %d): %s",
                len(batch),
                kind.name,
                state.attempt_number,
                self.last_error,
            )
            at = since if _suspect(exc) else None
            await self.use(self.store.failed, seqs, self.last_error, at)

        def again(exc: BaseException) -> bool:
            """Whether to wait and try the batch again: a transient failure, unless the cloud
            answered a SUSPECT code often enough, over long enough, to be failing on it."""
            nonlocal suspect, since, last
            if not transient(exc):
                return False
            if _suspect(exc):
                suspect += 1
                last = datetime.now(UTC)
                since = since or last
                if (
                    suspect >= self._give_up_tries
                    and (last - since).total_seconds() >= self._give_up_s
                ):
                    return False
            return True

        retrying = AsyncRetrying(
            retry=retry_if_exception(again),
            wait=wait_random_exponential(multiplier=self._initial_s, max=self._max_s),
            sleep=self._pause(stop),
            before_sleep=note_failure,
            reraise=True,
        )
        refusals: dict[int, str] = {}
        try:
            async for attempt in retrying:
                if self._follow:  # each try: a certificate revoked mid-batch left its
                    channel = await self._open(stop)  # channel refused for good
                with attempt:
                    refusals = await kind.send(channel, batch)
        except _Stopped:
            raise
        except Exception as exc:  # refused for good, or failed on too often (`again`)
            if _predates(kind.name, exc):
                self.last_error = _describe(exc, self._explain)
                log.warning(
                    "outbox: %d %s item(s) kept for a newer cloud (this one cannot take them: "
                    "%s); tried again when the cloud reconnects",
                    len(batch), kind.name, self.last_error,
                )  # fmt: skip
                await self.use(self.store.set_aside, seqs, self.last_error)
                self.changed.set()
                return
            if len(batch) > 1:  # find the one the cloud cannot take; send the others
                await self.use(self.store.forgive, seqs)
                for item in batch:
                    fresh = dataclasses.replace(item, suspect=0, suspect_since=None)
                    await self._deliver(channel, [fresh], stop)
                return
            why = _describe(exc, self._explain)
            if transient(exc) and since is not None and last is not None:  # given up on
                why += f" ({suspect} tries over {(last - since).total_seconds():.0f}s)"
            await self._refuse(batch[0], why)
            return
        self.last_error = None
        for index, why in refusals.items():  # taken apart from these: never sent again
            await self._refuse(batch[index], why)
        await self.use(self.store.sent, [s for i, s in enumerate(seqs) if i not in refusals])
        self.changed.set()
