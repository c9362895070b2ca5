"""Whether the model provider answers this replica's planner, and the dispatch pause it implies.

One task's step failing to plan says little; the provider failing every call of every task does:
then handing out more tasks only fills phones with steps that wait. `ProviderHealth` hears each
Decide's outcome (it is the planner service's `ProviderHealth` port): after `threshold`
temporarily-impossible answers in a row it calls the provider down, the dispatcher stops handing
new tasks to hosts on the cloud planner transport (they stay queued; running steps wait inside
their leases, see host/agent/planning_wait.py), and a probe call (`probe_step`, run by a
supervised loop that backs off while it fails) brings dispatch back the moment it succeeds — as
does any successful Decide. The fleet page shows the pause and its reason.

A provider that refuses the cloud's credentials (`refused`: the key revoked, the account's
billing lapsed) pauses dispatch at its first refusal: every call of every task will be refused
until an operator acts, and each task handed out meanwhile fails at its first step for good. The
reason names the setting to fix; a probe or a Decide that succeeds resumes dispatch as above.

Each replica judges by its own calls (they share no provider state), which is enough: the
provider is the same for all of them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from cloud import metrics
from planner.errors import PlannerAuthError

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class DispatchPause:
    """Why dispatch is paused, and since when."""

    since: datetime
    reason: str
    #: Set when the provider refused the credentials (not down): the setting that holds them.
    key_setting: str | None = None

    def describe(self) -> str:
        if self.key_setting is not None:
            return (
                f"the model provider refused the API key since {self.since:%H:%M:%S} UTC: "
                f"{self.reason}; set {self.key_setting} to a key it accepts (and restart the "
                "cloud), or fix the key's account (billing, permissions) at the provider: "
                "dispatch resumes when a call succeeds"
            )
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
        #: Named in the reason of a pause for refused credentials (the planner's key setting).
        self.key_setting = "AMC_PLANNER_ANTHROPIC_API_KEY or AMC_PLANNER_OPENAI_API_KEY"
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

    def refused(self, reason: str) -> None:
        """A Decide (or a probe) found the provider refusing the cloud's credentials: no call of
        any task can succeed until an operator acts, so dispatch pauses at once (replacing an
        outage's pause: this is what the operator must fix)."""
        if self.probe is None or (self._pause is not None and self._pause.key_setting):
            return
        self._pause = DispatchPause(self._clock(), reason, self.key_setting)
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
        try:
            await self.probe()
        except PlannerAuthError as err:  # e.g. the key was revoked during an outage
            self.refused(str(err))
            raise
        self.succeeded()
