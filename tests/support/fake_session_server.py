"""A local HTTP server speaking Anthropic Messages and OpenAI Responses that ENFORCES the rules
about reasoning in multi-turn tool loops, so a session that breaks them fails a test instead of
passing silently.

The server signs what it emits (HMAC over a nonce and the content) and remembers it: a thinking
block, redacted data or encrypted reasoning that comes back altered, invented or reordered is
rejected with the error the real API gives. Enforced:

Anthropic (`POST /v1/messages`, JSON or SSE):
- roles alternate (no two assistant messages in a row — one model turn is one message);
- every thinking block carries a valid signature it emitted, every redacted_thinking block data it
  emitted; thinking blocks come before text and tool_use;
- an assistant message holding tool_use from one response carries either none of that response's
  thinking (omitted from an earlier turn) or all of it, exactly and in order; with thinking on the
  assistant message before the last tool results must start with it ("Expected `thinking` or
  `redacted_thinking`, but found `tool_use`…");
- tool_use ids answered by tool_result blocks in the next message, tool results first;
- thinking config rules (budget ≥ 1024 and < max_tokens, no thinking with a forced tool_choice).

OpenAI Responses (`POST /v1/responses`, JSON or SSE):
- `store` must be false; encrypted content is only emitted when included;
- a reasoning item must carry the encrypted content emitted for its id and be followed by the
  item that followed it ("…was provided without its required following item");
- every function_call has its function_call_output and vice versa.

Turns are scripted: push `ScriptedTurn`s (built with `thinking()`, `tool_use()`, … below) onto
`anthropic_script` / `responses_script`; every request is recorded in `requests`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BAD_KEY = "bad-key"  # any request with this API key gets a 401

EXPECTED_THINKING = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
    "recommend you include thinking blocks from previous turns. To avoid this requirement, "
    "disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)


# --- script builders -------------------------------------------------------------------------


def thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text}


def redacted() -> dict[str, Any]:
    return {"type": "redacted_thinking"}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": arguments}


def reasoning(*summary: str) -> dict[str, Any]:
    return {"type": "reasoning", "summary": list(summary)}


def message(value: str) -> dict[str, Any]:
    return {"type": "message", "text": value}


def function_call(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    return {"type": "function_call", "name": name, "arguments": arguments}


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


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _prefix_hash(
    body: dict[str, Any], messages: list[dict[str, Any]], partial: list[dict[str, Any]]
) -> str:
    """What a thinking block is bound to on models with preserved thinking: system, tools,
    every earlier message and the blocks before it in its own message."""
    msgs = [
        {
            "role": m["role"],
            "content": m["content"]
            if isinstance(m["content"], list)
            else [{"type": "text", "text": m["content"]}],
        }
        for m in messages
    ]
    data = {
        "system": body.get("system"),
        "tools": body.get("tools"),
        "messages": msgs,
        "partial": partial,
    }
    raw = json.dumps(_normalized(data), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass
class ScriptedTurn:
    """One model answer. `interrupt` cuts an SSE stream off after the first thinking deltas."""

    blocks: list[dict[str, Any]]
    interrupt: bool = False


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 0
    error: str | None = None


class _Rejected(Exception):
    pass


@dataclass
class _Emitted:
    """What the server handed out, to check what comes back."""

    thinking: set[tuple[str, str]] = field(default_factory=set)
    redacted: set[str] = field(default_factory=set)
    # block identity -> response id; response id -> identities of its blocks, in order
    response_of: dict[tuple[str, str], str] = field(default_factory=dict)
    shape: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # reasoning block identity -> hash of its prefix (system, tools, everything before it)
    prefix: dict[tuple[str, str], str] = field(default_factory=dict)
    encrypted: dict[str, str] = field(default_factory=dict)
    following: dict[str, str | None] = field(default_factory=dict)


class FakeSessionServer:
    """Start with `with FakeSessionServer() as server:`; point the SDKs at `anthropic_base_url`
    and `openai_base_url`."""

    def __init__(
        self, key: bytes = b"amc-fake-session-server", *, prefix_binding: bool = True
    ) -> None:
        self._key = key
        self.prefix_binding = prefix_binding
        self.anthropic_script: deque[ScriptedTurn] = deque()
        self.responses_script: deque[ScriptedTurn] = deque()
        self.requests: list[RecordedRequest] = []
        self._emitted = _Emitted()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- lifecycle ---
    def __enter__(self) -> FakeSessionServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def anthropic_base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.anthropic_base_url}/v1"

    @property
    def rejections(self) -> list[str]:
        return [r.error for r in self.requests if r.error]

    def bodies(self, path: str) -> list[dict[str, Any]]:
        """The bodies of every request to `path` ("/v1/messages" or "/v1/responses")."""
        return [r.body for r in self.requests if r.path == path]

    # --- signing ---
    def _token(self, *parts: str) -> str:
        nonce = os.urandom(12)
        mac = hmac.new(self._key, nonce + "\x00".join(parts).encode(), hashlib.sha256).digest()
        return base64.b64encode(nonce + mac).decode()

    def _valid(self, token: str, *parts: str) -> bool:
        try:
            raw = base64.b64decode(token.encode(), validate=True)
        except (ValueError, TypeError):
            return False
        nonce, mac = raw[:12], raw[12:]
        want = hmac.new(self._key, nonce + "\x00".join(parts).encode(), hashlib.sha256).digest()
        return hmac.compare_digest(mac, want)

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):04d}"

    # --- HTTP ---
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0]
                record = RecordedRequest(
                    path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                key = record.headers.get("x-api-key") or record.headers.get(
                    "authorization", ""
                ).removeprefix("Bearer ")
                if key == BAD_KEY:
                    record.status, record.error = 401, "invalid x-api-key"
                    error = {"type": "authentication_error", "message": "invalid x-api-key"}
                    self._json(401, {"type": "error", "error": error})
                    return
                with server._lock:
                    server.requests.append(record)
                    try:
                        if path == "/v1/messages":
                            events, payload = server._anthropic(body)
                        elif path == "/v1/responses":
                            events, payload = server._responses(body)
                        else:
                            raise _Rejected(f"unknown path {path}")
                    except _Rejected as err:
                        record.status, record.error = 400, str(err)
                        self._json(400, server._error_body(path, str(err)))
                        return
                record.status = 200
                if body.get("stream"):
                    self._sse(events, interrupted=payload is None)
                else:
                    assert payload is not None
                    self._json(200, payload)

            def _json(self, status: int, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _sse(self, events: list[dict[str, Any]], *, interrupted: bool) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for event in events:
                    chunk = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                    self.wfile.write(chunk.encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler

    def _error_body(self, path: str, msg: str) -> dict[str, Any]:
        if path == "/v1/messages":
            return {"type": "error", "error": {"type": "invalid_request_error", "message": msg}}
        return {
            "error": {"message": msg, "type": "invalid_request_error", "param": None, "code": None}
        }

    # --- Anthropic ---
    def _anthropic(
        self, body: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        thinking_on = self._check_anthropic(body)
        if not self.anthropic_script:
            raise _Rejected("fake session server: no scripted Anthropic turn left")
        turn = self.anthropic_script.popleft()
        msg_id = self._next_id("msg_fake_")
        content: list[dict[str, Any]] = []
        reasoning_blocks: list[dict[str, Any]] = []
        for spec in turn.blocks:
            kind = spec["type"]
            if kind in ("thinking", "redacted_thinking") and not thinking_on:
                continue
            if kind == "thinking":
                block = {
                    "type": "thinking",
                    "thinking": spec["thinking"],
                    "signature": self._token("thinking", spec["thinking"]),
                }
                reasoning_blocks.append(block)
            elif kind == "redacted_thinking":
                block = {"type": "redacted_thinking", "data": self._token("redacted")}
                reasoning_blocks.append(block)
            elif kind == "text":
                block = {"type": "text", "text": spec["text"]}
            else:
                block = {
                    "type": "tool_use",
                    "id": self._next_id("toolu_fake_"),
                    "name": spec["name"],
                    "input": spec["input"],
                }
            content.append(block)
        if not turn.interrupt:
            for block in reasoning_blocks:
                if block["type"] == "thinking":
                    self._emitted.thinking.add((block["thinking"], block["signature"]))
                else:
                    self._emitted.redacted.add(block["data"])
            self._emitted.shape[msg_id] = [_identity(b) for b in content]
            for j, block in enumerate(content):
                self._emitted.response_of[_identity(block)] = msg_id
                if block["type"] in ("thinking", "redacted_thinking"):
                    self._emitted.prefix[_identity(block)] = _prefix_hash(
                        body, body.get("messages") or [], content[:j]
                    )
        usage = {
            "input_tokens": len(json.dumps(body)) // 4,
            "output_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        message_body = {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-fake"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        events = self._anthropic_events(message_body, interrupt=turn.interrupt)
        return events, None if turn.interrupt else message_body

    def _anthropic_events(
        self, message_body: dict[str, Any], *, interrupt: bool
    ) -> list[dict[str, Any]]:
        start = {**message_body, "content": [], "stop_reason": None}
        start["usage"] = {**message_body["usage"], "output_tokens": 1}
        events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
        for index, block in enumerate(message_body["content"]):
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
                    return events
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
            elif kind == "tool_use":
                events.append(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {**block, "input": {}},
                    }
                )
                raw = json.dumps(block["input"])
                half = len(raw) // 2
                for part in (raw[:half], raw[half:]):
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
            events.append({"type": "content_block_stop", "index": index})
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": message_body["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message_body["usage"]["output_tokens"]},
            }
        )
        events.append({"type": "message_stop"})
        return events

    def _check_anthropic(self, body: dict[str, Any]) -> bool:
        """Validate a Messages request; returns whether thinking is on."""
        config = body.get("thinking") or {}
        thinking_on = config.get("type") in ("enabled", "adaptive")
        max_tokens = int(body.get("max_tokens") or 0)
        if config.get("type") == "enabled":
            budget = int(config.get("budget_tokens") or 0)
            if budget < 1024:
                raise _Rejected(
                    "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
                )
            if max_tokens <= budget:
                raise _Rejected("`max_tokens` must be greater than `thinking.budget_tokens`")
        choice = (body.get("tool_choice") or {}).get("type")
        if thinking_on and choice in ("any", "tool"):
            raise _Rejected("Thinking may not be enabled when tool_choice forces tool use.")

        messages = body.get("messages") or []
        if not messages or messages[0].get("role") != "user":
            raise _Rejected('messages: first message must use the "user" role')
        contents = [
            m["content"]
            if isinstance(m["content"], list)
            else [{"type": "text", "text": m["content"]}]
            for m in messages
        ]
        for i, m in enumerate(messages):
            if i and m["role"] == messages[i - 1]["role"]:
                raise _Rejected(
                    'messages: roles must alternate between "user" and "assistant", but found '
                    f'multiple "{m["role"]}" roles in a row'
                )
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                self._check_assistant(
                    body, i, contents[i], contents[i + 1] if i + 1 < len(messages) else None
                )
            else:
                self._check_user(i, contents[i], contents[i - 1] if i else [])

        last = messages[-1]
        in_tool_loop = any(b.get("type") == "tool_result" for b in contents[-1])
        if thinking_on and last["role"] == "user" and len(messages) >= 2 and in_tool_loop:
            k = len(messages) - 2
            first = contents[k][0]["type"] if contents[k] else "nothing"
            if first not in ("thinking", "redacted_thinking"):
                raise _Rejected(EXPECTED_THINKING.format(index=k, found=first))
        return thinking_on

    def _check_assistant(
        self,
        body: dict[str, Any],
        i: int,
        content: list[dict[str, Any]],
        after: list[dict[str, Any]] | None,
    ) -> None:
        has_reasoning = False
        uses: list[str] = []
        for j, block in enumerate(content):
            kind = block.get("type")
            if kind == "thinking":
                if "signature" not in block:
                    raise _Rejected(f"messages.{i}.content.{j}.thinking.signature: Field required")
                pair = (block.get("thinking", ""), block["signature"])
                if pair not in self._emitted.thinking or not self._valid(
                    block["signature"], "thinking", pair[0]
                ):
                    raise _Rejected(
                        f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                    )
            elif kind == "redacted_thinking":
                data = block.get("data", "")
                if data not in self._emitted.redacted or not self._valid(data, "redacted"):
                    raise _Rejected(
                        f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block"
                    )
            elif kind == "text" and not block.get("text"):
                raise _Rejected("messages: text content blocks must be non-empty")
            elif kind == "tool_use":
                uses.append(block["id"])
            if kind in ("thinking", "redacted_thinking"):
                has_reasoning = True
                if self.prefix_binding and self._emitted.prefix.get(_identity(block)) != (
                    _prefix_hash(body, (body.get("messages") or [])[:i], content[:j])
                ):
                    raise _Rejected(
                        f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block. The "
                        "block is bound to a different conversation. Remove the block, or set "
                        '`thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
                    )
        identities = [_identity(b) for b in content]
        responses = {
            self._emitted.response_of[k] for k in identities if k in self._emitted.response_of
        }
        if len(responses) > 1:
            raise _Rejected(
                f"messages.{i}: one assistant message holds blocks of several responses"
            )
        if has_reasoning and responses:
            (response,) = responses
            if identities != self._emitted.shape[response]:
                raise _Rejected(
                    f"messages.{i}: an assistant turn with thinking must be passed back "
                    "unmodified, complete and in its original order: thinking, text and "
                    "tool_use of one response in one message"
                )
        if uses:
            answered = {
                b.get("tool_use_id") for b in (after or []) if b.get("type") == "tool_result"
            }
            missing = [u for u in uses if u not in answered]
            if missing:
                raise _Rejected(
                    f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )

    def _check_user(
        self, i: int, content: list[dict[str, Any]], before: list[dict[str, Any]]
    ) -> None:
        uses = {b.get("id") for b in before if b.get("type") == "tool_use"}
        seen_other = False
        for j, block in enumerate(content):
            if block.get("type") != "tool_result":
                seen_other = True
                continue
            if seen_other:
                raise _Rejected(
                    f"messages.{i}.content.{j}: `tool_result` blocks must come first in the user "
                    "message, before any other content"
                )
            if block.get("tool_use_id") not in uses:
                raise _Rejected(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )

    # --- OpenAI Responses ---
    def _responses(
        self, body: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        if body.get("store") is not False:
            raise _Rejected("fake session server: requests must be stateless (store=false)")
        self._check_responses_input(body.get("input") or [])
        if not self.responses_script:
            raise _Rejected("fake session server: no scripted Responses turn left")
        turn = self.responses_script.popleft()
        reasoning_on = body.get("reasoning") is not None
        include_encrypted = "reasoning.encrypted_content" in (body.get("include") or [])
        resp_id = self._next_id("resp_fake_")
        output: list[dict[str, Any]] = []
        for spec in turn.blocks:
            kind = spec["type"]
            if kind == "reasoning":
                if not reasoning_on:
                    continue
                rid = self._next_id("rs_fake_")
                output.append(
                    {
                        "type": "reasoning",
                        "id": rid,
                        "summary": [{"type": "summary_text", "text": s} for s in spec["summary"]],
                        "encrypted_content": self._token("rs", rid) if include_encrypted else None,
                        "status": "completed",
                    }
                )
            elif kind == "message":
                calls_follow = any(b["type"] == "function_call" for b in turn.blocks)
                output.append(
                    {
                        "type": "message",
                        "id": self._next_id("msg_fake_"),
                        "role": "assistant",
                        "phase": "commentary" if calls_follow else "final_answer",
                        "status": "completed",
                        "content": [
                            {"type": "output_text", "text": spec["text"], "annotations": []}
                        ],
                    }
                )
            else:
                args = spec["arguments"]
                output.append(
                    {
                        "type": "function_call",
                        "id": self._next_id("fc_fake_"),
                        "call_id": self._next_id("call_fake_"),
                        "name": spec["name"],
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                        "status": "completed",
                    }
                )
        if not turn.interrupt:
            for n, item in enumerate(output):
                if item["type"] == "reasoning":
                    if item["encrypted_content"]:
                        self._emitted.encrypted[item["id"]] = item["encrypted_content"]
                    nxt = output[n + 1]["id"] if n + 1 < len(output) else None
                    self._emitted.following[item["id"]] = nxt
        reasoning_tokens = 30 * sum(1 for o in output if o["type"] == "reasoning")
        response = {
            "id": resp_id,
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model", "gpt-fake"),
            "status": "completed",
            "output": output,
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "store": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": {},
            "temperature": 1.0,
            "top_p": 1.0,
            "usage": {
                "input_tokens": len(json.dumps(body)) // 4,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 20 + reasoning_tokens,
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": len(json.dumps(body)) // 4 + 20 + reasoning_tokens,
            },
        }
        events = self._responses_events(response, interrupt=turn.interrupt)
        return events, None if turn.interrupt else response

    def _responses_events(
        self, response: dict[str, Any], *, interrupt: bool
    ) -> list[dict[str, Any]]:
        seq = itertools.count()
        events: list[dict[str, Any]] = [
            {
                "type": "response.created",
                "sequence_number": next(seq),
                "response": {**response, "status": "in_progress", "output": []},
            }
        ]
        for n, item in enumerate(response["output"]):
            added = {**item, "status": "in_progress"}
            if item["type"] == "reasoning":
                added = {**added, "summary": [], "encrypted_content": None}
            events.append(
                {
                    "type": "response.output_item.added",
                    "sequence_number": next(seq),
                    "output_index": n,
                    "item": added,
                }
            )
            if item["type"] == "reasoning":
                for s_index, part in enumerate(item["summary"]):
                    for i in range(0, len(part["text"]), 7):
                        events.append(
                            {
                                "type": "response.reasoning_summary_text.delta",
                                "sequence_number": next(seq),
                                "item_id": item["id"],
                                "output_index": n,
                                "summary_index": s_index,
                                "delta": part["text"][i : i + 7],
                            }
                        )
                if interrupt:
                    return events
            events.append(
                {
                    "type": "response.output_item.done",
                    "sequence_number": next(seq),
                    "output_index": n,
                    "item": item,
                }
            )
        events.append(
            {"type": "response.completed", "sequence_number": next(seq), "response": response}
        )
        return events

    def _check_responses_input(self, items: list[dict[str, Any]]) -> None:
        calls: list[str] = []
        outputs: set[str] = set()
        for n, item in enumerate(items):
            kind = item.get("type", "message")
            if kind == "reasoning":
                rid = item.get("id")
                enc = item.get("encrypted_content")
                if not enc:
                    raise _Rejected(
                        f"Item with id '{rid}' not found. Items are not persisted when `store` is "
                        "set to false. Try again with `store` set to true, or remove this item "
                        "from your input."
                    )
                if self._emitted.encrypted.get(str(rid)) != enc or not self._valid(
                    enc, "rs", str(rid)
                ):
                    raise _Rejected(f"The encrypted content for item {rid} could not be verified.")
                want = self._emitted.following.get(str(rid))
                nxt = items[n + 1] if n + 1 < len(items) else None
                if want is None or nxt is None or nxt.get("id") != want:
                    raise _Rejected(
                        f"Item '{rid}' of type 'reasoning' was provided without its required "
                        "following item."
                    )
            elif kind == "function_call":
                calls.append(str(item.get("call_id")))
            elif kind == "function_call_output":
                call_id = str(item.get("call_id"))
                if call_id not in calls:
                    raise _Rejected(
                        f"No tool call found for function call output with call_id {call_id}."
                    )
                outputs.add(call_id)
        for call_id in calls:
            if call_id not in outputs:
                raise _Rejected(f"No tool output found for function call {call_id}.")
