"""The real `openai` SDK in compact mode (Chat Completions; Responses for the GPT-5 family)
against the local fake server."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from planner.errors import (
    PlannerAuthError,
    PlannerConfigError,
    PlannerError,
    PlannerRateLimited,
    PlannerRefused,
    PlannerRejected,
    PlannerUnavailable,
    cut_off_of,
)
from planner.model_profiles import profile_for
from planner.planner import Planner
from planner.settings import THINKING_MAX_TOKENS, PlannerSettings
from planner.vendors import make_adapter
from planner.vendors.images import OPENAI_MAX_BASE64, base64_size
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    OPENAI_KEY,
    FakeModelServer,
    Reply,
    ScriptedTurn,
    chat_completion,
    function_call,
    message,
    openai_error,
    openai_tool_call,
    rate_limited_openai,
    reasoning,
)
from tests.support.screenshots import image_of, phone_png

TAP = {
    "element_id": "e17",
    "purpose": "open display settings",
    "expected_outcome": "the Display page is open",
}


def make(server: FakeModelServer, **overrides: Any) -> Planner:
    values: dict[str, Any] = {
        "provider": "openai",
        "openai_api_key": OPENAI_KEY,
        "openai_base_url": server.openai_base_url,
        "model": "gpt-test-model",
        "max_retries": 2,
        **overrides,
    }
    settings = PlannerSettings(**values)
    return Planner(make_adapter(settings), settings)


async def decide(planner: Planner) -> Any:
    try:
        return await planner.decide("Turn on dark theme", settings_main())
    finally:
        await planner.aclose()


async def test_content_is_rationale_reasoning_content_is_thinking(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_openai(
        chat_completion(
            "Start: Display holds the switch.",
            openai_tool_call("tap", TAP),
            reasoning_content="dark theme lives in Display",
            cached_tokens=50,
            reasoning_tokens=12,
        )
    )
    decision = await decide(make(fake_server))

    assert decision.rationale == "Start: Display holds the switch."
    assert [b.text for b in decision.thinking] == ["dark theme lives in Display"]
    assert decision.arguments == {"element_id": "e17"}
    assert decision.purpose == "open display settings"
    assert decision.provider == "openai"
    assert decision.model == "gpt-test-model"
    assert decision.usage.input_tokens == 100
    assert decision.usage.cache_read_input_tokens == 50
    assert decision.usage.thinking_tokens == 12
    (sent,) = fake_server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.body["tool_choice"] == "auto"
    assert sent.body["parallel_tool_calls"] is False
    assert sent.body["messages"][0]["role"] == "system"
    tap = next(t for t in sent.body["tools"] if t["function"]["name"] == "tap")
    assert {"purpose", "expected_outcome"} <= set(tap["function"]["parameters"]["required"])


# The SDK's types say `content: str`: its serializer warns of the list (an error under pytest).
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_content_as_a_list_of_parts_is_the_rationale(fake_server: FakeModelServer) -> None:
    """`message.content` as content parts (`[{"type": "text", "text": …}]`, the form the Chat
    Completions reference gives an assistant message's content, which some OpenAI-compatible
    servers answer in) was read only as a string and dropped: the decision had no rationale."""
    parts = [
        {"type": "text", "text": "Start: Display holds the switch."},
        {"type": "text", "text": "I will open it."},
    ]
    fake_server.script_openai(
        chat_completion(parts),
        chat_completion(None, openai_tool_call("tap", TAP)),
    )
    decision = await decide(make(fake_server))
    assert decision.rationale == "Start: Display holds the switch.\nI will open it."
    assert decision.forced_retry is True


async def test_no_tool_call_is_retried_with_required(fake_server: FakeModelServer) -> None:
    fake_server.script_openai(
        chat_completion("I will open Display."),
        chat_completion(None, openai_tool_call("tap", TAP)),
    )
    decision = await decide(make(fake_server))
    first, second = fake_server.bodies()
    assert first["tool_choice"] == "auto"
    assert second["tool_choice"] == "required"
    assert decision.forced_retry is True
    assert decision.rationale == "I will open Display."


async def test_arguments_that_are_not_json_get_a_corrective_tool_message(
    fake_server: FakeModelServer,
) -> None:
    # A compatible server that requires reasoning_content back on the tool-call message, and
    # parses the arguments of the calls it is sent back (vLLM, SGLang): the unparseable ones
    # used to go back verbatim, and it refused the corrective turn with a 400.
    fake_server.require_reasoning_content_back = True
    fake_server.chat.require_json_arguments = True
    bad = openai_tool_call("tap", '{"element_id": "e17", "purpose": ')
    fake_server.script_openai(
        chat_completion("Opening Display.", bad, reasoning_content="think"),
        chat_completion(None, openai_tool_call("tap", TAP)),
    )
    decision = await decide(make(fake_server))

    assert decision.corrective_retries == 1
    second = fake_server.requests[1]
    assert second.status == 200
    assistant, tool = second.body["messages"][2], second.body["messages"][3]
    assert assistant["tool_calls"][0]["id"] == bad["id"]
    assert assistant["reasoning_content"] == "think"
    assert tool["role"] == "tool"
    assert tool["tool_call_id"] == bad["id"]
    assert "not valid JSON" in tool["content"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == "{}"


async def test_responses_arguments_that_are_not_json_go_back_as_a_json_object(
    fake_server: FakeModelServer,
) -> None:
    """The Responses form of the same call (a GPT-5 compact step, as a session's): its
    function_call item goes back in the corrective turn with `{}` as its arguments, the
    correction saying what was wrong."""
    fake_server.script_responses(
        ScriptedTurn([function_call("tap", '{"element_id": "e17", "purpose": ')]),
        ScriptedTurn([function_call("tap", TAP)]),
    )
    decision = await decide(make(fake_server, model="gpt-5"))

    assert decision.corrective_retries == 1
    sent = fake_server.bodies()[1]["input"]
    call = next(i for i in sent if i.get("type") == "function_call")
    output = next(i for i in sent if i.get("type") == "function_call_output")
    assert call["arguments"] == "{}"
    assert "not valid JSON" in output["output"]


async def test_arguments_with_a_lone_surrogate_escape_get_a_corrective_tool_message(
    fake_server: FakeModelServer,
) -> None:
    # JSON may escape half of a surrogate pair; Python's decoder keeps it, nothing can encode
    # it. The call was an unexpected UnicodeEncodeError (the decision failed as an internal
    # error); now it gets the corrective turn, and its masked form goes back encodable.
    bad = openai_tool_call(
        "input_text",
        '{"text": "pw \\ud83d", "sensitive": true, "purpose": "log in \\udc00",'
        ' "expected_outcome": "o"}',
    )
    good = {"text": "pw", "sensitive": True, "purpose": "log in", "expected_outcome": "o"}
    fake_server.script_openai(
        chat_completion(None, bad), chat_completion(None, openai_tool_call("input_text", good))
    )
    decision = await decide(make(fake_server))

    assert decision.arguments == {"text": "pw", "sensitive": True}
    assert decision.corrective_retries == 1
    second = fake_server.requests[1]
    assert second.status == 200
    assistant, tool = second.body["messages"][2], second.body["messages"][3]
    sent = json.loads(assistant["tool_calls"][0]["function"]["arguments"])
    assert sent == {**good, "text": "•••", "purpose": "log in \ufffd"}
    assert "lone surrogate" in tool["content"]
    assert "pw" not in tool["content"]


async def test_off_screen_point_is_corrected(fake_server: FakeModelServer) -> None:
    fake_server.script_openai(
        chat_completion(
            None,
            openai_tool_call("tap", {"x": 1080, "y": 5, "purpose": "p", "expected_outcome": "o"}),
        ),
        chat_completion(
            None,
            openai_tool_call("tap", {"x": 1079, "y": 5, "purpose": "p", "expected_outcome": "o"}),
        ),
    )
    decision = await decide(make(fake_server))
    assert decision.arguments == {"x": 1079, "y": 5}
    complaint = fake_server.bodies()[1]["messages"][-1]["content"]
    assert "off the screen" in complaint
    assert "1080x2400" in complaint


async def test_a_point_past_any_screen_is_corrected_when_the_screen_size_is_unknown(
    fake_server: FakeModelServer,
) -> None:
    # A Decide without a screen size (0x0) checks only that a point is not negative: a
    # coordinate past int32 was an unexpected ValueError while the action was built.
    fake_server.script_openai(
        chat_completion(
            None,
            openai_tool_call(
                "tap", {"x": 5_000_000_000, "y": 5, "purpose": "p", "expected_outcome": "o"}
            ),
        ),
        chat_completion(
            None,
            openai_tool_call("tap", {"x": 10, "y": 5, "purpose": "p", "expected_outcome": "o"}),
        ),
    )
    planner = make(fake_server)
    try:
        decision = await planner.decide_from_prompts("system", "tap something", screen_size=None)
    finally:
        await planner.aclose()
    assert decision.arguments == {"x": 10, "y": 5}
    complaint = fake_server.bodies()[1]["messages"][-1]["content"]
    assert "(5000000000, 5) is off the screen" in complaint


@pytest.mark.parametrize("model", ["gpt-4.1", "gpt-5.4"], ids=["chat", "responses"])
async def test_a_page_that_is_no_api_answer_is_unavailable_not_an_attribute_error(
    fake_server: FakeModelServer, model: str
) -> None:
    # A proxy or gateway in front of the API answers HTTP 200 with HTML: the SDK hands that
    # back as a string, and the planner failed with "'str' object has no attribute 'to_dict'".
    fake_server.answer_with_page("<html><body>502 upstream connect error</body></html>")
    with pytest.raises(PlannerUnavailable, match="not an API answer") as caught:
        await decide(make(fake_server, model=model))
    assert "upstream connect error" in str(caught.value)
    assert "AMC_PLANNER_OPENAI_BASE_URL" in str(caught.value)


async def test_429_then_success_and_persistent_429(fake_server: FakeModelServer) -> None:
    fake_server.script_openai(
        rate_limited_openai(), chat_completion(None, openai_tool_call("tap", TAP))
    )
    assert (await decide(make(fake_server))).tool_name == "tap"
    assert [r.status for r in fake_server.requests] == [429, 200]

    fake_server.script_openai(rate_limited_openai(), rate_limited_openai())
    with pytest.raises(PlannerRateLimited, match="planner: OpenAI rate limit"):
        await decide(make(fake_server, max_retries=1))


async def test_a_retry_after_given_as_an_http_date_is_waited_for(
    fake_server: FakeModelServer,
) -> None:
    """RFC 9110 lets `retry-after` be an HTTP-date (a gateway in front of the API may send
    one). Only the seconds form was read: a date was no wait at all, the retries were spent at
    once against a server that said "not before", and the error told the host no wait. A date
    past is "now" (the backoff); one past the call's wait limit ends the call and travels."""

    def limited(seconds: float) -> Reply:
        when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), True)
        return openai_error(
            429, "Rate limit reached", "requests", "rate_limit_exceeded", retry_after=when
        )

    fake_server.script_openai(limited(-3600), limited(171), limited(171))
    with pytest.raises(PlannerRateLimited, match=r"it asks to wait 1[67][0-9] s") as info:
        await asyncio.wait_for(decide(make(fake_server)), timeout=10)
    assert info.value.retry_after is not None and 150 < info.value.retry_after <= 171
    assert len(fake_server.requests) == 2  # the past date asked again; the far one ended it


async def test_a_retry_after_longer_than_a_call_waits_is_left_to_the_caller(
    fake_server: FakeModelServer,
) -> None:
    """The OpenAI SDK slept up to two minutes per retry (four with the default two retries,
    past the host's Decide deadline with the calls themselves) and the error did not say how
    long to wait."""
    limited = openai_error(
        429, "Rate limit reached", "requests", "rate_limit_exceeded", retry_after="60"
    )
    fake_server.script_openai(limited, limited, limited)
    started = time.monotonic()
    with pytest.raises(PlannerRateLimited) as info:
        await asyncio.wait_for(decide(make(fake_server)), timeout=10)
    assert time.monotonic() - started < 5
    assert info.value.retry_after == 60
    assert len(fake_server.requests) == 1


async def test_500_is_unavailable(fake_server: FakeModelServer) -> None:
    boom = openai_error(500, "The server had an error", "server_error", retry_after_ms="5")
    fake_server.script_openai(boom, boom, boom)
    with pytest.raises(PlannerUnavailable, match="HTTP 500 after 2 retries"):
        await decide(make(fake_server))
    assert len(fake_server.requests) == 3


async def test_bad_key(fake_server: FakeModelServer) -> None:
    with pytest.raises(PlannerAuthError, match=r"^planner: OpenAI rejected the API key"):
        await decide(make(fake_server, openai_api_key="sk-wrong"))


async def test_tool_arguments_json_round_trip_is_exact(fake_server: FakeModelServer) -> None:
    args = {
        "text": "hunter2",
        "sensitive": True,
        "purpose": "enter the password",
        "expected_outcome": "dots shown",
    }
    fake_server.script_openai(
        chat_completion(None, openai_tool_call("input_text", json.dumps(args)))
    )
    decision = await decide(make(fake_server))
    assert decision.arguments == {"text": "hunter2", "sensitive": True}
    assert decision.masked_arguments() == {"text": "•••", "sensitive": True}


async def test_whitespace_only_content_is_not_sent_back(fake_server: FakeModelServer) -> None:
    """As for Claude (whose API refuses it), a content of only whitespace is no rationale and
    does not go back on the assistant message of the corrective turn."""
    bad = openai_tool_call("tap", {"element_id": "e17"})
    fake_server.script_openai(
        chat_completion("\n\n", bad), chat_completion(None, openai_tool_call("tap", TAP))
    )
    decision = await decide(make(fake_server))
    assert decision.corrective_retries == 1 and decision.rationale is None
    assistant = fake_server.requests[1].body["messages"][2]
    assert assistant["role"] == "assistant" and assistant["content"] is None


@pytest.mark.parametrize(("model", "sent"), [("o4-mini", False), ("gpt-4.1-mini", True)])
async def test_parallel_tool_calls_only_where_the_model_takes_it(
    fake_server: FakeModelServer, model: str, sent: bool
) -> None:
    """The o-series answer `parallel_tool_calls` with 400 "Unsupported parameter": every
    compact step used to be refused."""
    fake_server.script_openai(chat_completion(None, openai_tool_call("tap", TAP)))
    decision = await decide(make(fake_server, model=model))
    assert decision.tool_name == "tap"
    (request,) = fake_server.requests
    assert ("parallel_tool_calls" in request.body) is sent
    assert fake_server.rejections == []


@pytest.mark.parametrize("model", ["o3", "o4-mini"])
async def test_the_o_series_is_asked_only_at_efforts_it_takes(
    fake_server: FakeModelServer, model: str
) -> None:
    """The o-series take reasoning effort low, medium or high: `minimal` came with GPT-5. The
    profile let it through, so AMC_PLANNER_EFFORT=minimal passed the check at start and every
    step was refused with 400 "Unsupported value"."""
    efforts = sorted(profile_for(model, "openai").efforts)
    for effort in efforts:
        fake_server.script_openai(chat_completion(None, openai_tool_call("tap", TAP)))
        decision = await decide(make(fake_server, model=model, thinking="adaptive", effort=effort))
        assert decision.tool_name == "tap"
    assert [r.body["reasoning_effort"] for r in fake_server.requests] == efforts
    assert fake_server.rejections == []


@pytest.mark.parametrize(
    "model",
    [
        "gpt-5-codex",
        "gpt-5.1-codex",
        "gpt-5.1-codex-mini",
        "gpt-5.2-codex",
        "gpt-5.2-pro",
        "gpt-5.4-pro",
        "gpt-5.5-pro",
    ],
)
async def test_the_codex_and_pro_models_are_asked_only_at_efforts_they_take(
    fake_server: FakeModelServer, model: str
) -> None:
    """The Codex models reason always and refuse `none` ("'none' is not supported with the
    'gpt-5.1-codex' model", openai/codex#6647; gpt-5-codex refuses GPT-5's `minimal` too, and
    took GPT-5's row); gpt-5.1-codex-mini takes medium and high
    only; gpt-5.2-pro, gpt-5.4-pro and gpt-5.5-pro medium to xhigh. They took their base
    version's levels, so those efforts passed the check at start and every step was refused
    with 400 "Unsupported value" (gpt-5.2-pro still did: it was left on gpt-5.2's row)."""
    efforts = sorted(profile_for(model, "openai").efforts)
    for effort in efforts:
        fake_server.script_responses(
            ScriptedTurn([reasoning("Display"), function_call("tap", TAP)])
        )
        decision = await decide(make(fake_server, model=model, thinking="adaptive", effort=effort))
        assert decision.tool_name == "tap"
    assert [r.body["reasoning"]["effort"] for r in fake_server.requests] == efforts
    assert fake_server.rejections == []


@pytest.mark.parametrize(
    "model",
    [
        "gpt-5.4",
        "gpt-5.6-sol",
        "gpt-5-mini",
        "gpt-6-sol",
        "gpt-6-astra",
        "gpt-6.1-sol",
        "gpt-6.2-astra",
        "gpt-6.2-sol",
    ],
)
@pytest.mark.parametrize("thinking", ["adaptive", "off"])
async def test_gpt5_compact_steps_use_responses(
    fake_server: FakeModelServer, model: str, thinking: str
) -> None:
    """GPT-5.4 refuses function tools with `reasoning_effort` on Chat Completions, and gpt-5.6
    refuses them unless the effort is `none` (openai/openai-openapi#541, BerriAI/litellm#34569):
    every compact step of the default OpenAI reasoning setup was a 400; GPT-6 (gpt-6-sol,
    gpt-6-astra) refuses them as gpt-5.6 does, and took the lenient unknown profile. The GPT-5
    and GPT-6 families take their compact steps through the stateless Responses API, as session
    mode does."""
    fake_server.script_responses(
        ScriptedTurn(
            [reasoning("Display holds it"), message("Opening Display."), function_call("tap", TAP)]
        )
    )
    decision = await decide(make(fake_server, model=model, thinking=thinking))
    assert decision.tool_name == "tap" and decision.rationale == "Opening Display."
    (request,) = fake_server.requests
    assert request.path == "/v1/responses" and request.status == 200, request.error
    assert request.body["store"] is False
    # thinking off asks for the least reasoning the model takes (see the test below)
    effort = "medium" if thinking == "adaptive" else profile_for(model, "openai").off_effort
    assert request.body["reasoning"]["effort"] == effort
    # reasoning tokens count toward the output limit: a reasoning call gets room for them
    limit = 2048 if effort == "none" else THINKING_MAX_TOKENS
    assert request.body["max_output_tokens"] == limit
    assert request.body["input"][0]["role"] == "user"


@pytest.mark.parametrize("model", ["o3-pro", "o1-pro-2025-03-19"])
@pytest.mark.parametrize("thinking", ["adaptive", "off"])
async def test_o_series_pro_compact_steps_use_responses(
    fake_server: FakeModelServer, model: str, thinking: str
) -> None:
    """o1-pro and o3-pro are served by the Responses API alone: Chat Completions answers them
    with 404 "This model is only supported in v1/responses and not in v1/chat/completions."
    They took the o-series profile, whose compact steps go to Chat Completions: every step of
    a compact task on them failed."""
    fake_server.script_responses(ScriptedTurn([reasoning("Display"), function_call("tap", TAP)]))
    decision = await decide(make(fake_server, model=model, thinking=thinking))
    assert decision.tool_name == "tap"
    (request,) = fake_server.requests
    assert request.path == "/v1/responses" and request.status == 200, request.error
    assert request.body["reasoning"]["effort"] in profile_for(model, "openai").efforts


@pytest.mark.parametrize("model", ["gpt-5.1-chat-latest", "gpt-5.3-chat-latest"])
async def test_the_gpt5_chat_models_output_limit_is_kept_at_start(
    fake_server: FakeModelServer, model: str
) -> None:
    """gpt-5-chat-latest and the gpt-5.x-chat-latest models write at most 16,384 output tokens
    (their model pages): AMC_PLANNER_MAX_TOKENS may be up to 20,000, and above their limit
    every step was refused with 400 "max_tokens is too large". It is refused at start now,
    naming the setting, as for the other models whose limit the table knows. (gpt-5-chat-latest
    takes no function tools and is refused at start whatever its limit.)"""
    with pytest.raises(PlannerConfigError, match="AMC_PLANNER_MAX_TOKENS"):
        make(fake_server, model=model, max_tokens=20000)
    fake_server.script_openai(chat_completion(None, openai_tool_call("tap", TAP)))
    fake_server.script_responses(ScriptedTurn([reasoning("Display"), function_call("tap", TAP)]))
    decision = await decide(make(fake_server, model=model, max_tokens=16384))
    assert decision.tool_name == "tap"
    assert fake_server.rejections == []


@pytest.mark.parametrize("model", ["gpt-5-pro", "gpt-5-pro-2025-10-06"])
async def test_gpt5_pro_is_asked_at_the_only_effort_it_takes(
    fake_server: FakeModelServer, model: str
) -> None:
    """gpt-5-pro takes reasoning effort `high` only (its default). With no effort configured
    it was sent GPT-5's `medium`: 400 "Unsupported value" on every step."""
    fake_server.script_responses(ScriptedTurn([reasoning("Display"), function_call("tap", TAP)]))
    decision = await decide(make(fake_server, model=model, thinking="adaptive"))
    assert decision.tool_name == "tap"
    (request,) = fake_server.requests
    assert request.status == 200, request.error
    assert request.body["reasoning"]["effort"] == "high"


async def test_a_response_that_failed_is_no_answer_and_its_call_is_never_executed(
    fake_server: FakeModelServer,
) -> None:
    """OpenAI answers a failed response with HTTP 200 and `status: "failed"` (its `error`, and
    the output it had, a function call among it). It was read as an answer: the call was
    executed as the step's action (and without one, the step ended "unusable tool call
    twice", not retryable). It is now the provider failing, by its error's code (server_error:
    temporarily impossible), asked again as a 500 is (`max_retries`, 2 here), and the usage
    every failed try reported counts."""
    fake_server.script_responses(
        *[
            ScriptedTurn(
                [reasoning("Display holds it"), function_call("tap", TAP)],
                usage={"input_tokens": 900, "output_tokens": 60},
                fail=("server_error", "The model failed to generate a response."),
                failed_event=True,
            )
            for _ in range(3)
        ]
    )
    with pytest.raises(PlannerUnavailable, match="server_error") as caught:
        await decide(make(fake_server, model="gpt-5", thinking="adaptive"))
    assert "The model failed to generate a response." in str(caught.value)
    reported = cut_off_of(caught.value)
    assert reported is not None
    assert (reported.usage.input_tokens, reported.usage.output_tokens) == (2700, 180)
    assert len(fake_server.requests) == 3


async def test_a_response_that_failed_on_the_provider_s_side_is_asked_again(
    fake_server: FakeModelServer,
) -> None:
    """A response answered `status: "failed"` with `server_error` (HTTP 200) was reported as
    transient to the host but not asked again within the call, as an HTTP 500 is: the step
    waited out a whole Decide round for what one more try answers. It is asked again within
    the planner's retries, and the decision costs the failed try too."""
    fake_server.script_responses(
        ScriptedTurn(
            [reasoning("Display holds it"), function_call("tap", TAP)],
            usage={"input_tokens": 900, "output_tokens": 60},
            fail=("server_error", "The model failed to generate a response."),
            failed_event=True,
        ),
        ScriptedTurn(
            [reasoning("Display holds it"), function_call("tap", TAP)],
            usage={"input_tokens": 1000, "output_tokens": 40},
        ),
    )
    decision = await decide(make(fake_server, model="gpt-5", thinking="adaptive"))
    assert decision.tool_name == "tap"
    assert len(fake_server.requests) == 2
    assert (decision.usage.input_tokens, decision.usage.output_tokens) == (1900, 100)
    assert decision.usage.cost_usd > 0


async def test_failed_requests_and_failed_responses_share_one_budget_of_retries(
    fake_server: FakeModelServer,
) -> None:
    """A 500 is asked again by `fetch_response`, a response that failed (`status: "failed"`) by
    the Responses adapter: each counted its own `retries`, so with 2 of them one decision
    made up to 9 billed calls (the 500s, then a failed response, three times over) and waited
    twice RETRY_WAIT_LIMIT_S. Both share one budget: the first call and 2 retries, then the
    failure is the caller's."""
    failed = ("server_error", "The model failed to generate a response.")
    outage = ScriptedTurn([function_call("tap", TAP)], fail=failed)  # an HTTP 500
    answer_failed = ScriptedTurn([function_call("tap", TAP)], fail=failed, failed_event=True)
    fake_server.script_responses(
        *[outage, outage, answer_failed] * 3, ScriptedTurn([function_call("tap", TAP)])
    )
    with pytest.raises(PlannerUnavailable, match="server_error"):
        await decide(make(fake_server, model="gpt-5", thinking="adaptive"))
    assert len(fake_server.requests) == 3


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("image_too_large", PlannerRejected),
        ("invalid_image_format", PlannerRejected),
        ("data_residency_mismatch", PlannerRejected),
        ("bio_policy", PlannerRefused),
        ("misalignment_policy_violation", PlannerRefused),
        ("vector_store_timeout", PlannerUnavailable),
    ],
)
async def test_a_response_that_failed_for_its_request_is_not_waited_out(
    fake_server: FakeModelServer, code: str, error: type[PlannerError]
) -> None:
    """A failed response names why (`error.code`): most of its codes say what in the request
    cannot be answered (the screenshot it was sent, the region it asked for) or that a policy
    stopped it. Every code but the known ones fell to "OpenAI answered that it failed": planning
    temporarily impossible, so the host waited and asked again with the same screenshot, for
    ever. The request's own codes fail the decision; a policy's is a refusal."""
    tries = 3 if code == "vector_store_timeout" else 1  # the provider's failure: asked again
    fake_server.script_responses(
        *[
            ScriptedTurn(
                [reasoning("Display holds it"), function_call("tap", TAP)],
                fail=(code, "The response could not be completed."),
                failed_event=True,
            )
            for _ in range(tries)
        ]
    )
    with pytest.raises(PlannerError, match=code) as caught:
        await decide(make(fake_server, model="gpt-5", thinking="adaptive"))
    assert type(caught.value) is error
    assert len(fake_server.requests) == tries


async def test_gpt5_compact_correction_sends_the_encrypted_reasoning_back(
    fake_server: FakeModelServer,
) -> None:
    """A corrective turn in compact mode on Responses sends the answer back as received: its
    reasoning item with the encrypted content, then the call and its error output (the fake
    verifies the content and the following-item rule)."""
    fake_server.script_responses(
        ScriptedTurn([reasoning("hmm"), function_call("tap", {"element_id": "e17"})]),
        ScriptedTurn([reasoning("fix"), function_call("tap", TAP)]),
    )
    decision = await decide(make(fake_server, model="gpt-5.4", thinking="adaptive"))
    assert decision.corrective_retries == 1
    _first, second = fake_server.requests
    assert second.status == 200, second.error
    kinds = [i.get("type", "message") for i in second.body["input"]]
    assert kinds == ["message", "reasoning", "function_call", "function_call_output"]
    assert second.body["input"][1]["encrypted_content"]


async def test_gpt5_compact_screenshot_goes_as_input_image(fake_server: FakeModelServer) -> None:
    fake_server.script_responses(ScriptedTurn([function_call("tap", TAP)]))
    planner = make(fake_server, model="gpt-5.4", send_screenshot=True)
    try:
        shot = phone_png(108, 240, noisy_rows=4)  # an image: a damaged one is left out
        await planner.decide("Turn on dark theme", settings_main(), screenshot=shot)
    finally:
        await planner.aclose()
    (request,) = fake_server.requests
    image, prompt = request.body["input"][0]["content"]
    assert image["type"] == "input_image" and image["detail"] == "auto"
    assert image["image_url"].startswith("data:image/png;base64,")
    assert prompt["type"] == "input_text"


@pytest.mark.parametrize("model", ["gpt-4.1", "gpt-5.4"], ids=["chat", "responses"])
async def test_a_screenshot_over_openais_image_limit_goes_within_it_at_the_screens_size(
    fake_server: FakeModelServer, model: str
) -> None:
    """OpenAI takes up to 20 MB per image; the direct transport has no cap of its own, so a
    larger PNG went as it was. It now goes as a JPEG of the same pixel size, within it."""
    png = phone_png(1600, 3400, noisy_rows=3400)
    assert base64_size(len(png)) > OPENAI_MAX_BASE64
    if model == "gpt-4.1":
        fake_server.script_openai(chat_completion(None, openai_tool_call("tap", TAP)))
    else:
        fake_server.script_responses(ScriptedTurn([function_call("tap", TAP)]))
    planner = make(fake_server, model=model, send_screenshot=True, thinking="off")
    try:
        await planner.decide("Turn on dark theme", settings_main(), screenshot=png)
    finally:
        await planner.aclose()
    (request,) = fake_server.requests
    if model == "gpt-4.1":
        url = request.body["messages"][1]["content"][0]["image_url"]["url"]
    else:
        url = request.body["input"][0]["content"][0]["image_url"]
    assert url.startswith("data:image/jpeg;base64,")
    assert len(url.split(",", 1)[1]) <= OPENAI_MAX_BASE64
    sent = image_of(url)
    assert (sent.format, sent.size) == ("JPEG", (1600, 3400))


@pytest.mark.parametrize(
    ("model", "effort", "room"),
    [
        ("gpt-5-mini", "minimal", True),
        ("gpt-5.4", "none", False),
        ("gpt-5.1-codex", "low", True),
        ("gpt-5-codex", "low", True),  # not GPT-5's `minimal`: a 400 at every step
        ("gpt-5-pro", "high", True),
        ("gpt-5.2-pro", "medium", True),  # not gpt-5.2's `none`: a 400 at every step
    ],
)
async def test_thinking_off_asks_a_reasoning_model_for_the_least_it_takes(
    fake_server: FakeModelServer, model: str, effort: str, room: bool
) -> None:
    """With thinking off (the default) the `reasoning` field was left out, and a reasoning
    model then reasons at its default effort (GPT-5: `medium`), hidden and billed, inside
    the answer's 2,048 output tokens: answers were cut off. Thinking off now asks for the
    least the model takes (`none` where it can stop reasoning), with room for the reasoning
    where it still reasons, and the reasoning's encrypted content included, so a corrective
    turn carries it back."""
    fake_server.script_responses(
        ScriptedTurn([reasoning(), function_call("tap", {"element_id": "e17"})]),
        ScriptedTurn([reasoning(), function_call("tap", TAP)]),
    )
    decision = await decide(make(fake_server, model=model, thinking="off"))
    assert decision.corrective_retries == 1 and decision.tool_name == "tap"
    first, second = fake_server.requests
    assert first.body["reasoning"] == {"effort": effort}  # no summaries asked for
    assert first.body["include"] == ["reasoning.encrypted_content"]
    assert first.body["max_output_tokens"] == (THINKING_MAX_TOKENS if room else 2048)
    assert second.status == 200, second.error
    assert fake_server.rejections == []


async def test_a_raised_limit_stays_within_the_models_own_output_limit(
    fake_server: FakeModelServer,
) -> None:
    """An answer cut off without a call doubles the limit for the rest of the decision; for
    gpt-4o (16,384 output tokens) asked with 12,000 that was 24,000: the API refuses it (400)."""
    fake_server.script_openai(
        chat_completion("Let me look at every setting first", finish_reason="length"),
        chat_completion(None, openai_tool_call("tap", TAP)),
    )
    decision = await decide(make(fake_server, model="gpt-4o", max_tokens=12000))
    assert decision.tool_name == "tap" and decision.output_truncated
    limits = [r.body["max_completion_tokens"] for r in fake_server.requests]
    assert limits == [12000, 16384]


@pytest.mark.parametrize("code", ["insufficient_quota", "project_spend_limit_exceeded"])
async def test_a_429_for_money_is_billing_and_never_asked_again(
    fake_server: FakeModelServer, code: str
) -> None:
    """OpenAI answers a used-up quota or spend limit with 429 and type `insufficient_quota`
    (the code says which limit): "retrying billing, spend, or quota errors won't restore API
    access". It was asked again like a rate limit, twice, before the billing error came."""
    quota = openai_error(
        429,
        "You exceeded your current quota, please check your plan and billing details.",
        "insufficient_quota",
        code,
    )
    fake_server.script_openai(quota)
    with pytest.raises(PlannerAuthError, match="refused the request for billing"):
        await decide(make(fake_server))
    assert [r.status for r in fake_server.requests] == [429]
