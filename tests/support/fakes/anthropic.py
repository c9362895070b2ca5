"""A fake of the Anthropic Messages API (`POST /v1/messages`, JSON or SSE) that enforces its
documented rules, including those about reasoning in multi-turn tool loops.

The fake signs what it emits (HMAC over a nonce, the model and the content) and remembers it: a
thinking block or redacted data that comes back altered, invented or reordered, or to another
model than the one that wrote it (signatures are model-bound: vybestack/llxprt-code#2335,
openclaw/openclaw#107221), is rejected with the error the real API gives. Enforced:
- the API key and the `anthropic-version` header; `model`, `max_tokens`, `messages` present;
- at most 4 cache breakpoints, none on an empty text block; with thinking on, no temperature
  but 1, no top_k, top_p 0.95 to 1; images of a documented media type, size and count;
- thinking config: the model's accepted forms (`rules.py`), budget >= 1024 and < max_tokens,
  effort levels, no thinking with a forced tool_choice (and no forced tool_choice at all on the
  models that refuse it);
- roles alternate (one model turn is one message), the first message is the user's;
- every thinking block carries a signature it emitted, every redacted_thinking block data it
  emitted; an assistant message carries either none of one response's thinking or all of it,
  exactly and in order (text blocks may be left out; a whitespace-only one is refused), bound to
  the same prefix (system, tools, earlier messages); with thinking on, the assistant message
  before the last tool results must start with thinking;
- tool_use ids of the API's pattern, unique across the request, answered by tool_result blocks
  in the next message, tool results first.

Answers are scripted: `ScriptedTurn`s (built with `thinking()`, `tool_use()`, … below, or
`anthropic_message(...)`) and `Reply`s (errors) in `script`, used in order.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import itertools
import json
import os
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from tests.support.fakes.cache import PromptCache
from tests.support.fakes.cache import blocks as cache_blocks
from tests.support.fakes.rules import ALL_EFFORTS, rules_for
from tests.support.fakes.server import BAD_KEY, Answer, Rejected, Reply

#: The ids the API takes in tool_use and tool_result blocks (its own are `toolu_…`).
TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
THINKING_WITH_FORCED_TOOL = "Thinking may not be enabled when tool_choice forces tool use."
BUDGET_TOO_SMALL = "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
MAX_TOKENS_NOT_ABOVE_BUDGET = (
    "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation "
    "at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    "#max-tokens-and-context-window-size"
)
EXPECTED_THINKING = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
    "recommend you include thinking blocks from previous turns. To avoid this requirement, "
    "disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)
# The fake's own wording (models of Claude 4.7 and later reject `enabled` and `disabled`).
ENABLED_THINKING_UNSUPPORTED = (
    "thinking.type.enabled is not supported for this model. Use thinking.type.adaptive and "
    "output_config.effort to control thinking behavior."
)
# The fake's own wording (Claude Opus 5.5, Sonnet 5.5, Fable 5.1 refuse any forced tool choice).
FORCED_TOOL_UNSUPPORTED = (
    "tool_choice.type: forced tool use is not supported for this model; use tool_choice auto"
)
DISPLAY_UPDATES_BETA = "thinking-display-updates-2026-08-18"
# The API's words for any effort sent to a model without one (anthropics/claude-code#30795).
NO_EFFORT = "This model does not support the effort parameter."
DISABLED_THINKING_UNSUPPORTED = (
    "thinking.type.disabled is not supported for this model. Use thinking.type.adaptive and "
    "output_config.effort to control thinking behavior."
)


# --- script builders -------------------------------------------------------------------------


def thinking(text: str) -> dict[str, Any]:
    """A thinking block; the fake signs it when it answers."""
    return {"type": "thinking", "thinking": text}


def redacted() -> dict[str, Any]:
    """A redacted_thinking block; the fake makes (and remembers) its data."""
    return {"type": "redacted_thinking"}


redacted_thinking = redacted


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, arguments: dict[str, Any], id: str | None = None) -> dict[str, Any]:
    """A tool_use block; the fake assigns the id unless one is given."""
    block: dict[str, Any] = {"type": "tool_use", "name": name, "input": arguments}
    if id is not None:
        block["id"] = id
    return block


@dataclass
class ScriptedTurn:
    """One model answer. `interrupt` cuts an SSE stream off after the first thinking deltas.
    `fail` (error type, message) makes a streamed answer fail after HTTP 200 with an `error`
    event (a JSON answer then gets the matching HTTP error). `usage` overrides the computed usage
    fields; `model` the echoed request model; `status` (Responses) may be "incomplete"."""

    blocks: list[dict[str, Any]]
    interrupt: bool = False
    stop_reason: str | None = None
    model: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    fail: tuple[str, str] | None = None
    status: str = "completed"
    incomplete_reason: str = "max_output_tokens"
    """Responses, with status "incomplete": `incomplete_details.reason` ("content_filter")."""
    stop_details: dict[str, Any] | None = None
    """Anthropic: the message's `stop_details` (with stop_reason "refusal": `{"type":
    "refusal", "category": …, "explanation": …}`), on the message and on `message_delta`."""
    cut_in_tool: bool = False
    """Anthropic, streamed: max_tokens is reached inside the last tool_use — its input JSON
    stops halfway, then the stream ends properly with stop_reason "max_tokens"."""
    hold: threading.Event | None = None
    """Anthropic: the answer is sent once this is set (`Answer.hold`)."""
    hold_after: str | None = None
    """Anthropic, streamed, with `hold`: the events up to the `hold_nth` of this type (say
    "content_block_delta") are sent at once, the rest once `hold` is set (`Answer.hold_at`)."""
    hold_nth: int = 1
    output_so_far: tuple[int, int] | None = None
    """Anthropic, streamed: (block index, tokens) — a `message_delta` reporting that many output
    tokens so far after that block ends (a stream may send several; each usage is cumulative)."""
    failed_event: bool = False
    """Responses, with `fail` (code, message): the response fails as the API fails one, with
    `status: "failed"`, its error and usage. Streamed, `response.failed` ends the stream after
    the output items (instead of an `error` event after `response.created`); not streamed, it
    is the answer of an HTTP 200 (instead of a 500)."""
    left_open: bool = False
    """Anthropic, streamed: the last content block gets no `content_block_stop` (its deltas
    stop, then `message_delta` and `message_stop` end the stream), as when a streaming
    classifier stops the answer mid-block (`stop_reason: "refusal"`)."""
    item_events: bool | tuple[int, ...] = True
    """Responses, streamed: False sends no item events (`response.output_item.added`, deltas,
    `…done`); the output is only in the terminal event's response, as some OpenAI-compatible
    servers stream. A tuple sends them only for those output indices."""
    fail_after: str | None = None
    """Anthropic, streamed, with `fail`: the `error` event comes after the first event of this
    type (say "message_delta", with `output_so_far`) instead of after message_start and a ping."""
    response_id: str | None = None
    """Responses: the response's `id` (None: a fresh `resp_fake_…`). "" as an OpenAI-compatible
    server that numbers nothing sends it: the answers of a conversation then share one."""


#: HTTP status of each Anthropic error type (for a failure outside a stream).
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


def overloaded() -> ScriptedTurn:
    """A stream that starts (HTTP 200, message_start, ping) and then fails: overloaded."""
    return ScriptedTurn([], fail=("overloaded_error", "Overloaded"))


def anthropic_message(
    *content: dict[str, Any],
    stop_reason: str | None = None,
    model: str | None = None,
    input_tokens: int = 120,
    output_tokens: int = 40,
    cache_read_input_tokens: int = 0,
    cache_creation_input_tokens: int = 0,
    thinking_tokens: int | None = None,
) -> ScriptedTurn:
    """A turn with fixed usage figures (for tests that add usage up)."""
    usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": cache_creation_input_tokens,
        "cache_read_input_tokens": cache_read_input_tokens,
    }
    if thinking_tokens is not None:
        usage["output_tokens_details"] = {"thinking_tokens": thinking_tokens}
    return ScriptedTurn(list(content), stop_reason=stop_reason, model=model, usage=usage)


def anthropic_error(status: int, kind: str, message: str, **headers: str) -> Reply:
    return Reply(
        status,
        {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"},
        {k.replace("_", "-"): v for k, v in headers.items()},
    )


def rate_limited_anthropic() -> Reply:
    return anthropic_error(
        429,
        "rate_limit_error",
        "Number of request tokens has exceeded your per-minute rate limit",
        retry_after="0",
        retry_after_ms="5",
    )


def _bad(message: str) -> Rejected:
    return Rejected(anthropic_error(400, "invalid_request_error", message), message)


#: The most blocks one request may mark with `cache_control` (the prompt caching page).
MAX_CACHE_BREAKPOINTS = 4
#: The most base64 one image may take ("image exceeds 5 MB maximum: 5316444 bytes > 5242880
#: bytes", as the API answers).
IMAGE_MAX_BASE64 = 5 * 1024 * 1024
_MAGIC = {b"\x89PNG": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF8": "image/gif"}


#: The most pixels an image may have a side ("If you submit an image larger than 8000x8000 px,
#: it will be rejected"), and with more than MANY_IMAGES images in the request ("If you submit
#: more than 20 images in one API request, this limit is 2000x2000 px"); at most MAX_IMAGES
#: images a request (models with a 200K context window; the vision page).
IMAGE_MAX_SIDE = 8000
MANY_IMAGES = 20
MANY_IMAGES_MAX_SIDE = 2000
MAX_IMAGES = 100
MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def _check_image(where: str, block: dict[str, Any], images: int) -> None:
    """An image block's base64 source: within 5 MB, of a media type the API takes and the one
    it claims, and within the pixel size allowed a request of `images` images."""
    source = block.get("source") or {}
    if source.get("type") != "base64":
        return
    if source.get("media_type") not in MEDIA_TYPES:
        raise _bad(
            f"{where.removesuffix('.data')}.media_type: Input should be "
            + ", ".join(f"'{t}'" for t in MEDIA_TYPES)
        )
    data = str(source.get("data") or "")
    if len(data) > IMAGE_MAX_BASE64:
        raise _bad(
            f"{where}: image exceeds 5 MB maximum: {len(data)} bytes > {IMAGE_MAX_BASE64} bytes"
        )
    head = base64.b64decode(data[:16] + "=" * (-len(data[:16]) % 4))
    kind = next((t for magic, t in _MAGIC.items() if head.startswith(magic)), None)
    if kind is not None and kind != source.get("media_type"):
        raise _bad(
            f"{where}: Image does not match the provided media type {source.get('media_type')}"
        )
    try:
        with Image.open(io.BytesIO(base64.b64decode(data))) as image:
            size = image.size
            image.load()  # the API decodes the image: damaged data is refused
    except (OSError, ValueError, SyntaxError, EOFError):
        raise _bad(f"{where}: Could not process image") from None
    if images > MANY_IMAGES and max(size) > MANY_IMAGES_MAX_SIDE:
        raise _bad(
            f"{where}: At least one of the image dimensions exceed max allowed size for "
            f"many-image requests: {MANY_IMAGES_MAX_SIDE} pixels"
        )
    if max(size) > IMAGE_MAX_SIDE:
        raise _bad(
            f"{where}: At least one of the image dimensions exceed max allowed size: "
            f"{IMAGE_MAX_SIDE} pixels"
        )


# --- what identifies a block across a round trip ---------------------------------------------


def _identity(block: dict[str, Any]) -> tuple[str, str]:
    """What identifies a content block across a round trip (tool_use input may be masked)."""
    kind = str(block.get("type"))
    if kind == "thinking":
        return (kind, str(block.get("signature")))
    if kind == "redacted_thinking":
        return (kind, str(block.get("data")))
    if kind == "tool_use":
        return (kind, str(block.get("id")))
    return (kind, json.dumps(block, sort_keys=True))


def _kept(identities: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The identities a round trip must keep as they were: every block but text."""
    return [k for k in identities if k[0] != "text"]


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _blocks(content: Any) -> list[dict[str, Any]]:
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def _prefix_hash(
    body: dict[str, Any], messages: list[dict[str, Any]], partial: list[dict[str, Any]]
) -> str:
    """What a thinking block is bound to on models with preserved thinking: system, tools,
    every earlier message and the blocks before it in its own message."""
    msgs = [{"role": m["role"], "content": _blocks(m["content"])} for m in messages]
    system = body.get("system")
    data = {
        "system": _blocks(system) if system is not None else None,
        "tools": body.get("tools"),
        "messages": msgs,
        "partial": partial,
    }
    raw = json.dumps(_normalized(data), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass
class _Emitted:
    """What the fake handed out, to check what comes back."""

    thinking: set[tuple[str, str]] = field(default_factory=set)
    redacted: set[str] = field(default_factory=set)
    # block identity -> response id; response id -> identities of its blocks, in order
    response_of: dict[tuple[str, str], str] = field(default_factory=dict)
    shape: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # reasoning block identity -> hash of its prefix (system, tools, everything before it)
    prefix: dict[tuple[str, str], str] = field(default_factory=dict)


class MessagesFake:
    """The Messages endpoint. `key`: the only API key accepted (None: any but BAD_KEY)."""

    paths: tuple[str, ...] = ("/v1/messages",)

    def __init__(
        self,
        *,
        key: str | None = None,
        signing_key: bytes = b"amc-fake-provider",
        prefix_binding: bool = True,
    ) -> None:
        self.key = key
        self.signing_key = signing_key
        self.prefix_binding = prefix_binding
        self.script: deque[ScriptedTurn | Reply] = deque()
        self._emitted = _Emitted()
        self._caches: dict[str, PromptCache] = {}
        # Ids count per fake, as each real conversation's would be its own: two fakes scripted
        # alike answer alike (the transports' comparison test relies on it).
        self._ids = itertools.count(1)

    @property
    def pending(self) -> int:
        return len(self.script)

    # --- signing ---
    def _token(self, *parts: str) -> str:
        nonce = os.urandom(12)
        mac = hmac.new(self.signing_key, nonce + "\x00".join(parts).encode(), hashlib.sha256)
        return base64.b64encode(nonce + mac.digest()).decode()

    def _valid(self, token: str, *parts: str) -> bool:
        try:
            raw = base64.b64decode(token.encode(), validate=True)
        except (ValueError, TypeError):
            return False
        nonce, mac = raw[:12], raw[12:]
        want = hmac.new(self.signing_key, nonce + "\x00".join(parts).encode(), hashlib.sha256)
        return hmac.compare_digest(mac, want.digest())

    def signature_of(self, thought: str) -> str:
        """The signature the fake gave the thinking block with this text."""
        return next(sig for text_, sig in self._emitted.thinking if text_ == thought)

    # --- the endpoint ---
    def check_key(self, headers: dict[str, str]) -> None:
        # Older SDKs send the key as x-api-key, newer ones as a bearer token; accept either.
        keys = {headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")}
        ok = self.key in keys if self.key is not None else BAD_KEY not in keys
        if not ok:
            raise Rejected(
                anthropic_error(401, "authentication_error", "invalid x-api-key"),
                "invalid x-api-key",
            )

    def outage(self, status: int) -> Reply:
        kind = "overloaded_error" if status == 529 else "api_error"
        message = "Overloaded" if status == 529 else "Internal server error"
        return anthropic_error(status, kind, message, retry_after_ms="5")

    def model_info(self, model: str) -> dict[str, Any]:
        return {
            "type": "model",
            "id": model,
            "display_name": model,
            "created_at": "2026-01-01T00:00:00Z",
        }

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Answer:
        if "anthropic-version" not in headers:
            raise _bad("anthropic-version: header is required")
        thinking_on = self._check(body, headers)
        if not self.script:
            # 400, not 5xx: the SDK must not retry into an empty script.
            raise _bad("fake server: no scripted response left")
        entry = self.script.popleft()
        if isinstance(entry, Reply):
            return Answer(entry.status, entry.body, entry.headers)
        if entry.fail is not None and not body.get("stream"):
            kind, text_ = entry.fail
            reply = anthropic_error(ERROR_STATUS.get(kind, 500), kind, text_)
            return Answer(reply.status, reply.body)
        message = self._render(entry, body, thinking_on)
        if body.get("stream"):
            events = self._events(
                message, interrupt=entry.interrupt, cut=entry.cut_in_tool, open_=entry.left_open
            )
            if entry.output_so_far is not None:
                block, tokens = entry.output_so_far
                end = events.index(
                    ("content_block_stop", {"type": "content_block_stop", "index": block})
                )
                so_far = {
                    "type": "message_delta",
                    "delta": {"stop_reason": None, "stop_sequence": None},
                    "usage": {"output_tokens": tokens},
                }
                events.insert(end + 1, ("message_delta", so_far))
            if entry.fail is not None:
                kind, text_ = entry.fail
                error = {"type": "error", "error": {"type": kind, "message": text_}}
                sent = (
                    [name for name, _ in events].index(entry.fail_after) + 1
                    if entry.fail_after
                    else 2
                )
                events = [*events[:sent], ("error", error)]
            at = None
            if entry.hold_after:
                ends = [i + 1 for i, (kind, _) in enumerate(events) if kind == entry.hold_after]
                at = ends[entry.hold_nth - 1]
            return Answer(events=events, hold=entry.hold, hold_at=at)
        return Answer(body=message, hold=entry.hold)

    def _render(
        self, turn: ScriptedTurn, body: dict[str, Any], thinking_on: bool
    ) -> dict[str, Any]:
        msg_id = f"msg_fake_{next(self._ids):04d}"
        model = str(body.get("model"))
        rules = rules_for(model)
        config = body.get("thinking") or {}
        between_tools = config.get("type") == "between_tools"
        display = config.get("display") or rules.display_default
        content: list[dict[str, Any]] = []
        for i, spec in enumerate(turn.blocks):
            kind = spec["type"]
            said = (  # text the model writes before a tool call, on a model that returns it
                kind == "text"
                and rules.text_as_thinking
                and any(b["type"] == "tool_use" for b in turn.blocks[i + 1 :])
            )
            if kind in ("thinking", "redacted_thinking") and not thinking_on:
                continue
            if said:
                # In a thinking block of its own, where the text block was (a progress update):
                # readable when the display returns text (`summarized` with the reasoning,
                # `updates` alone), or when up-front thinking is off (`between_tools`).
                shown = spec["text"] if between_tools or display != "omitted" else ""
                block = {
                    "type": "thinking",
                    "thinking": shown,
                    "signature": self._token("thinking", model, shown),
                }
            elif kind == "thinking":
                # Omitted display: the block comes back with empty text, signature kept.
                thought = spec["thinking"] if display == "summarized" else ""
                block = {
                    "type": "thinking",
                    "thinking": thought,
                    "signature": self._token("thinking", model, thought),
                }
            elif kind == "redacted_thinking":
                block = {"type": "redacted_thinking", "data": self._token("redacted", model)}
            elif kind == "tool_use":
                block = {
                    "type": "tool_use",
                    "id": spec["id"] if "id" in spec else f"toolu_fake_{next(self._ids):04d}",
                    "name": spec["name"],
                    "input": spec["input"],
                }
            else:
                block = dict(spec)
            content.append(block)
        if not turn.interrupt:
            self._remember(msg_id, body, content)
        cache = self._caches.setdefault(str(body.get("model")), PromptCache(rules.min_cache_tokens))
        use = cache.account(body, total=len(json.dumps(body)) // 4)
        usage = {
            "input_tokens": use.input_tokens,
            "output_tokens": 20,
            "cache_creation_input_tokens": use.cache_creation_input_tokens,
            "cache_read_input_tokens": use.cache_read_input_tokens,
            **turn.usage,
        }
        stop = turn.stop_reason or (
            "max_tokens"
            if turn.cut_in_tool
            else "tool_use"
            if any(b["type"] == "tool_use" for b in content)
            else "end_turn"
        )
        return {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": turn.model or body.get("model", "claude-fake"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "stop_details": turn.stop_details,
            "usage": usage,
        }

    def _remember(self, msg_id: str, body: dict[str, Any], content: list[dict[str, Any]]) -> None:
        emitted = self._emitted
        for block in content:
            if block["type"] == "thinking":
                emitted.thinking.add((block["thinking"], block["signature"]))
            elif block["type"] == "redacted_thinking":
                emitted.redacted.add(block["data"])
        emitted.shape[msg_id] = [_identity(b) for b in content]
        for j, block in enumerate(content):
            emitted.response_of[_identity(block)] = msg_id
            if block["type"] in ("thinking", "redacted_thinking"):
                emitted.prefix[_identity(block)] = _prefix_hash(
                    body, body.get("messages") or [], content[:j]
                )

    @staticmethod
    def _events(
        message: dict[str, Any], *, interrupt: bool, cut: bool = False, open_: bool = False
    ) -> list[tuple[str, dict[str, Any]]]:
        start = {**message, "content": [], "stop_reason": None, "stop_details": None}
        start["usage"] = {**message["usage"], "output_tokens": 1}
        events: list[dict[str, Any]] = [
            {"type": "message_start", "message": start},
            {"type": "ping"},  # as the API does: a stream may hold any number of pings
        ]
        for index, block in enumerate(message["content"]):
            kind = block["type"]
            if kind == "thinking":
                events.append(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                    }
                )
                whole = block["thinking"]
                for i in range(0, len(whole), 7):
                    events.append(
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "thinking_delta", "thinking": whole[i : i + 7]},
                        }
                    )
                if interrupt:
                    return [(e["type"], e) for e in events]
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": block["signature"]},
                    }
                )
            elif kind == "text":
                events.append(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    }
                )
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": block["text"]},
                    }
                )
            elif kind in ("tool_use", "server_tool_use"):  # a server tool's input streams so too
                events.append(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {**block, "input": {}},
                    }
                )
                raw = json.dumps(block["input"])
                half = len(raw) // 2
                last = index == len(message["content"]) - 1
                for part in (raw[:half],) if cut and last else (raw[:half], raw[half:]):
                    events.append(
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": part},
                        }
                    )
            else:
                events.append(
                    {"type": "content_block_start", "index": index, "content_block": block}
                )
            if not (open_ and index == len(message["content"]) - 1):
                events.append({"type": "content_block_stop", "index": index})
            events.append({"type": "ping"})
        events.append(
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": message["stop_reason"],
                    "stop_sequence": None,
                    "stop_details": message["stop_details"],
                },
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            }
        )
        events.append({"type": "message_stop"})
        return [(e["type"], e) for e in events]

    # --- the rules ---
    def _check(self, body: dict[str, Any], headers: dict[str, str]) -> bool:
        """Validate a request; returns whether thinking is on."""
        for key in ("model", "max_tokens", "messages"):
            if key not in body:
                raise _bad(f"{key}: Field required")
        rules = rules_for(str(body["model"]))
        config = body.get("thinking") or {}
        kind = config.get("type")
        if kind not in (None, "disabled", "adaptive", "enabled", "between_tools"):
            raise _bad(f"thinking.type: Input tag '{kind}' found is not valid")
        if kind == "enabled" and kind not in rules.thinking_types:
            raise _bad(ENABLED_THINKING_UNSUPPORTED)
        if kind is not None and kind not in rules.thinking_types:
            raise _bad(
                DISABLED_THINKING_UNSUPPORTED
                if kind == "disabled"
                else f"thinking.type.{kind} is not supported for this model."
            )
        display = config.get("display")
        betas = {b.strip() for b in headers.get("anthropic-beta", "").split(",")}
        # `updates` is a beta value: without its header it is refused as an unknown one.
        known = ("summarized", "omitted", *(("updates",) if DISPLAY_UPDATES_BETA in betas else ()))
        if display is not None and display not in known:
            raise _bad("thinking.adaptive.display: Input should be 'summarized' or 'omitted'")
        max_tokens = int(body.get("max_tokens") or 0)
        if rules.max_output_tokens is not None and max_tokens > rules.max_output_tokens:
            raise _bad(
                f"max_tokens: {max_tokens} > {rules.max_output_tokens}, which is the maximum "
                f"allowed number of output tokens for {body['model']}"
            )
        if kind == "enabled":
            budget = config.get("budget_tokens")
            if not isinstance(budget, int) or budget < 1024:
                raise _bad(BUDGET_TOO_SMALL)
            if max_tokens <= budget:
                raise _bad(MAX_TOKENS_NOT_ABOVE_BUDGET)
        effort = (body.get("output_config") or {}).get("effort")
        if effort is not None and not rules.efforts:
            raise _bad(NO_EFFORT)
        if effort is not None and effort not in rules.efforts:
            raise _bad(
                "output_config.effort: Input should be "
                + ", ".join(f"'{e}'" for e in sorted(rules.efforts))
            )
        if kind in ("disabled", "between_tools") and (effort or "high") not in (
            rules.off_efforts or ALL_EFFORTS
        ):
            raise _bad(f"thinking.type.{kind} is not supported with effort '{effort}'.")
        thinking_on = kind in ("enabled", "adaptive") or (
            kind is None and rules.thinks_when_omitted
        )
        choice = (body.get("tool_choice") or {}).get("type", "auto")
        if choice not in ("auto", "any", "tool", "none"):
            raise _bad(f"tool_choice.type: Input tag '{choice}' found is not valid")
        if not rules.forced_tool_choice and choice in ("any", "tool"):
            raise _bad(FORCED_TOOL_UNSUPPORTED)
        if thinking_on and choice in ("any", "tool"):
            raise _bad(THINKING_WITH_FORCED_TOOL)
        self._check_sampling(body, thinking_on)
        self._check_cache_breakpoints(body)
        self._check_messages(body, thinking_on)
        return thinking_on

    @staticmethod
    def _check_sampling(body: dict[str, Any], thinking_on: bool) -> None:
        """With thinking on, temperature only 1, top_p 0.95 to 1, no top_k (the extended
        thinking page: "Thinking isn't compatible with temperature or top_k modifications")."""
        if not thinking_on:
            return
        if body.get("temperature") not in (None, 1, 1.0):
            raise _bad(
                "`temperature` may only be set to 1 when thinking is enabled. Please consult our "
                "documentation at https://docs.claude.com/en/docs/build-with-claude/"
                "extended-thinking#feature-compatibility"
            )
        if body.get("top_k") is not None:
            raise _bad("`top_k` is not compatible with thinking.")
        top_p = body.get("top_p")
        if top_p is not None and not 0.95 <= float(top_p) <= 1:
            raise _bad("`top_p` must be greater than or equal to 0.95 when thinking is enabled.")

    @staticmethod
    def _check_cache_breakpoints(body: dict[str, Any]) -> None:
        """At most 4 blocks with `cache_control` (the request-level one counts: the API puts it
        on the last block), and none on an empty text block (the prompt caching page)."""
        marked = [b for b in cache_blocks(body) if b.get("cache_control")]
        if len(marked) > MAX_CACHE_BREAKPOINTS:
            raise _bad(
                f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
                f"provided. Found {len(marked)}."
            )
        if any(b.get("type") == "text" and not b.get("text") for b in marked):
            raise _bad("cache_control cannot be set for empty text blocks")

    def _check_messages(self, body: dict[str, Any], thinking_on: bool) -> None:
        messages = body.get("messages") or []
        if not messages or messages[0].get("role") != "user":
            raise _bad('messages: first message must use the "user" role')
        for i, m in enumerate(messages):
            if i and m["role"] == messages[i - 1]["role"]:
                raise _bad(
                    'messages: roles must alternate between "user" and "assistant", but found '
                    f'multiple "{m["role"]}" roles in a row'
                )
        contents = [_blocks(m["content"]) for m in messages]
        seen_ids: set[str] = set()
        for i, blocks in enumerate(contents):
            for j, block in enumerate(blocks):
                field_ = {"tool_use": "id", "tool_result": "tool_use_id"}.get(
                    str(block.get("type"))
                )
                if field_ and not TOOL_ID.fullmatch(str(block.get(field_))):
                    raise _bad(
                        f"messages.{i}.content.{j}.{block['type']}.{field_}: String should match "
                        f"pattern '{TOOL_ID.pattern}'"
                    )
                if block.get("type") != "tool_use":
                    continue
                if block.get("id") in seen_ids:  # the API's words, across the whole request
                    raise _bad(f"messages.{i}.content.{j}: `tool_use` ids must be unique")
                seen_ids.add(str(block.get("id")))
        images = sum(1 for blocks in contents for b in blocks if b.get("type") == "image")
        if images > MAX_IMAGES:
            raise _bad(f"messages: too many images in the request: {images} > {MAX_IMAGES}")
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                after = contents[i + 1] if i + 1 < len(messages) else None
                self._check_assistant(body, i, contents[i], after)
            else:
                self._check_user(i, contents[i], contents[i - 1] if i else [], images)
        in_tool_loop = any(b.get("type") == "tool_result" for b in contents[-1])
        if thinking_on and messages[-1]["role"] == "user" and len(messages) >= 2 and in_tool_loop:
            k = len(messages) - 2
            first = contents[k][0]["type"] if contents[k] else "nothing"
            if first not in ("thinking", "redacted_thinking"):
                raise _bad(EXPECTED_THINKING.format(index=k, found=first))

    def _check_assistant(
        self,
        body: dict[str, Any],
        i: int,
        content: list[dict[str, Any]],
        after: list[dict[str, Any]] | None,
    ) -> None:
        if not content:
            raise _bad(f"messages.{i}: all messages must have non-empty content")
        if content[-1].get("type") in ("thinking", "redacted_thinking"):
            raise _bad(
                f"messages.{i}: The final block in an assistant message cannot be `thinking`."
            )
        emitted = self._emitted
        model = str(body.get("model"))
        has_reasoning = False
        uses: list[str] = []
        for j, block in enumerate(content):
            kind = block.get("type")
            if kind == "thinking":
                if "signature" not in block:
                    raise _bad(f"messages.{i}.content.{j}.thinking.signature: Field required")
                pair = (block.get("thinking", ""), block["signature"])
                if pair not in emitted.thinking or not self._valid(
                    block["signature"], "thinking", model, pair[0]
                ):
                    raise _bad(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
            elif kind == "redacted_thinking":
                data = block.get("data", "")
                if data not in emitted.redacted or not self._valid(data, "redacted", model):
                    raise _bad(
                        f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block"
                    )
            elif kind == "text" and not block.get("text"):
                raise _bad("messages: text content blocks must be non-empty")
            elif kind == "text" and not str(block.get("text")).strip():
                raise _bad("messages: text content blocks must contain non-whitespace text")
            elif kind == "tool_use":
                uses.append(block["id"])
            if kind in ("thinking", "redacted_thinking"):
                has_reasoning = True
                if self.prefix_binding and emitted.prefix.get(_identity(block)) != (
                    _prefix_hash(body, (body.get("messages") or [])[:i], content[:j])
                ):
                    raise _bad(
                        f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block. The "
                        "block is bound to a different conversation. Remove the block, or set "
                        '`thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
                    )
        identities = [_identity(b) for b in content]
        responses = {emitted.response_of[k] for k in identities if k in emitted.response_of}
        if len(responses) > 1:
            raise _bad(f"messages.{i}: one assistant message holds blocks of several responses")
        if has_reasoning and responses:
            # The documented rule is about the thinking blocks (and the tool_use they lead to):
            # complete, unmodified, in order, in one message. Text may be left out (a client
            # must drop a whitespace-only block the model wrote).
            (response,) = responses
            if _kept(identities) != _kept(emitted.shape[response]):
                raise _bad(
                    f"messages.{i}: an assistant turn with thinking must be passed back "
                    "unmodified, complete and in its original order: thinking and tool_use of "
                    "one response in one message"
                )
        if uses:
            answered = {
                b.get("tool_use_id") for b in (after or []) if b.get("type") == "tool_result"
            }
            missing = [u for u in uses if u not in answered]
            if missing:
                raise _bad(
                    f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )

    @staticmethod
    def _check_user(
        i: int, content: list[dict[str, Any]], before: list[dict[str, Any]], images: int
    ) -> None:
        uses = {b.get("id") for b in before if b.get("type") == "tool_use"}
        seen_other = False
        for j, block in enumerate(content):
            if block.get("type") == "image":
                _check_image(f"messages.{i}.content.{j}.image.source.base64.data", block, images)
            if block.get("type") == "text" and not str(block.get("text") or "").strip():
                raise _bad(
                    "messages: text content blocks must be non-empty"
                    if not block.get("text")
                    else "messages: text content blocks must contain non-whitespace text"
                )
            if block.get("type") != "tool_result":
                seen_other = True
                continue
            if seen_other:
                raise _bad(
                    f"messages.{i}.content.{j}: `tool_result` blocks must come first in the user "
                    "message, before any other content"
                )
            if block.get("tool_use_id") not in uses:
                raise _bad(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
