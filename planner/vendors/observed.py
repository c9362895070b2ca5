"""Every model call, observed: a span, the turn's usage priced, and whoever listens told.

The one seam all model calls pass through is the adapter's `complete` (both planning modes, every
retry and correction, on the cloud and on a host), so `make_adapter` and `make_provider` wrap each
adapter in `ObservedAdapter`. It prices the turn (`planner/prices.py`: `Turn.usage.cost_usd`,
which `Usage.add` then sums into the decision's usage), opens a span for the call (provider,
model, mode, tokens, cost; an error status when the call fails) and tells its `observer` — the
cloud's metrics, when the cloud set one — how the call went. It changes nothing else: the turn
is returned as the adapter made it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from opentelemetry.trace import Status, StatusCode

from planner import unsettled
from planner.decision import Usage
from planner.errors import PlannerUnavailable, cut_off_of
from planner.model_profiles import RetryForm
from planner.prices import PriceTable
from planner.settings import MAX_CALL_TOKENS
from planner.vendors.base import ModelAdapter, Turn, TurnRequest
from telemetry import tracing

log = logging.getLogger(__name__)


class CallObserver(Protocol):
    """Hears how each model call went (the cloud's metrics implement it)."""

    def call_finished(
        self,
        provider: str,
        model: str,
        seconds: float,
        usage: Usage | None,
        error: BaseException | None,
    ) -> None:
        """`usage` is the priced usage of a call that answered, or of a failed one what the
        provider reported of it before it failed (a stream it broke off: the spending ledger
        counts it too), else None; `error` what a failed one raised (a
        `planner.errors.PlannerError` subclass, or anything unexpected)."""
        ...


class ObservedAdapter:
    """A `ModelAdapter` that observes the calls of the adapter it wraps."""

    def __init__(
        self,
        inner: ModelAdapter,
        prices: PriceTable | None = None,
        observer: CallObserver | None = None,
    ) -> None:
        self.inner = inner
        self.prices = prices or PriceTable()
        self.observer = observer

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def retry_form(self) -> RetryForm:
        return self.inner.retry_form

    async def complete(self, request: TurnRequest) -> Turn:
        attributes = {
            "gen_ai.system": self.inner.name,
            "gen_ai.request.model": self.inner.model,
            "amc.planner.mode": request.mode,
            "amc.planner.forced": request.forced,
        }
        marker = [await self._open(request)]  # the marker of the call's latest try

        async def next_try() -> None:
            # The try before may have been billed: its marker stays (`unsettled.another_try`).
            if marker[0] is not None:
                marker[0] = None  # not settled below should the new one fail to be written
                marker[0] = await self._open(request)

        with tracing.span("model call", attributes) as span:
            started = time.perf_counter()
            tries = unsettled.next_try.set(next_try)
            try:
                turn = await self.inner.complete(request)
            except BaseException as err:
                call_id = marker[0]
                seconds = time.perf_counter() - started
                span.set_status(Status(StatusCode.ERROR, type(err).__name__))
                cut_off = cut_off_of(err)
                if cut_off is not None:  # a call cut off or broken: what it reported is billed
                    cut_off.usage.cost_usd = self.prices.cost(cut_off.model, cut_off.usage)
                if call_id is not None:
                    if cut_off is not None:  # settled where what it reported is recorded
                        cut_off.usage.calls.append(call_id)
                    elif isinstance(err, Exception) and not _may_have_been_billed(err):
                        await self._settle(call_id)  # refused by the API, or never sent
                    # Cancelled, timed out or its connection lost with nothing reported: the
                    # provider may have billed it; its cost is unknown and the marker stays.
                if self.observer is not None and isinstance(err, Exception):
                    billed = cut_off.usage if cut_off is not None else None
                    self.observer.call_finished(
                        self.inner.name, self.inner.model, seconds, billed, err
                    )
                raise
            finally:
                unsettled.next_try.reset(tries)
            call_id = marker[0]
            seconds = time.perf_counter() - started
            model = turn.model or self.inner.model
            turn.usage.cost_usd = self.prices.cost(model, turn.usage)
            if call_id is not None:  # settled where the decision or its failure is recorded
                turn.usage.calls.append(call_id)
            u = turn.usage
            tracing.set_attributes(
                span,
                {
                    "gen_ai.response.model": model,
                    "gen_ai.usage.input_tokens": u.input_tokens,
                    "gen_ai.usage.output_tokens": u.output_tokens,
                    "amc.usage.cache_read_tokens": u.cache_read_input_tokens,
                    "amc.usage.cache_write_tokens": u.cache_creation_input_tokens,
                    "amc.usage.thinking_tokens": u.thinking_tokens,
                    "amc.usage.cost_usd": u.cost_usd,
                },
            )
            if self.observer is not None:
                self.observer.call_finished(self.inner.name, model, seconds, u, None)
            return turn

    async def _open(self, request: TurnRequest) -> str | None:
        """The call's marker (`planner.unsettled`), when whoever plans keeps them. A marker
        that cannot be written stops the call: were the process to die during it, nothing
        would say it was made."""
        book = unsettled.ledger.get()
        if book is None:
            return None
        # What the adapter sends is the request's output limit, raised for thinking to at most
        # MAX_CALL_TOKENS (`messages.py`, `chat.py`, `responses.py`); the model writes no more
        # than its profile's limit either.
        asked = request.max_tokens or getattr(self.inner, "max_tokens", 0) or 0
        output = max(asked, MAX_CALL_TOKENS)
        limit = getattr(getattr(self.inner, "profile", None), "max_output_tokens", None)
        if limit:
            output = min(output, limit)
        bound = unsettled.at_most(
            system=request.system,
            items=request.items,
            tools=request.tools,
            images=len(request.images),
            output_tokens=output,
            price=self.prices.price(self.inner.model),
        )
        try:
            return await book.opened(self.inner.name, self.inner.model, bound)
        except Exception as err:
            raise PlannerUnavailable(
                f"planner: the model call was not made: its record could not be written first "
                f"({type(err).__name__})"
            ) from err

    async def _settle(self, call_id: str) -> None:
        book = unsettled.ledger.get()
        if book is None:
            return
        try:
            await book.settled(call_id)
        except Exception as err:  # the marker stays: "unknown, at most", an over-statement
            log.warning("an unbilled model call's record was not settled: %s", type(err).__name__)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __getattr__(self, name: str) -> Any:
        """Anything else is the wrapped adapter's (its client, its profile)."""
        return getattr(self.inner, name)


class ObservedProbeableAdapter(ObservedAdapter):
    """The same, for an adapter that can probe its provider (`planner.vendors.base.Probeable`)."""

    async def probe(self) -> None:
        await self.inner.probe()  # type: ignore[attr-defined]  # only made for probeable ones


def observed(adapter: ModelAdapter, prices: PriceTable | None = None) -> ObservedAdapter:
    """`adapter` wrapped (once: an observed adapter is returned as it is)."""
    if isinstance(adapter, ObservedAdapter):
        return adapter
    if callable(getattr(adapter, "probe", None)):
        return ObservedProbeableAdapter(adapter, prices)
    return ObservedAdapter(adapter, prices)


def _may_have_been_billed(err: Exception) -> bool:
    """`failures.may_have_been_billed`, imported when a call failed: the module loads both
    provider SDKs, which a process whose planner is offline must not pay for at start."""
    from planner.vendors import failures

    return failures.may_have_been_billed(err)
