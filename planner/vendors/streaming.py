"""One call to a vendor SDK, streamed or not, returned as the complete response dict.

Streamed answers are accumulated into the complete response that gets committed (each vendor's
accumulator lives with its wire format). Two paths leave a stream, on purpose kept apart: the
live thinking text is forwarded to a callback as each delta arrives (a console can show the
model thinking; a block that may turn out to be the model's text, not thinking, once the next
block starts: `AnthropicStreamAccumulator`), while the persisted reasoning item is built only
from completed blocks — thinking deltas joined, signature deltas joined — once the stream has
ended properly. A stream cut off before its end raises `IncompleteStream` and nothing of it is
committed, so a half-received thinking block or a signature from an interrupted stream is never
reused. A 200 that is no event stream at all (a proxy's page) is `NotAnAnswer`, as it is for a
call not streamed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from planner import unsettled
from planner.errors import PlannerError
from planner.vendors.base import RetrySpend, TurnRequest
from planner.vendors.failures import (
    IncompleteStream,
    NotAnAnswer,
    is_connection_error,
    may_have_been_billed,
    planner_error,
    read_answer,
    retry_wait,
)

log = logging.getLogger(__name__)

__all__ = ["IncompleteStream", "Tries", "call_timeout", "event_dict", "fetch_response"]

#: The Anthropic SDK's own estimate of how long a non-streamed call may take: an hour for
#: 128,000 output tokens (`_calculate_nonstreaming_timeout`); used for both vendors.
SECONDS_PER_OUTPUT_TOKEN = 3600 / 128_000


@dataclass
class Tries:
    """One decision's budget: `retries` more tries at most, within RETRY_WAIT_LIMIT_S of waits,
    shared by every loop that asks a call again (`_asked` after a failed request, the
    Responses adapter after a response that failed) and, through `spent`, by every call of the
    decision (`TurnRequest.spent`). Each loop counted its own before: one Decide could make
    (retries+1)² billed calls and wait twice the limit; each call, then, its own: a decision of
    three calls could take three times the retries."""

    retries: int
    spent: RetrySpend = field(default_factory=RetrySpend)

    @classmethod
    def of(cls, retries: int, request: TurnRequest) -> Tries:
        """The budget of a call of `request`: its decision's, else one of its own."""
        return cls(retries, request.spent if request.spent is not None else RetrySpend())

    @property
    def taken(self) -> int:
        return self.spent.taken

    @property
    def waited(self) -> float:
        return self.spent.waited

    def left(self) -> bool:
        return self.spent.taken < self.retries

    async def wait(self, seconds: float) -> None:
        """Counts one more try and its wait, then waits."""
        self.spent.taken += 1
        self.spent.waited += seconds
        await asyncio.sleep(seconds)


def call_timeout(configured: object, max_tokens: int) -> float | None:
    """The timeout of one non-streamed call: the client's (`AMC_PLANNER_TIMEOUT_S`), raised to
    what `max_tokens` of output may take, so a long thought is not cut off (and paid for) at
    60 s — 2,048 tokens may take ~58 s, the 21,024 of the largest thinking budget ~590 s. None
    (the SDK decides) when the client has no single number of seconds."""
    if isinstance(configured, bool) or not isinstance(configured, int | float):
        return None
    return max(float(configured), SECONDS_PER_OUTPUT_TOKEN * max_tokens)


def event_dict(event: Any) -> dict[str, Any]:
    """An SDK event model (or a plain dict, as tests feed) as a dict of its wire fields."""
    if isinstance(event, Mapping):
        return dict(event)
    to_dict = getattr(event, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if isinstance(data, dict):
            return data
    raise TypeError(f"cannot read stream event {type(event).__name__}")


async def fetch_response(
    create: Callable[..., Awaitable[Any]],
    params: dict[str, Any],
    vendor: str,
    stream: tuple[Callable[[Any], None], Callable[[], dict[str, Any]]] | None,
    *,
    retries: int,
    call_seconds: float | None = None,
    tries: Tries | None = None,
) -> dict[str, Any]:
    """One call's response as a wire dict. With `stream` (feed, complete) each event goes to
    `feed` and the response is what `complete` builds once the stream has ended. Both SDKs
    stream the same way, so every vendor shares this path and fails through the one mapper.
    `call_seconds` is a non-streamed call's timeout (a stream's read timeout is between
    events). The request is asked again `retries` times at most (`_asked`), fewer when the
    caller's own loop shares its `tries`; a stream that breaks off after it started is not:
    its thinking may already have been shown."""
    budget = tries if tries is not None else Tries(retries)
    if stream is None:
        extra = {"timeout": call_seconds} if call_seconds is not None else {}
        response = await _asked(lambda: create(**params, **extra), vendor, budget)
        if not callable(getattr(response, "to_dict", None)):  # a 200 that was not JSON
            raise planner_error(NotAnAnswer(response), vendor, retries=budget.taken)
        # The SDK's own reading of the answer: it may fail on a shape against its types (its
        # serializer warns, an error where warnings are): answered, so billed, not "never sent".
        return read_answer(vendor, lambda: dict(response.to_dict()))
    feed, complete = stream
    events = await _asked(lambda: create(**params, stream=True), vendor, budget)
    try:
        page = await _not_a_stream(events)
        if page is not None:
            raise NotAnAnswer(page)
        # An event or an ended stream the accumulator cannot read was answered (and billed)
        # all the same: an unreadable answer, as one not streamed (`read_answer`), not a call
        # that failed; a stream that broke off or failed passes through as what it is.
        try:
            async for event in events:
                read_answer(vendor, partial(feed, event))
        except Exception as err:
            whole = _read_whole(err, complete)
            if whole is None:
                raise
            log.debug("a provider stream's connection broke after its answer ended: %s", err)
            return whole
        return read_answer(vendor, complete)
    except PlannerError:
        raise
    except Exception as err:
        cancelled = _cancellation_in(err)
        if cancelled is not None:
            raise cancelled from None
        raise planner_error(err, vendor, retries=budget.taken) from None
    finally:
        # However the stream is left (an event the accumulator cannot read, a page, a caller
        # that went away), its response is closed: left open, its connection stayed out of the
        # client's pool, held by a half-read answer, until the stream was collected.
        await _close(events)


def _read_whole(err: Exception, complete: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """The answer of a stream whose connection failed (`err`) after its last event: a
    connection reset as it closed (an RST in place of the FIN that ends an event stream, from a
    proxy or load balancer) surfaces as the SDK reads on past that event, and was taken for a
    broken stream: a complete answer, paid for, was thrown away and the decision asked again,
    paid twice. None when the failure is no connection's or the answer had not ended (the
    accumulator says so: `IncompleteStream`, or whatever else it raises)."""
    if not is_connection_error(err):
        return None
    try:
        return complete()
    except Exception:
        return None


def _cancellation_in(err: BaseException) -> asyncio.CancelledError | None:
    """The cancellation `err` was raised over, if any: both SDKs close the response in their
    stream's `finally`, and a close that fails there (a connection reset as it closed)
    replaced the CancelledError; a cancelled Decide was answered UNAVAILABLE, its call counted
    as failed, not CANCELLED. (Not `Task.cancelling()`: a task that once swallowed a
    cancellation without `uncancel()` would turn every later planner error into one.)"""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, asyncio.CancelledError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def _close(events: Any) -> None:
    """Close an SDK stream (both SDKs' `AsyncStream.close` closes its HTTP response; closing
    one read to its end, or closed already, does nothing). A close that fails (a connection
    reset as it closed) is logged at debug and goes no further: raised in `fetch_response`'s
    `finally`, it replaced the answer already read, or the error the call is failing with."""
    close = getattr(events, "close", None)
    if callable(close):
        try:
            await close()
        except Exception as exc:
            # The error's type and text only: a connection's, never the request or its headers.
            log.debug("closing a provider stream failed: %s: %s", type(exc).__name__, exc)


async def _not_a_stream(events: Any) -> str | None:
    """The body of a 200 that says it is something else than an event stream (a proxy's or
    gateway's HTML page), else None. The SDKs read any 200 of a streamed call as events: a
    page yields none, and would read as a stream that broke off rather than as the page it is
    (what a non-streamed call reports, `NotAnAnswer`). A 200 without a Content-Type says
    nothing of what it is: it is read as the SDKs read it, as events (a proxy that drops the
    header passes a whole answer on)."""
    response = getattr(events, "response", None)
    headers = getattr(response, "headers", None)
    if response is None or headers is None:
        return None
    content_type = str(headers.get("content-type", "")).lower()
    if not content_type.strip() or "text/event-stream" in content_type:
        return None
    head = b""
    try:
        async for chunk in response.aiter_bytes():  # its start says what it is
            head += chunk
            if len(head) >= 4096:
                break
    finally:
        await response.aclose()
    return head.decode("utf-8", "replace")


async def _asked(send: Callable[[], Awaitable[Any]], vendor: str, tries: Tries) -> Any:
    """`send()`, asked again after a failure worth it while `tries` has some left, each after
    the bounded wait of `retry_wait`. These are the only retries of a failed request: the
    adapters turn the SDKs' off, which sleep as long as the provider's retry-after says."""
    while True:
        try:
            return await send()
        except Exception as err:
            wait = retry_wait(err, tries.taken, tries.waited) if tries.left() else None
            if wait is None:
                raise planner_error(err, vendor, retries=tries.taken) from None
            lost = may_have_been_billed(err)
        if lost:  # the try's marker stays, its cost unknown; the next has its own
            await unsettled.another_try()
        await tries.wait(wait)
