"""Model calls written down before they start, so a process that dies during one leaves a trace.

The spending ledger counts what a provider reported of a call (decision 0062), which a process
killed while the call is under way never hears: the provider bills it, and the record and the
budgets saw nothing (decision 0080). Whoever records a planner's spending may set `ledger` for
the calls it plans (the cloud's Decide does); `ObservedAdapter` then opens a marker before each
call with the most the call can cost (`at_most`) and puts the marker's id on the call's usage
(`Usage.calls`), and whoever records that usage deletes the marker in the same write. A call
that fails unbilled settles its marker at once. A marker left over is a call whose cost is
unknown: at most its bound.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Protocol

from planner.budget import dollars
from planner.conversation.items import SessionItem, dumps_item
from planner.decision import TokenCounts, Usage, billed_tokens
from planner.prices import Price
from planner.tools import ToolSpec

#: Tokens one attached screenshot counts as at most: above what either provider counts for one
#: image (Anthropic scales an image to at most ~1,600 tokens, OpenAI's high detail to a few
#: thousand), whatever its size.
IMAGE_TOKENS_AT_MOST = 10_000
#: Room for what a provider adds around the request's text (roles, tool framing).
FRAMING_TOKENS = 1_000


class CallLedger(Protocol):
    """Where the markers of one attempt's model calls are written (the cloud's store)."""

    async def opened(self, provider: str, model: str, at_most: Usage) -> str:
        """Write a marker before a call; its id. Raises when it cannot be written: the call is
        then not made, since nothing would be left of it if the process died during it."""
        ...

    async def settled(self, call_id: str) -> None:
        """Delete the marker of a call that ended without being billed."""
        ...


#: The ledger of the calls planned in this context (unset: no markers, as on a direct host).
ledger: ContextVar[CallLedger | None] = ContextVar("amc_planner_call_ledger", default=None)
#: Set by `ObservedAdapter` for the call under way: gives the call's next try a marker of its
#: own, leaving the marker of the try before it (`another_try`).
next_try: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar(
    "amc_planner_next_try", default=None
)


async def another_try() -> None:
    """The call is asked again after a try whose answer was lost (a timeout, a connection
    dropped after the request went out): that try may have been billed, and nothing reported
    what it cost. Its marker stays, its cost unknown, and the next try gets a marker of its
    own. One marker for every try of a call was settled by the try that answered, and the
    tries lost before it vanished from every record. Raises when the new marker cannot be
    written (the try is then not made)."""
    hook = next_try.get()
    if hook is not None:
        await hook()


def at_most(
    *,
    system: str,
    items: Sequence[SessionItem],
    tools: Sequence[ToolSpec],
    images: int,
    output_tokens: int,
    price: Price | None,
) -> Usage:
    """The most one call can cost: every input token is at least one byte of the request's text
    (byte-level tokenizers), plus each image's most and some framing; every output token within
    the output limit. Priced at the highest input rate (a cache write costs more than plain
    input) and the output rate: an upper bound, not an estimate."""
    text = len(system.encode()) + sum(len(dumps_item(item).encode()) for item in items)
    text += sum(len(json.dumps([t.name, t.description, t.parameters]).encode()) for t in tools)
    input_tokens = text + images * IMAGE_TOKENS_AT_MOST + FRAMING_TOKENS
    cost = 0.0
    if price is not None:
        rate = max(price.input, price.cache_write, price.cache_write_1h or 0.0, price.cache_read)
        cost = (input_tokens * rate + output_tokens * price.output) / 1_000_000
    return Usage(input_tokens=input_tokens, output_tokens=output_tokens, cost_usd=cost)


class PricedCounts(TokenCounts, Protocol):
    """A usage's token counts and its cost: `Usage` or the wire's `types_pb2.Usage`."""

    @property
    def cost_usd(self) -> float: ...


def unsettled_words(calls: int, at_most: PricedCounts) -> str:
    """`1 model call whose cost was never recorded: at most 12,345 tokens · $0.0123`: how the
    operators' console and CLI and the host's console say it (not in the cost they show). Kept
    here, which both may import: the host must not import the operators' console, and the two
    copies it had would drift apart."""
    what = (
        "1 model call whose cost was" if calls == 1 else f"{calls:,} model calls whose costs were"
    )
    most = f"{billed_tokens(at_most):,} tokens · {dollars(at_most.cost_usd)}"
    return f"{what} never recorded: at most {most}"
