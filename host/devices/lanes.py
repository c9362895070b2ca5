"""One worker thread per phone for its (blocking) driver calls, kept across its attempts.

Not asyncio's default pool, which every phone, the device poll and the outbox share: a call
that does not return soon (a wedged phone, a dump waiting for an idle screen) keeps its
thread, also once a cancel abandoned it, so a few stuck phones stalled all the others. One
thread per phone also keeps a phone's calls one at a time across attempts: an attempt started
right after a cancelled one waits for the call the cancel abandoned (every driver read has a
timeout) instead of running beside it (two `uiautomator dump`s fight over the accessibility
bridge).

A lane lives while its phone is there, an attempt uses it or a call (an abandoned one too)
still runs in it: phones come and go with new serials (USB hubs, emulators rebooted), and a
thread kept per serial ever seen would pile up for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import queue
import threading
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Lane(Executor):
    """A one-thread executor for one phone's calls that knows how many are not done yet.

    Its thread is a daemon, unlike a `ThreadPoolExecutor`'s, which Python joins at exit: a call
    a stop abandoned (a look at a wedged phone, a gesture adbd sits on; each may take as long as
    its timeout, 30 s and more) held a stopped host's exit that long, and `amc host run` was
    SIGKILLed by whoever stopped it. Nothing is lost: the attempt was handed back without it."""

    def __init__(self, serial: str, *, name: str = "") -> None:
        self._name = name or f"phone-{serial}_0"
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pending = 0
        self._count_lock = threading.Lock()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._count_lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            if self._thread is None:  # started before the call counts: a failed start
                thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                thread.start()  # (no thread left to the process) leaves the lane idle
                self._thread = thread
            self._pending += 1
            self._calls.put((future, functools.partial(fn, *args, **kwargs)))
        future.add_done_callback(self._done)
        return future

    def _work(self) -> None:
        while (item := self._calls.get()) is not None:
            _run(*item)
            del item  # a finished call's arguments are not kept alive until the next one

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        dropped: list[Future[Any]] = []
        with self._count_lock:
            self._closed = True
            if cancel_futures:
                with contextlib.suppress(queue.Empty):
                    while True:
                        item = self._calls.get_nowait()
                        if item is not None:
                            dropped.append(item[0])
            self._calls.put(None)
            thread = self._thread
        for future in dropped:  # its callback counts it done, under the lock
            future.cancel()
        if wait and thread is not None:
            thread.join()

    def _done(self, _: Any = None) -> None:
        with self._count_lock:
            self._pending -= 1

    @property
    def idle(self) -> bool:
        """No call queued or running (one a cancel abandoned still counts)."""
        with self._count_lock:
            return self._pending == 0


def _run(future: Future[Any], call: Callable[[], Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = call()
    except BaseException as exc:  # as ThreadPoolExecutor: the caller sees it
        future.set_exception(exc)
    else:
        future.set_result(result)


async def in_own_thread(call: Callable[..., T], *args: Any, name: str = "disk-write") -> T:
    """`call(*args)` awaited in a daemon thread of its own (a `Lane` let go at once), with the
    caller's context, as `asyncio.to_thread`. For writes that may hang on the disk: asyncio's
    default pool, whose threads `asyncio.run` and Python join at exit, held a stopped host's
    exit for as long as one hung; a thread per call keeps the writes of several attempts
    side by side as that pool did, and needs no owner to shut it down."""
    lane = Lane("", name=name)
    call_in_context = functools.partial(contextvars.copy_context().run, call, *args)
    job = asyncio.get_running_loop().run_in_executor(lane, call_in_context)
    lane.shutdown(wait=False)  # the thread ends after the call
    return await job


def new_lane(serial: str) -> Lane:
    """A one-thread executor for `serial`'s calls."""
    return Lane(serial)


class PhoneLanes:
    """The host's lanes, one per phone serial, made on first use, retired once idle and gone."""

    def __init__(self) -> None:
        self._lanes: dict[str, Lane] = {}
        self._users: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def use(self, serial: str) -> Iterator[Lane]:
        """`serial`'s lane, kept from retirement until the block ends (an attempt on it)."""
        with self._lock:
            lane = self._lanes.get(serial)
            if lane is None:
                lane = self._lanes[serial] = new_lane(serial)
            self._users[serial] = self._users.get(serial, 0) + 1
        try:
            yield lane
        finally:
            with self._lock:
                self._users[serial] -= 1
                if not self._users[serial]:
                    del self._users[serial]

    def serials(self) -> list[str]:
        """The serials that have a lane now."""
        with self._lock:
            return sorted(self._lanes)

    def retire(self, present: Collection[str]) -> list[str]:
        """Let the threads of phones not in `present` go when no attempt uses them and no call
        runs in them; the serials retired. A phone that comes back gets a new lane."""
        with self._lock:
            gone = [
                serial
                for serial, lane in self._lanes.items()
                if serial not in present and serial not in self._users and lane.idle
            ]
            lanes = [self._lanes.pop(serial) for serial in gone]
        for lane in lanes:
            lane.shutdown(wait=False)
        return gone

    def close(self) -> None:
        """Let every thread go (one inside a call ends when the call does)."""
        with self._lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.shutdown(wait=False, cancel_futures=True)
