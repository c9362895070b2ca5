"""Whether the model provider answers this replica's planner, and the dispatch pause it implies.

One task's step failing to plan says little; the provider failing every call of every task does:
then handing out more tasks only fills phones with steps that wait. `ProviderHealth` hears each
Decide's outcome (it is the planner service's `ProviderHealth` port): after `threshold`
temporarily-impossible answers in a row it calls the provider down, the dispatcher stops handing
new tasks to hosts on the cloud planner transport (they stay queued; running steps wait inside
their leases, see host/agent/planning_wait.py), and a probe call (`probe_step`, run by a
supervised loop that backs off while it fails) brings dispatch back the moment it succeeds — as
does any successful Decide. The fleet page shows the pause and its reason.

Each replica judges by its own calls (they share no provider state), which is enough: the
provider is the same for all of them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from cloud import metrics

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class DispatchPause:
    """Why dispatch is paused, and since when."""

    since: datetime
    reason: str

    def describe(self) -> str:
        return f"the model provider is unavailable since {self.since:%H:%M:%S} UTC: {self.reason}"


class ProviderHealth:
    """The provider's state as this replica's Decide calls see it."""

    def __init__(
        self,
        probe: Probe | None = None,
        *,
        threshold: int = 3,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.probe = probe
        self.threshold = max(1, threshold)
        self._clock = clock
        self._failures = 0
        self._pause: DispatchPause | None = None
        #: Called when the provider is back (the dispatcher wakes up).
        self.on_available: list[Callable[[], None]] = []

    @property
    def pause(self) -> DispatchPause | None:
        """Set while dispatch to cloud-transport hosts is paused."""
        return self._pause

    def failed(self, reason: str) -> None:
        """A Decide found planning temporarily impossible."""
        self._failures += 1
        if self._pause is None and self._failures >= self.threshold and self.probe is not None:
            self._pause = DispatchPause(self._clock(), reason)
            metrics.current().dispatch_paused.set(1)
            log.warning("pausing dispatch: %s", self._pause.describe())

    def succeeded(self) -> None:
        """A Decide (or a probe) got an answer from the provider."""
        self._failures = 0
        if self._pause is None:
            return
        log.warning("the model provider answers again: dispatch resumes")
        self._pause = None
        metrics.current().dispatch_paused.set(0)
        for callback in self.on_available:
            callback()

    async def probe_step(self) -> None:
        """While paused, one probe call; raises (and the supervised loop backs off) while the
        provider still fails."""
        if self._pause is None or self.probe is None:
            return
        await self.probe()
        self.succeeded()
