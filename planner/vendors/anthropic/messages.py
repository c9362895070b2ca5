"""The Anthropic Messages wire format: request body, reply → items, usage, stream events.

Both planning modes build their requests here, from the model's profile
(`planner/model_profiles.py`), so a thinking rule, a header or a token floor lands once: `adaptive`
thinking (with `display: summarized` where the model omits thinking text by default; at least
THINKING_MAX_TOKENS, as thinking counts toward max_tokens) or `budget` (`enabled` +
`budget_tokens`, max_tokens above the budget, the profile's beta header), either with the
configured effort in `output_config` — sent with thinking off too (effort governs every output
token and needs no thinking; beside a budget the API applies both). A forced tool choice
(the forced retry) never carries thinking: the API rejects thinking with a forced tool choice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from planner.conversation.items import AssistantItem, AssistantText, Reasoning, ToolCall
from planner.decision import Usage
from planner.model_profiles import ModelProfile
from planner.settings import ANSWER_ROOM_TOKENS, THINKING_MAX_TOKENS
from planner.tools import ToolSpec
from planner.vendors.base import (
    LiveBlocks,
    TextInThinking,
    ThinkingConfig,
    ThinkingSink,
    live_blocks,
    mask_sensitive,
    sendable,
)
from planner.vendors.streaming import IncompleteStream, event_dict

EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
#: Key of a streamed tool_use block whose input JSON was cut off (never sent back: the block's
#: `input` is then empty; `raw_calls` hands the partial text to parsing, which refuses it).
PARTIAL_INPUT = "amc_partial_input_json"

Cache = Literal["off", "prompt", "conversation"]
"""Prompt caching: `prompt` puts breakpoints on the system prompt and the tools (the part every
request of a task repeats); `conversation` adds the request-level breakpoint, which the API puts
on the last block, so each step of a kept conversation reads the prefix the step before wrote."""


def request_params(
    *,
    model: str,
    system: str,
    messages: list[dict[str, Any]],
    tools: Sequence[ToolSpec],
    profile: ModelProfile,
    thinking: ThinkingConfig,
    thinking_on: bool,
    forced: bool,
    max_tokens: int,
    cache: Cache = "off",
) -> dict[str, Any]:
    """The request body, built from the model's profile. `thinking_on` False (or `forced`)
    sends no thinking: the field left out, or `{type: disabled}` where the profile says so."""
    tool_defs: list[dict[str, Any]] = [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]
    system_param: str | list[dict[str, Any]] = system
    if cache != "off":
        system_param = [{"type": "text", "text": system, "cache_control": EPHEMERAL}]
        if tool_defs:
            tool_defs[-1] = {**tool_defs[-1], "cache_control": EPHEMERAL}
    params: dict[str, Any] = {
        "model": model,
        "system": system_param,
        "messages": messages,
        "tools": tool_defs,
        "tool_choice": {"type": "any" if forced else "auto", "disable_parallel_tool_use": True},
        "max_tokens": max_tokens,
    }
    if cache == "conversation":
        params["cache_control"] = EPHEMERAL
    mode = thinking.mode if thinking_on and not forced else "off"
    config: dict[str, Any] | None = None
    if mode == "budget" and thinking.budget_tokens is not None:
        config = {"type": "enabled", "budget_tokens": thinking.budget_tokens}
        params["max_tokens"] = max(max_tokens, thinking.budget_tokens + ANSWER_ROOM_TOKENS)
    elif mode == "adaptive":
        config = {"type": "adaptive"}
        params["max_tokens"] = max(max_tokens, THINKING_MAX_TOKENS)
    elif profile.thinking_off != "omit":
        params["thinking"] = {"type": profile.thinking_off}
    if thinking.effort:
        # With or without thinking (a forced retry too): effort governs every output token,
        # text and tool calls included; beside a budget the API applies both.
        params["output_config"] = {"effort": thinking.effort}
    if config is not None:
        if profile.visible_display is not None:
            config["display"] = profile.visible_display
        params["thinking"] = config
        beta = profile.beta_headers.get(mode)
        if beta:
            params["extra_headers"] = {"anthropic-beta": beta}
    return params


def text_in_thinking(params: Mapping[str, Any], profile: ModelProfile) -> TextInThinking:
    """Where an answer to `params` carries the text the model writes before its call when that
    text comes back in thinking blocks: every readable one with `between_tools` (no up-front
    thinking: "any short progress updates the model writes between tool calls come back as
    thinking blocks", the SDK's ThinkingTypes) and with `display: "updates"` ("any thinking
    block with non-empty text is a progress update", the Thinking page; reasoning comes back
    empty); the last before the call on a profile that says so (`text_as_thinking`, under the
    summarized display); else none."""
    config = params.get("thinking") or {}
    if config.get("type") == "between_tools" or config.get("display") == "updates":
        return "all"
    return "last" if profile.text_as_thinking else "none"


#: The stop reason of an answer that filled the model's context window: cut off like one at
#: `max_tokens`, but more output room cannot help and a correction on top overflows again.
CONTEXT_EXCEEDED_STOP = "model_context_window_exceeded"


def truncated(stop_reason: str | None) -> bool:
    """The answer was cut off by the output token limit."""
    return stop_reason == "max_tokens"


#: The stop reasons this planner reads an answer under: finished (`end_turn`, `tool_use`,
#: `stop_sequence`), or stopped for a reason handled on its own (`max_tokens`: `truncated`;
#: `refusal`; the context window).
_HANDLED_STOPS = frozenset(
    {"end_turn", "tool_use", "stop_sequence", "max_tokens", "refusal", CONTEXT_EXCEEDED_STOP}
)


#: The stop reasons of a finished answer, whose tool call runs.
_FINISHED_STOPS = frozenset({"end_turn", "tool_use", "stop_sequence"})


def cut_short(stop_reason: str | None) -> str | None:
    """Why the answer is unfinished where it is neither cut off at the output limit nor
    refused: `pause_turn` ("send the assistant content back to continue", the Stop reasons
    page: the turn is not over) or a stop reason newer than this code. Its tool call may be
    one the model had not finished deciding on, so nothing of it runs. None for the others,
    and for no stop reason at all (some compatible servers leave it out)."""
    if stop_reason is None or stop_reason in _HANDLED_STOPS:
        return None
    return f"stop reason {stop_reason}"


def refusal(message: Mapping[str, Any]) -> str | None:
    """Why the model declined (`stop_reason: "refusal"`), from `stop_details` (category,
    explanation; either may be null), or None when it did not."""
    if message.get("stop_reason") != "refusal":
        return None
    details = message.get("stop_details") or {}
    category, explanation = details.get("category"), details.get("explanation")
    parts = [f"category {category}" if category else "", str(explanation or "")]
    return ": ".join(p for p in parts if p) or "no reason given"


def items_from_message(message: Mapping[str, Any], model: str | None = None) -> list[AssistantItem]:
    """A Messages response's content blocks as items, in their order, nothing rewritten; its
    reasoning marked as made by `model` (the model the request named: the response's `model`
    may spell it otherwise). A block of another type (`server_tool_use`,
    `web_search_tool_result`, a newer one) is kept whole, to be sent back as it came, and
    marked so too."""
    turn_id = str(message.get("id") or "")
    out: list[AssistantItem] = []
    for block in message.get("content") or []:
        kind = block.get("type")
        if kind == "thinking":
            out.append(
                Reasoning(
                    "anthropic",
                    turn_id,
                    text=block.get("thinking") or "",
                    signature=block.get("signature") or None,
                    model=model,
                )
            )
        elif kind == "redacted_thinking":
            data = block.get("data") or None
            out.append(Reasoning("anthropic", turn_id, redacted_data=data, model=model))
        elif kind == "text":
            out.append(AssistantText("anthropic", turn_id, block.get("text") or ""))
        elif kind == "tool_use":
            name = str(block.get("name") or "")
            args = block.get("input")
            out.append(
                ToolCall(
                    "anthropic",
                    turn_id,
                    str(block.get("id") or ""),
                    name,
                    mask_sensitive(name, sendable(args) if isinstance(args, dict) else {}),
                )
            )
        elif isinstance(kind, str) and kind:
            # A block this code does not read: kept as received, to go back so
            # (`AssistantText.opaque`), not dropped from the turn.
            out.append(
                AssistantText("anthropic", turn_id, "", wire=sendable(dict(block)), model=model)
            )
    return out


def raw_calls(message: Mapping[str, Any]) -> list[Any]:
    """Each call's input exactly as the model sent it (unmasked, for execution only), in the
    order of the calls `items_from_message` reads; the partial JSON text of a call the output
    limit cut off. A list, not keyed by id: two blocks may share one."""
    return [
        b[PARTIAL_INPUT] if PARTIAL_INPUT in b else _as_sent(b.get("input"))
        for b in message.get("content") or []
        if b.get("type") == "tool_use"
    ]


def _as_sent(value: Any) -> Any:
    """An input for parsing: an object as it is; anything else (a proxy's JSON text of the
    arguments in place of the object) as its JSON, which parsing refuses as no object. Taken
    for an OpenAI arguments string, such text ran while the call kept, and sent back, had no
    arguments (`items_from_message` keeps only an object)."""
    return value if value is None or isinstance(value, dict) else json.dumps(value)


def usage_from(usage: Mapping[str, Any] | None) -> Usage:
    """The usage, with the cache writes' breakdown by lifetime where the answer gives it
    (`cache_creation: {ephemeral_5m_input_tokens, ephemeral_1h_input_tokens}`, the Messages
    reference's Usage): a 1-hour write costs 2x input, a 5-minute one 1.25x, so the 1-hour
    part is priced apart (`Usage.cache_creation_1h_input_tokens`), at most the writes' total."""
    u = usage or {}
    details = u.get("output_tokens_details") or {}
    written = int(u.get("cache_creation_input_tokens") or 0)
    lifetimes = u.get("cache_creation")
    hour = lifetimes.get("ephemeral_1h_input_tokens") if isinstance(lifetimes, Mapping) else 0
    return Usage(
        input_tokens=int(u.get("input_tokens") or 0),
        output_tokens=int(u.get("output_tokens") or 0),
        cache_read_input_tokens=int(u.get("cache_read_input_tokens") or 0),
        cache_creation_input_tokens=written,
        thinking_tokens=int(details.get("thinking_tokens") or 0),
        cache_creation_1h_input_tokens=min(int(hour or 0), written),
    )


#: The block types the planner reads; any other (`server_tool_use`, a newer type) is kept
#: whole and sent back as received (`AssistantText.opaque`).
_READ_BLOCKS = frozenset({"text", "thinking", "redacted_thinking", "tool_use"})


class AnthropicStreamAccumulator:
    """Builds a Messages response dict from `message_start` … `message_stop` events.

    The live thinking fed to `on_thinking` is what the decision will record as thinking
    (`Turn.thought`): none where every readable thinking block is the model's text
    (`text_in_thinking` "all"), which the decision records as its rationale. With "last" a
    block may be that text or reasoning, and cannot be told until the block after it starts,
    so its deltas are held until then: the tool call makes them the text, not shown (unless a
    text block follows after all); anything else (another block, the end without a call)
    shows them then, as the thinking they are. A lone block before the call is not held: the
    decision records it as thinking too. The contract's live view only appends
    (`LiveThinking.delta`), so what it showed cannot be taken back."""

    def __init__(
        self,
        on_thinking: ThinkingSink | LiveBlocks | None = None,
        text_in_thinking: TextInThinking = "none",
    ) -> None:
        self._live = live_blocks(on_thinking if text_in_thinking != "all" else None)
        self._call = object()  # this answer's blocks, apart from another call's in the view
        self._last = text_in_thinking == "last"
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}
        self._open: set[int] = set()
        self._done = False
        #: Live thinking not shown yet: index → deltas of a block that may be the model's text.
        self._held: dict[int, list[str]] = {}
        #: Blocks a tool call made the model's text (shown after all if a text block follows).
        self._said: dict[int, list[str]] = {}
        self._wrote_text = False
        self._called = False

    def feed(self, event: Any) -> None:
        data = event_dict(event)
        kind = data.get("type")
        if kind == "message_start":
            self._message = dict(data["message"])
            self._message["content"] = []
        elif kind == "content_block_start":
            index = int(data["index"])
            block = dict(data["content_block"])
            if self._last:
                self._classify(block.get("type"), index)
            if block.get("type") == "thinking":
                block.setdefault("thinking", "")
                block["signature"] = block.get("signature") or ""
            if block.get("type") == "tool_use" or "input" in block:
                self._json[index] = ""  # a server_tool_use streams its input so too
            self._blocks[index] = block
            self._open.add(index)
        elif kind == "content_block_delta":
            self._delta(int(data["index"]), data["delta"])
        elif kind == "content_block_stop":
            self._close(int(data["index"]))
        elif kind == "message_delta":
            if self._message is None:
                raise IncompleteStream("message_delta before message_start")
            self._message.update(data.get("delta") or {})
            usage = dict(self._message.get("usage") or {})
            usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            self._message["usage"] = usage
        elif kind == "message_stop":
            self._done = True
            self._show(self._held)  # no call followed: thinking

    def _close(self, index: int) -> None:
        self._open.discard(index)
        block = self._blocks[index]
        if block.get("type") == "tool_use":
            raw = self._json.pop(index, "")
            try:
                block["input"] = json.loads(raw) if raw.strip() else block.get("input") or {}
            except json.JSONDecodeError:
                # Cut off by max_tokens inside the call (thinking counts toward the limit):
                # nothing of it may run. Kept as an empty input; the partial text goes to
                # parsing only, which refuses it, and the corrective turn follows.
                block["input"] = {}
                block[PARTIAL_INPUT] = raw
        elif index in self._json:
            # Another block with an input (`server_tool_use`): kept whole, sent back so.
            raw = self._json.pop(index)
            try:
                if raw.strip():
                    block["input"] = json.loads(raw)
            except json.JSONDecodeError:
                block["input"] = raw  # cut off: as received, for the API to judge

    def reported(self) -> tuple[str, Mapping[str, Any]] | None:
        """The model and usage the stream reported so far (None before `message_start`):
        input and cache tokens from `message_start`, output from the last `message_delta`."""
        if self._message is None:
            return None
        return str(self._message.get("model") or ""), dict(self._message.get("usage") or {})

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self._blocks[index]
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta["text"]
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
            if index in self._held:
                self._held[index].append(delta["thinking"])
            else:
                self._live.show((self._call, index), delta["thinking"])
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta["signature"]
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + delta["partial_json"]

    def _classify(self, kind: object, index: int) -> None:
        """What the start of block `index` (of type `kind`) says of the held ones, and whether
        to hold it: the rule of `Turn.said` ("last"), applied as the blocks arrive. A block
        the planner does not read (a server tool's call or result) changes nothing: it is not
        what the model wrote, so a block held before it is still directly before the call."""
        if kind not in _READ_BLOCKS:
            return
        if kind == "text":
            self._wrote_text = True  # an answer with a text block has its text there
            self._show(self._said)
            self._show(self._held)
        elif kind == "tool_use" and not self._called:
            self._called = True
            if not self._wrote_text:
                self._said.update(self._held)
                self._held.clear()
        else:
            self._show(self._held)  # no longer directly before the call
        if (
            kind == "thinking"
            and not self._wrote_text
            and not self._called
            and self._read_before(index) in ("thinking", "redacted_thinking")
        ):
            self._held[index] = []

    def _read_before(self, index: int) -> object:
        """The type of the last block before `index` the planner reads (None if none)."""
        kinds = [self._blocks[i].get("type") for i in sorted(self._blocks) if i < index]
        return next((k for k in reversed(kinds) if k in _READ_BLOCKS), None)

    def _show(self, blocks: dict[int, list[str]]) -> None:
        """Feed `blocks`' deltas to the live view, in order, and forget them."""
        for index in sorted(blocks):
            for delta in blocks[index]:
                self._live.show((self._call, index), delta)
        blocks.clear()

    def message(self) -> dict[str, Any]:
        """The complete response. Raises IncompleteStream if the stream did not finish. A
        block still open at the end of a stream that ended (`message_stop`) with a stop reason
        under which nothing of the answer runs is closed where it stands: a streaming
        classifier stops the answer mid-block (`refusal`), and so may the output limit, the
        context window or a pause. What the provider said is that stop reason, not a broken
        stream: read as one, it was asked again as a transient failure, stopped the same way
        each time. Under a finished stop reason (`tool_use`, `end_turn`, `stop_sequence`) an
        open block stays an incomplete stream: its call would run."""
        stop = self._message.get("stop_reason") if self._message is not None else None
        if self._done and stop is not None and stop not in _FINISHED_STOPS:
            for index in sorted(self._open):
                self._close(index)
        if self._message is None or not self._done or self._open:
            raise IncompleteStream(
                "the Anthropic stream ended before message_stop; the partial turn is discarded"
            )
        return {**self._message, "content": [self._blocks[i] for i in sorted(self._blocks)]}
