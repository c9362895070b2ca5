"""The OpenAI Responses wire format (session mode): stateless request body, reply → items,
usage, stream events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from planner.conversation.items import AssistantItem, AssistantText, Reasoning
from planner.decision import Usage
from planner.settings import THINKING_MAX_TOKENS
from planner.tools import ToolSpec
from planner.vendors.base import LiveBlocks, ThinkingSink, live_blocks
from planner.vendors.failures import FailedResponse, StreamError
from planner.vendors.openai.calls import CONTENT_FILTERED, arguments_text, function_call
from planner.vendors.openai.responses_projection import request_flags
from planner.vendors.streaming import IncompleteStream, event_dict


def request_params(
    *,
    model: str,
    system: str,
    input_items: list[dict[str, Any]],
    tools: Sequence[ToolSpec],
    effort: str | None,
    summaries: bool,
    forced: bool,
    max_tokens: int,
) -> dict[str, Any]:
    """The request body: stateless (`store=false`; encrypted reasoning included when the request
    reasons). `effort` is None for a model that takes no reasoning parameters (they reject them,
    and the include with them); `none` asks a reasoning model not to reason, any other effort
    gets room for the reasoning tokens, which count toward `max_output_tokens`."""
    params: dict[str, Any] = {
        "model": model,
        "instructions": system,
        "input": input_items,
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": False,
            }
            for t in tools
        ],
        "tool_choice": "required" if forced else "auto",
        "parallel_tool_calls": False,
        "max_output_tokens": max_tokens,
        **request_flags(reasoning=effort is not None),
    }
    if effort is not None:
        params["reasoning"] = {"effort": effort}
        if effort != "none":
            params["max_output_tokens"] = max(max_tokens, THINKING_MAX_TOKENS)
        if summaries:
            params["reasoning"]["summary"] = "auto"
    return params


def items_from_response(response: Mapping[str, Any]) -> list[AssistantItem]:
    """A response's output items as session items, in their order, nothing rewritten (the
    function-call arguments string is kept byte for byte, except a masked sensitive value and
    unreadable input_text arguments, which may hold the text)."""
    turn_id = str(response.get("id") or "")
    out: list[AssistantItem] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "reasoning":
            out.append(
                Reasoning(
                    "openai",
                    turn_id,
                    text="\n".join(c.get("text", "") for c in item.get("content") or []),
                    encrypted_content=item.get("encrypted_content"),
                    item_id=item.get("id"),
                    summary=tuple(s.get("text", "") for s in item.get("summary") or []),
                    wire=dict(item),
                )
            )
        elif kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    out.append(
                        AssistantText(
                            "openai", turn_id, part.get("text", ""), item.get("id"), dict(item)
                        )
                    )
        elif kind == "function_call":
            out.append(
                function_call(
                    turn_id,
                    call_id=str(item.get("call_id") or ""),
                    name=str(item.get("name") or ""),
                    raw=arguments_text(item.get("arguments")),
                    item_id=item.get("id"),
                    wire=dict(item),
                )
            )
    return out


def refusal(response: Mapping[str, Any]) -> str | None:
    """The text of the response's `refusal` content parts (the model declined), words saying
    the content filter stopped it (`status: incomplete`, `incomplete_details.reason:
    "content_filter"`), or None for an answer."""
    texts = [
        str(part.get("refusal") or "").strip()
        for item in response.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content") or []
        if part.get("type") == "refusal"
    ]
    details = response.get("incomplete_details") or {}
    filtered = response.get("status") == "incomplete" and details.get("reason") == "content_filter"
    if filtered:
        texts.append(CONTENT_FILTERED + " (incomplete: content_filter)")
    if not texts:
        return None
    return "; ".join(t for t in texts if t) or "no reason given"


def usage_from(usage: Mapping[str, Any] | None) -> Usage:
    u = usage or {}
    details = u.get("input_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    written = int(details.get("cache_write_tokens") or 0)
    reasoning = (u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
    # Responses counts the tokens read from the cache and those written to it (billed at their
    # own rates from GPT-5.6 on) inside `input_tokens`: they are reported apart (as Anthropic's
    # usage is), so each input token is priced once, at its own rate.
    return Usage(
        input_tokens=int(u.get("input_tokens") or 0) - cached - written,
        output_tokens=int(u.get("output_tokens") or 0),
        cache_read_input_tokens=cached,
        cache_creation_input_tokens=written,
        thinking_tokens=int(reasoning),
    )


def raw_calls(response: Mapping[str, Any]) -> list[Any]:
    """Each call's arguments string exactly as the model sent it (for execution only), in the
    order of the function_call items. A list, not keyed by call_id: two may share one."""
    return [
        i.get("arguments") for i in response.get("output") or [] if i.get("type") == "function_call"
    ]


class ResponsesStreamAccumulator:
    """Builds a Responses response dict from its stream events.

    Items are taken from `response.output_item.done` (the `…added` copy of a reasoning item may
    carry incomplete encrypted content); the envelope (id, model, usage) from `response.completed`.
    The API sends each item's `done` before the terminal event, whose response holds the whole
    output too; an item a compatible server sent no event for (it may send none at all, only
    the terminal one) is taken from there: it used to be lost (an answer without output, or
    without its call).
    """

    def __init__(self, on_thinking: ThinkingSink | LiveBlocks | None = None) -> None:
        self._live = live_blocks(on_thinking)
        self._call = object()  # this answer's summaries, apart from another call's in the view
        self._items: dict[int, dict[str, Any]] = {}
        self._response: dict[str, Any] | None = None
        self._failed: dict[str, Any] = {}

    def reported(self) -> tuple[str, Mapping[str, Any]] | None:
        """The model and usage a response that failed reported (`response.failed`, or a
        failed response not streamed: `check`), else None: the Responses stream reports usage
        only in its terminal event, so a stream cut off before one (a hang-up, an `error`
        event, a dropped connection) is not known to have cost anything."""
        usage = self._failed.get("usage")
        if not isinstance(usage, Mapping):
            return None
        return str(self._failed.get("model") or ""), usage

    def feed(self, event: Any) -> None:
        data = event_dict(event)
        kind = data.get("type")
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            part = data.get("summary_index", data.get("content_index"))
            self._live.show(
                (self._call, data.get("output_index"), part), str(data.get("delta") or "")
            )
        elif kind == "response.output_item.done":
            self._items[int(data["output_index"])] = dict(data["item"])
        elif kind in ("response.completed", "response.incomplete"):
            self._response = dict(data["response"])
        elif kind == "error":
            # Documented flat (`code`, `message` on the event); the live API nests them in
            # `error` (`{"type": "error", "error": {"type", "code", "message"}}`).
            nested = data.get("error")
            error = nested if isinstance(nested, dict) else data
            raise StreamError(
                f"the Responses stream failed: {error.get('message') or data}",
                str(error.get("code") or error.get("type") or "") or None,
            )
        elif kind == "response.failed":
            # The stream ended as the API ends one: a response that failed, as `check` reads
            # one not streamed, not a stream cut off.
            self.check(dict(data.get("response") or {}) | {"status": "failed"})

    def check(self, response: Mapping[str, Any]) -> None:
        """Raise `FailedResponse` for a response that says it failed: OpenAI answers one with
        HTTP 200 and `status: "failed"`, or ends a stream with it (`response.failed`), and its
        output may hold a function call the model never finished. What it reports of its usage
        is kept (`reported`)."""
        if response.get("status") != "failed":
            return
        self._failed = dict(response)
        error = response.get("error") or {}
        raise FailedResponse(
            f"the response failed: {error.get('message') or 'no reason given'}",
            str(error.get("code") or "") or None,
        )

    def response(self) -> dict[str, Any]:
        """The complete response. Raises IncompleteStream if `response.completed` never came."""
        if self._response is None:
            raise IncompleteStream(
                "the Responses stream ended before response.completed; the partial turn is "
                "discarded"
            )
        final = list(self._response.get("output") or [])
        indices = sorted(set(self._items) | set(range(len(final))))
        return {
            **self._response,
            "output": [self._items[i] if i in self._items else final[i] for i in indices],
        }


def truncated(response: Mapping[str, Any]) -> bool:
    """The response stopped at the output token limit (`status: incomplete`)."""
    details = response.get("incomplete_details") or {}
    return response.get("status") == "incomplete" and details.get("reason") in (
        None,
        "max_output_tokens",
    )


def cut_short(response: Mapping[str, Any]) -> str | None:
    """Why the provider ended the response unfinished where more output room cannot help and
    it is no refusal: `incomplete` for another reason than the output limit (`truncated`) or
    the content filter (`refusal`) — `max_messages`, `steered` (a WebSocket steer, which no
    call of the planner sends) or a reason newer than this code — or a status that is no
    finished response (`cancelled`, `queued`, `in_progress`; `failed` raises in `check`).
    Its output may hold a call the model never finished. None for a completed response, and
    for one without a status (some compatible servers leave it out)."""
    status = response.get("status")
    if status in (None, "completed", "failed"):
        return None
    if status != "incomplete":
        return f"status {status}"
    reason = (response.get("incomplete_details") or {}).get("reason")
    return (
        None if reason in (None, "max_output_tokens", "content_filter") else f"incomplete: {reason}"
    )


def readable_thinking(response: Mapping[str, Any]) -> Literal["full", "summarized"]:
    """Reasoning text (`content`) is the model's own; otherwise only summaries are readable."""
    for item in response.get("output") or []:
        if item.get("type") == "reasoning" and any(
            c.get("text") for c in item.get("content") or []
        ):
            return "full"
    return "summarized"
