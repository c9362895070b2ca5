"""A local HTTP server speaking the Anthropic Messages and OpenAI Chat Completions wire formats.

Tests point the real `anthropic` and `openai` SDKs at it (`base_url`), script its answers per
test, and assert on the request bodies and headers the SDKs actually sent. It enforces the
documented request constraints with the real error messages (thinking with a forced tool_choice,
budget below 1024, max_tokens not above the budget, thinking blocks sent back modified or missing
on a tool-use continuation, tool calls without results, a bad key) so that a client regression
fails a test instead of passing against a lenient fake. A request it rejects consumes no
scripted answer.

It is a `http.server.ThreadingHTTPServer` on 127.0.0.1 port 0 in a daemon thread: no framework,
nothing to mock.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANTHROPIC_KEY = "sk-ant-test-key"
OPENAI_KEY = "sk-openai-test-key"

THINKING_WITH_FORCED_TOOL = "Thinking may not be enabled when tool_choice forces tool use."
BUDGET_TOO_SMALL = "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
MAX_TOKENS_NOT_ABOVE_BUDGET = (
    "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation "
    "at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    "#max-tokens-and-context-window-size"
)
FINAL_ASSISTANT_NEEDS_THINKING = (
    "Expected `thinking` or `redacted_thinking`, but found `{found}`. When `thinking` is enabled, "
    "a final `assistant` message must start with a thinking block (preceeding the lastmost set of "
    "`tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous "
    "turns. To avoid this requirement, disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)
# The fake's own wording (models of Claude 4.7 and later reject `enabled` with a 400).
ENABLED_THINKING_UNSUPPORTED = (
    "thinking.type.enabled is not supported for this model. Use thinking.type.adaptive and "
    "output_config.effort to control thinking behavior."
)


@dataclass(slots=True)
class Reply:
    """One scripted HTTP answer."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Recorded:
    """One request as the server received it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 0


# ---- Anthropic builders ----------------------------------------------------------------------


def thinking(text: str, signature: str | None = None) -> dict[str, Any]:
    """A thinking block; the server signs it when `signature` is None."""
    block: dict[str, Any] = {"type": "thinking", "thinking": text}
    if signature is not None:
        block["signature"] = signature
    return block


def redacted_thinking(data: str = "EmwKAhgBEgy3va3pzix/LafPsn4a") -> dict[str, Any]:
    return {"type": "redacted_thinking", "data": data}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


_ids = itertools.count(1)


def tool_use(name: str, arguments: dict[str, Any], id: str | None = None) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": id or f"toolu_fake{next(_ids):04d}",
        "name": name,
        "input": arguments,
    }


def anthropic_message(
    *content: dict[str, Any],
    stop_reason: str | None = None,
    model: str = "claude-test-model",
    input_tokens: int = 120,
    output_tokens: int = 40,
    cache_read_input_tokens: int = 0,
    cache_creation_input_tokens: int = 0,
    thinking_tokens: int | None = None,
) -> Reply:
    has_tool = any(b["type"] == "tool_use" for b in content)
    usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": cache_creation_input_tokens,
        "cache_read_input_tokens": cache_read_input_tokens,
    }
    if thinking_tokens is not None:
        usage["output_tokens_details"] = {"thinking_tokens": thinking_tokens}
    return Reply(
        200,
        {
            "id": f"msg_fake{next(_ids):04d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": list(content),
            "stop_reason": stop_reason or ("tool_use" if has_tool else "end_turn"),
            "stop_sequence": None,
            "usage": usage,
        },
    )


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


# ---- OpenAI builders -------------------------------------------------------------------------


def openai_tool_call(
    name: str, arguments: dict[str, Any] | str, id: str | None = None
) -> dict[str, Any]:
    return {
        "id": id or f"call_fake{next(_ids):04d}",
        "type": "function",
        "function": {
            "name": name,
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def chat_completion(
    content: str | None = None,
    *tool_calls: dict[str, Any],
    reasoning_content: str | None = None,
    model: str = "gpt-test-model",
    finish_reason: str | None = None,
    prompt_tokens: int = 150,
    completion_tokens: int = 30,
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    return Reply(
        200,
        {
            "id": f"chatcmpl-fake{next(_ids):04d}",
            "object": "chat.completion",
            "created": 1_764_000_000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
            },
        },
    )


def openai_error(
    status: int, message: str, kind: str, code: str | None = None, **headers: str
) -> Reply:
    return Reply(
        status,
        {"error": {"message": message, "type": kind, "param": None, "code": code}},
        {k.replace("_", "-"): v for k, v in headers.items()},
    )


def rate_limited_openai() -> Reply:
    return openai_error(
        429,
        "Rate limit reached for requests",
        "requests",
        "rate_limit_exceeded",
        retry_after="0",
        retry_after_ms="5",
    )


# ---- the server ------------------------------------------------------------------------------


class _Rejected(Exception):
    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.body)
        self.reply = reply


def _bad_anthropic(message: str) -> _Rejected:
    return _Rejected(anthropic_error(400, "invalid_request_error", message))


def _bad_openai(message: str, param: str | None = None) -> _Rejected:
    reply = openai_error(400, message, "invalid_request_error")
    reply.body["error"]["param"] = param
    return _Rejected(reply)


class FakeProviderServer:
    """Scriptable fake of both APIs. Use as a context manager (or start()/stop())."""

    def __init__(
        self,
        *,
        anthropic_key: str = ANTHROPIC_KEY,
        openai_key: str = OPENAI_KEY,
        adaptive_only_models: frozenset[str] = frozenset({"claude-opus-4-7"}),
        require_reasoning_content_back: bool = False,
    ) -> None:
        self.anthropic_key = anthropic_key
        self.openai_key = openai_key
        self.adaptive_only_models = adaptive_only_models
        self.require_reasoning_content_back = require_reasoning_content_back
        self.requests: list[Recorded] = []
        self._anthropic: deque[Reply] = deque()
        self._openai: deque[Reply] = deque()
        self._signatures: dict[str, str] = {}
        self._redacted: set[str] = set()
        self._reasoning_by_call: dict[str, str] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --
    def start(self) -> FakeProviderServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = fake._handle(self.path, headers, body)
                data = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeProviderServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def anthropic_base_url(self) -> str:
        """For `AsyncAnthropic(base_url=...)` (the SDK appends /v1/messages)."""
        return self.base_url

    @property
    def openai_base_url(self) -> str:
        """For `AsyncOpenAI(base_url=...)` (includes /v1)."""
        return self.base_url + "/v1"

    # -- scripting --
    def script_anthropic(self, *replies: Reply) -> None:
        with self._lock:
            self._anthropic.extend(replies)

    def script_openai(self, *replies: Reply) -> None:
        with self._lock:
            self._openai.extend(replies)

    def bodies(self, path_suffix: str = "") -> list[dict[str, Any]]:
        """Bodies of the requests (to one API, by path suffix) in arrival order."""
        return [r.body for r in self.requests if r.path.endswith(path_suffix)]

    @property
    def pending(self) -> int:
        return len(self._anthropic) + len(self._openai)

    # -- handling --
    def _handle(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        record = Recorded(path, headers, body)
        with self._lock:
            self.requests.append(record)
            try:
                if path.rstrip("/").endswith("/v1/messages"):
                    self._check_anthropic(headers, body)
                    reply = self._next(self._anthropic)
                    if reply.status == 200:
                        self._sign(reply.body)
                elif path.rstrip("/").endswith("/v1/chat/completions"):
                    self._check_openai(headers, body)
                    reply = self._next(self._openai)
                    if reply.status == 200:
                        self._remember_reasoning(reply.body)
                else:
                    reply = Reply(404, {"error": {"message": f"no route {path}"}})
            except _Rejected as rejected:
                reply = rejected.reply
        record.status = reply.status
        return reply

    @staticmethod
    def _next(queue: deque[Reply]) -> Reply:
        if not queue:
            # 400, not 5xx: the SDK must not retry into an empty script.
            return Reply(
                400,
                {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": "fake server: no scripted response left",
                    },
                },
            )
        return queue.popleft()

    def _sign(self, message: dict[str, Any]) -> None:
        for block in message.get("content", []):
            if block.get("type") == "thinking" and "signature" not in block:
                digest = hashlib.sha256(block["thinking"].encode()).hexdigest()[:24]
                block["signature"] = f"sig_{digest}"
            if block.get("type") == "thinking":
                self._signatures[block["signature"]] = block["thinking"]
            if block.get("type") == "redacted_thinking":
                self._redacted.add(block["data"])

    def _remember_reasoning(self, completion: dict[str, Any]) -> None:
        message = completion["choices"][0]["message"]
        for call in message.get("tool_calls") or []:
            if message.get("reasoning_content"):
                self._reasoning_by_call[call["id"]] = message["reasoning_content"]

    def _check_anthropic(self, headers: dict[str, str], body: dict[str, Any]) -> None:
        # Older SDKs send the key as x-api-key, newer ones as a bearer token; accept either.
        keys = {headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")}
        if self.anthropic_key not in keys:
            raise _Rejected(anthropic_error(401, "authentication_error", "invalid x-api-key"))
        if "anthropic-version" not in headers:
            raise _bad_anthropic("anthropic-version: header is required")
        for key in ("model", "max_tokens", "messages"):
            if key not in body:
                raise _bad_anthropic(f"{key}: Field required")
        config = body.get("thinking") or {}
        kind = config.get("type")
        choice = (body.get("tool_choice") or {}).get("type", "auto")
        if kind == "enabled":
            if body["model"] in self.adaptive_only_models:
                raise _bad_anthropic(ENABLED_THINKING_UNSUPPORTED)
            budget = config.get("budget_tokens")
            if not isinstance(budget, int) or budget < 1024:
                raise _bad_anthropic(BUDGET_TOO_SMALL)
            if body["max_tokens"] <= budget:
                raise _bad_anthropic(MAX_TOKENS_NOT_ABOVE_BUDGET)
        elif kind not in (None, "disabled", "adaptive"):
            raise _bad_anthropic(f"thinking.type: Input tag '{kind}' found is not valid")
        effort = (body.get("output_config") or {}).get("effort")
        if effort is not None and effort not in ("low", "medium", "high", "xhigh", "max"):
            raise _bad_anthropic(
                "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"
            )
        thinking_on = kind in ("enabled", "adaptive")
        if thinking_on and choice in ("any", "tool"):
            raise _bad_anthropic(THINKING_WITH_FORCED_TOOL)
        if choice not in ("auto", "any", "tool", "none"):
            raise _bad_anthropic(f"tool_choice.type: Input tag '{choice}' found is not valid")
        self._check_anthropic_messages(body["messages"], thinking_on)

    def _check_anthropic_messages(self, messages: list[dict[str, Any]], thinking_on: bool) -> None:
        if not messages or messages[0].get("role") != "user":
            raise _bad_anthropic('messages: first message must use the "user" role')
        for i, (a, b) in enumerate(itertools.pairwise(messages)):
            if a.get("role") == b.get("role"):
                raise _bad_anthropic(
                    f'messages: roles must alternate between "user" and "assistant", but found '
                    f'multiple "{a.get("role")}" roles in a row (at {i + 1})'
                )
        last_assistant = max(
            (i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None
        )
        for i, message in enumerate(messages):
            content = message.get("content")
            blocks = content if isinstance(content, list) else []
            if message.get("role") == "assistant":
                if not blocks:
                    raise _bad_anthropic(f"messages.{i}: all messages must have non-empty content")
                for j, block in enumerate(blocks):
                    if block.get("type") == "thinking":
                        sig = block.get("signature")
                        if self._signatures.get(sig or "") != block.get("thinking"):
                            raise _bad_anthropic(
                                f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                            )
                    if (
                        block.get("type") == "redacted_thinking"
                        and block.get("data") not in self._redacted
                    ):
                        raise _bad_anthropic(
                            f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block"
                        )
                uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
                if uses:
                    nxt = messages[i + 1] if i + 1 < len(messages) else {}
                    nxt_content = nxt.get("content")
                    nxt_blocks = nxt_content if isinstance(nxt_content, list) else []
                    answered = {
                        b.get("tool_use_id") for b in nxt_blocks if b.get("type") == "tool_result"
                    }
                    missing = [u for u in uses if u not in answered]
                    if missing:
                        raise _bad_anthropic(
                            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                            f"immediately after: {', '.join(missing)}. Each `tool_use` block must "
                            "have a corresponding `tool_result` block in the next message."
                        )
                if thinking_on and i == last_assistant and uses:
                    first = blocks[0].get("type")
                    if first not in ("thinking", "redacted_thinking"):
                        raise _bad_anthropic(
                            f"messages.{i}.content.0.type: "
                            + FINAL_ASSISTANT_NEEDS_THINKING.format(found=first)
                        )

    def _check_openai(self, headers: dict[str, str], body: dict[str, Any]) -> None:
        if headers.get("authorization") != f"Bearer {self.openai_key}":
            raise _Rejected(
                openai_error(
                    401,
                    "Incorrect API key provided. You can find your API key at "
                    "https://platform.openai.com/account/api-keys.",
                    "invalid_request_error",
                    "invalid_api_key",
                )
            )
        for key in ("model", "messages"):
            if key not in body:
                raise _bad_openai(f"Missing required parameter: '{key}'.", key)
        tools = body.get("tools")
        if "tool_choice" in body and not tools:
            raise _bad_openai(
                "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                "specified.",
                "tool_choice",
            )
        if "parallel_tool_calls" in body and not tools:
            raise _bad_openai(
                "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed "
                "when 'tools' are specified.",
                "parallel_tool_calls",
            )
        choice = body.get("tool_choice")
        if isinstance(choice, str) and choice not in ("auto", "required", "none"):
            raise _bad_openai(f"Invalid value: '{choice}'.", "tool_choice")
        messages = body["messages"]
        pending: list[str] = []
        for i, message in enumerate(messages):
            role = message.get("role")
            if role == "tool":
                if message.get("tool_call_id") not in pending:
                    raise _bad_openai(
                        "Invalid parameter: messages with role 'tool' must be a response to a "
                        "preceeding message with 'tool_calls'.",
                        f"messages.[{i}].role",
                    )
                pending.remove(message["tool_call_id"])
                continue
            if pending:
                raise _bad_openai(
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                    f"response messages: {', '.join(pending)}",
                    "messages",
                )
            if role == "assistant":
                for call in message.get("tool_calls") or []:
                    pending.append(call["id"])
                    want = self._reasoning_by_call.get(call["id"])
                    if (
                        self.require_reasoning_content_back
                        and want is not None
                        and (message.get("reasoning_content") != want)
                    ):
                        raise _bad_openai(
                            "thinking is enabled but reasoning_content is missing in assistant "
                            f"tool call message at index {i}",
                            "messages",
                        )
