"""Accumulating streamed responses into the complete turn that gets committed.

Two paths leave a stream, on purpose kept apart: the live thinking text is forwarded to a
callback as each delta arrives (a console can show the model thinking), while the persisted
reasoning item is built only from completed blocks — thinking deltas joined, signature deltas
joined — once the stream has ended properly. A stream cut off before its end raises
`IncompleteStream` and nothing of it is committed, so a half-received thinking block or a
signature from an interrupted stream is never reused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

ThinkingSink = Callable[[str], None]


class IncompleteStream(RuntimeError):
    """The stream ended before the response was complete; the partial turn is discarded."""


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


class AnthropicStreamAccumulator:
    """Builds a Messages response dict from `message_start` … `message_stop` events."""

    def __init__(self, on_thinking: ThinkingSink | None = None) -> None:
        self._on_thinking = on_thinking
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}
        self._open: set[int] = set()
        self._done = False

    def feed(self, event: Any) -> None:
        data = event_dict(event)
        kind = data.get("type")
        if kind == "message_start":
            self._message = dict(data["message"])
            self._message["content"] = []
        elif kind == "content_block_start":
            index = int(data["index"])
            block = dict(data["content_block"])
            if block.get("type") == "thinking":
                block.setdefault("thinking", "")
                block["signature"] = block.get("signature") or ""
            if block.get("type") == "tool_use":
                self._json[index] = ""
            self._blocks[index] = block
            self._open.add(index)
        elif kind == "content_block_delta":
            self._delta(int(data["index"]), data["delta"])
        elif kind == "content_block_stop":
            index = int(data["index"])
            self._open.discard(index)
            block = self._blocks[index]
            if block.get("type") == "tool_use":
                raw = self._json.pop(index, "")
                block["input"] = json.loads(raw) if raw.strip() else block.get("input") or {}
        elif kind == "message_delta":
            if self._message is None:
                raise IncompleteStream("message_delta before message_start")
            self._message.update(data.get("delta") or {})
            usage = dict(self._message.get("usage") or {})
            usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            self._message["usage"] = usage
        elif kind == "message_stop":
            self._done = True

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self._blocks[index]
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta["text"]
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
            if self._on_thinking is not None and delta["thinking"]:
                self._on_thinking(delta["thinking"])
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta["signature"]
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + delta["partial_json"]

    def message(self) -> dict[str, Any]:
        """The complete response. Raises IncompleteStream if the stream did not finish."""
        if self._message is None or not self._done or self._open:
            raise IncompleteStream(
                "the Anthropic stream ended before message_stop; the partial turn is discarded"
            )
        return {**self._message, "content": [self._blocks[i] for i in sorted(self._blocks)]}


class ResponsesStreamAccumulator:
    """Builds a Responses response dict from its stream events.

    Items are taken from `response.output_item.done` (the `…added` copy of a reasoning item may
    carry incomplete encrypted content); the envelope (id, model, usage) from `response.completed`.
    """

    def __init__(self, on_thinking: ThinkingSink | None = None) -> None:
        self._on_thinking = on_thinking
        self._items: dict[int, dict[str, Any]] = {}
        self._response: dict[str, Any] | None = None

    def feed(self, event: Any) -> None:
        data = event_dict(event)
        kind = data.get("type")
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            if self._on_thinking is not None and data.get("delta"):
                self._on_thinking(str(data["delta"]))
        elif kind == "response.output_item.done":
            self._items[int(data["output_index"])] = dict(data["item"])
        elif kind in ("response.completed", "response.incomplete"):
            self._response = dict(data["response"])
        elif kind in ("response.failed", "error"):
            raise IncompleteStream(f"the Responses stream failed: {data}")

    def response(self) -> dict[str, Any]:
        """The complete response. Raises IncompleteStream if `response.completed` never came."""
        if self._response is None:
            raise IncompleteStream(
                "the Responses stream ended before response.completed; the partial turn is "
                "discarded"
            )
        return {**self._response, "output": [self._items[i] for i in sorted(self._items)]}
