"""A connection reset (an RST in place of the FIN) right after the provider's whole answer was
sent: a proxy or load balancer that drops the connection as it closes. The answer arrived whole
and is paid for, so the planner keeps it: once thrown away as a broken stream, the decision was
asked again and paid twice. Real SDKs against the fake provider server, which resets each
connection (SO_LINGER 0) after its answer's last byte; each vendor as the planner calls it,
compact (not streamed) and session (streamed)."""

from __future__ import annotations

import pytest

from planner.conversation.items import ToolCall, UserObservation
from planner.prompts import SYSTEM_PROMPT
from planner.settings import PlannerSettings
from planner.tools import TOOLS
from planner.vendors import make_adapter
from planner.vendors.base import TurnRequest
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    anthropic_message,
    chat_completion,
    function_call,
    openai_tool_call,
    tool_use,
)
from tests.support.fakes.anthropic import ScriptedTurn

TAP = {"element_id": "e17", "purpose": "open display", "expected_outcome": "Display opens"}
MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4.1"}


def _script(server: FakeModelServer, vendor: str, mode: str) -> None:
    if vendor == "anthropic":
        server.script_anthropic(anthropic_message(tool_use("tap", TAP), input_tokens=500))
    elif mode == "compact":
        server.script_openai(chat_completion(None, openai_tool_call("tap", TAP), prompt_tokens=500))
    else:
        server.script_responses(
            ScriptedTurn([function_call("tap", TAP)], usage={"input_tokens": 500})
        )


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
@pytest.mark.parametrize(("mode", "stream"), [("compact", False), ("session", True)])
async def test_an_answer_read_whole_is_kept_when_its_connection_resets(
    fake_server: FakeModelServer, vendor: str, mode: str, stream: bool
) -> None:
    """Streamed, the reset surfaced as the SDK read on past the stream's last event (a
    ReadError, from the OpenAI SDK an APIConnectionError) and the answer became
    PlannerUnavailable; not streamed, the body's length says it is whole and the reset is not
    met. Either way the call is answered once, with the model's call."""
    _script(fake_server, vendor, mode)
    fake_server.reset_after_answer = True
    adapter = make_adapter(
        PlannerSettings(
            provider=vendor,
            anthropic_api_key=ANTHROPIC_KEY,
            anthropic_base_url=fake_server.anthropic_base_url,
            openai_api_key=OPENAI_KEY,
            openai_base_url=fake_server.openai_base_url,
            model=MODELS[vendor],
            max_retries=2,
        )
    )
    request = TurnRequest(
        system=SYSTEM_PROMPT,
        items=[UserObservation("Screen: settings")],
        tools=TOOLS,
        mode=mode,  # type: ignore[arg-type]
        stream=stream,
    )
    try:
        turn = await adapter.complete(request)
    finally:
        await adapter.aclose()
    (call,) = [item for item in turn.items if isinstance(item, ToolCall)]
    assert (call.name, call.arguments) == ("tap", TAP)
    assert turn.usage.input_tokens == 500
    assert len(fake_server.requests) == 1
    assert fake_server.pending == 0
