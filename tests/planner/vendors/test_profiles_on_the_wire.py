"""Requests built from the model's profile, against fakes that apply each model's own rules
(`tests/support/fakes/rules.py`), in compact mode; session mode is in
`tests/planner/session/test_provider_failures.py`."""

from __future__ import annotations

from typing import Any

import pytest

from planner.deciding import CUT_OFF, NUDGE
from planner.decision import Decision
from planner.errors import PlannerConfigError
from planner.planner import Planner
from planner.settings import THINKING_MAX_TOKENS, PlannerSettings
from planner.vendors import make_adapter
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    ScriptedTurn,
    anthropic_message,
    chat_completion,
    function_call,
    openai_tool_call,
    text,
    thinking,
    tool_use,
)

TAP = {"element_id": "e17", "purpose": "open display", "expected_outcome": "Display opens"}
AGAIN = {**TAP, "purpose": "open display, asked again"}


def make(server: FakeModelServer, **overrides: Any) -> Planner:
    values: dict[str, Any] = {
        "provider": "anthropic",
        "anthropic_api_key": ANTHROPIC_KEY,
        "anthropic_base_url": server.anthropic_base_url,
        "max_retries": 0,
        **overrides,
    }
    settings = PlannerSettings(**values)
    return Planner(make_adapter(settings), settings)


def shown(display: str | None) -> dict[str, Any]:
    """The settings that choose `AMC_PLANNER_THINKING_DISPLAY` (None: left at its default)."""
    return {} if display is None else {"thinking_display": display}


async def decide(planner: Planner) -> Decision:
    try:
        return await planner.decide("Turn on dark theme", settings_main())
    finally:
        await planner.aclose()


async def test_opus_47_is_asked_for_summarized_thinking_and_it_is_visible(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(
        anthropic_message(thinking("Display holds the theme."), tool_use("tap", TAP))
    )
    decision = await decide(make(fake_server, model="claude-opus-4-7", thinking="adaptive"))
    (sent,) = fake_server.requests
    assert sent.body["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert [b.text for b in decision.thinking] == ["Display holds the theme."]
    assert decision.thinking_kind == "summarized"


async def test_without_summarized_display_the_thinking_is_omitted_not_redacted(
    fake_server: FakeModelServer,
) -> None:
    """What the planner did before profiles (no display field): the model still thinks, the
    provider returns a signature only, and the decision says so instead of "redacted"."""
    fake_server.script_anthropic(anthropic_message(thinking("hidden"), tool_use("tap", TAP)))
    decision = await decide(
        make(
            fake_server,
            model="claude-opus-4-7",
            thinking="adaptive",
            model_profile="anthropic-unknown",
        )
    )
    assert "display" not in fake_server.requests[0].body["thinking"]
    assert [(b.text, b.redacted) for b in decision.thinking] == [("", False)]
    assert decision.thinking_kind == "omitted"


async def test_adaptive_only_model_gets_a_nudge_not_a_forced_tool_choice(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(
        anthropic_message(thinking("Let me look first."), text("The list shows Display.")),
        anthropic_message(thinking("Now act."), tool_use("tap", TAP)),
    )
    decision = await decide(make(fake_server, model="claude-opus-4-7", thinking="adaptive"))
    _first, retry = fake_server.requests
    assert retry.status == 200, retry.error
    assert retry.body["tool_choice"]["type"] == "auto"
    assert retry.body["thinking"] == {"type": "adaptive", "display": "summarized"}
    assistant, nudge = retry.body["messages"][1:]
    assert [b["type"] for b in assistant["content"]] == ["thinking", "text"]
    assert nudge["content"][-1] == {"type": "text", "text": NUDGE}
    assert decision.forced_retry and decision.retry_kind == "nudge"
    assert [b.text for b in decision.thinking] == ["Let me look first.", "Now act."]
    assert decision.rationale == "The list shows Display."


SUMMARIES = ["Look first.", "Now act."]


@pytest.mark.parametrize(
    ("model", "chosen", "display", "thoughts"),
    [
        # By default every one is asked for summaries: the reasoning is readable.
        ("claude-opus-5-5", None, "summarized", SUMMARIES),
        ("claude-sonnet-5-5", None, "summarized", SUMMARIES),
        ("claude-fable-5-1", None, "summarized", SUMMARIES),
        ("claude-mythos-5", None, "summarized", SUMMARIES),
        # `updates` chosen: the models with progress updates return their text alone.
        ("claude-opus-5-5", "updates", "updates", ["", ""]),
        ("claude-sonnet-5-5", "updates", "updates", ["", ""]),
        ("claude-fable-5-1", "updates", "updates", ["", ""]),
        ("claude-mythos-5", "updates", "summarized", SUMMARIES),  # no progress updates
    ],
)
async def test_models_that_always_think_are_nudged_and_asked_for_readable_thinking(
    fake_server: FakeModelServer,
    model: str,
    chosen: str | None,
    display: str,
    thoughts: list[str],
) -> None:
    """They refuse a forced tool choice whatever the thinking, and think when told nothing."""
    fake_server.script_anthropic(
        anthropic_message(thinking("Look first."), text("The list shows Display.")),
        anthropic_message(thinking("Now act."), tool_use("tap", TAP)),
    )
    decision = await decide(make(fake_server, model=model, thinking="adaptive", **shown(chosen)))
    assert [r.body["tool_choice"]["type"] for r in fake_server.requests] == ["auto", "auto"]
    for sent in fake_server.requests:
        assert sent.body["thinking"] == {"type": "adaptive", "display": display}
    assert decision.retry_kind == "nudge" and fake_server.rejections == []
    assert [b.text for b in decision.thinking] == thoughts


JUDGED = "Settings opened as expected. Now open Display, where the theme is."


PROGRESS_UPDATES = ["claude-opus-5-5", "claude-sonnet-5-5", "claude-fable-5-1", "claude-mythos-5-1"]


@pytest.mark.parametrize("model", PROGRESS_UPDATES)
@pytest.mark.parametrize(
    ("chosen", "thoughts", "thinking_kind"),
    [
        (None, ["Display holds the theme."], "summarized"),
        ("updates", [""], "omitted"),  # asked for the text alone
    ],
)
async def test_the_text_a_55_model_writes_before_its_call_is_the_rationale_not_thinking(
    fake_server: FakeModelServer,
    model: str,
    chosen: str | None,
    thoughts: list[str],
    thinking_kind: str,
) -> None:
    """Claude Opus 5.5 and Sonnet 5.5 (and Fable 5.1, Mythos 5.1) return the text they write
    before a tool call in a thinking block of its own ("text between tool calls comes back in
    thinking blocks"): the decision's rationale was empty and that text was recorded as the
    model's thinking."""
    fake_server.script_anthropic(
        anthropic_message(thinking("Display holds the theme."), text(JUDGED), tool_use("tap", TAP))
    )
    decision = await decide(make(fake_server, model=model, thinking="adaptive", **shown(chosen)))
    assert decision.rationale == JUDGED
    assert [b.text for b in decision.thinking] == thoughts
    assert decision.thinking_kind == thinking_kind
    assert (decision.purpose, decision.expected_outcome) == (
        TAP["purpose"],
        TAP["expected_outcome"],
    )


@pytest.mark.parametrize("model", PROGRESS_UPDATES)
@pytest.mark.parametrize(
    ("blocks", "rationale", "thinking_kind"),
    [
        pytest.param([text(JUDGED)], JUDGED, "none", id="its-text-alone"),
        pytest.param([thinking("Display holds the theme.")], None, "omitted", id="reasoning-alone"),
    ],
)
async def test_a_lone_block_before_the_call_of_a_model_with_progress_updates_is_read_exactly(
    fake_server: FakeModelServer,
    model: str,
    blocks: list[dict[str, Any]],
    rationale: str | None,
    thinking_kind: str,
) -> None:
    """Asked for summarized thinking, Opus 5.5 and Sonnet 5.5 (and Fable 5.1 and Mythos 5.1,
    which were read as if they never did) return the text they write before a call (a
    progress update) in a thinking block "not distinguishable from a reasoning block" (the
    Thinking page), and either may be skipped: one block before the call was read as thinking
    by its position, so a step whose model wrote its judgement and no reasoning recorded no
    rationale and the judgement as thinking. With `AMC_PLANNER_THINKING_DISPLAY=updates` they
    are asked for `display: "updates"` (beta header): reasoning comes back empty, the text
    readable, and each block is read for what it is."""
    fake_server.script_anthropic(anthropic_message(*blocks, tool_use("tap", TAP)))
    decision = await decide(
        make(fake_server, model=model, thinking="adaptive", thinking_display="updates")
    )
    assert decision.rationale == rationale
    assert decision.thinking_kind == thinking_kind
    assert [b.text for b in decision.thinking] == ([""] if thinking_kind == "omitted" else [])
    (sent,) = fake_server.requests
    assert sent.status == 200, sent.error
    assert sent.body["thinking"] == {"type": "adaptive", "display": "updates"}
    assert sent.headers["anthropic-beta"] == "thinking-display-updates-2026-08-18"


REASONED = "Display holds the theme."


@pytest.mark.parametrize("model", PROGRESS_UPDATES)
@pytest.mark.parametrize(
    ("blocks", "rationale", "thoughts"),
    [
        pytest.param(
            [thinking(REASONED), text(JUDGED)], JUDGED, [REASONED], id="reasoning-then-its-text"
        ),
        # One readable block and nothing else: the text or reasoning, which a summarized
        # display does not tell apart; recorded as both, so nothing is lost either way.
        pytest.param([text(JUDGED)], JUDGED, [JUDGED], id="its-text-alone"),
        pytest.param([thinking(REASONED)], REASONED, [REASONED], id="reasoning-alone"),
    ],
)
async def test_by_default_a_model_with_progress_updates_shows_its_reasoning_and_its_rationale(
    fake_server: FakeModelServer,
    model: str,
    blocks: list[dict[str, Any]],
    rationale: str,
    thoughts: list[str],
) -> None:
    """Asked for the `updates` display, these models' reasoning summaries never came back: the
    decision log said "thinking omitted by the provider" and the live view showed nothing for
    the flagship models. By default they are asked for summaries (no beta header): every
    reasoning block is recorded as thinking, the readable block right before the call as the
    rationale (and, when it is the only one, as thinking too)."""
    fake_server.script_anthropic(anthropic_message(*blocks, tool_use("tap", TAP)))
    decision = await decide(make(fake_server, model=model, thinking="adaptive"))
    (sent,) = fake_server.requests
    assert sent.status == 200, sent.error
    assert sent.body["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert "anthropic-beta" not in sent.headers
    assert decision.rationale == rationale
    assert [b.text for b in decision.thinking] == thoughts
    assert decision.thinking_kind == "summarized"


@pytest.mark.parametrize("model", ["claude-opus-5-7", "claude-sonnet-6"])
@pytest.mark.parametrize(
    ("chosen", "display", "thoughts"),
    [(None, "summarized", ["Display holds the theme."]), ("updates", "updates", [""])],
)
async def test_a_newer_opus_or_sonnet_reads_its_text_in_thinking_as_the_rationale(
    fake_server: FakeModelServer,
    model: str,
    chosen: str | None,
    display: str,
    thoughts: list[str],
) -> None:
    """A version past the table (the fake answers it as its family's newest, 5.5, does) got
    `claude-newer` without the family's text-in-thinking reading: its judgement and intent
    were recorded as thinking and the rationale was empty."""
    fake_server.script_anthropic(
        anthropic_message(thinking("Display holds the theme."), text(JUDGED), tool_use("tap", TAP))
    )
    decision = await decide(make(fake_server, model=model, thinking="adaptive", **shown(chosen)))
    assert fake_server.rejections == []
    assert fake_server.requests[0].body["thinking"]["display"] == display
    assert decision.rationale == JUDGED
    assert [b.text for b in decision.thinking] == thoughts


async def test_with_up_front_thinking_off_sonnet_55_thinking_blocks_hold_its_text(
    fake_server: FakeModelServer,
) -> None:
    """`between_tools`: no up-front thinking, and what the model writes between tool calls
    comes back in thinking blocks (the SDK's ThinkingTypes): that is its rationale."""
    fake_server.script_anthropic(anthropic_message(text(JUDGED), tool_use("tap", TAP)))
    decision = await decide(make(fake_server, model="claude-sonnet-5-5"))
    assert decision.rationale == JUDGED
    assert decision.thinking == [] and decision.thinking_kind == "none"


async def test_opus_5_with_thinking_off_says_disabled_and_can_be_forced(
    fake_server: FakeModelServer,
) -> None:
    """Opus 5 thinks when `thinking` is left out: "off" used to omit it, so the model thought
    anyway and the forced retry (thinking with a forced tool choice) was refused."""
    fake_server.script_anthropic(
        anthropic_message(text("Display.")), anthropic_message(tool_use("tap", TAP))
    )
    decision = await decide(make(fake_server, model="claude-opus-5"))
    first, forced = fake_server.requests
    assert first.body["thinking"] == {"type": "disabled"}
    assert forced.body["thinking"] == {"type": "disabled"}
    assert forced.body["tool_choice"]["type"] == "any"
    assert decision.retry_kind == "forced" and fake_server.rejections == []
    assert decision.thinking_kind == "none"


@pytest.mark.parametrize(
    ("model", "off"), [("claude-haiku-5-5", "disabled"), ("claude-sonnet-5-5", "between_tools")]
)
async def test_claude_55_models_that_can_run_without_thinking_are_told_how(
    fake_server: FakeModelServer, model: str, off: str
) -> None:
    """Haiku 5.5 thinks unless told `{type: disabled}`; Sonnet 5.5 refuses that and turns its
    up-front thinking off with `{type: between_tools}` (the SDK's ThinkingConfigBetweenToolsParam).
    Both were taken for models past the table, which always think: thinking "off" was refused
    at start."""
    fake_server.script_anthropic(anthropic_message(text("Display."), tool_use("tap", TAP)))
    decision = await decide(make(fake_server, model=model))
    (sent,) = fake_server.requests
    assert sent.body["thinking"] == {"type": off}
    assert fake_server.rejections == []
    assert decision.thinking_kind == "none"


@pytest.mark.parametrize("effort", ["xhigh", "max"])
async def test_sonnet_55_without_thinking_above_high_is_refused_at_start(
    fake_server: FakeModelServer, effort: str
) -> None:
    """Sonnet 5.5 takes `between_tools` at effort low, medium or high only ("At xhigh or max
    effort, a request with between_tools returns a 400 error"). With thinking off and such an
    effort the planner started and sent it anyway, and every decision was refused with that
    400; it is now refused at start, saying what to change, and nothing is sent."""
    fake_server.script_anthropic(anthropic_message(text("Display."), tool_use("tap", TAP)))
    with pytest.raises(PlannerConfigError, match="turns thinking off only at effort high, low"):
        await decide(make(fake_server, model="claude-sonnet-5-5", effort=effort))
    assert fake_server.requests == []


async def test_opus_48_is_asked_for_summarized_thinking(fake_server: FakeModelServer) -> None:
    """Unknown to the table before, it got no display field: its thinking came back empty."""
    fake_server.script_anthropic(anthropic_message(thinking("Visible."), tool_use("tap", TAP)))
    decision = await decide(make(fake_server, model="claude-opus-4-8", thinking="adaptive"))
    assert fake_server.requests[0].body["thinking"]["display"] == "summarized"
    assert decision.thinking_kind == "summarized"


async def test_budget_thinking_carries_the_configured_effort(
    fake_server: FakeModelServer,
) -> None:
    """AMC_PLANNER_EFFORT was dropped, without a word, when thinking was `budget`: the model
    ran at its default effort (high). The API applies both (effort governs every output token,
    text and tool calls too; the budget caps the thinking), so both are sent."""
    fake_server.script_anthropic(anthropic_message(thinking("Display."), tool_use("tap", TAP)))
    await decide(
        make(
            fake_server,
            model="claude-sonnet-4-6",
            thinking="budget",
            thinking_budget_tokens=2048,
            effort="low",
        )
    )
    (sent,) = fake_server.requests
    assert sent.status == 200, sent.error
    assert sent.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent.body["output_config"] == {"effort": "low"}


@pytest.mark.parametrize(
    ("model", "effort"),
    [
        ("claude-sonnet-4-6", "low"),
        ("claude-opus-4-7", "xhigh"),
        ("claude-opus-5", "high"),  # `disabled` at effort high or below
    ],
)
async def test_effort_without_thinking_is_sent(
    fake_server: FakeModelServer, model: str, effort: str
) -> None:
    """AMC_PLANNER_EFFORT with thinking off was dropped without a word: the model answered at
    its default effort (high). Effort governs every output token, text and tool calls too, and
    "doesn't require thinking to be enabled" (the effort page), so it goes without thinking."""
    fake_server.script_anthropic(anthropic_message(tool_use("tap", TAP)))
    await decide(make(fake_server, model=model, effort=effort))
    (sent,) = fake_server.requests
    assert sent.status == 200, sent.error
    assert sent.body.get("thinking", {"type": "disabled"})["type"] == "disabled"
    assert sent.body["output_config"] == {"effort": effort}


async def test_a_forced_retry_keeps_the_effort(fake_server: FakeModelServer) -> None:
    """The forced retry runs without thinking; the effort asked for still applies to it."""
    fake_server.script_anthropic(
        anthropic_message(thinking("hm"), text("Display.")),
        anthropic_message(tool_use("tap", TAP)),
    )
    await decide(make(fake_server, model="claude-sonnet-4-6", thinking="adaptive", effort="low"))
    forced = fake_server.requests[1]
    assert forced.status == 200, forced.error
    assert forced.body["tool_choice"]["type"] == "any"
    assert forced.body["output_config"] == {"effort": "low"}


async def test_claude_46_forced_retry_says_thinking_disabled(fake_server: FakeModelServer) -> None:
    fake_server.script_anthropic(
        anthropic_message(thinking("hm"), text("Display.")),
        anthropic_message(tool_use("tap", TAP)),
    )
    decision = await decide(make(fake_server, model="claude-sonnet-4-6", thinking="adaptive"))
    forced = fake_server.requests[1]
    assert forced.body["tool_choice"]["type"] == "any"
    assert forced.body["thinking"] == {"type": "disabled"}
    assert decision.retry_kind == "forced"


async def test_a_call_in_a_reply_cut_off_at_max_tokens_is_not_executed(
    fake_server: FakeModelServer,
) -> None:
    """Its input may be cut off and still validate (the docs: retry an incomplete tool_use with
    a higher max_tokens): it used to be executed. It gets the corrective turn, with more room."""
    fake_server.script_anthropic(
        anthropic_message(
            text("Display is the row to open because the theme"),
            tool_use("tap", TAP),
            stop_reason="max_tokens",
        ),
        anthropic_message(tool_use("tap", AGAIN)),
    )
    decision = await decide(make(fake_server, model="claude-sonnet-4-6"))
    assert decision.purpose == AGAIN["purpose"] and decision.corrective_retries == 1
    assert decision.output_truncated
    assert decision.rationale == f"Display is the row to open because the theme\n{CUT_OFF}"
    first, retried = fake_server.requests
    assert retried.body["max_tokens"] == THINKING_MAX_TOKENS > first.body["max_tokens"]
    (result,) = retried.body["messages"][-1]["content"]
    assert result["type"] == "tool_result" and result["is_error"] is True
    assert "not executed: your answer was cut off" in str(result["content"])


async def test_the_rationale_is_not_repeated_after_a_corrective_retry(
    fake_server: FakeModelServer,
) -> None:
    bad = {**TAP, "element_id": "e999"}
    fake_server.script_anthropic(
        anthropic_message(text("Open Display."), tool_use("tap", bad)),
        anthropic_message(text("Open Display."), tool_use("tap", TAP)),
    )
    decision = await decide(make(fake_server, model="claude-sonnet-4-6"))
    assert decision.corrective_retries == 1
    assert decision.rationale == "Open Display."


async def test_prompt_cache_reads_and_writes_are_recorded_per_decision(
    fake_server: FakeModelServer,
) -> None:
    """Breakpoints on the system prompt and tools: the first decision writes them to the
    cache, the next reads them (the fake prices requests as the API documents)."""
    fake_server.script_anthropic(
        *[ScriptedTurn([tool_use("tap", TAP)]) for _ in range(2)]  # usage priced by the fake
    )
    first = await decide(make(fake_server, model="claude-sonnet-4-6"))
    second = await decide(make(fake_server, model="claude-sonnet-4-6"))
    assert first.usage.cache_creation_input_tokens > 1000
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens < first.usage.input_tokens + 1


async def test_without_prompt_caching_nothing_is_cached(fake_server: FakeModelServer) -> None:
    fake_server.script_anthropic(
        *[ScriptedTurn([tool_use("tap", TAP)]) for _ in range(2)]  # usage priced by the fake
    )
    for _ in range(2):
        decision = await decide(make(fake_server, model="claude-sonnet-4-6", prompt_cache=False))
        assert decision.usage.cache_read_input_tokens == 0
        assert decision.usage.cache_creation_input_tokens == 0
    assert isinstance(fake_server.requests[-1].body["system"], str)


def _openai(server: FakeModelServer, **overrides: Any) -> Planner:
    values: dict[str, Any] = {
        "provider": "openai",
        "openai_api_key": OPENAI_KEY,
        "openai_base_url": server.openai_base_url,
        "max_retries": 0,
        **overrides,
    }
    settings = PlannerSettings(**values)
    return Planner(make_adapter(settings), settings)


@pytest.mark.parametrize(
    ("model", "thinking_mode", "sent"),
    [
        ("gpt-4.1-mini", "off", None),
        ("o4-mini", "adaptive", "low"),
        ("o4-mini", "off", "low"),  # the least it takes: it always reasons
    ],
)
async def test_chat_reasoning_effort_only_for_reasoning_models(
    fake_server: FakeModelServer, model: str, thinking_mode: str, sent: str | None
) -> None:
    fake_server.script_openai(chat_completion(None, openai_tool_call("tap", TAP), model=model))
    # An effort is for thinking adaptive (refused beside `off`, which asks for the least).
    effort = {"effort": "low"} if thinking_mode == "adaptive" else {}
    await decide(_openai(fake_server, model=model, thinking=thinking_mode, **effort))
    (request,) = fake_server.requests
    assert request.status == 200, request.error
    assert request.body.get("reasoning_effort") == sent


@pytest.mark.parametrize(
    ("model", "effort"),
    [
        ("gpt-5-mini", "minimal"),
        ("gpt-5.1", "none"),
        ("gpt-5.2", "xhigh"),
        ("gpt-5.1-chat-latest", "medium"),
        ("gpt-5.1-codex-max", "xhigh"),
        ("gpt-5.6-luna", "max"),
    ],
)
async def test_each_gpt_5_family_is_sent_an_effort_it_takes(
    fake_server: FakeModelServer, model: str, effort: str
) -> None:
    """What the table accepts at start the provider (the fake, with each model's own list of
    efforts) accepts too."""
    fake_server.script_responses(ScriptedTurn([function_call("tap", TAP)], model=model))
    await decide(_openai(fake_server, model=model, thinking="adaptive", effort=effort))
    (request,) = fake_server.requests
    assert request.status == 200, request.error
    assert request.body["reasoning"]["effort"] == effort


async def test_the_default_openai_model_reasons_with_tools(fake_server: FakeModelServer) -> None:
    """The default OpenAI model was gpt-4.1-mini: AMC_PLANNER_THINKING=adaptive with a key and
    no model was refused at start ("does not reason"), and the planner ran on a model OpenAI's
    models page no longer lists. The default is the one that page names for balancing
    intelligence and cost, a reasoning model with function tools on Responses."""
    fake_server.script_responses(ScriptedTurn([function_call("tap", TAP)]))
    decision = await decide(_openai(fake_server, thinking="adaptive", effort="medium"))
    (request,) = fake_server.requests
    assert request.status == 200, request.error
    assert request.path.endswith("/responses")
    assert request.body["model"] == "gpt-6.2-sol"
    assert request.body["reasoning"]["effort"] == "medium"
    assert decision.purpose == TAP["purpose"]
    assert decision.usage.cost_usd > 0  # the default has a price row


async def test_a_call_in_a_chat_reply_cut_off_at_length_is_not_executed(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_openai(
        chat_completion("Open", openai_tool_call("tap", TAP), finish_reason="length"),
        chat_completion(None, openai_tool_call("tap", AGAIN)),
    )
    decision = await decide(_openai(fake_server, model="gpt-4.1-mini"))
    assert decision.purpose == AGAIN["purpose"] and decision.corrective_retries == 1
    assert decision.output_truncated and decision.rationale == f"Open\n{CUT_OFF}"
    first, retried = fake_server.requests
    assert retried.body["max_completion_tokens"] > first.body["max_completion_tokens"]
    result = retried.body["messages"][-1]
    assert result["role"] == "tool" and "not executed: your answer was cut off" in str(result)
