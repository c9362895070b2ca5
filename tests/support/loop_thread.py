"""An asyncio event loop in a daemon thread, for tests whose servers must outlive (or not stall
with) the test's own loop: synchronous Hypothesis tests, browser tests, fault proxies."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
WAIT_S = 20.0


class LoopThread:
    """Submit coroutines with `run`; `stop` ends every task still on the loop, then the loop."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = WAIT_S) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def stop(self, timeout: float = WAIT_S) -> None:
        """Cancel what is left and let it finish before the loop closes: a task still pending
        when its loop closes is destroyed later, wherever the collector happens to run, as
        "Task was destroyed but it is pending" in some other test's output."""

        async def drain() -> None:
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        if self.loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self.run(drain(), timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
