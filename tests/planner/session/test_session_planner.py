"""SessionPlanner end to end: the real SDKs against the enforcing fake server, a SQLite store,
restarts, streaming, retries and provider switches. Every request must be accepted by a server
that checks signatures, turn structure and reasoning order, so a violation fails here."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from planner.conversation.items import Reasoning, ToolCall, ToolResult, UserObservation
from planner.conversation.turns import ForeignReasoning
from planner.errors import PlannerAuthError, PlannerUnavailable
from planner.history import MASK
from planner.session.config import SessionConfig
from planner.session.factory import SessionProvider
from planner.session.planner import NOT_RECORDED, NUDGE, SessionPlanner
from planner.session.store import SqliteSessionStore
from planner.vendors import ModelAdapter, ThinkingConfig
from planner.vendors.anthropic import AnthropicAdapter
from planner.vendors.openai import OpenAIAdapter
from tests.support.fakes import (
    BAD_KEY,
    FakeModelServer,
    ScriptedTurn,
    function_call,
    message,
    reasoning,
    redacted,
    text,
    thinking,
    tool_use,
)

INTENT = {"purpose": "make progress", "expected_outcome": "the next screen shows"}
BUDGET = ThinkingConfig("budget", budget_tokens=2048)


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as s:
        yield s


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "host.sqlite"


class Factory:
    """Builds planners the way a host does after every (re)start: a fresh store object and
    client over the same database file."""

    def __init__(self, server: FakeModelServer, db: Path) -> None:
        self.server = server
        self.db = db
        self.open_planners: list[SessionPlanner] = []

    async def __call__(
        self,
        provider: SessionProvider = "anthropic",
        *,
        thinking: ThinkingConfig = BUDGET,
        stream: bool = False,
        attempt: int = 1,
        live: list[str] | None = None,
        foreign: ForeignReasoning = "drop",
        keep_scenes: int | None = 6,
        model: str | None = None,
    ) -> SessionPlanner:
        client: anthropic.AsyncAnthropic | openai.AsyncOpenAI
        if provider == "anthropic":
            client = anthropic.AsyncAnthropic(
                api_key="test-key", base_url=self.server.anthropic_base_url, max_retries=0
            )
            model = model or "claude-sonnet-4-6"  # a profile that turns thinking off explicitly
        else:
            client = openai.AsyncOpenAI(
                api_key="test-key", base_url=self.server.openai_base_url, max_retries=0
            )
            model = "gpt-test"
        planner = await SessionPlanner.open(
            store=SqliteSessionStore(self.db),
            task_id="task-1",
            attempt=attempt,
            adapter=adapter_for(client, model, thinking),
            config=SessionConfig(
                stream=stream,
                foreign_reasoning=foreign,
                keep_scenes=keep_scenes,
            ),
            on_thinking=live.append if live is not None else None,
            owns_adapter=True,
        )
        self.open_planners.append(planner)
        return planner


@pytest.fixture
async def make(server: FakeModelServer, db: Path) -> AsyncIterator[Factory]:
    factory = Factory(server, db)
    yield factory
    for planner in factory.open_planners:
        await planner.aclose()


def adapter_for(
    client: anthropic.AsyncAnthropic | openai.AsyncOpenAI, model: str, thinking: ThinkingConfig
) -> ModelAdapter:
    if isinstance(client, anthropic.AsyncAnthropic):
        return AnthropicAdapter(client, model=model, thinking=thinking, retries=0)
    return OpenAIAdapter(client, model=model, thinking=thinking, retries=0)


def _database_bytes(db: Path) -> bytes:
    """The SQLite file and its WAL, where an unmasked value would have landed."""
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))


def _last_messages(server: FakeModelServer) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = server.bodies("/v1/messages")[-1]["messages"]
    return messages


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_anthropic_session_resumes_after_restart_with_signed_thinking(
    server: FakeModelServer, make: Factory, stream: bool
) -> None:
    server.anthropic_script.extend(
        [
            ScriptedTurn(
                [
                    thinking("The home screen shows the Settings icon."),
                    redacted(),
                    text("Home screen. Open Settings."),
                    tool_use("launch_app", {"package_name": "com.android.settings", **INTENT}),
                ]
            ),
            ScriptedTurn(
                [
                    thinking("Settings opened as expected; Display is row e6."),
                    text("Settings is open. Tap Display."),
                    tool_use("tap", {"element_id": "e6", **INTENT}),
                ]
            ),
            ScriptedTurn(
                [
                    thinking("Display page open; dark theme toggle visible."),
                    text("Display is open. Done for this test."),
                    tool_use("complete", {"success": True, "reason": "reached Display"}),
                ]
            ),
        ]
    )
    live: list[str] = []
    planner = await make(stream=stream, live=live)
    first = await planner.decide("screen 1: home, Settings icon e4")
    assert first.tool_name == "launch_app"
    assert first.arguments == {"package_name": "com.android.settings"}
    assert (first.purpose, first.expected_outcome) == ("make progress", "the next screen shows")
    assert first.rationale == "Home screen. Open Settings."
    assert [(b.text, b.redacted) for b in first.thinking] == [
        ("The home screen shows the Settings icon.", False),
        ("", True),
    ]
    await planner.record_tool_result("launched")
    second = await planner.decide("screen 2: Settings list, Display is e6")
    assert second.arguments == {"element_id": "e6"}
    await planner.record_tool_result("tapped e6")
    if stream:
        assert "".join(live) == (
            "The home screen shows the Settings icon."
            "Settings opened as expected; Display is row e6."
        )
    signed = [i for i in planner.history if isinstance(i, Reasoning) and i.signature]
    await planner.aclose()
    del planner  # the host stops here; only the SQLite file survives

    resumed = await make(stream=stream)
    assert [i for i in resumed.history if isinstance(i, Reasoning) and i.signature] == signed
    third = await resumed.decide("screen 3: Display page")
    assert third.tool_name == "complete"
    assert server.rejections == []

    messages = _last_messages(server)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2 + ["user"]
    assert messages[3]["content"] == [
        {"type": "thinking", "thinking": signed[1].text, "signature": signed[1].signature},
        {"type": "text", "text": "Settings is open. Tap Display."},
        {
            "type": "tool_use",
            "id": messages[3]["content"][2]["id"],
            "name": "tap",
            "input": {"element_id": "e6", **INTENT},
        },
    ]
    assert [b["type"] for b in messages[1]["content"]] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
    ]
    assert messages[4]["content"][0]["type"] == "tool_result"
    assert messages[4]["content"][1] == {"type": "text", "text": "screen 3: Display page"}
    request = server.bodies("/v1/messages")[-1]
    assert request["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert request["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert server.requests[-1].headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


async def test_the_live_view_keeps_a_decisions_thinking_blocks_apart(
    server: FakeModelServer, make: Factory
) -> None:
    """The live view only appends, and it ran every block of a decision into one line ("…the
    theme.Now tap it."), where the record keeps them apart: a blank line now separates two
    blocks, of one answer or of the decision's next call (the nudge after no tool call)."""
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("Look first."), text("The list shows Display.")]),
            ScriptedTurn(
                [
                    thinking("Display holds the theme."),
                    thinking("Now tap it."),
                    tool_use("tap", {"element_id": "e6", **INTENT}),
                ]
            ),
        ]
    )
    live: list[str] = []
    planner = await make(
        stream=True, live=live, model="claude-opus-4-7", thinking=ThinkingConfig("adaptive")
    )
    decision = await planner.decide("screen 1: Settings list, Display is e6")
    assert decision.retry_kind == "nudge" and server.rejections == []
    blocks = ["Look first.", "Display holds the theme.", "Now tap it."]
    assert [b.text for b in decision.thinking] == blocks
    assert "".join(live) == "\n\n".join(blocks)


async def test_the_live_view_keeps_openai_reasoning_summaries_apart(
    server: FakeModelServer, make: Factory
) -> None:
    server.responses_script.append(
        ScriptedTurn(
            [
                reasoning("Settings icon is visible.", "It opens Settings."),
                reasoning("Launch it."),
                function_call("launch_app", {"package_name": "com.android.settings", **INTENT}),
            ]
        )
    )
    live: list[str] = []
    thinking_on = ThinkingConfig("adaptive", effort="low")
    planner = await make("openai-responses", thinking=thinking_on, stream=True, live=live)
    await planner.decide("screen 1")
    assert server.rejections == []
    assert "".join(live) == "Settings icon is visible.\n\nIt opens Settings.\n\nLaunch it."


async def test_interrupted_stream_commits_nothing_and_the_session_goes_on(
    server: FakeModelServer, make: Factory
) -> None:
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("half a thought that never ends"), text("x")], interrupt=True),
            ScriptedTurn(
                [thinking("whole thought"), tool_use("press_key", {"key": "back", **INTENT})]
            ),
            ScriptedTurn(
                [thinking("next"), tool_use("complete", {"success": False, "reason": "r"})]
            ),
        ]
    )
    planner = await make(stream=True)
    with pytest.raises(PlannerUnavailable, match="stream broke off"):
        await planner.decide("screen 1")
    assert planner.history == (UserObservation("screen 1"),)
    decision = await planner.decide("screen 1 again")
    assert decision.tool_name == "press_key"
    await planner.record_tool_result("pressed")
    await planner.decide("screen 2")
    assert server.rejections == []
    thoughts = [i.text for i in planner.history if isinstance(i, Reasoning)]
    assert thoughts == ["whole thought", "next"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_responses_session_resumes_with_encrypted_reasoning(
    server: FakeModelServer, make: Factory, stream: bool
) -> None:
    server.responses_script.extend(
        [
            ScriptedTurn(
                [
                    reasoning("Settings icon is visible."),
                    message("Opening Settings."),
                    function_call("launch_app", {"package_name": "com.android.settings", **INTENT}),
                ]
            ),
            ScriptedTurn(
                [
                    reasoning("Display row is e6."),
                    function_call("tap", {"element_id": "e6", **INTENT}),
                ]
            ),
            ScriptedTurn(
                [reasoning("Done."), function_call("complete", {"success": True, "reason": "ok"})]
            ),
        ]
    )
    live: list[str] = []
    thinking_on = ThinkingConfig("adaptive", effort="low")
    planner = await make("openai-responses", thinking=thinking_on, stream=stream, live=live)
    first = await planner.decide("screen 1")
    assert first.arguments == {"package_name": "com.android.settings"}
    assert first.rationale == "Opening Settings."
    assert [b.text for b in first.thinking] == ["Settings icon is visible."]
    await planner.record_tool_result("launched")
    await planner.decide("screen 2")
    await planner.record_tool_result("tapped")
    if stream:
        assert "".join(live) == "Settings icon is visible.Display row is e6."
    encrypted = [i.encrypted_content for i in planner.history if isinstance(i, Reasoning)]
    await planner.aclose()

    resumed = await make("openai-responses", thinking=thinking_on, stream=stream)
    third = await resumed.decide("screen 3")
    assert third.tool_name == "complete"
    assert server.rejections == []
    body = server.bodies("/v1/responses")[-1]
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert body["parallel_tool_calls"] is False
    kinds = [i.get("type", "message") for i in body["input"]]
    assert kinds == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
    ]
    sent = [i["encrypted_content"] for i in body["input"] if i.get("type") == "reasoning"]
    assert sent == encrypted
    assert body["input"][2]["phase"] == "commentary"


async def test_a_session_stored_with_broken_arguments_sends_them_as_a_json_object(
    server: FakeModelServer, make: Factory, db: Path
) -> None:
    """A session stored before calls' unparseable arguments were kept as `{}` still holds the
    model's broken text, in `raw_arguments` and in the Responses item (`wire`); a server that
    parses the arguments it is sent back (vLLM, SGLang) refused every later step with a 400."""
    broken = '{"element_id": "e17", "purpose": '
    wire = {
        "type": "function_call",
        "id": "fc_old",
        "call_id": "call_old",
        "name": "tap",
        "arguments": broken,
        "status": "completed",
    }
    await SqliteSessionStore(db).append(
        "task-1",
        1,
        [
            UserObservation("screen 1"),
            ToolCall("openai", "resp_old", "call_old", "tap", {}, broken, "fc_old", wire),
            ToolResult("call_old", "tap: arguments are not valid JSON", is_error=True),
        ],
    )
    server.responses.require_json_arguments = True
    server.responses_script.append(
        ScriptedTurn([function_call("tap", {"element_id": "e17", **INTENT})])
    )
    planner = await make("openai-responses")
    decision = await planner.decide("screen 2")

    assert decision.arguments == {"element_id": "e17"}
    assert server.rejections == []
    sent = server.bodies("/v1/responses")[-1]["input"]
    call = next(i for i in sent if i.get("type") == "function_call")
    assert (call["id"], call["arguments"]) == ("fc_old", "{}")


async def test_forced_retry_then_thinking_turn_closes_the_unthought_loop_as_text(
    server: FakeModelServer, make: Factory
) -> None:
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("I should look around."), text("Looking at the screen.")]),
            ScriptedTurn([tool_use("press_key", {"key": "home", **INTENT})]),
            ScriptedTurn(
                [thinking("Home now."), tool_use("complete", {"success": True, "reason": "r"})]
            ),
        ]
    )
    planner = await make()
    decision = await planner.decide("screen 1")
    assert decision.forced_retry
    assert decision.rationale == "Looking at the screen."
    forced = server.bodies("/v1/messages")[1]
    assert forced["tool_choice"]["type"] == "any"
    assert forced["thinking"] == {"type": "disabled"}
    assert [b["type"] for b in forced["messages"][1]["content"]] == ["text"]  # no thinking sent
    assert forced["messages"][-1] == {"role": "user", "content": [{"type": "text", "text": NUDGE}]}
    await planner.record_tool_result("went home")
    await planner.decide("screen 2")
    assert server.rejections == []
    last = _last_messages(server)
    # The forced turn had no thinking, so with thinking back on it is sent as plain text.
    assert last[-2]["content"] == [
        {
            "type": "text",
            "text": '[called tool press_key with {"expected_outcome": "the next screen shows", '
            '"key": "home", "purpose": "make progress"}]',
        }
    ]
    assert last[-1]["content"][0] == {
        "type": "text",
        "text": "[result of tool press_key]\nwent home",
    }
    assert planner.last_stats.turns_as_text == 1


async def test_corrective_retry_keeps_the_thinking_turn_intact(
    server: FakeModelServer, make: Factory
) -> None:
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("Tap e99."), tool_use("tap", {"element_id": "e99", **INTENT})]),
            ScriptedTurn([thinking("Oops, e2."), tool_use("tap", {"element_id": "e2", **INTENT})]),
        ]
    )
    planner = await make()
    decision = await planner.decide("screen 1", element_ids={"e1", "e2"})
    assert decision.arguments == {"element_id": "e2"}
    assert decision.corrective_retries == 1
    assert server.rejections == []
    retry = _last_messages(server)
    assert retry[-2]["content"][0]["type"] == "thinking"
    assert retry[-1]["content"][0]["is_error"] is True
    assert "not in the current scene" in retry[-1]["content"][0]["content"]


async def test_sensitive_text_is_executed_but_never_stored_or_sent_back(
    server: FakeModelServer, make: Factory, db: Path
) -> None:
    secret = "hunter2-secret"
    server.anthropic_script.extend(
        [
            ScriptedTurn(
                [
                    thinking("Type the password."),
                    tool_use("input_text", {"text": secret, "sensitive": True, **INTENT}),
                ]
            ),
            ScriptedTurn(
                [thinking("Signed in."), tool_use("complete", {"success": True, "reason": "r"})]
            ),
        ]
    )
    planner = await make()
    decision = await planner.decide("login screen")
    assert decision.arguments["text"] == secret
    await planner.record_tool_result("typed")
    await planner.decide("home screen")
    assert server.rejections == []
    assert secret not in json.dumps(server.bodies("/v1/messages")[-1])
    assert secret.encode() not in _database_bytes(db)
    calls = [i for i in planner.history if isinstance(i, ToolCall)]
    assert calls[0].arguments["text"] == MASK


async def test_restart_mid_step_answers_the_dangling_call(
    server: FakeModelServer, make: Factory
) -> None:
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("Go back."), tool_use("press_key", {"key": "back", **INTENT})]),
            ScriptedTurn(
                [thinking("Fine."), tool_use("complete", {"success": True, "reason": "r"})]
            ),
        ]
    )
    planner = await make()
    await planner.decide("screen 1")
    await planner.aclose()  # crashed before the result was recorded

    resumed = await make(attempt=2)  # the cloud re-queued the task as attempt 2
    assert len(resumed.history) == 3  # observation, thinking, tool call: copied from attempt 1
    await resumed.decide("screen after restart")
    assert server.rejections == []
    last = _last_messages(server)
    assert last[-1]["content"][0]["content"] == NOT_RECORDED
    assert last[-2]["content"][0]["type"] == "thinking"


async def test_the_recorded_prompt_is_everything_the_step_sent_the_model(
    server: FakeModelServer, make: Factory
) -> None:
    """The decision recorded only the step's observation as its user prompt, while the model
    also got the note answering the call a restart left open and, after an answer without a
    call, the instruction to call a tool: the record said less than the model was told. It
    now holds every user-side item of the step, in the order the model got them."""
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("Go back."), tool_use("press_key", {"key": "back", **INTENT})]),
            ScriptedTurn([thinking("Look first."), text("The list shows Display.")]),
            ScriptedTurn([tool_use("tap", {"element_id": "e6", **INTENT})]),
            ScriptedTurn(
                [thinking("Fine."), tool_use("complete", {"success": True, "reason": "r"})]
            ),
        ]
    )
    planner = await make()
    first = await planner.decide("screen 1")
    assert first.user_prompt == "screen 1"
    await planner.aclose()  # crashed before the result was recorded

    resumed = await make(attempt=2)
    second = await resumed.decide("screen 2: Display is e6")
    assert second.retry_kind == "forced" and server.rejections == []
    assert second.user_prompt == (
        f"[tool result] {NOT_RECORDED}\n\nscreen 2: Display is e6\n\n[instruction] {NUDGE}"
    )
    await resumed.record_tool_result("tapped e6: the Display page opened", is_error=False)
    third = await resumed.decide("screen 3: Display page")
    assert third.user_prompt == (
        "[tool result] tapped e6: the Display page opened\n\nscreen 3: Display page"
    )


async def test_provider_switch_drops_foreign_signatures_both_ways(
    server: FakeModelServer, make: Factory
) -> None:
    server.anthropic_script.extend(
        [
            ScriptedTurn(
                [thinking("A1 thought"), tool_use("press_key", {"key": "back", **INTENT})]
            ),
            ScriptedTurn(
                [thinking("A2 thought"), tool_use("complete", {"success": True, "reason": "r"})]
            ),
        ]
    )
    server.responses_script.append(
        ScriptedTurn(
            [reasoning("O1 summary"), function_call("press_key", {"key": "home", **INTENT})]
        )
    )
    first = await make()
    await first.decide("screen 1")
    await first.record_tool_result("back pressed")
    await first.aclose()

    switched = await make("openai-responses", thinking=ThinkingConfig("adaptive"))
    await switched.decide("screen 2")
    await switched.record_tool_result("home pressed")
    body = server.bodies("/v1/responses")[-1]
    assert "A1 thought" not in json.dumps(body)
    assert switched.last_stats.foreign_dropped == 1
    await switched.aclose()

    back = await make(foreign="text")
    await back.decide("screen 3")
    assert server.rejections == []
    messages = _last_messages(server)
    # Anthropic's own earlier thinking goes back signed; OpenAI's reasoning only as text; the
    # OpenAI turn that the last tool result answers is closed as text (it has no thinking).
    assert messages[1]["content"][0]["type"] == "thinking"
    assert messages[3]["content"][0] == {
        "type": "text",
        "text": "[earlier reasoning by openai]\nO1 summary",
    }
    assert "encrypted" not in json.dumps(messages)
    assert back.last_stats.turns_as_text == 1


async def test_thinking_goes_back_only_to_the_claude_model_that_wrote_it(
    server: FakeModelServer, make: Factory
) -> None:
    """Claude signatures are model-bound: a conversation continued on another Claude model sent
    the first model's signed thinking to the second, which refused the request (the recovery
    checkpoint then retired every earlier thought). Another model's thinking now travels as
    another provider's does (here as text); the new model's own goes back signed."""
    server.anthropic_script.extend(
        [
            ScriptedTurn(
                [thinking("S1 thought"), tool_use("press_key", {"key": "back", **INTENT})]
            ),
            ScriptedTurn(
                [thinking("O1 thought"), tool_use("press_key", {"key": "home", **INTENT})]
            ),
            ScriptedTurn(
                [thinking("O2 thought"), tool_use("complete", {"success": True, "reason": "r"})]
            ),
        ]
    )
    first = await make(thinking=ThinkingConfig("adaptive"))
    await first.decide("screen 1")
    await first.record_tool_result("back pressed")
    await first.aclose()

    switched = await make(
        model="claude-opus-4-6", thinking=ThinkingConfig("adaptive"), foreign="text"
    )
    await switched.decide("screen 2")
    await switched.record_tool_result("home pressed")
    await switched.decide("screen 3")
    assert server.rejections == []
    messages = _last_messages(server)
    assert messages[1]["content"][0] == {
        "type": "text",
        "text": "[earlier reasoning by claude-sonnet-4-6]\nS1 thought",
    }
    assert all(b["type"] == "text" for b in messages[1]["content"])
    assert messages[3]["content"][0]["type"] == "thinking"
    assert messages[3]["content"][0]["thinking"] == "O1 thought"


#: A signed block of a type the planner does not read (a server-side compaction summary, as
#: the compaction beta returns it): kept as received and sent back to the model that wrote it.
SIGNED_BLOCK = {"type": "compaction", "content": "Settings was opened.", "signature": "EuYBCkQY"}


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_blocks_the_planner_does_not_read_go_back_only_to_the_claude_model_that_wrote_them(
    server: FakeModelServer, make: Factory
) -> None:
    """A turn without a tool call (answered by the forced retry) keeps the blocks the planner
    does not read, and a later request sends them back as received. After a switch to another
    Claude model that turn's thinking was left out as model-bound, yet its signed block still
    went to the new model; it now goes back only to the model that wrote it, as thinking does
    (left out and counted). The model that wrote it still gets it back."""
    server.anthropic_script.extend(
        [
            ScriptedTurn([thinking("Look first."), SIGNED_BLOCK, text("Settings is open.")]),
            ScriptedTurn([tool_use("press_key", {"key": "back", **INTENT})]),
            ScriptedTurn(
                [thinking("O1 thought"), tool_use("press_key", {"key": "home", **INTENT})]
            ),
        ]
    )
    first = await make(thinking=ThinkingConfig("adaptive"))
    await first.decide("screen 1")
    assert SIGNED_BLOCK in _last_messages(server)[1]["content"]  # back to its own model
    await first.record_tool_result("back pressed")
    await first.aclose()

    switched = await make(model="claude-opus-4-6", thinking=ThinkingConfig("adaptive"))
    await switched.decide("screen 2")
    assert server.rejections == []
    sent = [b for m in _last_messages(server) if m["role"] == "assistant" for b in m["content"]]
    assert SIGNED_BLOCK not in sent
    assert {"type": "text", "text": "Settings is open."} in sent
    assert switched.last_stats.opaque_dropped == 1


@pytest.mark.parametrize("provider", ["anthropic", "openai-responses"])
async def test_long_session_keeps_the_budget_with_checkpoints(
    server: FakeModelServer, make: Factory, provider: SessionProvider
) -> None:
    """Twelve steps with keep_scenes=2 against a server that binds thinking to its prefix:
    every request is accepted, old scenes are condensed, the latest thinking still travels."""
    steps = 12
    for n in range(steps):
        args = {"key": "back", **INTENT}
        if provider == "anthropic":
            server.anthropic_script.append(
                ScriptedTurn(
                    [thinking(f"thought {n}"), text(f"step {n}"), tool_use("press_key", args)]
                )
            )
        else:
            server.responses_script.append(
                ScriptedTurn(
                    [
                        reasoning(f"thought {n}"),
                        message(f"step {n}"),
                        function_call("press_key", args),
                    ]
                )
            )
    planner = await make(provider, thinking=ThinkingConfig("adaptive"), keep_scenes=2)
    for n in range(steps):
        await planner.decide(f"full scene {n}", condensed=f"page {n}")
        await planner.record_tool_result(f"pressed {n}")
    assert server.rejections == []
    path = "/v1/messages" if provider == "anthropic" else "/v1/responses"
    sizes = [len(json.dumps(b)) for b in server.bodies(path)]
    last = json.dumps(server.bodies(path)[-1])
    assert "full scene 11" in last
    assert "full scene 10" in last
    assert "full scene 0" not in last
    assert "page 0" in last
    # The prompt stays bounded: the last request is far from twelve full scenes' worth of growth.
    assert sizes[-1] < sizes[0] * 8
    if provider == "anthropic":
        messages = _last_messages(server)
        assert messages[-2]["content"][0]["type"] == "thinking"
        assert messages[-2]["content"][0]["thinking"] == "thought 10"


@pytest.mark.parametrize("provider", ["anthropic", "openai-responses"])
async def test_a_rejected_key_is_an_operator_readable_error(
    server: FakeModelServer, db: Path, provider: SessionProvider
) -> None:
    client: anthropic.AsyncAnthropic | openai.AsyncOpenAI
    if provider == "anthropic":
        client = anthropic.AsyncAnthropic(
            api_key=BAD_KEY, base_url=server.anthropic_base_url, max_retries=0
        )
    else:
        client = openai.AsyncOpenAI(api_key=BAD_KEY, base_url=server.openai_base_url, max_retries=0)
    planner = await SessionPlanner.open(
        store=SqliteSessionStore(db),
        task_id="t",
        attempt=1,
        adapter=adapter_for(client, "m", ThinkingConfig()),
        owns_adapter=True,
    )
    label = "Anthropic" if provider == "anthropic" else "OpenAI"
    with pytest.raises(PlannerAuthError, match=f"^planner: {label} rejected the API key$"):
        await planner.decide("screen")
    await planner.aclose()
    assert planner.history == (UserObservation("screen"),)


async def test_interrupted_responses_stream_commits_nothing(
    server: FakeModelServer, make: Factory
) -> None:
    server.responses_script.extend(
        [
            ScriptedTurn([reasoning("cut off"), function_call("complete", {})], interrupt=True),
            ScriptedTurn(
                [reasoning("whole"), function_call("complete", {"success": True, "reason": "r"})]
            ),
        ]
    )
    planner = await make("openai-responses", thinking=ThinkingConfig("adaptive"), stream=True)
    with pytest.raises(PlannerUnavailable, match="stream broke off"):
        await planner.decide("screen 1")
    assert planner.history == (UserObservation("screen 1"),)
    decision = await planner.decide("screen 1 again")
    assert decision.tool_name == "complete"
    assert server.rejections == []


async def test_a_conversation_the_provider_no_longer_accepts_starts_afresh_once(
    server: FakeModelServer, db: Path
) -> None:
    """Signatures made under one key are refused after a key change (as after a model or
    account change). The planner asks once more with earlier reasoning retired; without that,
    every later step and attempt of the task would be refused the same way."""
    server.anthropic_script.append(
        ScriptedTurn(
            [
                thinking("Go home."),
                text("Home."),
                tool_use("press_key", {"key": "home", **INTENT}, id="toolu_home"),
            ]
        )
    )
    # Ids given: the two fakes number their ids alike, where the API's are unique.
    with FakeModelServer(signing_key=b"a different signing key") as rotated:
        rotated.anthropic_script.append(
            ScriptedTurn(
                [
                    thinking("Now tap Display."),
                    text("Tap."),
                    tool_use("tap", {"element_id": "e6", **INTENT}, id="toolu_tap"),
                ]
            )
        )
        first = await Factory(server, db)()
        try:
            await first.decide("screen one", condensed="one")
            await first.record_tool_result('{"ok":true}')
        finally:
            await first.aclose()
        second = await Factory(rotated, db)()
        try:
            decision = await second.decide("screen two", condensed="two")
        finally:
            await second.aclose()

        refused, accepted = rotated.requests
        assert refused.status == 400 and "signature" in (refused.error or "")
        assert accepted.status == 200
        assert decision.tool_name == "tap" and decision.extra["started_afresh"] is True
        sent = accepted.body["messages"]
        earlier = [b for m in sent[:-1] if m["role"] == "assistant" for b in m["content"]]
        assert not [b for b in earlier if b["type"] == "thinking"]  # retired, sent as text
        assert "screen one" not in json.dumps(sent)  # condensed
        assert "screen two" in json.dumps(sent[-1])  # the current screen stays whole


async def test_a_refused_over_limit_answer_is_kept_as_a_note_of_its_length(
    server: FakeModelServer, make: Factory, db: Path
) -> None:
    """An answer whose text to type is over the tool's limit is refused and corrected; the
    session keeps (and sends back) a note of the text's length in its place, as the corrective
    turn says, not the text: kept whole, a megabyte was stored and sent with every later call.
    The pairing the provider checks holds: the call, then its error result."""
    huge = "z" * 1_000_000
    server.anthropic_script.extend(
        [
            ScriptedTurn(
                [thinking("Type it all."), tool_use("input_text", {"text": huge, **INTENT})]
            ),
            ScriptedTurn([thinking("In parts."), tool_use("input_text", {"text": "z", **INTENT})]),
        ]
    )
    planner = await make()
    decision = await planner.decide("a form")
    assert decision.arguments["text"] == "z"
    assert decision.corrective_retries == 1
    assert server.rejections == []
    retry = _last_messages(server)
    assert "z" * 5000 not in json.dumps(retry)
    assert retry[-2]["content"][1]["input"]["text"] == (
        "[1,000,000 characters, over the 4,000 allowed: not kept]"
    )
    assert retry[-1]["content"][0]["is_error"] is True
    assert "is 1,000,000 characters, over the 4,000 allowed" in retry[-1]["content"][0]["content"]
    assert b"z" * 5000 not in _database_bytes(db)
    first = next(i for i in planner.history if isinstance(i, ToolCall))
    assert first.arguments["text"].startswith("[1,000,000 characters")


async def test_a_refused_over_limit_responses_call_is_sent_back_as_a_note(
    server: FakeModelServer, make: Factory, db: Path
) -> None:
    """The same on OpenAI Responses, where the function call goes back as its wire item (its
    arguments a JSON string) right after its reasoning item, then its output."""
    huge = "z" * 1_000_000
    server.responses_script.extend(
        [
            ScriptedTurn(
                [reasoning("Type it all."), function_call("input_text", {"text": huge, **INTENT})]
            ),
            ScriptedTurn(
                [reasoning("In parts."), function_call("input_text", {"text": "z", **INTENT})]
            ),
        ]
    )
    planner = await make("openai-responses", thinking=ThinkingConfig("adaptive", effort="low"))
    decision = await planner.decide("a form")
    assert decision.arguments["text"] == "z"
    assert decision.corrective_retries == 1
    assert server.rejections == []
    sent = server.bodies("/v1/responses")[-1]["input"]
    assert "z" * 5000 not in json.dumps(sent)
    [call] = [i for i in sent if i.get("type") == "function_call"]
    assert json.loads(call["arguments"])["text"] == (
        "[1,000,000 characters, over the 4,000 allowed: not kept]"
    )
    assert b"z" * 5000 not in _database_bytes(db)
