"""A model that declines (Anthropic `stop_reason: "refusal"`, OpenAI refusal content or
`message.refusal`) ends the decision at once with `PlannerRefused` naming why: no forced retry,
no corrective turn (they used to cost three more billed calls and end in "no tool call"), and in
session mode nothing of the refused turn is kept. Real SDKs against the fakes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from planner.conversation.items import AssistantItem, UserObservation
from planner.errors import PlannerError, PlannerRefused
from planner.planner import Planner
from planner.session.config import SessionConfig
from planner.session.planner import SessionPlanner
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from planner.vendors import ThinkingConfig, make_adapter
from planner.vendors.anthropic import AnthropicAdapter
from planner.vendors.openai import OpenAIAdapter
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    Reply,
    ScriptedTurn,
    chat_completion,
    function_call,
    openai_tool_call,
    refusal,
    text,
    thinking,
    tool_use,
)

INTENT = {"purpose": "go back", "expected_outcome": "the previous screen shows"}
CYBER = {"type": "refusal", "category": "cyber", "explanation": "Exploit development."}


def _compact(server: FakeModelServer, provider: str, model: str) -> Planner:
    settings = PlannerSettings(
        provider=provider,
        anthropic_api_key=ANTHROPIC_KEY,
        openai_api_key=OPENAI_KEY,
        anthropic_base_url=server.anthropic_base_url,
        openai_base_url=server.openai_base_url,
        model=model,
        max_retries=0,
    )
    return Planner(make_adapter(settings), settings)


async def _decide(planner: Planner) -> Any:
    try:
        return await planner.decide("Turn on dark theme", settings_main())
    finally:
        await planner.aclose()


async def test_an_anthropic_refusal_stops_at_once_naming_the_category(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(
        ScriptedTurn([text("I can't help with that.")], stop_reason="refusal", stop_details=CYBER)
    )
    with pytest.raises(PlannerRefused, match=r"refused to answer \(category cyber: Exploit"):
        await _decide(_compact(fake_server, "anthropic", "claude-sonnet-4-6"))
    assert len(fake_server.requests) == 1 and fake_server.pending == 0


async def test_a_chat_refusal_stops_at_once(fake_server: FakeModelServer) -> None:
    fake_server.script_openai(chat_completion(None, refusal="I can't assist with that."))
    with pytest.raises(PlannerRefused, match="I can't assist with that"):
        await _decide(_compact(fake_server, "openai", "gpt-4.1-mini"))
    assert len(fake_server.requests) == 1


# The SDK's types say `content: str`: its serializer warns of the list (an error under pytest).
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_a_chat_refusal_part_of_the_content_stops_at_once(
    fake_server: FakeModelServer,
) -> None:
    """A refusal as a content part (`{"type": "refusal", "refusal": …}`, the Chat Completions
    reference's assistant content part; some compatible servers answer so, `refusal` null) was
    dropped with the list: read as "no tool call", asked again twice, then failed as that."""
    declined = [{"type": "refusal", "refusal": "I can't assist with that."}]
    fake_server.script_openai(chat_completion(declined))
    with pytest.raises(PlannerRefused, match="refused to answer \\(I can't assist with that"):
        await _decide(_compact(fake_server, "openai", "gpt-4.1-mini"))
    assert len(fake_server.requests) == 1


@pytest.mark.parametrize("empty", ["", " "])
async def test_an_empty_chat_refusal_beside_a_call_is_no_refusal(
    fake_server: FakeModelServer, empty: str
) -> None:
    """Some OpenAI-compatible servers send `"refusal": ""` with every answer, tool calls
    included: it used to fail the decision as "refused to answer (no reason given)", billed,
    with the call never run."""
    fake_server.script_openai(
        chat_completion(
            None, openai_tool_call("press_key", {"key": "back", **INTENT}), refusal=empty
        )
    )
    decision = await _decide(_compact(fake_server, "openai", "gpt-4.1-mini"))
    assert (decision.tool_name, decision.arguments["key"]) == ("press_key", "back")
    assert len(fake_server.requests) == 1 and fake_server.pending == 0


async def test_a_chat_answer_the_content_filter_stopped_is_refused_at_once(
    fake_server: FakeModelServer,
) -> None:
    """`finish_reason: "content_filter"` used to be asked again like an answer without a call
    (a forced retry and a corrective turn: three more billed calls, filtered the same way)."""
    fake_server.script_openai(chat_completion(None, finish_reason="content_filter"))
    with pytest.raises(PlannerRefused, match="the content filter stopped the answer"):
        await _decide(_compact(fake_server, "openai", "gpt-4.1-mini"))
    assert len(fake_server.requests) == 1 and fake_server.pending == 0


#: Azure OpenAI's refusal of a prompt its content filter flagged, as its content-filter page
#: documents it (learn.microsoft.com/azure/ai-foundry/openai/concepts/content-filter: HTTP 400,
#: `code: "content_filter"`, `param: "prompt"`, `innererror.code:
#: "ResponsibleAIPolicyViolation"` with the `content_filter_result` per category).
AZURE_FILTERED = Reply(
    400,
    {
        "error": {
            "message": "The response was filtered due to the prompt triggering Azure OpenAI's "
            "content management policy. Please modify your prompt and retry.",
            "type": None,
            "param": "prompt",
            "code": "content_filter",
            "status": 400,
            "innererror": {
                "code": "ResponsibleAIPolicyViolation",
                "content_filter_result": {
                    "hate": {"filtered": False, "severity": "safe"},
                    "jailbreak": {"filtered": True, "detected": True},
                    "self_harm": {"filtered": False, "severity": "safe"},
                    "sexual": {"filtered": False, "severity": "safe"},
                    "violence": {"filtered": False, "severity": "safe"},
                },
            },
        }
    },
)


@pytest.mark.parametrize("model", ["gpt-4.1-mini", "gpt-5"])
async def test_a_request_azures_content_filter_refused_is_named_and_not_asked_again(
    fake_server: FakeModelServer, model: str
) -> None:
    """Azure's 400 `content_filter` used to read as a refused request parameter (its `param`
    is "prompt"): "rejected the request (HTTP 400 …)", which tells the operator to fix a
    setting. It is the content filter refusing the step, never asked again (Chat for
    gpt-4.1-mini, Responses for gpt-5)."""
    if model == "gpt-5":
        fake_server.script_responses(AZURE_FILTERED)
    else:
        fake_server.script_openai(AZURE_FILTERED)
    with pytest.raises(PlannerRefused) as info:
        await _decide(_compact(fake_server, "openai", model))
    assert str(info.value).startswith(
        "planner: OpenAI: the provider's content filter refused this step (HTTP 400: "
        "The response was filtered"
    )
    assert len(fake_server.requests) == 1 and fake_server.pending == 0


async def test_a_responses_answer_the_content_filter_stopped_is_refused_at_once(
    fake_server: FakeModelServer,
) -> None:
    """`status: incomplete` with `incomplete_details.reason: "content_filter"` (a GPT-5 model's
    compact step goes through Responses), even with a call in it: nothing of it runs."""
    fake_server.script_responses(
        ScriptedTurn(
            [function_call("press_key", {"key": "back", **INTENT})],
            status="incomplete",
            incomplete_reason="content_filter",
        )
    )
    with pytest.raises(PlannerRefused, match=r"content filter stopped the answer \(incomplete"):
        await _decide(_compact(fake_server, "openai", "gpt-5"))
    assert len(fake_server.requests) == 1 and fake_server.pending == 0


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ("incomplete", "max_messages"),
        ("incomplete", "steered"),
        ("incomplete", "a_reason_newer_than_the_planner"),
        ("cancelled", None),
        ("in_progress", None),
    ],
)
@pytest.mark.parametrize("called", [True, False])
async def test_a_responses_answer_cut_short_otherwise_fails_the_decision(
    fake_server: FakeModelServer, status: str, reason: str | None, called: bool
) -> None:
    """A response the provider ended unfinished for another reason than the output limit or
    the content filter (the SDK's `incomplete_details.reason` also lists `max_messages` and
    `steered`; `status` also `cancelled`, `queued`, `in_progress`) was read as an answer: its
    call ran, or, with none, three more billed calls ended in "no tool call". It fails the
    decision at once, naming why, billed, and nothing of it runs."""
    call = [function_call("press_key", {"key": "back", **INTENT})] if called else []
    fake_server.script_responses(
        ScriptedTurn(call, status=status, incomplete_reason=reason or "max_output_tokens")
    )
    with pytest.raises(PlannerError) as info:
        await _decide(_compact(fake_server, "openai", "gpt-5"))
    err = info.value
    assert type(err) is PlannerError
    said = f"incomplete: {reason}" if status == "incomplete" else f"status {status}"
    assert f"ended its answer unfinished ({said})" in str(err)
    assert len(fake_server.requests) == 1 and fake_server.pending == 0
    assert err.billed is not None and err.billed.usage.output_tokens > 0


@pytest.mark.parametrize("stop", ["pause_turn", "a_stop_reason_newer_than_the_planner"])
@pytest.mark.parametrize("called", [True, False])
async def test_an_anthropic_answer_paused_or_stopped_otherwise_fails_the_decision(
    fake_server: FakeModelServer, stop: str, called: bool
) -> None:
    """`pause_turn` ("send the assistant content back to continue": the turn is not over) or
    a stop reason newer than the planner was read as an answer: its tool call ran on the phone,
    or, with none, three more billed calls ended in "no tool call". It fails the decision at
    once, naming the stop reason, billed, and nothing of it runs."""
    call = [tool_use("press_key", {"key": "back", **INTENT})] if called else []
    fake_server.script_anthropic(ScriptedTurn([text("Going back."), *call], stop_reason=stop))
    with pytest.raises(PlannerError) as info:
        await _decide(_compact(fake_server, "anthropic", "claude-sonnet-4-6"))
    err = info.value
    assert type(err) is PlannerError
    assert f"ended its answer unfinished (stop reason {stop})" in str(err)
    assert len(fake_server.requests) == 1 and fake_server.pending == 0
    assert err.billed is not None and err.billed.usage.output_tokens > 0


async def _session(adapter: Any, db: Path) -> SessionPlanner:
    return await SessionPlanner.open(
        store=SqliteSessionStore(db),
        task_id="t1",
        attempt=1,
        adapter=adapter,
        owns_adapter=True,
        config=SessionConfig(stream=True),
    )


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_refused_turn_is_not_kept_in_the_session(
    fake_server: FakeModelServer, tmp_path: Path, vendor: str
) -> None:
    """Anthropic: "you must reset the conversation context before continuing"; a refused turn
    kept in the session would be sent again by every later step and attempt."""
    db = tmp_path / "s.sqlite"
    adaptive = ThinkingConfig("adaptive")

    def adapter() -> Any:
        if vendor == "anthropic":
            client = anthropic.AsyncAnthropic(
                api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
            )
            return AnthropicAdapter(client, model="claude-sonnet-4-6", thinking=adaptive)
        gpt = openai.AsyncOpenAI(
            api_key=OPENAI_KEY, base_url=fake_server.openai_base_url, max_retries=0
        )
        return OpenAIAdapter(gpt, model="o4-mini", thinking=adaptive)

    if vendor == "anthropic":
        fake_server.script_anthropic(
            ScriptedTurn([thinking("hmm"), text("No.")], stop_reason="refusal", stop_details=CYBER)
        )
        reason = "category cyber"
    else:
        fake_server.script_responses(ScriptedTurn([refusal("I can't help with that.")]))
        reason = "I can't help with that"
    planner = await _session(adapter(), db)
    try:
        with pytest.raises(PlannerRefused, match=reason):
            await planner.decide("screen 1")
        assert [type(i) for i in planner.history] == [UserObservation]
    finally:
        await planner.aclose()
    reopened = await _session(adapter(), db)
    try:
        assert not any(isinstance(i, AssistantItem) for i in reopened.history)
    finally:
        await reopened.aclose()
    assert len(fake_server.requests) == 1 and fake_server.rejections == []


@pytest.mark.parametrize("status", ["incomplete", "cancelled"])
async def test_a_streamed_turn_cut_short_is_not_kept_in_the_session(
    fake_server: FakeModelServer, tmp_path: Path, status: str
) -> None:
    """Session mode streams: the stream's `response.incomplete` ends it the same way, and
    nothing of the unfinished turn is kept to be sent again."""
    client = openai.AsyncOpenAI(
        api_key=OPENAI_KEY, base_url=fake_server.openai_base_url, max_retries=0
    )
    adapter = OpenAIAdapter(client, model="o4-mini", thinking=ThinkingConfig("adaptive"))
    fake_server.script_responses(
        ScriptedTurn(
            [function_call("press_key", {"key": "back", **INTENT})],
            status=status,
            incomplete_reason="max_messages",
        )
    )
    planner = await _session(adapter, tmp_path / "s.sqlite")
    try:
        with pytest.raises(PlannerError, match="ended its answer unfinished"):
            await planner.decide("screen 1")
        assert [type(i) for i in planner.history] == [UserObservation]
    finally:
        await planner.aclose()
    assert len(fake_server.requests) == 1


async def test_a_streamed_anthropic_turn_paused_is_not_kept_in_the_session(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """The stop reason arrives on the stream's `message_delta`: a paused turn ends the
    decision the same way, and nothing of it is kept to be sent again."""
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
    )
    adapter = AnthropicAdapter(
        client, model="claude-sonnet-4-6", thinking=ThinkingConfig("adaptive")
    )
    fake_server.script_anthropic(
        ScriptedTurn(
            [thinking("hmm"), tool_use("press_key", {"key": "back", **INTENT})],
            stop_reason="pause_turn",
        )
    )
    planner = await _session(adapter, tmp_path / "s.sqlite")
    try:
        with pytest.raises(PlannerError, match=r"unfinished \(stop reason pause_turn\)"):
            await planner.decide("screen 1")
        assert [type(i) for i in planner.history] == [UserObservation]
    finally:
        await planner.aclose()
    assert len(fake_server.requests) == 1


@pytest.mark.parametrize(
    "blocks",
    [[text("Sure, here is how to")], [text("Going back."), tool_use("press_key", INTENT)]],
    ids=["in-text", "in-tool-call"],
)
async def test_a_stream_refused_mid_block_is_a_refusal(
    fake_server: FakeModelServer, tmp_path: Path, blocks: list[dict[str, Any]]
) -> None:
    """A streaming classifier stops the answer where it stands ("Hello.." in the docs' example)
    and the stream ends with `stop_reason: "refusal"` on message_delta. When the block it
    stopped got no content_block_stop, the stream was read as one that broke off: a transient
    failure the host waits out and asks again, refused again each time. It is the refusal,
    billed, and nothing of it is kept (nor its half-written call run)."""
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
    )
    adapter = AnthropicAdapter(client, model="claude-sonnet-4-6")
    fake_server.script_anthropic(
        ScriptedTurn(blocks, stop_reason="refusal", stop_details=CYBER, left_open=True)
    )
    planner = await _session(adapter, tmp_path / "s.sqlite")
    try:
        with pytest.raises(PlannerRefused, match="category cyber") as info:
            await planner.decide("screen 1")
        assert [type(i) for i in planner.history] == [UserObservation]
    finally:
        await planner.aclose()
    assert info.value.billed is not None and info.value.billed.usage.output_tokens > 0
    assert len(fake_server.requests) == 1


@pytest.mark.parametrize("stop", ["max_tokens", "model_context_window_exceeded", "pause_turn"])
async def test_a_stream_stopped_mid_block_is_read_by_its_stop_reason(
    fake_server: FakeModelServer, tmp_path: Path, stop: str
) -> None:
    """A stream that ended properly (`message_delta` with its stop reason, `message_stop`)
    with its last block never closed, stopped there by the output limit, the context window
    or a pause, was read as one that broke off ("ended before message_stop", which it had
    not): a transient failure, asked again and stopped the same way each time. It is read by
    its stop reason: the half-written call never runs; cut off, it is asked again with more
    room; over the context window, the session starts afresh; paused, the decision fails
    naming it, billed."""
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
    )
    adapter = AnthropicAdapter(
        client, model="claude-sonnet-4-6", thinking=ThinkingConfig("adaptive")
    )
    call = tool_use("press_key", {"key": "back", **INTENT})
    fake_server.script_anthropic(
        ScriptedTurn(
            [thinking("hmm"), text("Going back."), call],
            stop_reason=stop,
            left_open=True,
            cut_in_tool=stop == "max_tokens",
        ),
        ScriptedTurn([thinking("again"), tool_use("press_key", {"key": "home", **INTENT})]),
    )
    planner = await _session(adapter, tmp_path / "s.sqlite")
    try:
        if stop == "pause_turn":
            with pytest.raises(
                PlannerError, match=r"unfinished \(stop reason pause_turn\)"
            ) as info:
                await planner.decide("screen 1")
            assert info.value.billed is not None and info.value.billed.usage.output_tokens > 0
            assert [type(i) for i in planner.history] == [UserObservation]
            assert len(fake_server.requests) == 1
        else:
            decision = await planner.decide("screen 1")
            assert (decision.tool_name, decision.arguments["key"]) == ("press_key", "home")
            assert len(fake_server.requests) == 2 and fake_server.rejections == []
    finally:
        await planner.aclose()
