"""The event that tells an attempt to stop, and why it was told (and its lease's pause)."""

from __future__ import annotations

import asyncio

from host.agent.lease_pause import LeasePause

#: The cloud took the lease back (an operator's cancel, an expiry it saw, a release).
REVOKED = "the lease was revoked"
#: This host process is stopping (SIGTERM/SIGINT, `amc up` stopped): nobody revoked anything.
HOST_STOPPED = "the host stopped"
#: The attempt's phone left adb and was not back within the host's grace
#: (`HostSettings.phone_lost_grace_s`): nothing it waited for could be done on it.
PHONE_LOST = "the phone was lost"


class StopSignal(asyncio.Event):
    """An `asyncio.Event` that keeps the first reason it was set with.

    The host's own record of a stopped attempt names what stopped it: every stop used to read
    "the lease was revoked", also when the host itself was shut down, and an operator reading
    the host's timeline looked for a revoke the cloud never sent.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reason = REVOKED
        #: Paused while the lease ran out by the host's clock and the cloud has not confirmed
        #: it since (`host.agent.lease_pause`): the attempt holds still, not stopped.
        self.lease = LeasePause()

    def stop(self, reason: str) -> None:
        """Set the event; a later stop keeps the first reason (what actually stopped it)."""
        if not self.is_set():
            self.reason = reason
        self.set()


def stop_reason(cancel: asyncio.Event) -> str:
    """Why `cancel` was set: its reason when it says one, else a revoke (a plain event)."""
    return cancel.reason if isinstance(cancel, StopSignal) else REVOKED


def lease_pause(cancel: asyncio.Event) -> LeasePause:
    """The attempt's pause: its `StopSignal`'s, or one never paused (a plain event: no lease)."""
    return cancel.lease if isinstance(cancel, StopSignal) else LeasePause()
