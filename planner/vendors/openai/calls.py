"""A function call as OpenAI sends it (arguments as a JSON string), in both OpenAI wire formats."""

from __future__ import annotations

import json
from typing import Any

from planner.conversation.items import ToolCall
from planner.vendors.base import mask_sensitive, sendable

#: The refusal reason of an answer OpenAI's content filter stopped (Chat `finish_reason:
#: "content_filter"`, Responses `incomplete_details.reason: "content_filter"`).
CONTENT_FILTERED = "the content filter stopped the answer"


def arguments_text(value: Any) -> str:
    """A call's `arguments` as the JSON text OpenAI sends: as it is, or, where an
    OpenAI-compatible server sent the object itself, its JSON. Kept as `str(value)`, an object
    became its Python repr ("{'element_id': 'e99'}"): the corrective turn sent that back as
    the call's arguments, no JSON (compatible servers refuse it) and not what ran."""
    if value is None or isinstance(value, str):
        return value or ""
    return json.dumps(value, ensure_ascii=False)


def sent_arguments(call: ToolCall) -> str:
    """A stored call's arguments as they go back (Chat and Responses alike): as stored when
    they are a JSON object, else the JSON of its parsed `arguments`. `function_call` keeps such
    arguments as `{}` when a call is read, but a session stored before that still holds the
    model's broken text, and vLLM and SGLang answer 400 to every later request sending it."""
    raw = call.raw_arguments
    if raw is not None and _is_json_object(raw):
        return raw
    return json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))


def _is_json_object(raw: str) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except json.JSONDecodeError:
        return False


def function_call(
    turn_id: str,
    *,
    call_id: str,
    name: str,
    raw: str,
    item_id: str | None = None,
    wire: dict[str, Any] | None = None,
) -> ToolCall:
    """The call as an item. The arguments string is kept byte for byte (it goes back to OpenAI
    exactly as the model wrote it), except a masked sensitive value, kept as the masked JSON,
    and arguments that are no JSON object (cut off, malformed, a bare value, empty), kept as
    `{}`: they go back in the corrective turn and the session history, and vLLM and SGLang
    parse every assistant call's arguments and answer 400 to the whole request when they do
    not parse. What was wrong with them goes back in the correction (`parse_tool_call` reads
    the model's own text from `Turn.raw_calls`); an unreadable input_text may hold the text."""
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        parsed = None
    args = sendable(parsed) if isinstance(parsed, dict) else {}
    masked = mask_sensitive(name, args)
    if masked is not args or not isinstance(parsed, dict) or not raw.strip():
        raw = json.dumps(masked, ensure_ascii=False)
    return ToolCall(
        "openai",
        turn_id,
        call_id,
        name,
        masked,
        raw_arguments=raw,
        item_id=item_id,
        wire={**wire, "arguments": raw} if wire is not None else None,
    )
