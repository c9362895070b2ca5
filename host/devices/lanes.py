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

import threading
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Lane(ThreadPoolExecutor):
    """A one-thread executor for one phone's calls that knows how many are not done yet."""

    def __init__(self, serial: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=f"phone-{serial}")
        self._pending = 0
        self._count_lock = threading.Lock()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._count_lock:
            self._pending += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._done()
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, _: Any = None) -> None:
        with self._count_lock:
            self._pending -= 1

    @property
    def idle(self) -> bool:
        """No call queued or running (one a cancel abandoned still counts)."""
        with self._count_lock:
            return self._pending == 0


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
