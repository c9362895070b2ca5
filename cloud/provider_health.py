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

The pause is shared (cloud/dispatch_holds.py): the replica that finds the provider down or
refusing writes it where every replica reads it, and a restart keeps it. Every replica probes
while it is set; the one whose probe or Decide succeeds lifts it for all. Whether the provider
is *down* is still judged by each replica's own calls in a row.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from cloud.dispatch_holds import DispatchHolds
from cloud.store import holds
from planner.errors import PlannerAuthError

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class DispatchPause:
    """Why dispatch is paused, since when, and which replica found it."""

    since: datetime
    reason: str
    #: Set when the provider refused the credentials (not down): the setting that holds them.
    key_setting: str | None = None
    #: The replica (its id) that found it.
    seen_by: str = ""
    #: When a replica probes the provider next, as last recorded.
    next_probe_at: datetime | None = None

    @property
    def kind(self) -> str:
        """The hold's reason in `dispatch_holds` (`holds.KEY_REFUSED` or `PROVIDER_DOWN`)."""
        return holds.KEY_REFUSED if self.key_setting is not None else holds.PROVIDER_DOWN

    def lifted_by(self) -> str:
        """What lifts the hold, for operators (DispatchStatus.lifted_by)."""
        if self.key_setting is not None:
            return (
                f"a probe call or a Decide that succeeds, once {self.key_setting} holds a key "
                "the provider accepts (restart the cloud with it) or the key's account "
                "(billing, permissions) is fixed at the provider"
            )
        return "a probe call or a Decide that succeeds"

    def describe(self) -> str:
        """The hold for operators: what, since when, which replica found it, what lifts it."""
        seen = f" (seen by replica {self.seen_by})" if self.seen_by else ""
        probe = (
            f" (next probe at {self.next_probe_at:%H:%M:%S} UTC)"
            if self.next_probe_at is not None
            else ""
        )
        if self.key_setting is not None:
            return (
                f"the model provider refused the API key since {self.since:%H:%M:%S} UTC{seen}: "
                f"{self.reason}; set {self.key_setting} to a key it accepts (and restart the "
                "cloud), or fix the key's account (billing, permissions) at the provider: "
                f"dispatch resumes when a probe call or a Decide succeeds{probe}"
            )
        return (
            f"the model provider is unavailable since {self.since:%H:%M:%S} UTC{seen}: "
            f"{self.reason}; dispatch resumes when a probe call or a Decide succeeds{probe}"
        )


class ProviderHealth:
    """The provider's state as this replica's Decide calls see it, and the shared pause."""

    def __init__(
        self,
        holds: DispatchHolds,
        probe: Probe | None = None,
        *,
        threshold: int = 3,
        probe_seconds: float = 5.0,
    ) -> None:
        self.holds = holds
        self.probe = probe
        self.threshold = max(1, threshold)
        self.probe_seconds = probe_seconds
        #: Named in the reason of a pause for refused credentials (the planner's key setting).
        self.key_setting = "AMC_PLANNER_ANTHROPIC_API_KEY or AMC_PLANNER_OPENAI_API_KEY"
        self._failures = 0

    @property
    def pause(self) -> DispatchPause | None:
        """Set while dispatch to cloud-transport hosts is paused. A replica whose planner cannot
        be down (no probe: the offline provider) is paused only while a replica that calls the
        provider is alive (`DispatchHolds.honoured`), and never lifts a pause."""
        if self.probe is None and not self.holds.provider_replicas_alive:
            return None
        refused = self.holds.get(holds.KEY_REFUSED)
        found = refused or self.holds.get(holds.PROVIDER_DOWN)
        if found is None:
            return None
        key = self.key_setting if refused is not None else None
        return DispatchPause(found.set_at, found.detail, key, found.set_by, found.next_probe_at)

    def _next_probe(self) -> datetime:
        return self.holds.now() + timedelta(seconds=self.probe_seconds)

    async def failed(self, reason: str) -> None:
        """A Decide found planning temporarily impossible."""
        self._failures += 1
        if self.pause is None and self._failures >= self.threshold and self.probe is not None:
            await self.holds.hold(holds.PROVIDER_DOWN, reason, next_probe_at=self._next_probe())

    async def refused(self, reason: str) -> None:
        """A Decide (or a probe) found the provider refusing the cloud's credentials: no call of
        any task can succeed until an operator acts, so dispatch pauses at once (replacing an
        outage's pause: this is what the operator must fix)."""
        pause = self.pause
        if self.probe is None or (pause is not None and pause.key_setting):
            return
        await self.holds.hold(
            holds.KEY_REFUSED,
            reason,
            next_probe_at=self._next_probe(),
            replacing=(holds.PROVIDER_DOWN,),
        )

    async def succeeded(self) -> None:
        """A Decide (or a probe) got an answer from the provider."""
        self._failures = 0
        if self.pause is None or self.probe is None:  # the offline planner proves nothing
            return
        log.warning("the model provider answers again: dispatch resumes")
        await self.holds.lift(holds.PROVIDER)

    async def probe_step(self) -> None:
        """While paused, one probe call; raises (and the supervised loop backs off) while the
        provider still fails. Reads the shared holds first: another replica may have set one
        (this replica probes too) or lifted it."""
        if self.probe is None:
            return
        await self.holds.refresh()
        if self.pause is None:
            return
        try:
            await self.probe()
        except PlannerAuthError as err:  # e.g. the key was revoked during an outage
            await self.refused(str(err))
            raise
        except Exception:
            await self.holds.probed(holds.PROVIDER, self._next_probe())
            raise
        await self.succeeded()
