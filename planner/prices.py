"""What a model call costs: one price row per model family, in US dollars per million tokens.

Beside `model_profiles.py` (what a model *accepts*) and apart from it: prices change on their
own schedule, and an operator with a negotiated rate overrides them without touching what a
request may carry. A model is looked up by the longest listed name prefix it falls under at a
boundary (`planner/model_names.py`), so a dated model name ("claude-sonnet-4-6-20260301") gets
its family's row and a later version that only starts alike ("claude-opus-4-10" beside
"claude-opus-4-1") gets none rather than another model's price.

Four rates per row, as the providers bill them: input (uncached), output (thinking included),
cache read and cache write (Anthropic's 5-minute writes; OpenAI's from GPT-5.6 on), and for
Claude a fifth, `cache_write_1h` (its 1-hour writes, 2x input; a `claude…` row of the
prices file without it gets 2x its input, any other row prices them at `cache_write`).
`Usage` counts each input token in exactly one of the three input kinds, so a call costs
`input·in + output·out + cache_read·read + cache_write·write` (the 1-hour part of the writes
at its own rate), divided by a million.

The defaults are list prices for the Claude API and the OpenAI API as their pricing pages
showed them on 2026-12-01 (standard tier; batch, priority, regional and long-prompt surcharges
are not modelled: Claude Haiku 5.5's rates above a 100k-token prompt, for one, are not). They
are an estimate, not an invoice. `AMC_PLANNER_PRICES_FILE` (TOML or JSON) overrides rows or
adds models:

    [models."claude-sonnet-4-6"]          # a name prefix, as in the table below
    input = 3.0
    output = 15.0
    cache_read = 0.3
    cache_write = 3.75

A model with no row costs 0 and the start-up banner says so. A model priced by a row that
names another model (more than a date after the row: "o3-mini-high" under "o3-mini") is logged
once, and the banner names the row, so a pricier sibling missing here is not billed at a
cheaper one's rate unseen.
"""

from __future__ import annotations

import json
import logging
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.decision import Usage
from planner.errors import PlannerConfigError
from planner.model_names import longest_row

log = logging.getLogger(__name__)

PRICES_AS_OF = "2026-12-05"
#: What may follow a row for a model to be that row's model itself: a dated snapshot
#: ("-20250514", "-2025-04-14") or nothing. Anything else (a size, "-pro", "-codex-mini") is
#: another model priced by a row that names a sibling, which may cost more.
_SNAPSHOT = re.compile(r"(-\d{4}-\d{2}-\d{2}|-\d{8})?")

#: Models the table prices by their version's row on purpose (the provider bills them alike):
#: no warning that they borrow it (`PriceTable.borrowed`). The default model is among them.
PRICED_AS_THEIR_VERSION: Mapping[str, str] = {
    "claude-sonnet-4-0": "claude-sonnet-4",
    "claude-sonnet-4-5": "claude-sonnet-4",
    "claude-sonnet-4-6": "claude-sonnet-4",
    "gpt-5-chat": "gpt-5",
    "gpt-5-codex": "gpt-5",  # $1.25 / $10, GPT-5's (models.dev)
    "gpt-5.1-chat": "gpt-5.1",
    "gpt-5.1-codex": "gpt-5.1",
    "gpt-5.1-codex-max": "gpt-5.1",
    "gpt-5.2-chat": "gpt-5.2",
    "gpt-5.2-codex": "gpt-5.2",
    "gpt-5.3-chat": "gpt-5.3",
    "gpt-5.3-codex": "gpt-5.3",
}
_MILLION = 1_000_000


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0
    #: Anthropic's 1-hour cache writes (2x input); None: the `cache_write` rate.
    cache_write_1h: float | None = None

    def cost(self, usage: Usage) -> float:
        """What `usage` costs at these rates: its 1-hour cache writes
        (`Usage.cache_creation_1h_input_tokens`) at `cache_write_1h`, the other writes at
        `cache_write`. Priced all at the 5-minute rate, a 1-hour write was billed at
        five-eighths of its cost."""
        hour = min(usage.cache_creation_1h_input_tokens, usage.cache_creation_input_tokens)
        hour_rate = self.cache_write if self.cache_write_1h is None else self.cache_write_1h
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_read_input_tokens * self.cache_read
            + (usage.cache_creation_input_tokens - hour) * self.cache_write
            + hour * hour_rate
        ) / _MILLION


def _claude(input: float, output: float, cache_read: float) -> Price:
    """A Claude row: 5-minute cache writes cost 1.25× input, 1-hour ones 2× (the pricing
    page's prompt caching table)."""
    return Price(input, output, cache_read, input * 1.25, input * 2.0)


#: Model name prefix → list price (as of PRICES_AS_OF). The longest row the model falls under
#: (at a boundary of its name) wins.
DEFAULT_PRICES: Mapping[str, Price] = {
    # Anthropic (platform.claude.com/docs/en/about-claude/pricing).
    "claude-fable-5-1": _claude(10.0, 50.0, 0.25),
    "claude-fable": _claude(10.0, 50.0, 1.0),
    "claude-mythos-5-1": _claude(10.0, 50.0, 0.25),
    "claude-mythos": _claude(10.0, 50.0, 1.0),
    "claude-opus-5-5": Price(4.0, 20.0, 0.20, 5.0, 8.0),
    "claude-opus-5": _claude(5.0, 25.0, 0.50),
    "claude-opus-4-8": _claude(5.0, 25.0, 0.50),
    "claude-opus-4-7": _claude(5.0, 25.0, 0.50),
    "claude-opus-4-6": _claude(5.0, 25.0, 0.50),
    "claude-opus-4-5": _claude(5.0, 25.0, 0.50),
    "claude-opus-4-1": _claude(15.0, 75.0, 1.50),
    "claude-opus-4-0": _claude(15.0, 75.0, 1.50),
    "claude-opus-4-20250514": _claude(15.0, 75.0, 1.50),  # Opus 4
    "claude-sonnet-5-5": _claude(2.0, 10.0, 0.10),
    "claude-sonnet-5": _claude(2.0, 10.0, 0.20),
    "claude-sonnet-4": _claude(3.0, 15.0, 0.30),  # 4, 4.5 and 4.6
    "claude-3-7-sonnet": _claude(3.0, 15.0, 0.30),
    "claude-haiku-5-5": Price(0.10, 0.50, 0.01, 0.125, 0.20),  # prompts up to 100k tokens
    "claude-haiku-4-5": _claude(1.0, 5.0, 0.10),
    "claude-3-5-haiku": _claude(0.80, 4.0, 0.08),
    # OpenAI (platform.openai.com/docs/pricing): cached input is a cache read, no write charge.
    # GPT-6 (developers.openai.com/api/docs/models/<model>, checked 2026-12-05); cache writes
    # cost 1.25x uncached input. No row for the family as a whole: its models differ 100-fold.
    # GPT-6.2 (released 2026-11-17): Astra $8 / $40, cached input $0.40 (BerriAI/litellm
    # discussion #52347: "20% cheaper … cached input 60% cheaper" than GPT-6 Astra's; apidog's
    # guide from its model page), Sol at GPT-6.1 Sol's rates (its model page, as w3cschool.cn
    # mirrors it: $2 input, $0.10 cached input, $2.50 cache writes, $10 output).
    "gpt-6.2-astra": Price(8.0, 40.0, 0.40, 10.0),
    "gpt-6.2-sol": Price(2.0, 10.0, 0.10, 2.5),
    "gpt-6.1-sol": Price(2.0, 10.0, 0.10, 2.5),
    "gpt-6.1-terra": Price(1.0, 5.0, 0.05, 1.25),
    "gpt-6-astra": Price(10.0, 50.0, 1.0, 12.5),
    "gpt-6-sol": Price(2.0, 10.0, 0.20, 2.5),
    "gpt-6-luna": Price(0.10, 0.50, 0.01, 0.125),
    # GPT-5.6 (Sol at its promotional rate; the `gpt-5.6` alias routes to Sol).
    "gpt-5.6": Price(4.0, 20.0, 0.40, 5.0),
    "gpt-5.6-terra": Price(2.0, 12.0, 0.20, 2.5),
    "gpt-5.6-luna": Price(0.20, 1.20, 0.02, 0.25),
    "gpt-5.5-pro": Price(30.0, 180.0),
    "gpt-5.5": Price(5.0, 30.0, 0.50),
    "gpt-5.4-pro": Price(30.0, 180.0),
    "gpt-5.4-nano": Price(0.20, 1.25, 0.02),
    "gpt-5.4-mini": Price(0.75, 4.50, 0.075),
    "gpt-5.4": Price(2.50, 15.0, 0.25),
    "gpt-5.3": Price(1.75, 14.0, 0.175),  # gpt-5.3-codex
    "gpt-5.2-pro": Price(21.0, 168.0),
    "gpt-5.2": Price(1.75, 14.0, 0.175),
    "gpt-5-nano": Price(0.05, 0.40, 0.005),
    "gpt-5-mini": Price(0.25, 2.0, 0.025),
    "gpt-5-pro": Price(15.0, 120.0),
    # gpt-5.1-codex-mini: a fifth of gpt-5.1 (benbencodes/llm-prices v0.1.41: "$0.25/$2.00 per
    # Mtok"); cached input at gpt-5-mini's $0.025.
    "gpt-5.1-codex-mini": Price(0.25, 2.0, 0.025),
    "gpt-5.1": Price(1.25, 10.0, 0.125),
    "gpt-5": Price(1.25, 10.0, 0.125),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1": Price(2.0, 8.0, 0.50),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "gpt-4o": Price(2.50, 10.0, 1.25),
    # The first GPT-4o snapshot kept its launch price, no cached input (llmpricing.site,
    # llmcloudhub.com: "$5.00 per 1M" input, "$15.00 per 1M" output).
    "gpt-4o-2024-05-13": Price(5.0, 15.0),
    # The deep research models are billed apart from the models they are named after (OpenAI's
    # announcement, community.openai.com/t/1299919: "$10/1M input tokens and $40/1M output
    # tokens for o3 and $2/1M input tokens and $8/1M output tokens for o4-mini"; o3's cached
    # input $2.50 on its model page; o4-mini's taken at o4-mini's quarter rate, unconfirmed).
    "o4-mini-deep-research": Price(2.0, 8.0, 0.50),
    "o3-deep-research": Price(10.0, 40.0, 2.50),
    "o4-mini": Price(1.10, 4.40, 0.275),
    "o3-mini": Price(1.10, 4.40, 0.55),
    "o3-pro": Price(20.0, 80.0),
    # o1-pro: ten times o1, and no cached-input rate (its model page, as aipromptshub.co and
    # aicoach.pw quote it: "$150 per 1M input tokens, $600 per 1M output tokens").
    "o1-pro": Price(150.0, 600.0),
    "o3": Price(2.0, 8.0, 0.50),
    "o1-mini": Price(1.10, 4.40, 0.55),
    "o1": Price(15.0, 60.0, 7.50),
    # The built-in offline planner calls no provider.
    "amc-offline": Price(0.0, 0.0),
}


class PricesFileError(PlannerConfigError):
    """The operator's price file cannot be read or has a bad row (one line naming it)."""


class PriceTable:
    """The default prices with the operator's rows on top."""

    def __init__(
        self, overrides: Mapping[str, Price] | None = None, source: str | None = None
    ) -> None:
        self._rows: dict[str, Price] = {**DEFAULT_PRICES, **(overrides or {})}
        self.source = source or f"list prices as of {PRICES_AS_OF}"
        self._told: set[str] = set()

    def row(self, model: str) -> str | None:
        """The longest listed prefix `model` falls under, or None."""
        return longest_row(model, self._rows)

    def price(self, model: str) -> Price | None:
        """The row of the longest listed prefix `model` falls under, or None. A model that
        is not that row's (`borrowed`) is logged once: a sibling missing from the table (o1-pro
        under o1's row) was billed at a tenth of its price, and every cost cap with it,
        without a word."""
        row = self.row(model)
        if row is None:
            return None
        if model not in self._told and self.borrowed(model):
            self._told.add(model)
            log.warning(
                "planner: no price row for %s: it is priced by the %r row (%s); if it is "
                "billed otherwise, add its row with AMC_PLANNER_PRICES_FILE",
                model,
                row,
                self._rates(self._rows[row]),
            )
        return self._rows[row]

    def borrowed(self, model: str) -> bool:
        """Whether `model` is priced by a row that names another model: more than a dated
        snapshot of it follows the row (`claude-sonnet-4-6` under `claude-sonnet-4` is, by
        the table's own comment; `gpt-4.1-mini-2025-04-14` under `gpt-4.1-mini` is not)."""
        row = self.row(model)
        if row is None:
            return False
        named = longest_row(model, PRICED_AS_THEIR_VERSION)  # priced so on purpose
        if named is not None and PRICED_AS_THEIR_VERSION[named] == row:
            return _SNAPSHOT.fullmatch(model[len(named) :]) is None
        return _SNAPSHOT.fullmatch(model[len(row) :]) is None

    def cost(self, model: str, usage: Usage) -> float:
        """What `usage` of `model` costs (0 for a model without a price)."""
        price = self.price(model)
        return price.cost(usage) if price is not None else 0.0

    def describe(self, model: str) -> str:
        """The start-up banner's words for the price of `model`."""
        price = self.price(model)
        if price is None:
            return (
                f"no price known for {model}: its cost is counted as 0 "
                "(add it with AMC_PLANNER_PRICES_FILE)"
            )
        row = f", by the {self.row(model)!r} row" if self.borrowed(model) else ""
        return f"{self._rates(price)} ({self.source}{row})"

    @staticmethod
    def _rates(price: Price) -> str:
        hour = "" if price.cache_write_1h is None else f" (${price.cache_write_1h:g} for 1 hour)"
        return (
            f"${price.input:g} in / ${price.output:g} out / ${price.cache_read:g} cache read / "
            f"${price.cache_write:g} cache write{hour} per million tokens"
        )

    @classmethod
    def load(cls, path: Path | None) -> PriceTable:
        """The defaults, overridden by the file at `path` (TOML or JSON by its suffix)."""
        if path is None:
            return cls()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PricesFileError(
                f"AMC_PLANNER_PRICES_FILE: cannot read {path} ({exc.strerror or exc})"
            ) from exc
        try:
            data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            kind = "JSON" if path.suffix == ".json" else "TOML"
            raise PricesFileError(
                f"AMC_PLANNER_PRICES_FILE: {path} is not valid {kind} ({exc})"
            ) from exc
        return cls(_rows_of(data, path), source=f"list prices as of {PRICES_AS_OF}, {path}")


def _rows_of(data: Any, path: Path) -> dict[str, Price]:
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict) or not models:
        raise PricesFileError(
            f'AMC_PLANNER_PRICES_FILE: {path} has no "models" table of name prefix → prices'
        )
    rows: dict[str, Price] = {}
    for name, row in models.items():
        if not isinstance(row, dict) or "input" not in row or "output" not in row:
            raise PricesFileError(
                f"AMC_PLANNER_PRICES_FILE: models.{name} needs input and output (USD per "
                "million tokens; cache_read, cache_write and cache_write_1h are optional)"
            )
        unknown = set(row) - {"input", "output", "cache_read", "cache_write", "cache_write_1h"}
        if unknown:
            raise PricesFileError(
                f"AMC_PLANNER_PRICES_FILE: models.{name} has unknown fields {sorted(unknown)}"
            )
        values = {k: row.get(k, 0.0) for k in ("input", "output", "cache_read", "cache_write")}
        if "cache_write_1h" in row:
            values["cache_write_1h"] = row["cache_write_1h"]
        elif str(name).startswith("claude") and isinstance(values["input"], int | float):
            # Anthropic bills every model's 1-hour writes at twice its input rate: a row
            # copied without the optional line must not price them at the 5-minute rate.
            values["cache_write_1h"] = values["input"] * 2.0
        bad = {k: v for k, v in values.items() if not isinstance(v, int | float) or v < 0}
        if bad or isinstance(values["input"], bool):
            raise PricesFileError(
                f"AMC_PLANNER_PRICES_FILE: models.{name}: prices must be numbers >= 0 "
                f"(got {bad or values})"
            )
        rows[str(name)] = Price(**{k: float(v) for k, v in values.items()})
    return rows
