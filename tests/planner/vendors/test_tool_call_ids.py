"""Tool calls are paired with their arguments by position, and an answer whose calls the
next request could not each answer (two sharing an id; on Anthropic, one without an id) fails
the decision as `UnreadableAnswer`, billed, before anything of it runs or is kept.

The arguments used to be looked up by id in a dict keyed by id: with two calls sharing an id
the second call's arguments ran under the first call's name (tap e14, then tap e3: the phone
tapped e3), and in session mode the next request answered both calls with one tool_result
("not executed"), so the model believed nothing ran. Real SDKs against the fakes, for each
wire format the planner speaks: Anthropic Messages, OpenAI Chat Completions, OpenAI Responses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from planner import deciding
from planner.conversation.items import SessionItem, ToolResult, UserObservation
from planner.errors import UnreadableAnswer
from planner.planner import Planner, PromptConversation
from planner.session.config import SessionConfig
from planner.session.planner import SessionPlanner
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
from planner.vendors.anthropic import AnthropicAdapter
from planner.vendors.openai import OpenAIAdapter
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    ScriptedTurn,
    chat_completion,
    function_call,
    openai_tool_call,
    tool_use,
)

INTENT = {"purpose": "open it", "expected_outcome": "it opens"}
FIRST = {"element_id": "e14", **INTENT}
SECOND = {"element_id": "e3", **INTENT}
#: provider, model (its wire format), the calls both sharing one id
WIRES = {
    "messages": ("anthropic", "claude-sonnet-4-6"),
    "chat": ("openai", "gpt-4.1-mini"),
    "responses": ("openai", "gpt-5"),
}


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


def _script(server: FakeModelServer, wire: str, first: str, second: str) -> None:
    """One answer with two taps, FIRST then SECOND, whose ids are `first` and `second`."""
    if wire == "messages":
        server.script_anthropic(
            ScriptedTurn([tool_use("tap", FIRST, id=first), tool_use("tap", SECOND, id=second)])
        )
    elif wire == "chat":
        server.script_openai(
            chat_completion(
                None,
                openai_tool_call("tap", FIRST, id=first),
                openai_tool_call("tap", SECOND, id=second),
            )
        )
    else:
        server.script_responses(
            ScriptedTurn(
                [
                    function_call("tap", FIRST, call_id=first),
                    function_call("tap", SECOND, call_id=second),
                ]
            )
        )


@pytest.mark.parametrize("wire", list(WIRES))
async def test_two_calls_sharing_an_id_are_refused_before_anything_runs(
    fake_server: FakeModelServer, wire: str
) -> None:
    shared = {"messages": "toolu_X", "chat": "", "responses": "call_X"}[wire]
    _script(fake_server, wire, shared, shared)
    with pytest.raises(UnreadableAnswer) as info:
        await _decide(_compact(fake_server, *WIRES[wire]))
    err = info.value
    assert f"call ids [{shared!r}] each name more than one call" in str(err)
    assert err.billed is not None and err.billed.usage.output_tokens > 0
    assert len(fake_server.requests) == 1 and fake_server.pending == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_two_responses_calls_sharing_an_item_id_are_refused_before_anything_runs(
    fake_server: FakeModelServer, tmp_path: Path, stream: bool
) -> None:
    """Distinct call ids, one output item id: the next request sends both items back with it
    and the API refuses that request whole ("Duplicate item found with id fc_X."). It used to
    be kept and run: the tap ran, then the next step's request (a session's; here streamed) or
    a corrective turn (compact) was refused."""
    fake_server.script_responses(
        ScriptedTurn(
            [
                function_call("tap", FIRST, call_id="call_A", item_id="fc_X"),
                function_call("tap", SECOND, call_id="call_B", item_id="fc_X"),
            ]
        )
    )
    if stream:
        client = openai.AsyncOpenAI(
            api_key=OPENAI_KEY, base_url=fake_server.openai_base_url, max_retries=0
        )
        planner = await SessionPlanner.open(
            store=SqliteSessionStore(tmp_path / "s.sqlite"),
            task_id="t1",
            attempt=1,
            adapter=OpenAIAdapter(client, model="gpt-5"),
            owns_adapter=True,
            config=SessionConfig(stream=True),
        )
        try:
            with pytest.raises(UnreadableAnswer) as info:
                await planner.decide("screen 1")
            assert [type(i) for i in planner.history] == [UserObservation]
        finally:
            await planner.aclose()
    else:
        with pytest.raises(UnreadableAnswer) as info:
            await _decide(_compact(fake_server, *WIRES["responses"]))
    err = info.value
    assert "output item ids ['fc_X'] each name more than one item" in str(err)
    assert err.billed is not None and err.billed.usage.output_tokens > 0
    assert len(fake_server.requests) == 1 and fake_server.pending == 0


@pytest.mark.parametrize("wire", list(WIRES))
async def test_the_first_call_runs_with_its_own_arguments(
    fake_server: FakeModelServer, wire: str
) -> None:
    """Distinct ids (one of them empty where the API allows it: an OpenAI-compatible server
    may send one call without an id, and that server pairs its result): the first call, with
    its own arguments."""
    first = "" if wire != "messages" else "toolu_A"
    _script(fake_server, wire, first, "call_B" if wire != "messages" else "toolu_B")
    decision = await _decide(_compact(fake_server, *WIRES[wire]))
    assert (decision.tool_name, decision.arguments["element_id"]) == ("tap", "e14")


async def test_an_anthropic_tool_use_without_an_id_is_refused(
    fake_server: FakeModelServer,
) -> None:
    """Its tool_result (the next step's, or a correction) must name a tool_use id."""
    fake_server.script_anthropic(ScriptedTurn([tool_use("tap", FIRST, id="")]))
    with pytest.raises(UnreadableAnswer, match="a tool_use block without an id"):
        await _decide(_compact(fake_server, *WIRES["messages"]))
    assert len(fake_server.requests) == 1


async def test_a_session_keeps_nothing_of_an_answer_whose_calls_share_an_id(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """It used to be kept: the next request sent both tool_use blocks and one tool_result,
    "Not executed", for the id both share, while the second call's tap had run."""
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
    )
    adapter = AnthropicAdapter(client, model="claude-sonnet-4-6")
    _script(fake_server, "messages", "toolu_X", "toolu_X")
    planner = await SessionPlanner.open(
        store=SqliteSessionStore(tmp_path / "s.sqlite"),
        task_id="t1",
        attempt=1,
        adapter=adapter,
        owns_adapter=True,
        config=SessionConfig(stream=True),
    )
    try:
        with pytest.raises(UnreadableAnswer, match="toolu_X") as info:
            await planner.decide("screen 1")
        assert [type(i) for i in planner.history] == [UserObservation]
    finally:
        await planner.aclose()
    assert info.value.billed is not None


class _StrayResult(PromptConversation):
    """A compact conversation whose correction also carries a tool result naming no call: a
    history the projection refuses (`SessionHistoryError`), as two results for one shared id
    once did. Stands for any such bug in whoever builds the history."""

    async def add(self, items: Sequence[SessionItem]) -> None:
        await super().add([*items, ToolResult("call_nowhere", "stray")])


@pytest.mark.parametrize("wire", ["messages", "responses"])
async def test_a_history_the_projection_refuses_fails_the_decision_billed(
    fake_server: FakeModelServer, wire: str
) -> None:
    """A plain ValueError used to escape the decision: the answer before it was billed on
    nothing (the Decide service counts a failed decision's calls from its planner error), and
    the cloud's Decide answered INTERNAL "retry later" instead of a planner error."""
    bad = {"element_id": "e99", **INTENT}  # no such element: the corrective turn follows
    if wire == "messages":
        fake_server.script_anthropic(ScriptedTurn([tool_use("tap", bad)]))
    else:
        fake_server.script_responses(ScriptedTurn([function_call("tap", bad)]))
    planner = _compact(fake_server, *WIRES[wire])
    try:
        with pytest.raises(UnreadableAnswer, match="cannot be sent back") as info:
            await deciding.decide(
                planner.provider,
                _StrayResult("system", "Turn on dark theme", None),
                system_prompt="system",
                user_prompt="Turn on dark theme",
                element_ids=[e.element_id for e in settings_main().elements],
            )
    finally:
        await planner.aclose()
    assert info.value.billed is not None and info.value.billed.usage.output_tokens > 0
    assert len(fake_server.requests) == 1  # the corrective request was never sent


def _session_adapter(server: FakeModelServer, wire: str) -> Any:
    provider, model = WIRES[wire]
    settings = PlannerSettings(
        provider=provider,
        anthropic_api_key=ANTHROPIC_KEY,
        openai_api_key=OPENAI_KEY,
        anthropic_base_url=server.anthropic_base_url,
        openai_base_url=server.openai_base_url,
        model=model,
        max_retries=0,
    )
    return make_adapter(settings)


def _script_one(server: FakeModelServer, wire: str, call_id: str) -> None:
    """One answer with one tap on e14, under `call_id`."""
    if wire == "messages":
        server.script_anthropic(ScriptedTurn([tool_use("tap", FIRST, id=call_id)]))
    else:
        server.script_responses(ScriptedTurn([function_call("tap", FIRST, call_id=call_id)]))


@pytest.mark.parametrize("wire", ["messages", "responses"])
async def test_a_session_keeps_nothing_of_an_answer_reusing_an_earlier_calls_id(
    fake_server: FakeModelServer, tmp_path: Path, wire: str
) -> None:
    """A proxy that numbers calls per answer sends a later call under an earlier call's id.
    Such an answer used to be kept and run: every later request carried two calls with one
    id, which Anthropic refuses whole ("messages.3.content.0: `tool_use` ids must be
    unique"; the session then started afresh at every step, or failed with thinking off) and
    a Responses `function_call_output` answers either call. Now it is refused before it runs
    or is kept, billed, and the conversation goes on unharmed when the step is asked again."""
    reused = {"messages": "toolu_R", "responses": "call_R"}[wire]
    planner = await SessionPlanner.open(
        store=SqliteSessionStore(tmp_path / "s.sqlite"),
        task_id="t1",
        attempt=1,
        adapter=_session_adapter(fake_server, wire),
        owns_adapter=True,
    )
    try:
        _script_one(fake_server, wire, reused)
        await planner.decide("screen 1")
        await planner.record_tool_result("tapped e14")
        kept = planner.history
        _script_one(fake_server, wire, reused)
        with pytest.raises(
            UnreadableAnswer, match=rf"already have \(call ids \['{reused}'\]\)"
        ) as info:
            await planner.decide("screen 2")
        assert info.value.billed is not None and info.value.billed.usage.output_tokens > 0
        assert planner.history[: len(kept)] == kept
        assert [type(i) for i in planner.history[len(kept) :]] == [UserObservation]
        # Asked again, an answer under a new id is taken; its request holds one call per id.
        _script_one(fake_server, wire, reused + "2")
        decision = await planner.decide("screen 2")
        await planner.record_tool_result("tapped e14 again")
        _script_one(fake_server, wire, reused + "3")
        await planner.decide("screen 3")
    finally:
        await planner.aclose()
    assert decision.extra["call_id"] == reused + "2"
    assert fake_server.rejections == [] and fake_server.pending == 0


#: A tool call id of an Anthropic-compatible server or proxy (OpenAI-style function ids some
#: servers pass through), outside the ids the API takes back (`^[a-zA-Z0-9_-]+$`).
FOREIGN_ID = "functions.tap:0"


async def test_a_call_id_anthropic_would_refuse_goes_back_in_a_form_it_takes(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """Kept as received, such an id was sent back as it was, and the API refused every later
    request of the session ("messages.1.content.0.tool_use.id: String should match pattern
    '^[a-zA-Z0-9_-]+$'"): started afresh, still refused (without thinking the call goes back
    as a tool_use all the same), the step failed, and so did every later one."""
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
    )
    planner = await SessionPlanner.open(
        store=SqliteSessionStore(tmp_path / "s.sqlite"),
        task_id="t1",
        attempt=1,
        adapter=AnthropicAdapter(client, model="claude-sonnet-4-6"),
        owns_adapter=True,
    )
    try:
        fake_server.script_anthropic(ScriptedTurn([tool_use("tap", FIRST, id=FOREIGN_ID)]))
        first = await planner.decide("screen 1")
        await planner.record_tool_result("tapped e14")
        fake_server.script_anthropic(ScriptedTurn([tool_use("tap", SECOND, id="functions.tap:1")]))
        await planner.decide("screen 2")
    finally:
        await planner.aclose()
    assert first.extra["call_id"] == FOREIGN_ID  # the conversation keeps the id as received
    assert fake_server.rejections == [] and fake_server.pending == 0
    sent = fake_server.bodies("/messages")[-1]["messages"]
    use, result = sent[1]["content"][0], sent[2]["content"][0]
    assert use["id"] == result["tool_use_id"] != FOREIGN_ID


async def test_a_corrected_call_under_such_an_id_is_answered(
    fake_server: FakeModelServer,
) -> None:
    """Compact mode sends a call back only to correct it: that request was refused, and the
    decision failed where the model would have fixed its call."""
    bad = {"element_id": "e99", **INTENT}  # not on screen: corrected
    fake_server.script_anthropic(ScriptedTurn([tool_use("tap", bad, id=FOREIGN_ID)]))
    fake_server.script_anthropic(ScriptedTurn([tool_use("tap", FIRST, id="functions.tap:1")]))
    decision = await _decide(_compact(fake_server, *WIRES["messages"]))
    assert (decision.tool_name, decision.arguments["element_id"]) == ("tap", "e14")
    assert fake_server.rejections == []


async def test_a_session_keeps_nothing_of_a_responses_answer_reusing_an_item_id(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """A proxy may repeat the output items' ids (`fc_…`) under fresh call ids. Stateless, every
    earlier item goes back with its id, and the API refuses a request holding two items of one
    id ("Duplicate item found with id fc_R."): every later step of the session was refused, and
    starting afresh changed nothing (an item keeps its id unless reasoning before it is left
    out). Now such an answer is refused before it runs or is kept, billed."""
    planner = await SessionPlanner.open(
        store=SqliteSessionStore(tmp_path / "s.sqlite"),
        task_id="t1",
        attempt=1,
        adapter=_session_adapter(fake_server, "responses"),
        owns_adapter=True,
    )
    try:
        fake_server.script_responses(ScriptedTurn([function_call("tap", FIRST, item_id="fc_R")]))
        await planner.decide("screen 1")
        await planner.record_tool_result("tapped e14")
        kept = planner.history
        fake_server.script_responses(ScriptedTurn([function_call("tap", FIRST, item_id="fc_R")]))
        with pytest.raises(UnreadableAnswer, match=r"already have \(item ids \['fc_R'\]\)") as info:
            await planner.decide("screen 2")
        assert info.value.billed is not None and info.value.billed.usage.output_tokens > 0
        assert planner.history[: len(kept)] == kept
        fake_server.script_responses(ScriptedTurn([function_call("tap", FIRST, item_id="fc_S")]))
        await planner.decide("screen 2")
        await planner.record_tool_result("tapped e14 again")
        fake_server.script_responses(ScriptedTurn([function_call("tap", FIRST)]))
        await planner.decide("screen 3")
    finally:
        await planner.aclose()
    assert fake_server.rejections == [] and fake_server.pending == 0


# The SDK warns as it serializes an input that is no object; a warning is no error outside
# tests, where the answer is read all the same.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
async def test_an_anthropic_call_whose_input_is_no_object_is_corrected_not_run(
    fake_server: FakeModelServer,
) -> None:
    """The API's tool_use `input` is an object; a proxy may put the arguments' JSON text there.
    Parsed as OpenAI's arguments string is, it ran (tap e14), while the call kept and sent
    back had no arguments (`input: {}`): what the model is shown is not what ran. It is now
    refused as arguments that are no object, and corrected."""
    fake_server.script_anthropic(ScriptedTurn([tool_use("tap", json.dumps(FIRST))]))  # type: ignore[arg-type]
    fake_server.script_anthropic(ScriptedTurn([tool_use("tap", SECOND)]))
    decision = await _decide(_compact(fake_server, *WIRES["messages"]))
    assert (decision.arguments["element_id"], decision.corrective_retries) == ("e3", 1)
    correction = fake_server.bodies("/messages")[-1]["messages"][-1]["content"][0]
    assert "arguments must be a JSON object" in correction["content"]


# The SDK warns as it serializes arguments that are no string (see above).
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
async def test_openai_arguments_sent_as_an_object_go_back_as_their_json(
    fake_server: FakeModelServer,
) -> None:
    """An OpenAI-compatible server may send a call's `arguments` as the object itself, not its
    JSON text. The call was parsed from the object, but kept as its Python repr ("{'element_id':
    'e99', …}"), which the corrective turn sent back as the call's arguments: no JSON, which
    compatible servers refuse, and not what the model wrote."""
    bad = {"element_id": "e99", **INTENT}  # not on screen: corrected
    call = openai_tool_call("tap", "")
    call["function"]["arguments"] = bad
    fake_server.script_openai(chat_completion(None, call))
    fake_server.script_openai(chat_completion(None, openai_tool_call("tap", FIRST)))
    decision = await _decide(_compact(fake_server, *WIRES["chat"]))
    assert (decision.arguments["element_id"], decision.corrective_retries) == ("e14", 1)
    sent = fake_server.bodies("/chat/completions")[-1]["messages"]
    (assistant,) = [m for m in sent if m["role"] == "assistant"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == bad
