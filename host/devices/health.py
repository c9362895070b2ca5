"""Phones whose screen cannot be read, kept out of work until a look at them works again.

An attempt that cannot read its phone (no `uiautomator` on it, a dumper that crashes on every
try, a display that never gives an image) ends retryable: the task is not to blame. On a phone
that can never be read every task sent to it used up its attempts that way. After
`limit` attempts in a row ended so, the phone is marked unhealthy: the registry reports it as
not usable (the cloud offers it no task) and the lease client refuses an assignment already on
its way, saying why (`DeviceRegistry.mark_unhealthy`). The host re-probes it every `probe_s`
with a whole look, as an attempt takes one (`Perceiver.probe`: waking it, a screenshot that
decodes, a dump that parses): a probe of one dump cleared a phone whose display or screenshots
had failed, which then burnt another `limit` attempts, again and again. The first probe that
works clears the mark. A phone the registry forgets is forgotten here too (`forget`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

#: What failed on the phone: a look at its screen, or its actions (taps, keys) that got no
#: answer in time. A probe takes the look either way, and for "action" a key press too: a
#: phone whose taps hang while its screen reads fine passed a look and was put back to work.
Part = Literal["look", "action"]


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A phone kept out of work: how many attempts in a row could not read it, and what the
    last one said."""

    attempts: int
    last: str
    part: Part = "look"
    #: What the last probe found when it failed ("" before one failed): what keeps the phone
    #: out now (a screen that gives no UI tree, even on the home screen), which may no longer
    #: be what its attempts said.
    probe: str = ""

    def words(self, serial: str, probe_s: float) -> str:
        """What an operator reads (a refusal, the console): what failed and how it clears.
        The last probe's finding first: the cloud keeps 512 characters of a phone's reason."""
        found = f"its last probe failed: {self.probe[:200]}; before it, " if self.probe else ""
        if self.part == "action":
            return (
                f"phone {serial} is unhealthy: {found}its actions got no answer in time in "
                f"{self.attempts} attempts in a row (last: {self.last}); it takes no work "
                f"until it answers again, which the host tries every {probe_s:g} s with a "
                "whole look and a key press (wake); mend what hangs (adb, the phone's input: "
                "restart the phone), or unplug the phone; a restart of the host probes it at once"
            )
        return (
            f"phone {serial} is unhealthy: {found}its screen could not be read in {self.attempts} "
            f"attempts in a row (last: {self.last}); it takes no work until a look at it "
            f"works again, which the host tries every {probe_s:g} s with a whole look (wake, "
            "screenshot, dump); mend what the last failure names (uiautomator, the display, "
            "adb), or unplug the phone; a restart of the host probes it at once"
        )


class PhoneHealth:
    """Counts each phone's attempts in a row that ended unable to read it; says which phones
    are unhealthy and which are due for a probe. Attempts end and probes report on the event
    loop (a probe's look runs in the phone's lane, but `probed` is called after it, back on
    the loop); `forget` comes from the registry's listener in the device poll's worker
    thread: hence the lock."""

    def __init__(
        self, limit: int, probe_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = max(1, limit)
        self.probe_s = probe_s
        self._clock = clock
        self._lock = threading.Lock()
        self._streak: dict[str, int] = {}
        self._unhealthy: dict[str, Unreadable] = {}
        self._probed_at: dict[str, float] = {}

    def attempt_ended(self, serial: str, unreadable: str, part: Part = "look") -> Unreadable | None:
        """An attempt on `serial` ended; `unreadable` is what it said when it could not read
        (`part` "look") or drive (`part` "action") the phone ("" when it ended otherwise: the
        streak ends). The mark when this attempt made the phone unhealthy, else None."""
        with self._lock:
            if not unreadable:
                self._streak.pop(serial, None)
                return None
            streak = self._streak[serial] = self._streak.get(serial, 0) + 1
            if streak < self.limit or serial in self._unhealthy:
                return None
            mark = self._unhealthy[serial] = Unreadable(streak, unreadable, part)
            self._probed_at[serial] = self._clock()
            return mark

    def due(self) -> list[str]:
        """The unhealthy phones whose last probe (or mark) is `probe_s` old."""
        now = self._clock()
        with self._lock:
            return [s for s in self._unhealthy if now - self._probed_at.get(s, 0.0) >= self.probe_s]

    def probed(self, serial: str, ok: bool, found: str = "") -> bool:
        """A probe of `serial` read it (`ok`) or not (`found`: why not, kept on the mark);
        True when that cleared its mark. A probe that ends after its phone was forgotten (or
        cleared) records nothing."""
        with self._lock:
            mark = self._unhealthy.get(serial)
            if mark is None:
                return False
            self._probed_at[serial] = self._clock()
            if not ok:
                if found:
                    self._unhealthy[serial] = replace(mark, probe=found)
                return False
            del self._unhealthy[serial]
            self._streak.pop(serial, None)
            return True

    def restore(self, serial: str, mark: Unreadable) -> None:
        """A mark kept from before the host restarted (`TimelineStore.unhealthy_phones`): the
        phone is unhealthy and due for a probe at once, so it takes work again only once a
        look (and for "action" a key press) works, and at once if it does."""
        with self._lock:
            self._unhealthy[serial] = mark
            self._streak[serial] = mark.attempts
            self._probed_at[serial] = float("-inf")

    def marked(self) -> list[str]:
        """The phones marked unhealthy now."""
        with self._lock:
            return list(self._unhealthy)

    def of(self, serial: str) -> Unreadable | None:
        with self._lock:
            return self._unhealthy.get(serial)

    def forget(self, serial: str) -> None:
        """The registry forgot the phone (adb has not listed it for `forget_after_s`): its
        streak and mark go too, else it was probed, and its failure logged, every `probe_s`
        for as long as the host ran. Should it come back, it starts afresh."""
        with self._lock:
            self._streak.pop(serial, None)
            self._unhealthy.pop(serial, None)
            self._probed_at.pop(serial, None)
