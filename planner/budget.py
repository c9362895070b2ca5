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
    as it said it (the assignment, then each renewal: `heard`) and what this attempt spent
    (`spend`). Checked before each model call as Decide checks it on the cloud transport.

    The cloud's tally counts this host's calls only once its outbox shipped them, so a word
    from the cloud may or may not include what the attempt spent just before; the day is
    taken as the larger of two sums that never count a call twice: the first word of the day
    plus everything the attempt spent since, and the latest word plus what the attempt spent
    after it. What other hosts spend reaches it with the next renewal."""

    caps: Budget = Budget()
    day: str = ""
    #: The cloud's first word of the day, and its latest with what the attempt had spent then.
    first: Usage = field(default_factory=Usage)
    latest: Usage = field(default_factory=Usage)
    spent_at_latest: Usage = field(default_factory=Usage)
    #: What the attempt spent this day.
    spent: Usage = field(default_factory=Usage)

    def heard(self, caps: Budget, day: str, spent: Usage) -> None:
        """The cloud's word: its caps, and what the fleet spent that UTC day."""
        if day != self.day:  # the first word, or a new day: the attempt has spent nothing of it
            self.day, self.first, self.spent = day, spent, Usage()
        self.caps, self.latest, self.spent_at_latest = caps, spent, _plus(self.spent)

    def spend(self, usage: Usage) -> None:
        """A model call of this attempt."""
        self.spent.add(usage)

    def refusal(self) -> str | None:
        """Why no further call may be made today ("budget exhausted: … of the fleet's daily
        … (UTC day …)", Decide's words), or None."""
        if not self.caps:
            return None
        since_latest = _less(self.spent, self.spent_at_latest)
        # The latest word first: it also holds what other hosts spent since the first.
        for total in (_plus(self.latest, since_latest), _plus(self.first, self.spent)):
            why = exhausted(self.caps, total, whose="the fleet's daily")
            if why is not None:
                return f"{why} (UTC day {self.day})"
        return None


def _less(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.input_tokens - b.input_tokens,
        a.output_tokens - b.output_tokens,
        a.cache_read_input_tokens - b.cache_read_input_tokens,
        a.cache_creation_input_tokens - b.cache_creation_input_tokens,
        a.thinking_tokens - b.thinking_tokens,
        a.cost_usd - b.cost_usd,
    )


def _plus(*parts: Usage) -> Usage:
    total = Usage()
    for part in parts:
        total.add(part)
    return total
