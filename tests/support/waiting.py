"""Waiting on a condition in async tests: poll it until true, bounded (never a fixed sleep)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def until(
    condition: Callable[[], bool | Awaitable[bool]], within: float = 30.0, what: str = ""
) -> None:
    """Return once `condition()` is true (it may be a coroutine function); fail after `within`
    seconds, naming `what`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while True:
        value = condition()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if loop.time() > end:
            raise AssertionError(f"not within {within:g} s: {what or condition}")
        await asyncio.sleep(0.05)
