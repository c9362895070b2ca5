"""One worker thread per phone for its (blocking) driver calls, kept across its attempts.

Not asyncio's default pool, which every phone, the device poll and the outbox share: a call
that does not return soon (a wedged phone, a dump waiting for an idle screen) keeps its
thread, also once a cancel abandoned it, so a few stuck phones stalled all the others. One
thread per phone also keeps a phone's calls one at a time across attempts: an attempt started
right after a cancelled one waits for the call the cancel abandoned (every driver read has a
timeout) instead of running beside it (two `uiautomator dump`s fight over the accessibility
bridge).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


def new_lane(serial: str) -> ThreadPoolExecutor:
    """A one-thread executor for `serial`'s calls."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"phone-{serial}")


class PhoneLanes:
    """The host's lanes, one per phone serial, made on first use."""

    def __init__(self) -> None:
        self._lanes: dict[str, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def lane(self, serial: str) -> ThreadPoolExecutor:
        with self._lock:
            lane = self._lanes.get(serial)
            if lane is None:
                lane = self._lanes[serial] = new_lane(serial)
            return lane

    def close(self) -> None:
        """Let every thread go (one inside a call ends when the call does)."""
        with self._lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.shutdown(wait=False, cancel_futures=True)
