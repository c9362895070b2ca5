"""A stored session conversation as operators read it (`DecisionLogService.GetConversation`).

Every item keeps its words; what goes is the opaque material only the provider can read —
signatures, redacted data, encrypted reasoning — which is bulky and meaningless to a person.
Tool call arguments were masked when the call was committed, so a secret is not in them.
"""

from __future__ import annotations

import json

from amc.v1 import decision_log_service_pb2 as pb
from planner.conversation.items import (
    AssistantText,
    ContextCheckpoint,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)


def conversation_item(seq: int, item: SessionItem) -> pb.ConversationItem:
    """One stored item in its readable wire form."""
    out = pb.ConversationItem(seq=seq)
    if isinstance(item, UserObservation):
        observation = item.kind == "observation"
        out.kind = (
            pb.CONVERSATION_ITEM_KIND_OBSERVATION
            if observation
            else pb.CONVERSATION_ITEM_KIND_INSTRUCTION
        )
        out.text = item.text
    elif isinstance(item, Reasoning):
        out.kind = pb.CONVERSATION_ITEM_KIND_REASONING
        out.text = item.readable
        out.redacted = item.redacted_data is not None
        out.omitted = not item.readable and item.redacted_data is None
        out.provider = item.provider
    elif isinstance(item, AssistantText):
        out.kind = pb.CONVERSATION_ITEM_KIND_ASSISTANT_TEXT
        out.text = item.text
        out.provider = item.provider
    elif isinstance(item, ToolCall):
        out.kind = pb.CONVERSATION_ITEM_KIND_TOOL_CALL
        out.tool_name = item.name
        out.arguments_json = json.dumps(item.arguments, ensure_ascii=False, sort_keys=True)
        out.call_id = item.call_id
        out.provider = item.provider
    elif isinstance(item, ToolResult):
        out.kind = pb.CONVERSATION_ITEM_KIND_TOOL_RESULT
        out.text = item.output
        out.call_id = item.call_id
        out.is_error = item.is_error
    elif isinstance(item, ContextCheckpoint):
        out.kind = pb.CONVERSATION_ITEM_KIND_CHECKPOINT
        out.text = f"screens before item {item.keep_from} are sent condensed from here on"
    return out
