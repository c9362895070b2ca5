"""A free-text argument over its limit (`planner.tools.MAX_TEXT_CHARS` and the others): the
model sees each limit in the tool schema, and an answer over one is an unusable call that gets
the corrective turn, naming the argument and the limit; it is never executed, typed or stored.
Real anthropic and openai SDKs against the fake provider server, on the direct transport (the
planner a host runs) and the cloud's (Decide over gRPC)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from planner.convert import decision_to_proto, record_bytes
from planner.decision import MAX_RECORD_BYTES, Decision, Usage
from planner.planner import Planner
from planner.settings import PlannerSettings
from planner.tools import MAX_REASON_CHARS, MAX_TEXT_CHARS, TOOLS, parse_tool_call
from planner.vendors import make_adapter
from tests.planner import scenes
from tests.planner.test_planner_service import MD, Running, make_server, request, typed
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    anthropic_message,
    chat_completion,
    openai_tool_call,
    tool_use,
)

__all__ = ["make_server"]  # the fixture, used here

MEGABYTE = 1024 * 1024
INTENT = {"purpose": "open display", "expected_outcome": "Display opens"}
TAP = {"element_id": "e4", **INTENT}


def _settings(server: FakeModelServer, vendor: str) -> PlannerSettings:
    return PlannerSettings(
        provider=vendor,
        anthropic_api_key=ANTHROPIC_KEY,
        anthropic_base_url=server.anthropic_base_url,
        openai_api_key=OPENAI_KEY,
        openai_base_url=server.openai_base_url,
        model="claude-test-model" if vendor == "anthropic" else "gpt-4.1",
        max_retries=0,
    )


def _script(server: FakeModelServer, vendor: str, *calls: tuple[str, dict[str, Any]]) -> None:
    if vendor == "anthropic":
        server.script_anthropic(*(anthropic_message(tool_use(n, a)) for n, a in calls))
    else:
        server.script_openai(*(chat_completion(None, openai_tool_call(n, a)) for n, a in calls))


def _sent_back(server: FakeModelServer, vendor: str) -> str:
    """What the second request carried after the first answer: the whole body, as text."""
    path = "/messages" if vendor == "anthropic" else "/chat/completions"
    bodies = server.bodies(path)
    assert len(bodies) == 2
    return json.dumps(bodies[1], ensure_ascii=False)


def test_every_free_text_argument_declares_its_limit() -> None:
    """Each string argument the model writes freely says its most characters, in the schema
    (`maxLength`) and in words (a schema that is not strict is read, not enforced)."""
    for tool in TOOLS:
        for name, schema in tool.parameters["properties"].items():
            if schema.get("type") == "string" and "enum" not in schema:
                assert schema["maxLength"] > 0, (tool.name, name)
                assert f"At most {schema['maxLength']:,} characters" in schema["description"]


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_text_of_a_megabyte_is_sent_back_not_typed(
    fake_server: FakeModelServer, vendor: str
) -> None:
    """Direct transport: the model answers an input_text of a megabyte, then a tap. The text
    is refused with its length and the limit (the model was shown the limit in the schema),
    and the decision is the tap: nothing of the megabyte is in it."""
    _script(
        fake_server,
        vendor,
        ("input_text", {"text": "x" * MEGABYTE, **INTENT}),
        ("tap", TAP),
    )
    settings = _settings(fake_server, vendor)
    planner = Planner(make_adapter(settings), settings)
    try:
        decision = await planner.decide("Turn on dark theme", scenes.launcher())
    finally:
        await planner.aclose()
    assert decision.tool_name == "tap"
    assert decision.corrective_retries == 1
    sent = _sent_back(fake_server, vendor)
    assert f"`text` is {MEGABYTE:,} characters, over the {MAX_TEXT_CHARS:,} allowed" in sent
    first = fake_server.bodies()[0]
    tools = first["tools"]
    schema = next(
        t.get("input_schema") or t["function"]["parameters"]
        for t in tools
        if t.get("name", t.get("function", {}).get("name")) == "input_text"
    )
    assert schema["properties"]["text"]["maxLength"] == MAX_TEXT_CHARS


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_reason_of_megabytes_through_decide_is_corrected_and_the_record_fits(
    make_server: Callable[..., Any], fake_server: FakeModelServer, vendor: str
) -> None:
    """Cloud transport: `complete` with a reason of three megabytes, then one within the
    limit. The host gets the short one, as does the decision log, whose record fits its cap:
    the reason was stored whole twice before (the action and arguments_json), past it."""
    reason = "done " * (3 * MEGABYTE // 5)
    _script(
        fake_server,
        vendor,
        ("complete", {"success": True, "reason": reason}),
        ("complete", {"success": True, "reason": "Dark theme is on."}),
    )
    adapter = make_adapter(_settings(fake_server, vendor))
    srv: Running = await make_server(adapter)
    try:
        response = await srv.stub.Decide(request(), metadata=MD)
    finally:
        await adapter.aclose()
    d = response.decision
    assert d.action.complete.reason == "Dark theme is on."
    assert d.corrective_retries == 1
    sent = _sent_back(fake_server, vendor)
    assert f"`reason` is {len(reason):,} characters, over the {MAX_REASON_CHARS:,}" in sent
    (row,) = srv.sink.rows
    stored = row[4]
    assert stored.action.complete.reason == "Dark theme is on."
    assert record_bytes(stored) <= MAX_RECORD_BYTES


def test_record_bytes_counts_the_stored_form_of_a_short_secret() -> None:
    """`record_bytes` measured the Decide reply (the secret revealed) only; the decision log
    stores the action and its arguments masked, and a secret shorter than the mask ("•••",
    9 bytes) makes that form the larger: the size `fit_record` fits must be the stored one
    too."""
    parsed = parse_tool_call("input_text", {"text": "7", "sensitive": True, **INTENT})
    decision = Decision(
        tool_name=parsed.tool_name,
        arguments=parsed.arguments,
        action=parsed.action,
        purpose=parsed.purpose,
        expected_outcome=parsed.expected_outcome,
        rationale=None,
        thinking=[],
        usage=Usage(),
        provider="anthropic",
        model="claude-test-model",
        latency_s=0.0,
        forced_retry=False,
        system_prompt="",
        user_prompt="",
    )
    stored = decision_to_proto(decision)
    assert stored.action.input_text.text == "•••"
    assert record_bytes(decision) >= stored.ByteSize()


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_text_at_its_limit_is_typed_whole_and_a_retried_decide_gets_it_again(
    make_server: Callable[..., Any], fake_server: FakeModelServer, vendor: str
) -> None:
    """Cloud transport: an input_text of exactly MAX_TEXT_CHARS (four-byte characters, the
    most bytes it can take) is the host's whole; the Decide retried with the same step key is
    answered from the stored row with the same action: nothing of what the host types is cut
    to fit the record."""
    text = "🙂" * MAX_TEXT_CHARS
    _script(fake_server, vendor, ("input_text", {"text": text, **INTENT}))
    adapter = make_adapter(_settings(fake_server, vendor))
    srv: Running = await make_server(adapter)
    try:
        first = await srv.stub.Decide(typed(step_key="1"), metadata=MD)
        again = await srv.stub.Decide(typed(step_key="1"), metadata=MD)
    finally:
        await adapter.aclose()
    assert first.decision.action.input_text.text == text
    assert again.replayed
    assert again.decision.action == first.decision.action
    assert len(fake_server.requests) == 1  # answered from the stored row
