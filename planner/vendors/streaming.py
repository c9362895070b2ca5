"""One call to a vendor SDK, streamed or not, returned as the complete response dict.

Streamed answers are accumulated into the complete response that gets committed (each vendor's
accumulator lives with its wire format). Two paths leave a stream, on purpose kept apart: the
live thinking text is forwarded to a callback as each delta arrives (a console can show the
model thinking), while the persisted reasoning item is built only from completed blocks —
thinking deltas joined, signature deltas joined — once the stream has ended properly. A stream
cut off before its end raises `IncompleteStream` and nothing of it is committed, so a half-
received thinking block or a signature from an interrupted stream is never reused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from planner.vendors.failures import IncompleteStream, planner_error

__all__ = ["IncompleteStream", "event_dict", "fetch_response"]


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
) -> dict[str, Any]:
    """One call's response as a wire dict. With `stream` (feed, complete) each event goes to
    `feed` and the response is what `complete` builds once the stream has ended. Both SDKs
    stream the same way, so every vendor shares this path and fails through the one mapper."""
    try:
        if stream is None:
            return dict((await create(**params)).to_dict())
        feed, complete = stream
        async for event in await create(**params, stream=True):
            feed(event)
        return complete()
    except Exception as err:
        raise planner_error(err, vendor, retries=retries) from err
