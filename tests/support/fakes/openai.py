"""Fakes of the two OpenAI wire formats the planner speaks, enforcing their documented rules.

Chat Completions (`POST /v1/chat/completions`, JSON; compact mode):
- the API key; `model` and `messages` present; a model served by Responses alone refused
  (404); `tool_choice` / `parallel_tool_calls` only with
  tools, the latter not for the o-series; function tools with a reasoning effort refused for
  GPT-5.2 and later (gpt-5.6: unless the effort is `none`); every assistant `tool_calls` entry
  answered by `tool` messages right after it; with `require_reasoning_content_back` (some
  compatible reasoning servers) the assistant message of a tool call must carry back the
  `reasoning_content` it came with; with `require_json_arguments` (vLLM, SGLang: they parse
  every assistant call's arguments) each call's `arguments` must be a JSON object.

Responses (`POST /v1/responses`, JSON or SSE; session mode):
- `store` must be false; encrypted reasoning is only emitted when included, and only a
  reasoning model takes the include ("Encrypted content is not supported with this model."); a
  reasoning item must carry the encrypted content emitted for its id and be followed by the item
  that followed it ("…was provided without its required following item"), and an item sent with
  the id of one that followed a reasoning item needs that reasoning item before it ("Item 'fc_…'
  of type 'function_call' was provided without its required 'reasoning' item: 'rs_…'."); GPT-5
  and the o-series reason also when `reasoning` is left out; every function_call has its
  function_call_output and vice versa; with `require_json_arguments` each function_call's
  `arguments` must be a JSON object.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import os
import struct
import time
from collections import deque
from typing import Any, Literal

from tests.support.fakes.anthropic import ScriptedTurn
from tests.support.fakes.rules import rules_for
from tests.support.fakes.server import BAD_KEY, Answer, Rejected, Reply

_ids = itertools.count(1)
#: Codes whose nested `error` event says `invalid_request_error` (the rest: `server_error`).
_INVALID_STREAM_CODES = frozenset(
    {"context_length_exceeded", "invalid_prompt", "unsupported_parameter", "unsupported_value"}
)


# --- Chat Completions builders ---------------------------------------------------------------


def openai_tool_call(
    name: str, arguments: dict[str, Any] | str, id: str | None = None
) -> dict[str, Any]:
    return {
        "id": id if id is not None else f"call_fake{next(_ids):04d}",
        "type": "function",
        "function": {
            "name": name,
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def chat_completion(
    content: str | list[dict[str, Any]] | None = None,
    *tool_calls: dict[str, Any],
    reasoning_content: str | None = None,
    refusal: str | None = None,
    model: str = "gpt-test-model",
    finish_reason: str | None = None,
    prompt_tokens: int = 150,
    completion_tokens: int = 30,
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
    cache_write_tokens: int = 0,
) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
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
                "prompt_tokens_details": {
                    "cached_tokens": cached_tokens,
                    "cache_write_tokens": cache_write_tokens,
                },
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


# --- Responses builders ----------------------------------------------------------------------


def reasoning(*summary: str, content: tuple[str, ...] = ()) -> dict[str, Any]:
    """A reasoning item; `content`: its reasoning text (`reasoning_text` parts), which a
    model returns as its own thinking, not a summary."""
    return {"type": "reasoning", "summary": list(summary), "content": list(content)}


def message(value: str) -> dict[str, Any]:
    return {"type": "message", "text": value}


def refusal(value: str) -> dict[str, Any]:
    """A message whose content is a `refusal` part (the model declined)."""
    return {"type": "message", "refusal": value}


def function_call(
    name: str,
    arguments: dict[str, Any] | str,
    call_id: str | None = None,
    item_id: str | None = None,
) -> dict[str, Any]:
    """A function_call item; the fake assigns the call_id and the item id unless given."""
    call: dict[str, Any] = {"type": "function_call", "name": name, "arguments": arguments}
    if call_id is not None:
        call["call_id"] = call_id
    if item_id is not None:
        call["item_id"] = item_id
    return call


def _bad(message: str, param: str | None = None, code: str | None = None) -> Rejected:
    reply = openai_error(400, message, "invalid_request_error", code)
    reply.body["error"]["param"] = param
    return Rejected(reply, message)


_EFFORT_ORDER = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def _check_reasoning(model: str, effort: Any, param: str) -> None:
    """Reasoning parameters only for reasoning models, with an effort level they take (refused
    in the API's words: Chat Completions as quoted in livekit/agents#7169, Responses in
    openai/openai-agents-python#2089)."""
    rules = rules_for(model)
    if not rules.reasoning:
        raise _bad(f"Unsupported parameter: '{param}' is not supported with this model.", param)
    if effort is not None and effort not in rules.efforts:
        what = (
            f"'{param}' does not support '{effort}' with this model"
            if param == "reasoning_effort"
            else f"'{effort}' is not supported with the '{model}' model"
        )
        takes = ", ".join(f"'{e}'" for e in _EFFORT_ORDER if e in rules.efforts)
        raise _bad(
            f"Unsupported value: {what}. Supported values are: {takes}.", param, "unsupported_value"
        )


def _check_output_limit(model: str, asked: Any, param: str) -> None:
    """An output limit above the model's (Chat Completions' words; Responses' alike)."""
    limit = rules_for(model).max_output_tokens
    if limit is not None and isinstance(asked, int) and asked > limit:
        raise _bad(
            f"{param} is too large: {asked}. This model supports at most {limit} completion "
            f"tokens, whereas you provided {asked}.",
            param,
            "invalid_value",
        )


def _outage(status: int) -> Reply:
    return openai_error(
        status, "The server is overloaded or not ready yet.", "server_error", retry_after_ms="5"
    )


def _model_info(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 1_764_000_000, "owned_by": "openai"}


def _check_key(key: str | None, headers: dict[str, str]) -> None:
    sent = headers.get("authorization", "").removeprefix("Bearer ")
    if (key is not None and sent != key) or (key is None and sent == BAD_KEY):
        raise Rejected(
            openai_error(
                401,
                "Incorrect API key provided. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                "invalid_api_key",
            ),
            "invalid api key",
        )


class ChatFake:
    """The Chat Completions endpoint; answers are `Reply`s given verbatim (`chat_completion`)."""

    paths: tuple[str, ...] = ("/v1/chat/completions",)

    def __init__(self, *, key: str | None = None, require_reasoning_content_back: bool = False):
        self.key = key
        self.require_reasoning_content_back = require_reasoning_content_back
        self.require_json_arguments = False
        self.script: deque[Reply] = deque()
        self._reasoning_by_call: dict[str, str] = {}

    @property
    def pending(self) -> int:
        return len(self.script)

    def check_key(self, headers: dict[str, str]) -> None:
        _check_key(self.key, headers)

    def outage(self, status: int) -> Reply:
        return _outage(status)

    def model_info(self, model: str) -> dict[str, Any]:
        return _model_info(model)

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Answer:
        self._check(body)
        if not self.script:
            raise _bad("fake server: no scripted response left")
        reply = self.script.popleft()
        if reply.status == 200:
            # any answer a test scripts, one without choices too (`choices: []`)
            for choice in reply.body.get("choices") or []:
                message_ = choice.get("message") or {}
                for call in message_.get("tool_calls") or []:
                    if message_.get("reasoning_content"):
                        self._reasoning_by_call[call["id"]] = message_["reasoning_content"]
        return Answer(reply.status, reply.body, reply.headers)

    @staticmethod
    def _check_tools_with_effort(model: str, tools: bool, effort: Any) -> None:
        """GPT-5.2 to 5.5 refuse function tools with a reasoning effort on Chat Completions;
        gpt-5.6 refuses them unless the effort is explicitly `none` (see `rules.py`)."""
        rule = rules_for(model).chat_tools_effort
        if not tools or rule == "any" or effort == "none":
            return
        head = (
            f"Function tools with reasoning_effort are not supported for {model} in "
            "/v1/chat/completions."
        )
        if rule == "none":
            raise _bad(
                f"{head} To use function tools, use /v1/responses or set reasoning_effort to "
                "'none'.",
                "reasoning_effort",
            )
        if effort is not None:
            raise _bad(f"{head} Please use /v1/responses instead.", "reasoning_effort")

    def _check(self, body: dict[str, Any]) -> None:
        for key in ("model", "messages"):
            if key not in body:
                raise _bad(f"Missing required parameter: '{key}'.", key)
        if rules_for(str(body["model"])).responses_only:
            reply = openai_error(
                404,
                "This model is only supported in v1/responses and not in v1/chat/completions.",
                "invalid_request_error",
            )
            reply.body["error"]["param"] = "model"
            raise Rejected(reply, "model only on v1/responses")
        tools = body.get("tools")
        for param in ("tool_choice", "parallel_tool_calls"):
            if param in body and not tools:
                raise _bad(
                    f"Invalid value for '{param}': '{param}' is only allowed when 'tools' are "
                    "specified.",
                    param,
                )
        choice = body.get("tool_choice")
        if isinstance(choice, str) and choice not in ("auto", "required", "none"):
            raise _bad(f"Invalid value: '{choice}'.", "tool_choice")
        if "parallel_tool_calls" in body and not rules_for(str(body["model"])).parallel_tool_calls:
            raise Rejected(
                openai_error(
                    400,
                    "Unsupported parameter: 'parallel_tool_calls' is not supported with this "
                    "model.",
                    "invalid_request_error",
                    "unsupported_parameter",
                ),
                "unsupported parameter: parallel_tool_calls",
            )
        for param in ("max_tokens", "max_completion_tokens"):
            _check_output_limit(str(body["model"]), body.get(param), param)
        if "reasoning_effort" in body:
            _check_reasoning(str(body["model"]), body["reasoning_effort"], "reasoning_effort")
        self._check_tools_with_effort(str(body["model"]), bool(tools), body.get("reasoning_effort"))
        pending: list[str] = []
        for i, msg in enumerate(body["messages"]):
            role = msg.get("role")
            if role == "tool":
                if msg.get("tool_call_id") not in pending:
                    raise _bad(
                        "Invalid parameter: messages with role 'tool' must be a response to a "
                        "preceeding message with 'tool_calls'.",
                        f"messages.[{i}].role",
                    )
                pending.remove(msg["tool_call_id"])
                continue
            if pending:
                raise _bad(
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                    f"response messages: {', '.join(pending)}",
                    "messages",
                )
            if role == "assistant":
                for call in msg.get("tool_calls") or []:
                    pending.append(call["id"])
                    if self.require_json_arguments:
                        _check_json_object(call["function"]["arguments"], i)
                    want = self._reasoning_by_call.get(call["id"])
                    if (
                        self.require_reasoning_content_back
                        and want is not None
                        and msg.get("reasoning_content") != want
                    ):
                        raise _bad(
                            "thinking is enabled but reasoning_content is missing in assistant "
                            f"tool call message at index {i}",
                            "messages",
                        )


def _check_json_object(arguments: Any, index: int, param: str = "messages") -> None:
    """What a compatible server that parses the arguments of the calls it is sent back
    refuses (the request's 400 in the fake's words)."""
    try:
        parsed = json.loads(arguments)
    except (TypeError, json.JSONDecodeError) as err:
        parsed = err
    if not isinstance(parsed, dict):
        raise _bad(
            f"{param}[{index}]: tool call arguments are not a JSON object: {arguments!r}",
            param,
        )


class ResponsesFake:
    """The Responses endpoint; answers are `ScriptedTurn`s of reasoning / message /
    function_call specs (or `Reply`s), rendered with signed encrypted reasoning."""

    paths: tuple[str, ...] = ("/v1/responses",)

    def __init__(self, *, key: str | None = None, signing_key: bytes = b"amc-fake-provider"):
        self.key = key
        self.signing_key = signing_key
        self.error_event_shape: Literal["nested", "flat"] = "nested"
        # False: the organisation is not verified, and asking for reasoning summaries is a 400.
        self.summaries_allowed = True
        # False: the organisation is not verified, and streaming a reasoning model is a 400.
        self.streaming_allowed = True
        #: True: a compatible server (vLLM, SGLang) that parses every function_call's arguments.
        self.require_json_arguments = False
        self.script: deque[ScriptedTurn | Reply] = deque()
        self._encrypted: dict[str, str] = {}
        self._following: dict[str, str | None] = {}
        #: Output item id → the reasoning item before it, which must come before it in input.
        self._needs_reasoning: dict[str, str] = {}

    @property
    def pending(self) -> int:
        return len(self.script)

    def check_key(self, headers: dict[str, str]) -> None:
        _check_key(self.key, headers)

    def outage(self, status: int) -> Reply:
        return _outage(status)

    def model_info(self, model: str) -> dict[str, Any]:
        return _model_info(model)

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

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Answer:
        if body.get("store") is not False:
            raise _bad("fake server: requests must be stateless (store=false)")
        if body.get("stream"):
            self._check_stream(str(body.get("model")))
        _check_output_limit(
            str(body.get("model")), body.get("max_output_tokens"), "max_output_tokens"
        )
        include = body.get("include") or []
        if (
            "reasoning.encrypted_content" in include
            and not rules_for(str(body.get("model"))).reasoning
        ):
            raise _bad("Encrypted content is not supported with this model.", "include")
        if body.get("reasoning") is not None:
            _check_reasoning(
                str(body.get("model")), body["reasoning"].get("effort"), "reasoning.effort"
            )
            if body["reasoning"].get("summary") is not None and not self.summaries_allowed:
                unverified = openai_error(
                    400,
                    "Your organization must be verified to generate reasoning summaries. Please "
                    "go to: https://platform.openai.com/settings/organization/general and click "
                    "on Verify Organization.",
                    "invalid_request_error",
                    "unsupported_value",
                )
                unverified.body["error"]["param"] = "reasoning.summary"
                raise Rejected(unverified, "organization not verified for reasoning summaries")
        self._check_input(body.get("input") or [])
        if not self.script:
            raise _bad("fake server: no scripted Responses turn left")
        entry = self.script.popleft()
        if isinstance(entry, Reply):
            return Answer(entry.status, entry.body, entry.headers)
        if entry.fail is not None and not body.get("stream") and not entry.failed_event:
            code, text_ = entry.fail
            reply = openai_error(500, text_, "server_error", code)
            return Answer(reply.status, reply.body)
        response = self._render(entry, body)
        if entry.fail is not None and entry.failed_event:
            code, text_ = entry.fail
            response = {**response, "status": "failed", "error": {"code": code, "message": text_}}
        if body.get("stream"):
            events = self._events(response, interrupt=entry.interrupt, items=entry.item_events)
            if entry.fail is not None and entry.failed_event:
                end = {"type": "response.failed", "sequence_number": len(events) - 1}
                events = [*events[:-1], ("response.failed", {**end, "response": response})]
            elif entry.fail is not None:
                events = [*events[:1], ("error", self._error_event(*entry.fail))]
            return Answer(events=events)
        return Answer(body=response)

    def _check_stream(self, model: str) -> None:
        """`stream: true` refused: by a model that never streams, or to an organisation not
        verified (the body OpenAI sends for GPT-5 and o3: danny-avila/LibreChat#6926,
        continuedev/continue#7129)."""
        if not rules_for(model).streams:
            never = openai_error(
                400,
                "Unsupported value: 'stream' does not support true with this model. Only the "
                "default (false) value is supported.",
                "invalid_request_error",
                "unsupported_value",
            )
            never.body["error"]["param"] = "stream"
            raise Rejected(never, f"{model} never streams")
        if not self.streaming_allowed and rules_for(model).reasoning:
            unverified = openai_error(
                400,
                "Your organization must be verified to stream this model. Please go to: "
                "https://platform.openai.com/settings/organization/general and click on Verify "
                "Organization. If you just verified, it can take up to 15 minutes for access to "
                "propagate.",
                "invalid_request_error",
                "unsupported_value",
            )
            unverified.body["error"]["param"] = "stream"
            raise Rejected(unverified, "organization not verified to stream")

    def _error_event(self, code: str, text_: str) -> dict[str, Any]:
        """The `error` event of a stream failing after HTTP 200. The API reference documents
        it flat (`code`, `message`, `param` on the event); the live API nests them under
        `error` (captured frames in openai/openai-dotnet#881, Effect-TS/effect#7262), which the
        SDK raises as an APIError without a status. `error_event_shape` picks one."""
        if self.error_event_shape == "flat":
            return {
                "type": "error",
                "sequence_number": 1,
                "code": code,
                "message": text_,
                "param": None,
            }
        kind = "invalid_request_error" if code in _INVALID_STREAM_CODES else "server_error"
        return {
            "type": "error",
            "sequence_number": 1,
            "error": {"type": kind, "code": code, "message": text_, "param": None},
        }

    def _render(self, turn: ScriptedTurn, body: dict[str, Any]) -> dict[str, Any]:
        reasoning_on = (
            body.get("reasoning") is not None
            or rules_for(str(body.get("model"))).reasons_when_omitted
        )
        summaries = reasoning_on and (body.get("reasoning") or {}).get("summary") is not None
        include_encrypted = "reasoning.encrypted_content" in (body.get("include") or [])
        output: list[dict[str, Any]] = []
        for spec in turn.blocks:
            kind = spec["type"]
            if kind == "reasoning":
                if not reasoning_on:
                    continue
                rid = f"rs_fake_{next(_ids):04d}"
                output.append(
                    {
                        "type": "reasoning",
                        "id": rid,
                        "summary": [
                            {"type": "summary_text", "text": s}
                            for s in (spec["summary"] if summaries else [])
                        ],
                        "encrypted_content": self._token("rs", rid) if include_encrypted else None,
                        "status": "completed",
                        **(
                            {
                                "content": [
                                    {"type": "reasoning_text", "text": t} for t in spec["content"]
                                ]
                            }
                            if spec.get("content")
                            else {}
                        ),
                    }
                )
            elif kind == "message":
                calls_follow = any(b["type"] == "function_call" for b in turn.blocks)
                output.append(
                    {
                        "type": "message",
                        "id": f"msg_fake_{next(_ids):04d}",
                        "role": "assistant",
                        "phase": "commentary" if calls_follow else "final_answer",
                        "status": "completed",
                        "content": [
                            {"type": "refusal", "refusal": spec["refusal"]}
                            if "refusal" in spec
                            else {"type": "output_text", "text": spec["text"], "annotations": []}
                        ],
                    }
                )
            else:
                args = spec["arguments"]
                output.append(
                    {
                        "type": "function_call",
                        "id": spec.get("item_id", f"fc_fake_{next(_ids):04d}"),
                        "call_id": spec.get("call_id", f"call_fake_{next(_ids):04d}"),
                        "name": spec["name"],
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                        "status": "completed",
                    }
                )
        if not turn.interrupt:
            for n, item in enumerate(output):
                if item["type"] == "reasoning":
                    if item["encrypted_content"]:
                        self._encrypted[item["id"]] = item["encrypted_content"]
                    self._following[item["id"]] = (
                        output[n + 1]["id"] if n + 1 < len(output) else None
                    )
                    for after in output[n + 1 :]:
                        if after["type"] == "reasoning":
                            break
                        self._needs_reasoning[after["id"]] = item["id"]
        reasoning_tokens = 30 * sum(1 for o in output if o["type"] == "reasoning")
        input_tokens = len(json.dumps(body)) // 4
        return {
            "id": f"resp_fake_{next(_ids):04d}" if turn.response_id is None else turn.response_id,
            "object": "response",
            "created_at": int(time.time()),
            "model": turn.model or body.get("model", "gpt-fake"),
            "status": turn.status,
            "output": output,
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "store": False,
            "error": None,
            "incomplete_details": {"reason": turn.incomplete_reason}
            if turn.status == "incomplete"
            else None,
            "instructions": body.get("instructions"),
            "metadata": {},
            "temperature": 1.0,
            "top_p": 1.0,
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 20 + reasoning_tokens,
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": input_tokens + 20 + reasoning_tokens,
                **turn.usage,
            },
        }

    @staticmethod
    def _events(
        response: dict[str, Any], *, interrupt: bool, items: bool | tuple[int, ...] = True
    ) -> list[tuple[str, dict[str, Any]]]:
        seq = itertools.count()
        events: list[dict[str, Any]] = [
            {
                "type": "response.created",
                "sequence_number": next(seq),
                # As the API's: no usage before the stream's terminal event.
                "response": {**response, "status": "in_progress", "output": [], "usage": None},
            }
        ]
        for n, item in enumerate(response["output"]):
            if items is False or (items is not True and n not in items):
                continue
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
                    return [(e["type"], e) for e in events]
            events.append(
                {
                    "type": "response.output_item.done",
                    "sequence_number": next(seq),
                    "output_index": n,
                    "item": item,
                }
            )
        final = "response.completed" if response["status"] == "completed" else "response.incomplete"
        events.append({"type": final, "sequence_number": next(seq), "response": response})
        return [(e["type"], e) for e in events]

    def _check_input(self, items: list[dict[str, Any]]) -> None:
        calls: list[str] = []
        outputs: set[str] = set()
        sent_reasoning: set[str] = set()
        seen_ids: set[str] = set()
        for n, item in enumerate(items):
            kind = item.get("type", "message")
            if item.get("id") is not None:
                if item["id"] in seen_ids:
                    raise _bad(f"Duplicate item found with id {item['id']}.")
                seen_ids.add(str(item["id"]))
            needs = self._needs_reasoning.get(str(item.get("id")))
            if needs is not None and needs not in sent_reasoning:
                raise _bad(
                    f"Item '{item.get('id')}' of type '{kind}' was provided without its "
                    f"required 'reasoning' item: '{needs}'."
                )
            if kind == "reasoning":
                sent_reasoning.add(str(item.get("id")))
                rid = item.get("id")
                enc = item.get("encrypted_content")
                if not enc:
                    raise _bad(
                        f"Item with id '{rid}' not found. Items are not persisted when `store` is "
                        "set to false. Try again with `store` set to true, or remove this item "
                        "from your input."
                    )
                if self._encrypted.get(str(rid)) != enc or not self._valid(enc, "rs", str(rid)):
                    raise _bad(f"The encrypted content for item {rid} could not be verified.")
                want = self._following.get(str(rid))
                nxt = items[n + 1] if n + 1 < len(items) else None
                if want is None or nxt is None or nxt.get("id") != want:
                    raise _bad(
                        f"Item '{rid}' of type 'reasoning' was provided without its required "
                        "following item."
                    )
            elif kind == "function_call":
                calls.append(str(item.get("call_id")))
                if self.require_json_arguments:
                    _check_json_object(item.get("arguments"), n, "input")
            elif kind == "function_call_output":
                call_id = str(item.get("call_id"))
                if call_id not in calls:
                    raise _bad(
                        f"No tool call found for function call output with call_id {call_id}."
                    )
                outputs.add(call_id)
        for call_id in calls:
            if call_id not in outputs:
                raise _bad(f"No tool output found for function call {call_id}.")


#: Embedding models the fake knows, with their vector length (the real ones are far longer:
#: text-embedding-3-small has 1536; a short vector keeps the tests fast and changes nothing).
EMBEDDING_MODELS = {"text-embedding-3-small": 64, "text-embedding-3-large": 128}
MAX_EMBEDDING_INPUTS = 2048


def fake_embedding(text: str, size: int) -> list[float]:
    """A deterministic unit vector: each lower-case word adds to a few hashed dimensions, so
    texts that share words point the same way (what retrieval relies on), and the same text
    always gets the same vector."""
    vector = [0.0] * size
    for word in "".join(c.lower() if c.isalnum() else " " for c in text).split():
        digest = hashlib.sha256(word.encode()).digest()
        for i in range(3):
            vector[digest[i] % size] += 1.0 if digest[i + 3] % 2 else -1.0
    norm = sum(v * v for v in vector) ** 0.5 or 1.0
    return [v / norm for v in vector]


class EmbeddingsFake:
    """`POST /v1/embeddings` as documented: `input` a string or a list of 1 to 2048 non-empty
    strings, `model` an embedding model, `encoding_format` "float" or "base64" (the Python SDK
    asks for base64 unless told otherwise: little-endian float32, base64-encoded). Counts the
    texts it embedded (`embedded`)."""

    paths: tuple[str, ...] = ("/v1/embeddings",)

    def __init__(self, *, key: str | None = None) -> None:
        self.key = key
        self.embedded: list[str] = []

    @property
    def pending(self) -> int:
        return 0

    def check_key(self, headers: dict[str, str]) -> None:
        _check_key(self.key, headers)

    def outage(self, status: int) -> Reply:
        return _outage(status)

    def model_info(self, model: str) -> dict[str, Any]:
        return _model_info(model)

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Answer:
        for key in ("model", "input"):
            if key not in body:
                raise _bad(f"Missing required parameter: '{key}'.", key)
        model = body["model"]
        if model not in EMBEDDING_MODELS:
            raise _bad(f"The model `{model}` does not exist or you do not have access to it.")
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if not texts or len(texts) > MAX_EMBEDDING_INPUTS:
            raise _bad(f"'input' must have 1 to {MAX_EMBEDDING_INPUTS} items.", "input")
        if any(not isinstance(t, str) or not t for t in texts):
            raise _bad("'$.input' is invalid. Please check the API reference.", "input")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise _bad(f"Invalid value: '{fmt}'.", "encoding_format")
        size = EMBEDDING_MODELS[model]
        data = []
        for i, text in enumerate(texts):
            vector = fake_embedding(text, size)
            encoded: Any = vector
            if fmt == "base64":
                encoded = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        self.embedded.extend(texts)
        tokens = sum(len(t.split()) for t in texts)
        return Answer(
            200,
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )
