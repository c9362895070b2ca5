"""The fake server rejects what the real APIs reject, so a projection bug cannot pass silently.

Each test gets a genuine turn from the server through the real SDK, then sends it back broken in
one specific way — including the split-assistant-message defect left open in the review this
work answers — and expects the provider's error.
"""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import anthropic
import openai
import pytest

from tests.support.fakes import (
    FakeModelServer,
    ScriptedTurn,
    chat_completion,
    function_call,
    message,
    reasoning,
    redacted,
    text,
    thinking,
    tool_use,
)
from tests.support.fakes.anthropic import overloaded

THINKING = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as s:
        yield s


@pytest.fixture
async def claude(server: FakeModelServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(
        api_key="k", base_url=server.anthropic_base_url, max_retries=0
    )
    yield client
    await client.close()


@pytest.fixture
async def gpt(server: FakeModelServer) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(api_key="k", base_url=server.openai_base_url, max_retries=0)
    yield client
    await client.close()


async def _anthropic_turn(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> list[dict[str, Any]]:
    """One genuine turn; returns the request's messages extended with the answer and a result."""
    server.anthropic_script.append(
        ScriptedTurn(
            [
                thinking("first thought"),
                redacted(),
                thinking("second"),
                text("Tap."),
                tool_use("tap", {"x": 1, "y": 1}),
            ]
        )
    )
    server.anthropic_script.append(ScriptedTurn([thinking("ok"), text("done")]))
    answer = await cast(Any, claude.messages.create)(
        model="m", max_tokens=2048, thinking=THINKING, messages=[{"role": "user", "content": "s"}]
    )
    content = [b.to_dict() for b in answer.content]
    tool_id = content[-1]["id"]
    return [
        {"role": "user", "content": [{"type": "text", "text": "s"}]},
        {"role": "assistant", "content": content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "ok"}],
        },
    ]


async def _send(claude: anthropic.AsyncAnthropic, messages: list[dict[str, Any]]) -> None:
    await cast(Any, claude.messages.create)(
        model="m",
        max_tokens=2048,
        thinking=THINKING,
        messages=messages,
    )


async def test_the_intact_turn_is_accepted(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> None:
    await _send(claude, await _anthropic_turn(server, claude))
    assert server.rejections == []


async def test_a_turn_split_across_assistant_messages_is_rejected(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> None:
    messages = await _anthropic_turn(server, claude)
    blocks = messages[1]["content"]
    split = [
        messages[0],
        {"role": "assistant", "content": blocks[:3]},
        {"role": "assistant", "content": [blocks[3]]},
        {"role": "assistant", "content": [blocks[4]]},
        messages[2],
    ]
    with pytest.raises(anthropic.BadRequestError, match='multiple "assistant" roles in a row'):
        await _send(claude, split)


async def test_missing_final_thinking_is_rejected(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> None:
    messages = await _anthropic_turn(server, claude)
    messages[1]["content"] = messages[1]["content"][3:]
    with pytest.raises(
        anthropic.BadRequestError,
        match="Expected `thinking` or `redacted_thinking`, but found `text`",
    ):
        await _send(claude, messages)
    messages[1]["content"] = messages[1]["content"][1:]
    with pytest.raises(anthropic.BadRequestError, match="but found `tool_use`"):
        await _send(claude, messages)


async def test_altered_or_partial_thinking_is_rejected(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> None:
    good = await _anthropic_turn(server, claude)
    tampered = copy.deepcopy(good)
    tampered[1]["content"][0]["thinking"] = "first thought (edited)"
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
        await _send(claude, tampered)
    forged = copy.deepcopy(good)
    forged[1]["content"][1]["data"] = "Zm9yZ2Vk"
    with pytest.raises(anthropic.BadRequestError, match="Invalid `data`"):
        await _send(claude, forged)
    partial = copy.deepcopy(good)
    del partial[1]["content"][2]
    with pytest.raises(anthropic.BadRequestError, match="passed back unmodified, complete"):
        await _send(claude, partial)
    reordered = copy.deepcopy(good)
    blocks = reordered[1]["content"]
    blocks[0], blocks[2] = blocks[2], blocks[0]
    # A moved block fails its prefix binding (or, without binding, the order check).
    with pytest.raises(anthropic.BadRequestError, match="bound to a different conversation"):
        await _send(claude, reordered)


async def test_whitespace_only_text_is_refused_and_text_may_be_left_out(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> None:
    """The API refuses a text block holding only whitespace; only the thinking blocks must come
    back unmodified, so a client may leave a text block out."""
    good = await _anthropic_turn(server, claude)
    blank = copy.deepcopy(good)
    blank[1]["content"][3]["text"] = "\n\n"
    with pytest.raises(anthropic.BadRequestError, match="must contain non-whitespace text"):
        await _send(claude, blank)
    without_text = copy.deepcopy(good)
    del without_text[1]["content"][3]
    await _send(claude, without_text)
    assert server.rejections == ["messages: text content blocks must contain non-whitespace text"]


async def test_an_edited_earlier_message_invalidates_later_thinking(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> None:
    """Preserved thinking: a sliding context window that condenses an earlier observation
    changes the prefix the thinking block was produced under."""
    edited = await _anthropic_turn(server, claude)
    edited[0]["content"] = [{"type": "text", "text": "(earlier screen condensed)"}]
    with pytest.raises(anthropic.BadRequestError, match="bound to a different conversation"):
        await _send(claude, edited)
    server.prefix_binding = False  # models without preserved thinking only check signatures
    await _send(claude, edited)


async def test_tool_results_must_answer_and_come_first(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> None:
    good = await _anthropic_turn(server, claude)
    late = copy.deepcopy(good)
    late[2]["content"].insert(0, {"type": "text", "text": "screen"})
    with pytest.raises(anthropic.BadRequestError, match="must come first"):
        await _send(claude, late)
    missing = copy.deepcopy(good)
    missing[2]["content"] = [{"type": "text", "text": "screen"}]
    with pytest.raises(anthropic.BadRequestError, match="without `tool_result` blocks"):
        await _send(claude, missing)


async def test_thinking_with_a_forced_tool_choice_is_rejected(
    claude: anthropic.AsyncAnthropic,
) -> None:
    with pytest.raises(anthropic.BadRequestError, match="forces tool use"):
        await cast(Any, claude.messages.create)(
            model="m",
            max_tokens=2048,
            thinking=THINKING,
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "s"}],
        )


async def _responses_turn(server: FakeModelServer, gpt: openai.AsyncOpenAI) -> list[dict[str, Any]]:
    server.responses_script.append(
        ScriptedTurn([reasoning("plan"), message("Tapping."), function_call("tap", {"x": 1})])
    )
    server.responses_script.append(ScriptedTurn([message("done")]))
    answer = await cast(Any, gpt.responses.create)(
        model="m",
        input=[{"role": "user", "content": "s"}],
        store=False,
        include=["reasoning.encrypted_content"],
        reasoning={"effort": "low"},
    )
    output = [o.to_dict() for o in answer.output]
    return [
        {"role": "user", "content": "s"},
        *output,
        {"type": "function_call_output", "call_id": output[-1]["call_id"], "output": "ok"},
    ]


async def _send_responses(gpt: openai.AsyncOpenAI, items: list[dict[str, Any]]) -> None:
    await cast(Any, gpt.responses.create)(
        model="m",
        input=items,
        store=False,
        include=["reasoning.encrypted_content"],
        reasoning={"effort": "low"},
    )


async def test_responses_rules(server: FakeModelServer, gpt: openai.AsyncOpenAI) -> None:
    good = await _responses_turn(server, gpt)
    await _send_responses(gpt, copy.deepcopy(good))
    assert server.rejections == []
    server.responses_script.extend(ScriptedTurn([message("x")]) for _ in range(4))

    orphan = [
        i for i in copy.deepcopy(good) if i.get("type") != "message" or i.get("role") == "user"
    ]
    with pytest.raises(openai.BadRequestError, match="without its required following item"):
        await _send_responses(gpt, orphan)
    tampered = copy.deepcopy(good)
    tampered[1]["encrypted_content"] = tampered[1]["encrypted_content"][:-4] + "AAAA"
    with pytest.raises(openai.BadRequestError, match="could not be verified"):
        await _send_responses(gpt, tampered)
    stripped = copy.deepcopy(good)
    stripped[1]["encrypted_content"] = None
    with pytest.raises(openai.BadRequestError, match="Items are not persisted"):
        await _send_responses(gpt, stripped)
    no_output = copy.deepcopy(good)[:-1]
    with pytest.raises(openai.BadRequestError, match="No tool output found"):
        await _send_responses(gpt, no_output)


# --- the per-model rules table (tests/support/fakes/rules.py) --------------------------------


@pytest.mark.parametrize("kind", ["enabled", "disabled"])
async def test_adaptive_only_model_refuses_enabled_and_disabled_thinking(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic, kind: str
) -> None:
    config: dict[str, Any] = {"type": kind}
    if kind == "enabled":
        config["budget_tokens"] = 1024
    with pytest.raises(anthropic.BadRequestError, match=f"thinking.type.{kind} is not supported"):
        await cast(Any, claude.messages.create)(
            model="claude-opus-4-7",
            max_tokens=4096,
            thinking=config,
            messages=[{"role": "user", "content": "s"}],
        )


@pytest.mark.parametrize(("display", "seen"), [(None, ""), ("summarized", "I see it.")])
async def test_adaptive_only_model_omits_thinking_text_unless_summarized(
    server: FakeModelServer,
    claude: anthropic.AsyncAnthropic,
    display: str | None,
    seen: str,
) -> None:
    server.anthropic_script.append(ScriptedTurn([thinking("I see it."), text("Ok.")]))
    config: dict[str, Any] = {"type": "adaptive"}
    if display:
        config["display"] = display
    answer = await cast(Any, claude.messages.create)(
        model="claude-opus-4-7",
        max_tokens=4096,
        thinking=config,
        messages=[{"role": "user", "content": "s"}],
    )
    block = answer.content[0]
    assert (block.type, block.thinking) == ("thinking", seen)
    assert block.signature  # still signed: it must go back on a tool-use continuation


@pytest.mark.parametrize(
    ("thinking_config", "shape"),
    [
        ({"type": "adaptive", "display": "summarized"}, [("thinking", "t"), ("thinking", "s")]),
        ({"type": "adaptive"}, [("thinking", ""), ("thinking", "")]),
        ({"type": "between_tools"}, [("thinking", "s")]),
    ],
)
async def test_a_55_model_returns_the_text_before_its_call_in_a_thinking_block(
    server: FakeModelServer,
    claude: anthropic.AsyncAnthropic,
    thinking_config: dict[str, Any],
    shape: list[tuple[str, str]],
) -> None:
    """Claude Sonnet 5.5 (and Opus 5.5): "text between tool calls comes back in thinking
    blocks", empty at the default display; with `between_tools` there is no up-front thinking
    and the text comes back readable."""
    server.anthropic_script.append(
        ScriptedTurn([thinking("t"), text("s"), tool_use("tap", {"x": 1, "y": 1})])
    )
    answer = await cast(Any, claude.messages.create)(
        model="claude-sonnet-5-5",
        max_tokens=20000,
        thinking=thinking_config,
        messages=[{"role": "user", "content": "s"}],
    )
    blocks = [b.to_dict() for b in answer.content]
    assert [(b["type"], b["thinking"]) for b in blocks[:-1]] == shape
    assert blocks[-1]["type"] == "tool_use"


async def test_mythos_thinks_when_thinking_is_left_out(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(anthropic.BadRequestError, match="tool_choice forces tool use"):
        await cast(Any, claude.messages.create)(
            model="claude-mythos-5",
            max_tokens=4096,
            tool_choice={"type": "any"},
            tools=[{"name": "tap", "input_schema": {"type": "object"}}],
            messages=[{"role": "user", "content": "s"}],
        )


async def test_non_reasoning_openai_model_refuses_reasoning(
    server: FakeModelServer, gpt: openai.AsyncOpenAI
) -> None:
    with pytest.raises(openai.BadRequestError, match=r"Unsupported parameter: 'reasoning\.effort'"):
        await cast(Any, gpt.responses.create)(
            model="gpt-4.1-mini",
            input="s",
            store=False,
            reasoning={"effort": "low", "summary": "auto"},
        )
    with pytest.raises(openai.BadRequestError, match="Unsupported parameter: 'reasoning_effort'"):
        await cast(Any, gpt.chat.completions.create)(
            model="gpt-4.1-mini",
            messages=[{"role": "user", "content": "s"}],
            reasoning_effort="low",
        )
    with pytest.raises(openai.BadRequestError, match="Encrypted content is not supported") as info:
        await cast(Any, gpt.responses.create)(
            model="gpt-4.1-mini",
            input="s",
            store=False,
            include=["reasoning.encrypted_content"],
        )
    assert cast(dict[str, Any], info.value.body)["param"] == "include"


async def _chat_refusal(
    gpt: openai.AsyncOpenAI, refused: str | None, **request: Any
) -> dict[str, Any] | None:
    """Send a Chat Completions request: None when `refused` is None and it was answered, else
    the error body of the 400 whose message holds `refused`."""
    call = cast(Any, gpt.chat.completions.create)(**request)
    if refused is None:
        await call
        return None
    with pytest.raises(openai.BadRequestError, match=re.escape(refused)) as info:
        await call
    return cast(dict[str, Any], info.value.body)


@pytest.mark.parametrize(
    ("model", "effort", "refused"),
    [
        ("gpt-5.1", "minimal", "Supported values are: 'none', 'low', 'medium', 'high'."),
        ("gpt-5.6-sol", "minimal", "'none', 'low', 'medium', 'high', 'xhigh', 'max'."),
        ("gpt-5.5", "max", "'none', 'low', 'medium', 'high', 'xhigh'."),
        ("gpt-5-mini", "none", "Supported values are: 'minimal', 'low', 'medium', 'high'."),
        ("gpt-5.1-chat-latest", "high", "Supported values are: 'medium'."),
        ("gpt-5.1", "none", None),
        ("gpt-5.2", "xhigh", None),
        ("gpt-5.2-chat-latest", "medium", None),
    ],
)
async def test_each_gpt_5_family_takes_its_own_efforts(
    server: FakeModelServer,
    gpt: openai.AsyncOpenAI,
    model: str,
    effort: str,
    refused: str | None,
) -> None:
    server.script_openai(chat_completion("ok"))
    error = await _chat_refusal(
        gpt,
        refused,
        model=model,
        messages=[{"role": "user", "content": "s"}],
        reasoning_effort=effort,
    )
    if error is None:
        return
    assert error["code"] == "unsupported_value" and error["param"] == "reasoning_effort"
    assert error["message"].startswith(
        f"Unsupported value: 'reasoning_effort' does not support '{effort}' with this model."
    )


@pytest.mark.parametrize(
    ("model", "effort"),
    [("gpt-5.10", "xhigh"), ("gpt-5.1-2025-11-13", "none"), ("gpt-4o1", "high")],
)
async def test_a_model_takes_a_rules_row_only_at_a_boundary_of_its_name(
    server: FakeModelServer, gpt: openai.AsyncOpenAI, model: str, effort: str
) -> None:
    """As the planner's tables (planner/model_names.py): gpt-5.10 is no gpt-5.1 (which refuses
    `xhigh`) and gpt-4o1 no gpt-4o (which refuses reasoning); a dated gpt-5.1 is."""
    server.script_openai(chat_completion("ok"))
    await _chat_refusal(
        gpt,
        None,
        model=model,
        messages=[{"role": "user", "content": "s"}],
        reasoning_effort=effort,
    )


_CHAT_TOOL = {"type": "function", "function": {"name": "tap", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("model", "effort", "refused"),
    [
        ("gpt-5.4", "medium", "Please use /v1/responses instead."),
        ("gpt-5.4", None, None),
        ("gpt-5.4", "none", None),
        ("gpt-5.6-sol", None, "or set reasoning_effort to 'none'."),
        ("gpt-5.6-sol", "low", "or set reasoning_effort to 'none'."),
        ("gpt-5.6-sol", "none", None),
        ("o4-mini", "low", None),
    ],
)
async def test_chat_refuses_function_tools_with_reasoning_on_newer_gpt5(
    server: FakeModelServer,
    gpt: openai.AsyncOpenAI,
    model: str,
    effort: str | None,
    refused: str | None,
) -> None:
    """As the live API does (openai/openai-openapi#541, BerriAI/litellm#34569): GPT-5.4 takes
    function tools on Chat Completions only without a reasoning effort, gpt-5.6 only with an
    explicit `none`."""
    server.script_openai(chat_completion("ok"))
    extra = {"reasoning_effort": effort} if effort is not None else {}
    error = await _chat_refusal(
        gpt,
        refused,
        model=model,
        messages=[{"role": "user", "content": "s"}],
        tools=[_CHAT_TOOL],
        **extra,
    )
    if error is None:
        return
    assert error["param"] == "reasoning_effort" and error["type"] == "invalid_request_error"
    assert error["message"].startswith(
        f"Function tools with reasoning_effort are not supported for {model} in "
        "/v1/chat/completions."
    )


async def test_a_stream_can_fail_after_http_200(
    server: FakeModelServer, claude: anthropic.AsyncAnthropic
) -> None:
    """The SDK raises the in-stream error with the stream's status (200): a client must classify
    it by its error type, not its status."""
    server.anthropic_script.append(overloaded())
    stream = await cast(Any, claude.messages.create)(
        model="m", max_tokens=2048, messages=[{"role": "user", "content": "s"}], stream=True
    )
    with pytest.raises(anthropic.APIStatusError) as info:
        async for _ in stream:
            pass
    assert info.value.status_code == 200
    assert cast(dict[str, Any], info.value.body)["error"]["type"] == "overloaded_error"


async def test_streams_carry_ping_events(server: FakeModelServer) -> None:
    """Read the raw SSE (the SDK drops pings itself): a ping follows message_start and each
    content block, as the API may send any number of them."""
    server.anthropic_script.append(ScriptedTurn([text("Ok.")]))
    answer = server.handle(
        "/v1/messages",
        {"anthropic-version": "2023-06-01", "x-api-key": "k"},
        {
            "model": "m",
            "max_tokens": 10,
            "stream": True,
            "messages": [{"role": "user", "content": "s"}],
        },
    )
    names = [name for name, _ in answer.events or []]
    assert names[:2] == ["message_start", "ping"]
    assert names.count("ping") == 2 and names[-1] == "message_stop"
