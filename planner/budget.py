"""Spending caps: whether a task (or the fleet today) may make one more model call.

A cap is checked before a call, against what was spent before it, so the call that crosses a
cap completes (its tokens were already being spent when the answer came) and nothing is spent
after it. Tokens are every billed token (`Usage.billed_tokens`), cost is `Usage.cost_usd`. The
cloud checks in Decide before it calls the provider; a host on the direct transport checks in
`DirectPlanner` with the caps and earlier spending its assignment carried. Both say the same
words: "budget exhausted: 10,412 tokens of the task's 10,000".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.decision import Usage

PREFIX = "budget exhausted: "


@dataclass(frozen=True, slots=True)
class Budget:
    """Caps; 0 is no cap of that kind."""

    max_tokens: int = 0
    max_cost_usd: float = 0.0

    def __bool__(self) -> bool:
        return self.max_tokens > 0 or self.max_cost_usd > 0


def dollars(value: float) -> str:
    """$0.0123 for small amounts, $12.35 from a dollar up."""
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def exhausted(budget: Budget, spent: Usage, whose: str = "the task's") -> str | None:
    """Why no further call may be made under `budget` after `spent`, or None while it may."""
    if budget.max_tokens > 0 and spent.billed_tokens >= budget.max_tokens:
        return f"{PREFIX}{spent.billed_tokens:,} tokens of {whose} {budget.max_tokens:,}"
    if budget.max_cost_usd > 0 and spent.cost_usd >= budget.max_cost_usd:
        return f"{PREFIX}{dollars(spent.cost_usd)} of {whose} {dollars(budget.max_cost_usd)}"
    return None


@dataclass(slots=True)
class FleetDay:
    """The fleet's daily caps as a direct-transport host sees them: the cloud's tally of today
    as it last said (the assignment, then each renewal: `heard`), plus what this attempt spent
    since (`spend`). Checked before each model call as Decide checks it on the cloud transport.

    Exact within a renewal interval: what other hosts spend reaches it with the next renewal,
    and what this host spent but had not yet shipped when the cloud answered is left out
    until the next (the outbox ships within about a second)."""

    caps: Budget = Budget()
    day: str = ""
    said: Usage = field(default_factory=Usage)
    since: Usage = field(default_factory=Usage)

    def heard(self, caps: Budget, day: str, spent: Usage) -> None:
        """The cloud's word: its caps, and what the fleet spent that UTC day."""
        self.caps, self.day, self.said, self.since = caps, day, spent, Usage()

    def spend(self, usage: Usage) -> None:
        """This attempt's model calls since the cloud's last word."""
        self.since.add(usage)

    def refusal(self) -> str | None:
        """Why no further call may be made today ("budget exhausted: … of the fleet's daily
        … (UTC day …)", Decide's words), or None."""
        if not self.caps:
            return None
        total = Usage()
        total.add(self.said)
        total.add(self.since)
        why = exhausted(self.caps, total, whose="the fleet's daily")
        return None if why is None else f"{why} (UTC day {self.day})"
