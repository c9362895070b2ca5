"""The real `anthropic` SDK against the local fake Messages API.

Assertions are on what the SDK actually sent (tool_choice, thinking, beta header, max_tokens) and
on what the planner made of the answers. The fake enforces the API's documented constraints, so
a request the real API would reject fails here too.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import pytest

from planner.conversation.items import UserObservation
from planner.convert import fit_record, record_bytes
from planner.decide_limits import MAX_SCREENSHOT
from planner.decision import CUT_MARK, MAX_RECORD_BYTES
from planner.errors import (
    PlannerAuthError,
    PlannerConfigError,
    PlannerError,
    PlannerRateLimited,
    PlannerUnavailable,
)
from planner.planner import Planner
from planner.prompts import SYSTEM_PROMPT
from planner.session.config import SessionConfig
from planner.session.planner import SessionPlanner
from planner.session.store import SqliteSessionStore
from planner.settings import MAX_CALL_TOKENS, THINKING_MAX_TOKENS, PlannerSettings
from planner.tools import TOOLS
from planner.vendors import failures, make_adapter
from planner.vendors.anthropic import INTERLEAVED_THINKING_BETA, AnthropicAdapter
from planner.vendors.base import Probeable, ThinkingConfig, TurnRequest
from planner.vendors.images import ANTHROPIC_MAX_BASE64, base64_size
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    BUDGET_TOO_SMALL,
    MAX_TOKENS_NOT_ABOVE_BUDGET,
    THINKING_WITH_FORCED_TOOL,
    FakeModelServer,
    Reply,
    ScriptedTurn,
    anthropic_error,
    anthropic_message,
    rate_limited_anthropic,
    redacted_thinking,
    text,
    thinking,
    tool_use,
)
from tests.support.screenshots import cut_jpeg, image_of, phone_png, png_with_bad_data

GOAL = "Turn on dark theme"
TAP_DISPLAY = {
    "element_id": "e17",
    "purpose": "open display settings",
    "expected_outcome": "the Display page is open",
}


def _settings(server: FakeModelServer) -> dict[str, Any]:
    return {
        "provider": "anthropic",
        "anthropic_api_key": ANTHROPIC_KEY,
        "anthropic_base_url": server.anthropic_base_url,
        "model": "claude-test-model",
    }


def make(server: FakeModelServer, **overrides: Any) -> Planner:
    values: dict[str, Any] = {**_settings(server), "max_retries": 2, **overrides}
    settings = PlannerSettings(**values)
    return Planner(make_adapter(settings), settings)


async def decide(planner: Planner) -> Any:
    try:
        return await planner.decide(GOAL, settings_main())
    finally:
        await planner.aclose()


async def test_text_before_tool_use_is_the_rationale_and_tool_choice_is_auto(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(
        anthropic_message(
            text("First step. Display holds the dark theme switch."),
            tool_use("tap", TAP_DISPLAY),
            cache_read_input_tokens=7,
        )
    )
    decision = await decide(make(fake_server))

    assert decision.tool_name == "tap"
    assert decision.arguments == {"element_id": "e17"}
    assert decision.purpose == "open display settings"
    assert decision.expected_outcome == "the Display page is open"
    assert decision.rationale == "First step. Display holds the dark theme switch."
    assert decision.thinking == []
    assert decision.forced_retry is False
    assert decision.provider == "anthropic"
    assert decision.model == "claude-test-model"
    assert decision.usage.input_tokens == 120
    assert decision.usage.cache_read_input_tokens == 7
    (sent,) = fake_server.requests
    assert sent.body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert "thinking" not in sent.body
    assert "anthropic-beta" not in sent.headers
    assert sent.body["max_tokens"] == 2048
    # Prompt caching (on by default): the system prompt and the tools end in cache breakpoints.
    (system,) = sent.body["system"]
    assert system["text"].startswith("You control an Android phone")
    assert system["cache_control"] == {"type": "ephemeral"}
    assert sent.body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in sent.body  # no conversation breakpoint in compact mode
    tool_names = [t["name"] for t in sent.body["tools"]]
    assert tool_names == [
        "tap",
        "swipe",
        "input_text",
        "press_key",
        "launch_app",
        "terminate_app",
        "complete",
        "get_ui_tree",
    ]
    tap_schema = sent.body["tools"][0]["input_schema"]
    assert {"purpose", "expected_outcome"} <= set(tap_schema["required"])


async def test_budget_thinking_sends_enabled_budget_beta_header_and_raised_max_tokens(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(
        anthropic_message(
            thinking("The goal names dark theme; Settings > Display has it."),
            redacted_thinking(),
            text("Open Display."),
            tool_use("tap", TAP_DISPLAY),
            thinking_tokens=31,
        )
    )
    decision = await decide(
        make(fake_server, thinking="budget", thinking_budget_tokens=4000, max_tokens=1024)
    )

    (sent,) = fake_server.requests
    assert sent.body["thinking"] == {"type": "enabled", "budget_tokens": 4000}
    assert sent.body["max_tokens"] >= 4001
    assert INTERLEAVED_THINKING_BETA in sent.headers["anthropic-beta"]
    assert [(b.text, b.redacted) for b in decision.thinking] == [
        ("The goal names dark theme; Settings > Display has it.", False),
        ("", True),
    ]
    assert decision.rationale == "Open Display."
    assert decision.usage.thinking_tokens == 31


async def test_seed_env_var_still_turns_budget_thinking_on(
    fake_server: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AI_PLANNER_THINKING_BUDGET_TOKENS", "2048")
    fake_server.script_anthropic(anthropic_message(thinking("hm"), tool_use("tap", TAP_DISPLAY)))
    await decide(make(fake_server))
    (sent,) = fake_server.requests
    assert sent.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent.body["max_tokens"] > 2048


async def test_adaptive_thinking_with_effort(fake_server: FakeModelServer) -> None:
    fake_server.script_anthropic(
        anthropic_message(thinking("adaptive"), tool_use("tap", TAP_DISPLAY))
    )
    decision = await decide(make(fake_server, thinking="adaptive", effort="low"))
    (sent,) = fake_server.requests
    assert sent.body["thinking"] == {"type": "adaptive"}
    assert sent.body["output_config"] == {"effort": "low"}
    assert "anthropic-beta" not in sent.headers
    assert decision.thinking[0].text == "adaptive"


async def test_no_tool_call_gets_one_forced_retry_without_thinking(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(
        anthropic_message(thinking("let me look"), text("I should open Display first.")),
        anthropic_message(tool_use("tap", TAP_DISPLAY)),
    )
    decision = await decide(make(fake_server, thinking="budget", thinking_budget_tokens=1024))

    first, second = fake_server.requests
    assert first.body["tool_choice"]["type"] == "auto"
    assert first.body["thinking"]["type"] == "enabled"
    assert second.body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert "thinking" not in second.body
    assert "anthropic-beta" not in second.headers
    assert decision.forced_retry is True
    assert decision.rationale == "I should open Display first."
    assert decision.thinking[0].text == "let me look"
    assert decision.usage.input_tokens == 240


async def _corrected(fake_server: FakeModelServer, *before: dict[str, Any]) -> Any:
    """A budget-thinking decision whose first answer (`before`, then a tap off the screen) got
    one corrective turn, answered with a tap by id: the decision, checked to be that tap."""
    off_screen = {"x": 5000, "y": 10, "purpose": "open display", "expected_outcome": "Display"}
    fake_server.script_anthropic(
        anthropic_message(*before, tool_use("tap", off_screen)),
        anthropic_message(thinking("Use the id."), tool_use("tap", TAP_DISPLAY)),
    )
    decision = await decide(make(fake_server, thinking="budget", thinking_budget_tokens=1024))
    assert decision.corrective_retries == 1
    assert decision.arguments == {"element_id": "e17"}
    return decision


async def test_invalid_tool_call_gets_one_corrective_turn_with_thinking_sent_back_intact(
    fake_server: FakeModelServer,
) -> None:
    await _corrected(
        fake_server, thinking("Tap the display row."), redacted_thinking(), text("Opening Display.")
    )
    first, second = fake_server.requests
    assert second.status == 200
    assistant, result = second.body["messages"][1], second.body["messages"][2]
    assert [b["type"] for b in assistant["content"]] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
    ]
    assert assistant["content"][0] == first_thinking(first, fake_server)
    (tool_result,) = result["content"]
    assert tool_result["type"] == "tool_result"
    assert tool_result["is_error"] is True
    assert "off the screen" in tool_result["content"]
    assert second.body["thinking"]["type"] == "enabled"


#: A server tool's call and result as the Messages reference shows them in a response's
#: content (the web search tool page: `server_tool_use` with an `srvtoolu_` id, then its
#: `web_search_tool_result` with encrypted content), and a block of a type newer than the
#: planner: each must come back as received in the assistant turn.
SERVER_TOOL_USE = {
    "type": "server_tool_use",
    "id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
    "name": "web_search",
    "input": {"query": "android dark theme settings"},
}
WEB_SEARCH_RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
    "content": [
        {
            "type": "web_search_result",
            "url": "https://support.google.com/android/answer/9730472",
            "title": "Change to dark or colour inverted background",
            "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5LTQ1NGUtODgxNC1kNjNjNTk1ZWI3Y2U",
            "page_age": "April 30, 2025",
        }
    ],
}
NEWER_BLOCK = {"type": "a_block_newer_than_the_planner", "data": "opaque-1"}


# The SDK's types do not know the newest block: its serializer warns (an error under pytest).
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_blocks_the_planner_does_not_read_go_back_as_received(
    fake_server: FakeModelServer,
) -> None:
    """Content blocks of other types were dropped from the assistant turn sent back, and the
    API wants a turn with thinking back complete and unmodified (the fake refuses it so): the
    corrective turn failed with a 400. They go back as received, in their place."""
    decision = await _corrected(
        fake_server,
        thinking("Look it up, then tap."),
        SERVER_TOOL_USE,
        WEB_SEARCH_RESULT,
        NEWER_BLOCK,
        text("Opening Display."),
    )
    assert decision.rationale == "Opening Display."
    _, second = fake_server.requests
    assert second.status == 200, second.error
    content = second.body["messages"][1]["content"]
    assert [b["type"] for b in content] == [
        "thinking",
        "server_tool_use",
        "web_search_tool_result",
        "a_block_newer_than_the_planner",
        "text",
        "tool_use",
    ]
    assert content[1:4] == [SERVER_TOOL_USE, WEB_SEARCH_RESULT, NEWER_BLOCK]


async def _session(fake_server: FakeModelServer, tmp_path: Path) -> SessionPlanner:
    """A streamed session on claude-sonnet-4-6 with adaptive thinking, against the fake."""
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
    )
    return await SessionPlanner.open(
        store=SqliteSessionStore(tmp_path / "s.sqlite"),
        task_id="t1",
        attempt=1,
        adapter=AnthropicAdapter(
            client, model="claude-sonnet-4-6", thinking=ThinkingConfig("adaptive")
        ),
        owns_adapter=True,
        config=SessionConfig(stream=True),
    )


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_streamed_blocks_the_planner_does_not_read_go_back_in_the_next_step(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """A session's streamed answer: the server tool's input arrives as `input_json_delta`s
    (the streaming reference), and the next step sends every block back as received."""
    fake_server.script_anthropic(
        anthropic_message(
            thinking("Look it up, then tap."),
            SERVER_TOOL_USE,
            WEB_SEARCH_RESULT,
            NEWER_BLOCK,
            tool_use("tap", TAP_DISPLAY),
        ),
        anthropic_message(thinking("Done."), tool_use("tap", TAP_DISPLAY)),
    )
    planner = await _session(fake_server, tmp_path)
    try:
        await planner.decide("screen 1: Settings list, Display is e17")
        await planner.record_tool_result("tapped e17")
        await planner.decide("screen 2: Display")
    finally:
        await planner.aclose()
    first, second = fake_server.requests
    assert first.body.get("stream") is True and second.status == 200, second.error
    content = second.body["messages"][1]["content"]
    assert [b["type"] for b in content][1:4] == [
        "server_tool_use",
        "web_search_tool_result",
        "a_block_newer_than_the_planner",
    ]
    assert content[1:4] == [SERVER_TOOL_USE, WEB_SEARCH_RESULT, NEWER_BLOCK]


@pytest.mark.parametrize("after", [[], [text("\n\n")]])
async def test_a_turn_of_only_thinking_is_not_sent_back_as_a_message_ending_in_thinking(
    fake_server: FakeModelServer, tmp_path: Path, after: list[dict[str, Any]]
) -> None:
    """An answer of thinking alone (or thinking and a whitespace text, which is never sent
    back) gets the forced retry; the session keeps it, and every later step sent it back as
    an assistant message of thinking blocks only. The API refuses an assistant message whose
    final block is thinking ("The final block in an assistant message cannot be
    `thinking`", quoted by public issue trackers, e.g. tailcallhq/forgecode#3073, which drops
    such reasoning-only turns). Thinking of a turn without a tool call need not go back (the
    extended thinking page: only the last assistant turn's, in a tool-use loop), so it is left
    out, the same at every step. Refused, the step asked again with the session started
    afresh, its earlier screens condensed for good."""
    fake_server.script_anthropic(
        anthropic_message(thinking("Which row is Display?"), *after, stop_reason="end_turn"),
        anthropic_message(tool_use("tap", TAP_DISPLAY)),
        anthropic_message(thinking("Done."), tool_use("tap", TAP_DISPLAY)),
    )
    planner = await _session(fake_server, tmp_path)
    try:
        first = await planner.decide("screen 1: Settings list, Display is e17")
        assert first.forced_retry is True
        await planner.record_tool_result("tapped e17")
        await planner.decide("screen 2: Display")
    finally:
        await planner.aclose()
    # Refused, the step started the session afresh (earlier screens condensed for good).
    assert fake_server.rejections == []
    _, _, third = fake_server.requests
    assert all(
        m["content"][-1]["type"] not in ("thinking", "redacted_thinking")
        for m in third.body["messages"]
        if m["role"] == "assistant"
    )


def first_thinking(first: Any, server: FakeModelServer) -> dict[str, Any]:
    """The signed thinking block the fake returned for the first request."""
    sig = server.messages.signature_of("Tap the display row.")
    return {"type": "thinking", "thinking": "Tap the display row.", "signature": sig}


@pytest.mark.parametrize(
    ("bad_args", "complaint"),
    [
        (
            {"element_id": "e999", "purpose": "p", "expected_outcome": "o"},
            "not in the current scene",
        ),
        ({"element_id": "e17"}, "purpose and expected_outcome must be given"),
        ({"element_id": "e17", "purpose": "  ", "expected_outcome": "o"}, "purpose must be given"),
    ],
)
async def test_still_invalid_after_the_corrective_turn_is_a_clear_planner_error(
    fake_server: FakeModelServer, bad_args: dict[str, Any], complaint: str
) -> None:
    fake_server.script_anthropic(
        anthropic_message(tool_use("tap", bad_args)),
        anthropic_message(tool_use("tap", bad_args)),
    )
    with pytest.raises(PlannerError, match=complaint) as info:
        await decide(make(fake_server))
    assert str(info.value).startswith("planner: anthropic gave an unusable tool call twice")
    assert len(fake_server.requests) == 2


async def test_unknown_tool_is_corrected(fake_server: FakeModelServer) -> None:
    fake_server.script_anthropic(
        anthropic_message(tool_use("click", {"element_id": "e17"})),
        anthropic_message(tool_use("tap", TAP_DISPLAY)),
    )
    decision = await decide(make(fake_server))
    assert decision.corrective_retries == 1
    tool_result = fake_server.requests[1].body["messages"][2]["content"][0]
    assert "unknown tool 'click'" in tool_result["content"]


async def test_rate_limit_is_retried_by_the_sdk(fake_server: FakeModelServer) -> None:
    fake_server.script_anthropic(
        rate_limited_anthropic(), anthropic_message(tool_use("tap", TAP_DISPLAY))
    )
    decision = await decide(make(fake_server))
    assert decision.tool_name == "tap"
    assert [r.status for r in fake_server.requests] == [429, 200]


async def test_rate_limit_that_persists_is_planner_rate_limited(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(*[rate_limited_anthropic() for _ in range(3)])
    with pytest.raises(PlannerRateLimited, match="planner: Anthropic rate limit"):
        await decide(make(fake_server, max_retries=2))
    assert len(fake_server.requests) == 3


async def test_a_long_retry_after_ends_the_call_at_once_and_travels_with_the_error(
    fake_server: FakeModelServer,
) -> None:
    """The Anthropic SDK slept whatever `retry-after` said, uncapped, once per retry: a tier-1
    reset window of ~171 s held a decision for 342 s with the default two retries, past the
    host's 300 s Decide deadline, and the error did not say how long to wait."""
    fake_server.script_anthropic(
        *[
            anthropic_error(429, "rate_limit_error", "rate limited", retry_after="171")
            for _ in range(3)
        ]
    )
    started = time.monotonic()
    with pytest.raises(PlannerRateLimited, match="it asks to wait 171 s") as info:
        await asyncio.wait_for(decide(make(fake_server)), timeout=10)
    assert time.monotonic() - started < 5
    assert info.value.retry_after == 171
    assert len(fake_server.requests) == 1


async def test_a_retry_after_given_as_an_http_date_is_waited_for(
    fake_server: FakeModelServer,
) -> None:
    """RFC 9110 lets `retry-after` be an HTTP-date (a gateway in front of the API may send
    one). Only the seconds form was read: a date was no wait at all, the retries were spent at
    once against a server that said "not before", and the error told the host no wait. A date
    past is "now" (the backoff); one past the call's wait limit ends the call and travels."""

    def limited(seconds: float) -> Reply:
        when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), True)
        return anthropic_error(429, "rate_limit_error", "rate limited", retry_after=when)

    fake_server.script_anthropic(limited(-3600), limited(171), limited(171))
    with pytest.raises(PlannerRateLimited, match=r"it asks to wait 1[67][0-9] s") as info:
        await asyncio.wait_for(decide(make(fake_server)), timeout=10)
    assert info.value.retry_after is not None and 150 < info.value.retry_after <= 171
    assert len(fake_server.requests) == 2  # the past date asked again; the far one ended it


async def test_retry_waits_stop_at_the_limit_of_one_call(
    fake_server: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short waits are waited here, until the next would take the call past the limit."""
    monkeypatch.setattr(failures, "RETRY_WAIT_LIMIT_S", 0.5)
    limited = anthropic_error(429, "rate_limit_error", "rate limited", retry_after_ms="300")
    fake_server.script_anthropic(limited, limited, anthropic_message(tool_use("tap", TAP_DISPLAY)))
    with pytest.raises(PlannerRateLimited, match="after 1 retries") as info:
        await decide(make(fake_server, max_retries=5))
    assert info.value.retry_after == 0.3
    assert len(fake_server.requests) == 2


async def test_a_stream_rate_limited_after_it_started_reports_the_retries_taken(
    fake_server: FakeModelServer,
) -> None:
    """A streamed call asked again once after a 429, whose stream then failed with a rate
    limit error event: the reason said "after 5 retries" (the most it could take), not the one
    it took."""
    limited = anthropic_error(429, "rate_limit_error", "rate limited", retry_after_ms="5")
    broken = ScriptedTurn([], fail=("rate_limit_error", "Rate limited"))
    fake_server.script_anthropic(limited, broken)
    adapter = make_adapter(PlannerSettings(**_settings(fake_server), max_retries=5))
    request = TurnRequest(
        system=SYSTEM_PROMPT, items=[UserObservation("Screen: settings")], tools=TOOLS, stream=True
    )
    try:
        with pytest.raises(PlannerRateLimited, match="after 1 retries"):
            await adapter.complete(request)
    finally:
        await adapter.aclose()
    assert len(fake_server.requests) == 2


async def test_the_calls_of_one_decision_share_its_retries(
    fake_server: FakeModelServer,
) -> None:
    """Each call of a decision had a budget of its own: with max_retries=2, a first answer
    after two 429s that called no tool, then its retry after two 429s more, made one decision
    take four retries. The decision's calls share one budget: the retry's first 429 finds none
    left and ends the decision, naming the two retries it took."""
    fake_server.script_anthropic(
        rate_limited_anthropic(),
        rate_limited_anthropic(),
        anthropic_message(text("The Display entry is visible.")),
        rate_limited_anthropic(),
        rate_limited_anthropic(),
        anthropic_message(tool_use("tap", TAP_DISPLAY)),
    )
    with pytest.raises(PlannerRateLimited, match="after 2 retries"):
        await decide(make(fake_server, max_retries=2))
    assert len(fake_server.requests) == 4


async def test_a_record_with_a_purpose_of_megabytes_is_cut_to_its_cap(
    fake_server: FakeModelServer,
) -> None:
    """The model's purpose and expected outcome are copied into the typed action as well;
    `fit_record` cut the decision's copies but not the action's, so a purpose of megabytes
    kept the record over MAX_RECORD_BYTES. The action's copies are cut as the texts people read
    they are; what the host executes (the text to type) is untouched. (A model's call with
    such a purpose is now refused over `MAX_INTENT_CHARS`, tests/planner/test_argument_limits.py;
    the texts are set on the decision here, as a record built otherwise may carry them.)"""
    huge = "y" * (3 * 1024 * 1024)
    typed = {"purpose": "type the name", "expected_outcome": "the name is typed", "text": "Ada"}
    fake_server.script_anthropic(anthropic_message(tool_use("input_text", typed)))
    decision = await decide(make(fake_server))
    decision.purpose = decision.action.purpose = huge
    decision.expected_outcome = decision.action.expected_outcome = huge
    fit_record(decision)
    assert record_bytes(decision) <= MAX_RECORD_BYTES
    assert decision.action.input_text.text == "Ada"
    assert CUT_MARK + "this action.purpose is" in decision.action.purpose
    assert CUT_MARK + "this action.expected outcome is" in decision.action.expected_outcome


async def test_server_errors_are_retried_then_unavailable(fake_server: FakeModelServer) -> None:
    boom = anthropic_error(500, "api_error", "Internal server error", retry_after_ms="5")
    overloaded = anthropic_error(529, "overloaded_error", "Overloaded", retry_after_ms="5")
    fake_server.script_anthropic(boom, anthropic_message(tool_use("tap", TAP_DISPLAY)))
    assert (await decide(make(fake_server))).tool_name == "tap"

    fake_server.script_anthropic(boom, overloaded)
    with pytest.raises(PlannerUnavailable, match="planner: Anthropic is unavailable"):
        await decide(make(fake_server, max_retries=1))


async def test_bad_key_is_an_operator_message(fake_server: FakeModelServer) -> None:
    with pytest.raises(PlannerAuthError) as info:
        await decide(make(fake_server, anthropic_api_key="sk-ant-wrong"))
    assert str(info.value).startswith("planner: Anthropic rejected the API key")
    assert fake_server.requests[0].status == 401


async def test_model_that_only_takes_adaptive_rejects_budget_mode(
    fake_server: FakeModelServer,
) -> None:
    """Refused at start by the model's profile, with the setting to change; before profiles it
    was the provider's 400 at the first step (the fake still gives that: test_fakes.py)."""
    with pytest.raises(PlannerConfigError, match=r"does not take budget thinking.*=adaptive"):
        make(fake_server, model="claude-opus-4-7", thinking="budget", thinking_budget_tokens=2048)
    assert fake_server.requests == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {
                "thinking": {"type": "enabled", "budget_tokens": 2048},
                "tool_choice": {"type": "any"},
            },
            THINKING_WITH_FORCED_TOOL,
        ),
        (
            {"thinking": {"type": "adaptive"}, "tool_choice": {"type": "tool", "name": "tap"}},
            THINKING_WITH_FORCED_TOOL,
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 512}}, BUDGET_TOO_SMALL),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 4096}, "max_tokens": 4096},
            MAX_TOKENS_NOT_ABOVE_BUDGET,
        ),
    ],
)
async def test_the_fake_enforces_the_documented_constraints(
    fake_server: FakeModelServer, kwargs: dict[str, Any], message: str
) -> None:
    """A client regression that sends these must fail a test, not pass against a lenient fake."""
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
    )
    request: dict[str, Any] = {
        "model": "claude-test-model",
        "max_tokens": 8192,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "tap", "input_schema": {"type": "object"}}],
        **kwargs,
    }
    try:
        with pytest.raises(anthropic.BadRequestError) as info:
            await client.messages.create(**request)
    finally:
        await client.close()
    assert message in str(info.value)
    assert fake_server.pending == 0


async def test_fake_rejects_a_tool_use_continuation_whose_thinking_was_dropped(
    fake_server: FakeModelServer,
) -> None:
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
    )
    messages: list[Any] = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "tap", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}],
        },
    ]
    try:
        with pytest.raises(
            anthropic.BadRequestError, match="Expected `thinking` or `redacted_thinking`"
        ):
            await client.messages.create(
                model="claude-test-model",
                max_tokens=4096,
                thinking={"type": "enabled", "budget_tokens": 1024},
                messages=messages,
            )
    finally:
        await client.close()


async def test_corrective_turn_after_a_forced_retry_runs_without_thinking(
    fake_server: FakeModelServer,
) -> None:
    """The forced answer carries no thinking, so the continuation must not enable it (the API
    would reject a thinking turn whose last tool_use message does not start with thinking)."""
    fake_server.script_anthropic(
        anthropic_message(thinking("hmm"), text("Display next.")),
        anthropic_message(
            tool_use("tap", {"element_id": "e999", "purpose": "p", "expected_outcome": "o"})
        ),
        anthropic_message(tool_use("tap", TAP_DISPLAY)),
    )
    decision = await decide(make(fake_server, thinking="adaptive"))
    first, forced, corrective = fake_server.requests
    assert first.body["thinking"] == {"type": "adaptive"}
    assert forced.body["tool_choice"]["type"] == "any"
    assert "thinking" not in forced.body
    assert corrective.status == 200
    assert corrective.body["tool_choice"]["type"] == "auto"
    assert "thinking" not in corrective.body
    assert decision.forced_retry is True
    assert decision.corrective_retries == 1
    assert decision.arguments == {"element_id": "e17"}
    assert decision.usage.input_tokens == 360


@pytest.mark.parametrize(
    ("overrides", "seconds"),
    [
        ({}, 60.0),  # 2,048 tokens may take ~58 s: the configured 60 s stands
        ({"thinking": "budget", "thinking_budget_tokens": 20000}, 3600 * 21024 / 128_000),
        ({"thinking": "budget", "thinking_budget_tokens": 20000, "timeout_s": 900.0}, 900.0),
    ],
)
async def test_a_non_streamed_call_gets_the_time_its_max_tokens_may_need(
    fake_server: FakeModelServer, overrides: dict[str, Any], seconds: float
) -> None:
    """A compact call is not streamed: with a large thinking budget the 60 s default cut it off
    (and was paid for) although the SDK itself expects ~590 s for 21,024 tokens. The SDK says
    the timeout it applied in a request header."""
    fake_server.script_anthropic(anthropic_message(tool_use("tap", TAP_DISPLAY)))
    await decide(make(fake_server, **{"timeout_s": 60.0, **overrides}))
    (sent,) = fake_server.requests
    assert float(sent.headers["x-stainless-read-timeout"]) == pytest.approx(seconds)


async def test_a_thinking_call_gets_room_beside_the_answer(fake_server: FakeModelServer) -> None:
    """Thinking tokens count toward max_tokens: with adaptive thinking the default 2,048 left
    a thinking Claude cut off mid-thought, with no tool call. A call that thinks gets at least
    THINKING_MAX_TOKENS; a call without thinking (the forced retry) keeps the configured limit."""
    fake_server.script_anthropic(
        anthropic_message(thinking("Display"), text("I will open Display.")),
        anthropic_message(tool_use("tap", TAP_DISPLAY)),
    )
    await decide(make(fake_server, model="claude-sonnet-4-6", thinking="adaptive"))
    first, forced = fake_server.requests
    assert first.body["thinking"]["type"] == "adaptive"
    assert first.body["max_tokens"] == THINKING_MAX_TOKENS
    assert forced.body["thinking"] == {"type": "disabled"}
    assert forced.body["max_tokens"] == 2048


async def test_an_answer_cut_off_without_a_call_is_asked_again_with_more_room(
    fake_server: FakeModelServer,
) -> None:
    """An always-thinking model is retried with a nudge, thinking kept: asked with the same
    limit, it was cut off again."""
    fake_server.script_anthropic(
        anthropic_message(thinking("long deliberation"), stop_reason="max_tokens"),
        anthropic_message(thinking("short"), tool_use("tap", TAP_DISPLAY)),
    )
    decision = await decide(make(fake_server, model="claude-opus-5-5", thinking="adaptive"))
    assert decision.tool_name == "tap" and decision.retry_kind == "nudge"
    assert decision.output_truncated
    limits = [r.body["max_tokens"] for r in fake_server.requests]
    assert limits == [THINKING_MAX_TOKENS, MAX_CALL_TOKENS]


async def test_answers_cut_off_every_time_end_naming_the_limit(
    fake_server: FakeModelServer,
) -> None:
    for _ in range(4):
        fake_server.script_anthropic(
            anthropic_message(thinking("long deliberation"), stop_reason="max_tokens")
        )
    with pytest.raises(PlannerError) as info:
        await decide(make(fake_server, model="claude-opus-5-5", thinking="adaptive", max_retries=0))
    assert f"cut off at the output token limit ({MAX_CALL_TOKENS} tokens" in str(info.value)
    assert "AMC_PLANNER_MAX_TOKENS" in str(info.value)
    limits = [r.body["max_tokens"] for r in fake_server.requests]
    assert limits[0] == THINKING_MAX_TOKENS and set(limits[1:]) == {MAX_CALL_TOKENS}


async def test_a_tool_input_with_a_lone_surrogate_gets_the_corrective_turn(
    fake_server: FakeModelServer,
) -> None:
    # A JSON escape of half a surrogate pair in the call's input: the action could not be
    # built (UnicodeEncodeError, an internal error), nor the call sent back in the correction.
    # Now the call is refused to the model, and goes back with U+FFFD in its place.
    fake_server.script_anthropic(
        anthropic_message(tool_use("tap", {**TAP_DISPLAY, "purpose": "open \ud83d display"})),
        anthropic_message(tool_use("tap", TAP_DISPLAY)),
    )
    decision = await decide(make(fake_server))

    assert decision.arguments == {"element_id": "e17"}
    assert decision.corrective_retries == 1
    second = fake_server.requests[1]
    assert second.status == 200
    call, result = (m["content"][-1] for m in second.body["messages"][-2:])
    assert call["input"]["purpose"] == "open \ufffd display"
    assert result["is_error"] is True
    assert "`purpose` holds a lone surrogate" in result["content"]


async def test_a_page_that_is_no_api_answer_is_unavailable_not_an_attribute_error(
    fake_server: FakeModelServer,
) -> None:
    # A proxy or gateway in front of the API (or a base URL that names a web page) answers
    # HTTP 200 with HTML: the SDK hands that back as a string, and the planner failed with
    # "'str' object has no attribute 'to_dict'" (an internal error at PlannerDecide).
    # The provider-health probe took the page for an answer as well.
    fake_server.answer_with_page(
        "<!DOCTYPE html><html><head><title>Sign in to the proxy</title></head></html>"
    )
    planner = make(fake_server)
    assert isinstance(planner.provider, Probeable)
    with pytest.raises(PlannerUnavailable, match="not an API answer") as caught:
        await planner.provider.probe()
    assert "Sign in to the proxy" in str(caught.value)
    with pytest.raises(PlannerUnavailable, match="not an API answer") as caught:
        await decide(planner)
    assert "Sign in to the proxy" in str(caught.value)
    assert "AMC_PLANNER_ANTHROPIC_BASE_URL" in str(caught.value)


async def test_a_large_screenshot_goes_within_the_image_limit_at_the_screens_size(
    fake_server: FakeModelServer,
) -> None:
    """Anthropic refuses an image over 5 MB of base64 (400 "image exceeds 5 MB maximum"),
    while Decide takes 8 MB: the PNG of a 1440×3120 phone is past it, and with
    `send_screenshot` every step failed. It now goes as a JPEG of the same pixel size (the
    model's coordinates stay the screen's), within the limit."""
    png = phone_png(1440, 3120, noisy_rows=1300)
    assert len(png) <= MAX_SCREENSHOT and base64_size(len(png)) > ANTHROPIC_MAX_BASE64
    fake_server.script_anthropic(anthropic_message(tool_use("tap", TAP_DISPLAY)))
    planner = make(fake_server, send_screenshot=True)
    try:
        decision = await planner.decide(GOAL, settings_main(), screenshot=png)
    finally:
        await planner.aclose()
    assert decision.arguments == {"element_id": "e17"}
    assert fake_server.rejections == []
    (request,) = fake_server.bodies("/v1/messages")
    image, prompt = request["messages"][0]["content"]
    source = image["source"]
    assert len(source["data"]) <= ANTHROPIC_MAX_BASE64
    assert source["media_type"] == "image/jpeg"
    sent = image_of(source["data"])
    assert (sent.format, sent.size) == ("JPEG", (1440, 3120))
    assert prompt["type"] == "text" and GOAL in prompt["text"]


async def test_a_screenshot_that_fits_no_way_is_left_out_and_the_prompt_says_so(
    fake_server: FakeModelServer,
) -> None:
    """A screen too large and busy to fit even as a JPEG goes without its image, and the
    model is told (rather than the step failing on the provider's 400)."""
    png = phone_png(2400, 5600, noisy_rows=5600)
    fake_server.script_anthropic(anthropic_message(tool_use("tap", TAP_DISPLAY)))
    planner = make(fake_server, send_screenshot=True)
    try:
        await planner.decide(GOAL, settings_main(), screenshot=png)
    finally:
        await planner.aclose()
    assert fake_server.rejections == []
    (request,) = fake_server.bodies("/v1/messages")
    note, prompt = request["messages"][0]["content"]
    assert note["type"] == "text" and note["text"].startswith("[No screenshot this step")
    assert "Anthropic's limit" in note["text"]
    assert GOAL in prompt["text"]


async def test_a_screenshot_over_the_pixel_limit_is_left_out_and_the_prompt_says_so(
    fake_server: FakeModelServer,
) -> None:
    """Anthropic refuses an image more than 8,000 pixels a side (400 "At least one of the
    image dimensions exceed max allowed size: 8000 pixels"), while amc takes screenshots up to
    8,192 a side: a small PNG of a 1080×8100 screen went as it was, and with `send_screenshot`
    every step of its task failed. It goes without its image now (scaled, the model's
    coordinates would no longer be the screen's), and the model is told."""
    png = phone_png(1080, 8100, noisy_rows=8)
    assert base64_size(len(png)) < ANTHROPIC_MAX_BASE64
    fake_server.script_anthropic(anthropic_message(tool_use("tap", TAP_DISPLAY)))
    planner = make(fake_server, send_screenshot=True)
    try:
        decision = await planner.decide(GOAL, settings_main(), screenshot=png)
    finally:
        await planner.aclose()
    assert decision.arguments == {"element_id": "e17"}
    assert fake_server.rejections == []
    (request,) = fake_server.bodies("/v1/messages")
    note, prompt = request["messages"][0]["content"]
    assert note["type"] == "text" and note["text"].startswith("[No screenshot this step")
    assert "1080x8100 pixels" in note["text"] and "8,000" in note["text"]
    assert GOAL in prompt["text"]


@pytest.mark.parametrize("damaged", [png_with_bad_data(), cut_jpeg()], ids=["png", "jpeg"])
async def test_a_damaged_screenshot_is_left_out_and_the_prompt_says_so(
    fake_server: FakeModelServer, damaged: bytes
) -> None:
    """Decide takes any screenshot that starts like a PNG or a JPEG, and a small one went to
    Claude as it was: the API decodes it and refuses the whole request (400 "Could not
    process image"), so every step of the task failed. It goes without its image now, and
    the model is told why."""
    fake_server.script_anthropic(anthropic_message(tool_use("tap", TAP_DISPLAY)))
    planner = make(fake_server, send_screenshot=True)
    try:
        decision = await planner.decide(GOAL, settings_main(), screenshot=damaged)
    finally:
        await planner.aclose()
    assert decision.arguments == {"element_id": "e17"}
    assert fake_server.rejections == []
    (request,) = fake_server.bodies("/v1/messages")
    note, prompt = request["messages"][0]["content"]
    assert note["type"] == "text" and note["text"].startswith("[No screenshot this step")
    assert "could not be read" in note["text"]
    assert GOAL in prompt["text"]
