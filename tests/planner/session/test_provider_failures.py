"""Session mode against providers as they fail and change in production: a stream that fails
after HTTP 200, 429 / 500 / 529, answers without a tool call, replies cut off, models that take
only adaptive thinking, non-reasoning OpenAI models. Real SDKs, the enforcing fakes, SQLite."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from planner.conversation.items import ContextCheckpoint, Reasoning, UserObservation
from planner.deciding import CUT_OFF, CUT_OFF_NUDGE, NUDGE
from planner.errors import (
    PlannerAuthError,
    PlannerConfigError,
    PlannerContextExceeded,
    PlannerError,
    PlannerParameterRejected,
    PlannerRateLimited,
    PlannerRejected,
    PlannerTransient,
    PlannerUnavailable,
)
from planner.model_profiles import PROFILES
from planner.session.config import SessionConfig
from planner.session.factory import open_session_planner
from planner.session.planner import SessionPlanner
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from planner.vendors import ThinkingConfig, thinking_config
from planner.vendors.anthropic import AnthropicAdapter
from planner.vendors.openai import OpenAIAdapter
from planner.vendors.openai import adapter as openai_adapter
from tests.support.fakes import (
    FakeModelServer,
    Reply,
    ScriptedTurn,
    anthropic_error,
    function_call,
    message,
    openai_error,
    rate_limited_anthropic,
    reasoning,
    text,
    thinking,
    tool_use,
)
from tests.support.fakes.anthropic import overloaded

INTENT = {"purpose": "make progress", "expected_outcome": "the next screen shows"}
ADAPTIVE = ThinkingConfig("adaptive")


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as s:
        yield s


class Planners:
    """Session planners over one SQLite file, closed at the end."""

    def __init__(self, server: FakeModelServer, db: Path) -> None:
        self.server, self.db = server, db
        self.opened: list[SessionPlanner] = []

    async def anthropic(
        self,
        model: str = "claude-sonnet-4-6",
        *,
        thinking: ThinkingConfig = ADAPTIVE,
        stream: bool = True,
        retries: int = 0,
        **adapter: Any,
    ) -> SessionPlanner:
        client = anthropic.AsyncAnthropic(
            api_key="k", base_url=self.server.anthropic_base_url, max_retries=retries
        )
        return await self._open(
            AnthropicAdapter(client, model=model, thinking=thinking, retries=retries, **adapter),
            stream,
        )

    async def openai(
        self, model: str = "o4-mini", *, thinking: ThinkingConfig = ADAPTIVE, stream: bool = True
    ) -> SessionPlanner:
        client = openai.AsyncOpenAI(
            api_key="k", base_url=self.server.openai_base_url, max_retries=0
        )
        return await self._open(
            OpenAIAdapter(client, model=model, thinking=thinking, retries=0), stream
        )

    async def _open(self, adapter: Any, stream: bool) -> SessionPlanner:
        planner = await SessionPlanner.open(
            store=SqliteSessionStore(self.db),
            task_id="t1",
            attempt=1,
            adapter=adapter,
            owns_adapter=True,
            config=SessionConfig(stream=stream),
        )
        self.opened.append(planner)
        return planner


@pytest.fixture
async def planners(server: FakeModelServer, tmp_path: Path) -> AsyncIterator[Planners]:
    made = Planners(server, tmp_path / "host.sqlite")
    yield made
    for planner in made.opened:
        await planner.aclose()


def _turn(n: int) -> ScriptedTurn:
    return ScriptedTurn(
        [
            thinking(f"thought {n}"),
            text(f"step {n}"),
            tool_use("press_key", {"key": "back", **INTENT}),
        ]
    )


async def test_overloaded_after_200_is_transient_and_never_starts_afresh(
    server: FakeModelServer, planners: Planners
) -> None:
    """`event: error` (overloaded_error) inside a stream that began with HTTP 200 used to be
    taken for a refusal: the session "started afresh", retiring every earlier thinking block."""
    server.anthropic_script.extend([_turn(1), overloaded(), overloaded(), _turn(2)])
    planner = await planners.anthropic()
    await planner.decide("screen 1")
    await planner.record_tool_result("pressed")
    with pytest.raises(PlannerUnavailable, match="failed mid-stream"):
        await planner.decide("screen 2")
    assert not any(isinstance(i, ContextCheckpoint) for i in planner.history)
    assert [r.status for r in server.requests] == [200, 200]  # only the first turn and the error
    # Asked again (the host waits and retries): the same screen is not added twice, and the
    # earlier thinking still travels, signed.
    with pytest.raises(PlannerUnavailable):
        await planner.decide("screen 2")
    decision = await planner.decide("screen 2")
    assert decision.extra["started_afresh"] is False
    observations = [i for i in planner.history if isinstance(i, UserObservation)]
    assert [o.text for o in observations] == ["screen 1", "screen 2"]
    sent = server.bodies("/v1/messages")[-1]["messages"]
    assert sent[1]["content"][0]["type"] == "thinking"
    assert server.rejections == []


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (rate_limited_anthropic(), PlannerRateLimited),
        (
            anthropic_error(500, "api_error", "Internal server error", retry_after_ms="5"),
            PlannerUnavailable,
        ),
        (
            anthropic_error(529, "overloaded_error", "Overloaded", retry_after_ms="5"),
            PlannerUnavailable,
        ),
    ],
    ids=["429", "500", "529"],
)
async def test_http_failures_in_session_mode_are_transient(
    server: FakeModelServer, planners: Planners, reply: Reply, error: type[PlannerError]
) -> None:
    server.anthropic_script.extend([_turn(1), reply, reply, reply, _turn(2)])
    planner = await planners.anthropic(retries=1)
    await planner.decide("screen 1")
    await planner.record_tool_result("pressed")
    with pytest.raises(error):
        await planner.decide("screen 2")  # the SDK's own retry failed too
    decision = await planner.decide("screen 2")  # the SDK retries past the third one
    assert decision.tool_name == "press_key"
    assert not any(isinstance(i, ContextCheckpoint) for i in planner.history)
    assert [r.status for r in server.requests] == [
        200,
        reply.status,
        reply.status,
        reply.status,
        200,
    ]


@pytest.mark.parametrize(
    "words",
    [
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
        "Billing to upgrade or purchase credits.",
        "You have reached your specified API usage limits. You will regain access on "
        "2026-04-01 at 00:00 UTC.",
    ],
    ids=["credit-balance", "usage-limits"],
)
async def test_a_billing_refusal_sent_as_an_invalid_request_fails_fast_and_keeps_the_session(
    server: FakeModelServer, planners: Planners, words: str
) -> None:
    """Anthropic refuses an account out of credit, or past its spend limit, with HTTP 400
    invalid_request_error. Taken for an invalid request, it "started afresh": the session was
    condensed for good (earlier screens, all reasoning retired), asked again, refused again,
    and reported as a rejected request (gRPC UNKNOWN) instead of a billing refusal."""
    refused = anthropic_error(400, "invalid_request_error", words)
    server.anthropic_script.extend([_turn(1), refused, refused])
    planner = await planners.anthropic()
    await planner.decide("screen 1")
    await planner.record_tool_result("pressed")
    with pytest.raises(PlannerAuthError, match="refused the request for billing") as caught:
        await planner.decide("screen 2")
    assert words in str(caught.value)
    assert not any(isinstance(i, ContextCheckpoint) for i in planner.history)
    assert [r.status for r in server.requests] == [200, 400]


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_page_in_place_of_a_stream_is_not_an_answer(
    server: FakeModelServer, planners: Planners, vendor: str
) -> None:
    """A proxy or gateway answering a streamed call with HTTP 200 and an HTML page: the SDK
    reads any 200 as events, a page has none, and the planner said "stream broke off" (as
    for a provider that dropped the connection) instead of what a non-streamed call says of
    the same page: not an API answer, and which base URL to look at."""
    server.answer_with_page(
        "<!DOCTYPE html><html><head><title>Sign in to the proxy</title></head></html>"
    )
    planner = await (planners.anthropic() if vendor == "anthropic" else planners.openai())
    with pytest.raises(PlannerUnavailable, match="not an API answer") as caught:
        await planner.decide("screen 1")
    assert "Sign in to the proxy" in str(caught.value)
    assert f"AMC_PLANNER_{vendor.upper()}_BASE_URL" in str(caught.value)
    assert "broke off" not in str(caught.value)
    assert server.bodies()[0]["stream"] is True  # it was asked as a stream


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_page_in_place_of_a_stream_cut_off_is_unavailable(
    server: FakeModelServer, planners: Planners, vendor: str
) -> None:
    """The connection drops while the page is read: still a planner error the host waits on,
    not the HTTP library's exception (an internal error at Decide)."""
    server.answer_with_page("<html><body>Sign in to the proxy</body></html>", cut=True)
    planner = await (planners.anthropic() if vendor == "anthropic" else planners.openai())
    with pytest.raises(PlannerUnavailable):
        await planner.decide("screen 1")


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_stream_without_a_content_type_is_read_as_the_sdks_read_it(
    server: FakeModelServer, planners: Planners, vendor: str
) -> None:
    """A streamed 200 whose Content-Type header is missing (a proxy in front of the API that
    drops it): both SDKs read the body of any streamed 200 as server-sent events whatever its
    Content-Type, and these events are a whole answer. It was taken for a page and the step
    failed "not an API answer"."""
    server.stream_content_type = None
    if vendor == "anthropic":
        server.anthropic_script.append(_turn(1))
    else:
        server.responses_script.append(
            ScriptedTurn([reasoning("look"), function_call("press_key", {"key": "back", **INTENT})])
        )
    planner = await (planners.anthropic() if vendor == "anthropic" else planners.openai())
    decision = await planner.decide("screen 1")
    assert decision.tool_name == "press_key"
    assert server.bodies()[0]["stream"] is True  # it was asked as a stream


async def test_no_tool_call_twice_recovers_with_a_corrective_turn(
    server: FakeModelServer, planners: Planners
) -> None:
    """Session mode used to fail the step here; compact mode always recovered."""
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("look"), text("Looking.")]),
            ScriptedTurn([text("Still looking.")]),  # the forced retry, no call either
            ScriptedTurn([thinking("act"), tool_use("press_key", {"key": "home", **INTENT})]),
        ]
    )
    planner = await planners.anthropic()
    decision = await planner.decide("screen 1")
    assert decision.tool_name == "press_key"
    assert (decision.retry_kind, decision.corrective_retries) == ("forced", 1)
    assert decision.rationale == "Still looking."
    assert server.rejections == []


async def test_adaptive_only_model_is_nudged_and_its_thinking_asked_summarized(
    server: FakeModelServer, planners: Planners
) -> None:
    """Claude Opus 4.7 refuses `thinking: {type: disabled}` (what the forced retry sent) and a
    forced tool choice with thinking; it omits thinking text unless asked for a summary."""
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("First look around."), text("Looking.")]),
            ScriptedTurn(
                [thinking("Back it is."), tool_use("press_key", {"key": "back", **INTENT})]
            ),
        ]
    )
    planner = await planners.anthropic("claude-opus-4-7")
    decision = await planner.decide("screen 1")
    first, nudged = server.bodies("/v1/messages")
    for body in (first, nudged):
        assert body["thinking"] == {"type": "adaptive", "display": "summarized"}
        assert body["tool_choice"]["type"] == "auto"
    assert nudged["messages"][-1]["content"][-1] == {"type": "text", "text": NUDGE}
    assert decision.retry_kind == "nudge"
    assert [b.text for b in decision.thinking] == ["First look around.", "Back it is."]
    assert decision.thinking_kind == "summarized"
    assert server.rejections == []


async def test_signature_only_thinking_is_omitted_not_redacted(
    server: FakeModelServer, planners: Planners
) -> None:
    server.anthropic_script.append(
        ScriptedTurn([thinking("unseen"), tool_use("press_key", {"key": "back", **INTENT})])
    )
    # The profile of an unknown model asks for no display: Opus 4.7 then omits the text.
    planner = await planners.anthropic("claude-opus-4-7", profile=PROFILES["anthropic-unknown"])
    decision = await planner.decide("screen 1")
    assert [(b.text, b.redacted) for b in decision.thinking] == [("", False)]
    assert decision.thinking_kind == "omitted"
    (kept,) = [i for i in planner.history if isinstance(i, Reasoning)]
    assert kept.signature and not kept.redacted_data


async def test_a_reply_cut_off_at_max_tokens_is_marked_and_its_call_not_executed(
    server: FakeModelServer, planners: Planners
) -> None:
    """A cut-off answer's call may be incomplete: it gets the corrective turn, asked with more
    room."""
    server.anthropic_script.extend(
        [
            ScriptedTurn(
                [
                    thinking("t"),
                    text("Pressing back because"),
                    tool_use("press_key", {"key": "back", **INTENT}),
                ],
                stop_reason="max_tokens",
            ),
            ScriptedTurn([thinking("again"), tool_use("press_key", {"key": "home", **INTENT})]),
        ]
    )
    decision = await (await planners.anthropic()).decide("screen 1")
    assert decision.arguments["key"] == "home" and decision.corrective_retries == 1
    assert decision.output_truncated
    assert decision.rationale == f"Pressing back because\n{CUT_OFF}"
    first, retried = server.bodies("/v1/messages")
    assert retried["max_tokens"] > first["max_tokens"]
    (result,) = retried["messages"][-1]["content"]
    assert result["type"] == "tool_result" and result["is_error"] is True
    assert server.rejections == []


async def test_a_session_past_the_context_window_starts_afresh_once_not_corrected(
    server: FakeModelServer, planners: Planners
) -> None:
    """Claude stopped at its context window (`model_context_window_exceeded`) was taken for an
    answer cut off at max_tokens: the corrective turn went back on top of a full context (and
    asked for more output room), overflowed again, and the step failed as "an unusable tool
    call twice"; every later step of the session overflowed the same way. The session now
    starts afresh (earlier screens condensed, earlier reasoning retired) and asks once more;
    the overflowed answer is never kept, but what it cost counts."""
    overflowed = ScriptedTurn(
        [thinking("t"), tool_use("press_key", {"key": "back", **INTENT})],
        stop_reason="model_context_window_exceeded",
        usage={"input_tokens": 199_000, "output_tokens": 1_000},
    )
    server.anthropic_script.extend([_turn(1), overflowed, _turn(2)])
    planner = await planners.anthropic()
    await planner.decide("screen 1")
    await planner.record_tool_result("pressed")
    decision = await planner.decide("screen 2")
    assert decision.extra["started_afresh"] is True
    assert decision.corrective_retries == 0 and not decision.output_truncated
    assert decision.usage.input_tokens > 199_000  # the overflowed call was billed
    assert any(isinstance(i, ContextCheckpoint) for i in planner.history)
    assert "thought 2" in [i.text for i in planner.history if isinstance(i, Reasoning)]
    assert "t" not in [i.text for i in planner.history if isinstance(i, Reasoning)]
    overflowing, afresh = server.bodies("/v1/messages")[1:]
    assert afresh["max_tokens"] == overflowing["max_tokens"]  # no more output room asked
    assert afresh["messages"][-1]["content"][-1] == {"type": "text", "text": "screen 2"}
    assert server.rejections == []


async def test_a_session_still_past_the_context_window_fails_the_step_typed(
    server: FakeModelServer, planners: Planners
) -> None:
    """Afresh and still over the window: the step fails with PlannerContextExceeded (gRPC
    UNKNOWN through Decide) after two calls, not a loop of corrective turns."""
    overflowed = ScriptedTurn(
        [thinking("t"), tool_use("press_key", {"key": "back", **INTENT})],
        stop_reason="model_context_window_exceeded",
    )
    server.anthropic_script.extend([overflowed, overflowed, overflowed])
    planner = await planners.anthropic()
    with pytest.raises(PlannerContextExceeded, match="context window") as caught:
        await planner.decide("screen 1")
    assert "claude-sonnet-4-6" in str(caught.value)
    assert len(server.requests) == 2
    assert not any(isinstance(i, Reasoning) for i in planner.history)


async def test_an_openai_request_over_the_context_window_starts_the_session_afresh(
    server: FakeModelServer, planners: Planners
) -> None:
    """OpenAI refuses a request over the window before answering (400
    `context_length_exceeded`, Responses and Chat alike): the same afresh path, and the same
    typed error when that does not help."""
    too_long = openai_error(
        400,
        "Your input exceeds the context window of this model. Please adjust your input and "
        "try again.",
        "invalid_request_error",
        "context_length_exceeded",
    )
    server.responses_script.extend([too_long, too_long])
    planner = await planners.openai()
    with pytest.raises(PlannerContextExceeded, match="context window"):
        await planner.decide("screen 1")
    assert len(server.requests) == 2
    assert any(isinstance(i, ContextCheckpoint) for i in planner.history)


async def test_gpt5s_input_limit_without_a_code_is_a_context_overflow(
    server: FakeModelServer, planners: Planners
) -> None:
    """GPT-5's input limit is below its context window: past it OpenAI answers 400 "Input tokens
    exceed the configured limit of 272000 tokens. …", reported in the wild both with the
    `context_length_exceeded` code and without any code. Without the code it was read as any
    invalid request: a decision after the first failed its step instead of starting afresh."""
    too_long = openai_error(
        400,
        "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in "
        "289650 tokens. Please reduce the length of the messages.",
        "invalid_request_error",
    )
    server.responses_script.extend([too_long, too_long])
    planner = await planners.openai()
    with pytest.raises(PlannerContextExceeded, match="context window"):
        await planner.decide("screen 1")
    assert len(server.requests) == 2
    assert any(isinstance(i, ContextCheckpoint) for i in planner.history)


async def test_a_stream_cut_off_inside_a_tool_call_gets_the_corrective_turn(
    server: FakeModelServer, planners: Planners
) -> None:
    """max_tokens reached inside a tool_use: its streamed input JSON is incomplete. That used
    to escape as a JSONDecodeError (a bare PlannerError: the task failed)."""
    server.anthropic_script.extend(
        [
            ScriptedTurn(
                [thinking("long thought"), tool_use("input_text", {"text": "secret", **INTENT})],
                cut_in_tool=True,
            ),
            ScriptedTurn([thinking("again"), tool_use("press_key", {"key": "back", **INTENT})]),
        ]
    )
    planner = await planners.anthropic()
    decision = await planner.decide("screen 1")
    assert decision.tool_name == "press_key"
    assert decision.corrective_retries == 1 and decision.output_truncated
    retried = server.bodies("/v1/messages")[-1]["messages"]
    cut_call = retried[1]["content"][-1]
    assert cut_call["type"] == "tool_use" and cut_call["input"] == {}
    (result,) = retried[2]["content"]
    assert result["type"] == "tool_result" and result["is_error"] is True
    assert "output token limit" in str(result["content"])
    assert server.rejections == []


async def test_a_whitespace_only_text_block_is_not_sent_back(
    server: FakeModelServer, planners: Planners
) -> None:
    """Claude may answer a text block of only newlines; the API refuses it on the way back
    ("text content blocks must contain non-whitespace text"), and the stored turn used to
    poison every later step of the task."""
    server.anthropic_script.extend(
        [
            ScriptedTurn(
                [thinking("t"), text("\n\n"), tool_use("press_key", {"key": "back", **INTENT})]
            ),
            _turn(2),
        ]
    )
    planner = await planners.anthropic()
    await planner.decide("screen 1")
    await planner.record_tool_result("pressed")
    await planner.decide("screen 2")
    sent = server.bodies("/v1/messages")[-1]["messages"][1]["content"]
    assert [b["type"] for b in sent] == ["thinking", "tool_use"]
    assert server.rejections == []


async def test_responses_incomplete_is_marked_and_its_call_not_executed(
    server: FakeModelServer, planners: Planners
) -> None:
    server.responses_script.extend(
        [
            ScriptedTurn(
                [
                    reasoning("r"),
                    message("Going back"),
                    function_call("press_key", {"key": "back", **INTENT}),
                ],
                status="incomplete",
            ),
            ScriptedTurn(
                [reasoning("again"), function_call("press_key", {"key": "home", **INTENT})]
            ),
        ]
    )
    decision = await (await planners.openai()).decide("screen 1")
    assert decision.arguments["key"] == "home" and decision.corrective_retries == 1
    assert decision.output_truncated and decision.rationale == f"Going back\n{CUT_OFF}"
    assert decision.thinking_kind == "summarized"
    first, retried = server.bodies("/v1/responses")
    assert retried["max_output_tokens"] > first["max_output_tokens"]
    output = retried["input"][-1]
    assert output["type"] == "function_call_output" and "not executed" in output["output"]
    assert server.rejections == []


async def test_an_answer_cut_off_before_its_call_is_told_so_not_that_it_called_nothing(
    server: FakeModelServer, planners: Planners
) -> None:
    """An OpenAI answer that spent its output limit reasoning (`status: incomplete`, no call)
    was asked again with more room but told "You answered without calling a tool": a model
    that was cut off, not one that chose to answer in prose. It is told it was cut off."""
    server.responses_script.extend(
        [
            ScriptedTurn([reasoning("a long look at the screen")], status="incomplete"),
            ScriptedTurn(
                [reasoning("again"), function_call("press_key", {"key": "home", **INTENT})]
            ),
        ]
    )
    decision = await (await planners.openai()).decide("screen 1")
    assert decision.arguments["key"] == "home" and decision.output_truncated
    first, retried = server.bodies("/v1/responses")
    assert retried["max_output_tokens"] > first["max_output_tokens"]
    told = retried["input"][-1]
    assert told["role"] == "user" and told["content"][-1]["text"] == CUT_OFF_NUDGE
    assert "without calling a tool" not in json.dumps(retried["input"])
    assert server.rejections == []


@pytest.mark.parametrize("shape", ["nested", "flat"])
@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("server_is_overloaded", PlannerUnavailable),
        ("server_error", PlannerUnavailable),
        ("rate_limit_exceeded", PlannerRateLimited),
        ("context_length_exceeded", PlannerRejected),
        ("invalid_api_key", PlannerAuthError),
        ("unsupported_value", PlannerParameterRejected),
        ("unsupported_parameter", PlannerParameterRejected),
    ],
)
async def test_a_responses_stream_error_is_classified_by_its_code(
    server: FakeModelServer, planners: Planners, shape: str, code: str, error: type[PlannerError]
) -> None:
    """The live API nests the error event's fields (`{"type": "error", "error": {…}}`), which
    the SDK raises as an APIError without a status; that used to be a bare PlannerError, so a
    mid-stream overload or rate limit failed the task instead of waiting. A parameter the
    model refuses (`unsupported_*`) was waited out as "unavailable" (flat) or started the
    session afresh (nested); only the settings change it: the step fails, the session kept."""
    server.responses.error_event_shape = shape  # type: ignore[assignment]
    server.responses_script.extend(
        [
            ScriptedTurn([], fail=(code, f"The stream failed: {code}.")),
            ScriptedTurn([reasoning("r"), function_call("press_key", {"key": "back", **INTENT})]),
        ]
    )
    planner = await planners.openai()
    if error is PlannerRejected:
        # An invalid request starts the session afresh once, then is asked again.
        decision = await planner.decide("screen 1")
        assert decision.extra["started_afresh"] is True
        return
    with pytest.raises(error, match=code if error is not PlannerAuthError else "API key") as info:
        await planner.decide("screen 1")
    assert type(info.value) is error
    if issubclass(error, PlannerTransient | PlannerParameterRejected):
        decision = await planner.decide("screen 1")
        assert decision.tool_name == "press_key" and not decision.extra.get("started_afresh")


async def test_a_failed_responses_stream_the_session_starts_afresh_over_still_counts(
    server: FakeModelServer, planners: Planners
) -> None:
    """`response.failed` for an invalid prompt starts the session afresh and asks once more;
    the usage the failed response reported was billed, and counts in the decision's usage."""
    server.responses_script.extend(
        [
            ScriptedTurn(
                [reasoning("r")],
                usage={"input_tokens": 7000, "output_tokens": 90},
                fail=("invalid_prompt", "Invalid prompt: flagged."),
                failed_event=True,
            ),
            ScriptedTurn(
                [reasoning("r"), function_call("press_key", {"key": "back", **INTENT})],
                usage={"input_tokens": 600, "output_tokens": 40},
            ),
        ]
    )
    planner = await planners.openai()
    decision = await planner.decide("screen 1")
    assert decision.extra["started_afresh"] is True
    assert (decision.usage.input_tokens, decision.usage.output_tokens) == (7600, 130)


async def test_reasoning_summaries_can_be_turned_off(
    server: FakeModelServer, planners: Planners
) -> None:
    """An organisation OpenAI has not verified gets a 400 for `reasoning.summary`; every
    session step with thinking on failed, and nothing let an operator turn summaries off."""
    server.responses.summaries_allowed = False
    server.responses_script.extend(
        [
            ScriptedTurn([reasoning("r1"), function_call("press_key", {"key": "back", **INTENT})]),
            ScriptedTurn([reasoning("r2"), function_call("press_key", {"key": "back", **INTENT})]),
        ]
    )
    with pytest.raises(PlannerRejected, match="verified to generate reasoning summaries"):
        await (await planners.openai()).decide("screen 1")
    settings = PlannerSettings(
        provider="openai", openai_api_key="k", thinking="adaptive", reasoning_summary="off"
    )
    planner = await planners.openai(thinking=thinking_config(settings))
    decision = await planner.decide("screen 1")
    sent = server.bodies("/v1/responses")[-1]
    assert sent["reasoning"] == {"effort": "medium"}
    assert sent["include"] == ["reasoning.encrypted_content"]
    assert decision.thinking_kind == "omitted"  # encrypted reasoning, no readable summary
    await planner.record_tool_result("pressed")
    assert (await planner.decide("screen 2")).tool_name == "press_key"


async def test_a_non_reasoning_openai_model_never_gets_reasoning(
    server: FakeModelServer, planners: Planners, tmp_path: Path
) -> None:
    server.responses_script.append(
        ScriptedTurn([message("Back."), function_call("press_key", {"key": "back", **INTENT})])
    )
    planner = await planners.openai("gpt-4.1-mini", thinking=ADAPTIVE)
    await planner.decide("screen 1")
    (sent,) = server.requests
    assert sent.status == 200, sent.error
    assert "reasoning" not in sent.body
    # The model rejects the encrypted-reasoning include (400 "Encrypted content is not
    # supported with this model."); the request stays stateless without it.
    assert sent.body["store"] is False and "include" not in sent.body
    # Through the settings, thinking on with that model is refused before any call.
    settings = PlannerSettings(
        provider="openai", openai_api_key="k", model="gpt-4.1-mini", thinking="adaptive"
    )
    with pytest.raises(PlannerConfigError, match="does not reason"):
        await open_session_planner(
            settings, store=SqliteSessionStore(tmp_path / "s.sqlite"), task_id="t", attempt=1
        )


async def test_the_conversation_prefix_is_read_from_the_cache(
    server: FakeModelServer, planners: Planners
) -> None:
    server.anthropic_script.extend([_turn(n) for n in range(3)])
    planner = await planners.anthropic()
    usages = []
    for n in range(3):
        decision = await planner.decide(f"screen {n} " + "element " * 400)
        await planner.record_tool_result("pressed")
        usages.append(decision.usage)
    assert server.bodies("/v1/messages")[0]["cache_control"] == {"type": "ephemeral"}
    assert usages[0].cache_read_input_tokens == 0 and usages[0].cache_creation_input_tokens > 0
    # Each step reads everything the step before wrote, and writes only what it added.
    for before, after in itertools.pairwise(usages):
        assert after.cache_read_input_tokens >= (
            before.cache_read_input_tokens + before.cache_creation_input_tokens
        )
        assert after.cache_creation_input_tokens < before.cache_read_input_tokens + 2000


async def test_a_raised_output_limit_past_the_context_window_starts_afresh(
    server: FakeModelServer, planners: Planners
) -> None:
    """Claude models before Sonnet 4.5 refuse a request whose input and `max_tokens` together
    exceed the context window (400 invalid_request_error "input length and `max_tokens`
    exceed context limit: …") rather than stopping at the window. Read as any invalid request,
    it failed the step when the call asking it was the one with the room raised after a cut
    off answer (only a decision's first call recovers from an invalid request): the session
    was never started afresh, and every later step overflowed the same way."""
    cut_off = ScriptedTurn(
        [thinking("t"), tool_use("press_key", {"key": "back", **INTENT})],
        stop_reason="max_tokens",
    )
    over = anthropic_error(
        400,
        "invalid_request_error",
        "input length and `max_tokens` exceed context limit: 188240 + 21024 > 200000, "
        "decrease input length or `max_tokens` and try again",
    )
    server.anthropic_script.extend([cut_off, over, _turn(2)])
    planner = await planners.anthropic(
        "claude-opus-4-1", thinking=ThinkingConfig("budget", budget_tokens=4000)
    )
    decision = await planner.decide("screen 1")
    assert decision.extra["started_afresh"] is True
    assert decision.arguments["key"] == "back"
    assert any(isinstance(i, ContextCheckpoint) for i in planner.history)
    assert [r.status for r in server.requests] == [200, 400, 200]


async def test_a_refused_parameter_fails_the_step_and_keeps_the_session(
    server: FakeModelServer, planners: Planners
) -> None:
    """OpenAI refuses a request parameter, not the conversation (400 `unsupported_value` /
    `unsupported_parameter`: here reasoning summaries for an organisation no longer verified).
    Taken for any invalid request it "started afresh": the session was condensed for good
    (earlier screens, all reasoning retired), asked again and refused again, the same way,
    before the step failed. Only the settings can change it: the step fails at once and the
    session stays whole."""
    server.responses_script.append(
        ScriptedTurn([reasoning("r1"), function_call("press_key", {"key": "back", **INTENT})])
    )
    planner = await planners.openai()
    await planner.decide("screen 1")
    await planner.record_tool_result("pressed")
    server.responses.summaries_allowed = False
    with pytest.raises(PlannerRejected, match="verified to generate reasoning summaries"):
        await planner.decide("screen 2")
    assert [r.status for r in server.requests] == [200, 400]
    assert not any(isinstance(i, ContextCheckpoint) for i in planner.history)
    assert "r1" in [i.summary[0] for i in planner.history if isinstance(i, Reasoning)]


@pytest.mark.parametrize(
    ("vendor", "reply"),
    [
        (
            "anthropic",
            anthropic_error(
                400,
                "invalid_request_error",
                "max_tokens: 128001 > 64000, which is the maximum allowed number of output "
                "tokens for claude-sonnet-4-6",
            ),
        ),
        (
            "openai",
            Reply(
                400,
                {
                    "error": {
                        "message": "Invalid 'max_output_tokens': integer above maximum value.",
                        "type": "invalid_request_error",
                        "param": "max_output_tokens",
                        "code": "integer_above_max_value",
                    }
                },
            ),
        ),
    ],
    ids=["anthropic-field-path", "openai-param"],
)
async def test_an_invalid_request_naming_a_parameter_keeps_the_session(
    server: FakeModelServer, planners: Planners, vendor: str, reply: Reply
) -> None:
    """A 400 that names a request parameter outside the conversation (Anthropic's message
    leads with the field's path, OpenAI's `param` names it) was taken for a conversation the
    provider no longer accepts: the session "started afresh" (condensed for good), was asked
    again and refused the same way. It fails the step at once and the session stays whole."""
    first = ScriptedTurn([reasoning("r1"), function_call("press_key", {"key": "back", **INTENT})])
    if vendor == "anthropic":
        server.anthropic_script.extend([_turn(1), reply])
        planner = await planners.anthropic()
    else:
        server.responses_script.extend([first, reply])
        planner = await planners.openai()
    await planner.decide("screen 1")
    await planner.record_tool_result("pressed")
    with pytest.raises(PlannerParameterRejected, match=r"max_tokens|max_output_tokens"):
        await planner.decide("screen 2")
    assert [r.status for r in server.requests] == [200, 400]
    assert not any(isinstance(i, ContextCheckpoint) for i in planner.history)


async def test_a_model_the_organisation_may_not_stream_is_asked_unstreamed(
    server: FakeModelServer,
    planners: Planners,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """OpenAI refuses to stream GPT-5 and o3 to an organisation it has not verified (400
    naming `stream`) and answers the same request unstreamed. Session mode streams every call
    (for the live view), and the refusal failed every step as a refused parameter: the planner
    could not work with the model at all. The step is asked again unstreamed, the model is not
    streamed again, and one warning says why the live view stays empty."""
    monkeypatch.setattr(openai_adapter, "_UNSTREAMED", set())
    server.responses.streaming_allowed = False
    server.responses_script.extend(
        [
            ScriptedTurn([reasoning("r1"), function_call("press_key", {"key": "back", **INTENT})]),
            ScriptedTurn([reasoning("r2"), function_call("press_key", {"key": "back", **INTENT})]),
        ]
    )
    planner = await planners.openai()
    with caplog.at_level(logging.WARNING, logger="planner.vendors.openai.adapter"):
        first = await planner.decide("screen 1")
        await planner.record_tool_result("pressed")
        second = await planner.decide("screen 2")
    assert (first.tool_name, second.tool_name) == ("press_key", "press_key")
    assert first.thinking_kind == second.thinking_kind == "summarized"  # recorded as before
    assert [r.status for r in server.requests] == [400, 200, 200]
    assert [b.get("stream") for b in server.bodies("/v1/responses")] == [True, None, None]
    (warned,) = caplog.records
    assert "refuses to stream o4-mini" in warned.getMessage()
    assert "verified to stream this model" in warned.getMessage()
    # Another adapter of the same model in this process does not ask for a stream at all.
    server.responses_script.append(
        ScriptedTurn([reasoning("r3"), function_call("press_key", {"key": "back", **INTENT})])
    )
    other = await planners.openai()
    assert (await other.decide("screen 1")).tool_name == "press_key"
    assert server.requests[-1].status == 200 and "stream" not in server.requests[-1].body


@pytest.mark.parametrize("model", ["o3-pro", "o1-pro", "gpt-5-pro", "gpt-5.5-pro"])
async def test_a_model_that_never_streams_is_never_asked_to(
    server: FakeModelServer, planners: Planners, model: str
) -> None:
    """o1-pro, o3-pro and the GPT-5 Pro models never stream: in session mode (streamed by
    default) every step was refused with 400 "'stream' does not support true with this
    model"."""
    server.responses_script.append(
        ScriptedTurn([reasoning("r1"), function_call("press_key", {"key": "back", **INTENT})])
    )
    planner = await planners.openai(model, thinking=ThinkingConfig("adaptive", effort="high"))
    decision = await planner.decide("screen 1")
    assert decision.tool_name == "press_key"
    (sent,) = server.requests
    assert sent.status == 200, sent.error
    assert "stream" not in sent.body
