"""An attempt held still while its lease is unconfirmed: run out by the host's clock, the cloud
not heard since.

A lease that runs out with no renewal answered may still be live: a cloud that was down (a
restart, a slow rolling deploy, a database failover) gives live leases a new term when it
starts again (decision 0076, `leases.extend_after_outage`), and resumes the assignments a
host's hello names. Stopping the attempt there threw its work away: every running task of the
fleet started again from step one after any outage longer than a lease, its model turns paid
twice. It may also be gone: the cloud swept it and handed the task to another phone. So the
attempt pauses: it does nothing more on its phone (the action already under way ends, as a stop
lets it) and asks no model, until the cloud either confirms the lease (a renewal answered, the
hello's resume of it: `LeasePause.resume`) or refuses it (a revoke stops the attempt as it
stops any other). The lease client pauses and resumes (`host.lease_client`); the agent loop
waits at its gates (`LeasePause.wait_live`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: The progress line of a paused attempt (after "step N: ").
PAUSED_SUMMARY = (
    "paused: the lease ran out while the cloud was unreachable; "
    "continuing when the cloud confirms it"
)


class PausedPastDeadline(Exception):
    """The task's deadline came while its attempt waited for the cloud to confirm its lease:
    the attempt ends with a retryable outcome, as one whose planning stayed impossible does."""

    def __init__(self) -> None:
        super().__init__(
            "the lease ran out while the cloud was unreachable, and the cloud had not "
            "confirmed it when the task's deadline came"
        )


class LeasePause:
    """Whether an attempt's lease is confirmed live (the default) or paused."""

    def __init__(self) -> None:
        self._live = asyncio.Event()
        self._live.set()
        #: The opposite of `_live`, for the planning to race (`wait_paused`): one model call
        #: can lead to more inside one decision (a correction, a forced retry, a recovery).
        self._paused = asyncio.Event()

    @property
    def paused(self) -> bool:
        """The lease ran out by the host's clock and the cloud has not confirmed it since."""
        return not self._live.is_set()

    def pause(self) -> None:
        """The lease ran out by the host's clock with no renewal answered."""
        self._live.clear()
        self._paused.set()

    def resume(self) -> None:
        """The cloud confirmed the lease (a renewal answered, a resumed assignment)."""
        self._paused.clear()
        self._live.set()

    async def wait_paused(self) -> None:
        """Return once the lease pauses (at once when it is paused)."""
        await self._paused.wait()

    async def wait_live(
        self,
        cancel: asyncio.Event,
        deadline: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> bool:
        """Wait while paused, until the cloud confirms the lease or `cancel` is set (the
        caller checks it). True when it waited (the caller looks at the screen again: it may
        have changed meanwhile). Raises `PausedPastDeadline` at `deadline` (monotonic)."""
        if not self.paused or cancel.is_set():
            return False
        waits = [asyncio.ensure_future(self._live.wait()), asyncio.ensure_future(cancel.wait())]
        timeout = None if deadline is None else max(0.0, deadline - clock())
        try:
            done, _ = await asyncio.wait(
                waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
        if not done:
            raise PausedPastDeadline
        return True
