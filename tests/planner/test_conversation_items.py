"""Stored items load back identical: signatures and encrypted reasoning byte for byte."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.conversation.items import (
    AssistantText,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
    dumps_item,
    item_from_dict,
    item_to_dict,
    loads_item,
)

# Opaque values with every character class that a careless encoder could alter.
SIGNATURE = 'EqQBCkYIBxgCKkB+/=\u00e9\\"quoted"\n\t\u2028end=='
ENCRYPTED = "gAAAAABo" + "x/+=" * 50 + "\u0000\ud7ff"


def test_round_trip_keeps_every_item_exactly() -> None:
    items: list[SessionItem] = [
        UserObservation("screen A", condensed="Settings"),
        UserObservation("Call a tool.", kind="instruction"),
        Reasoning("anthropic", "msg_1", text="I think… ✓", signature=SIGNATURE),
        Reasoning("anthropic", "msg_1", redacted_data="RED+/=" + SIGNATURE),
        Reasoning("anthropic", "msg_1", text="", signature="sig-only"),
        Reasoning(
            "openai", "resp_1", encrypted_content=ENCRYPTED, item_id="rs_1", summary=("a", "b")
        ),
        AssistantText(
            "openai",
            "resp_1",
            "Opening settings.",
            item_id="msg_9",
            wire={"type": "message", "id": "msg_9", "phase": "commentary", "content": []},
        ),
        ToolCall("anthropic", "msg_1", "toolu_1", "tap", {"element_id": "e1", "x": 1.5}),
        ToolCall(
            "openai", "resp_1", "call_1", "tap", {"x": 1}, raw_arguments='{"x":1 }', item_id="fc_1"
        ),
        ToolResult("toolu_1", "ok", is_error=False),
        ToolResult("call_1", "boom", is_error=True),
    ]
    for item in items:
        text = dumps_item(item)
        back = loads_item(text)
        assert back == item
        assert dumps_item(back) == text
    sig = loads_item(dumps_item(items[2]))
    assert isinstance(sig, Reasoning)
    assert sig.signature is not None
    assert sig.signature.encode("utf-8", "surrogatepass") == SIGNATURE.encode(
        "utf-8", "surrogatepass"
    )
    enc = loads_item(dumps_item(items[5]))
    assert isinstance(enc, Reasoning)
    assert enc.encrypted_content == ENCRYPTED
    raw = loads_item(dumps_item(items[8]))
    assert isinstance(raw, ToolCall)
    assert raw.raw_arguments == '{"x":1 }'


def test_dict_form_is_flat_and_typed() -> None:
    item = Reasoning("openai", "r", encrypted_content="E", item_id="rs", summary=("s",))
    data = item_to_dict(item)
    assert data == {
        "type": "reasoning",
        "provider": "openai",
        "turn_id": "r",
        "text": "",
        "signature": None,
        "redacted_data": None,
        "encrypted_content": "E",
        "item_id": "rs",
        "summary": ["s"],
        "wire": None,
    }
    assert item_from_dict(json.loads(json.dumps(data))) == item
    # The model that wrote Claude thinking travels in its provider: a replica from before it
    # was recorded reads such an item as another provider's reasoning instead of failing.
    claude = Reasoning("anthropic", "t", text="hm", signature="S", model="claude-opus-4-8")
    stored = item_to_dict(claude)
    assert stored["provider"] == "anthropic/claude-opus-4-8" and "model" not in stored
    assert item_from_dict(json.loads(json.dumps(stored))) == claude
    # stored before reasoning recorded its model: loads, as the current model's
    assert item_from_dict({**stored, "provider": "anthropic"}) == replace(claude, model=None)
    # So does the model of a block kept as received (it may be bound to it, as a signature
    # is); text the model wrote keeps its form from before.
    kept = AssistantText("anthropic", "t", "", wire={"type": "compaction"}, model="claude-x-1")
    stored = item_to_dict(kept)
    assert stored["provider"] == "anthropic/claude-x-1" and "model" not in stored
    assert item_from_dict(json.loads(json.dumps(stored))) == kept
    assert "model" not in item_to_dict(AssistantText("anthropic", "t", "Tap."))
    # written by a newer replica (a rolling deploy): fields this version does not know are
    # left out, not a reason to fail the step
    assert item_from_dict({**data, "written_by_a_newer_replica": 1}) == item


def test_unknown_or_malformed_items_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown session item type"):
        item_from_dict({"type": "message"})
    with pytest.raises(ValueError, match="malformed"):
        item_from_dict({"type": "tool_result", "output": "x"})


# --- what a turn keeps of a sensitive input_text call --------------------------------------


@pytest.mark.parametrize("flag", [True, "true", 1, "yes"])
def test_any_sensitive_flag_but_false_masks_the_text(flag: object) -> None:
    from planner.vendors.base import mask_sensitive

    masked = mask_sensitive("input_text", {"text": "hunter2", "sensitive": flag})
    assert masked["text"] != "hunter2"
    plain = {"text": "hello", "sensitive": False}
    assert mask_sensitive("input_text", plain) is plain
    assert mask_sensitive("input_text", {"text": "hello"})["text"] == "hello"


def test_unreadable_responses_input_text_arguments_are_not_kept_raw() -> None:
    from planner.vendors.openai.responses import items_from_response

    broken = '{"text": "hunter2", "sensitive": true'  # cut off: not valid JSON
    output = [
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c1",
            "name": "input_text",
            "arguments": broken,
        }
    ]
    (call,) = items_from_response({"id": "resp_1", "output": output})
    assert isinstance(call, ToolCall)
    assert "hunter2" not in dumps_item(call)
