"""What a decision's model calls cost, whatever becomes of the decision: the provider bills every
answered call, so a decision that needed a corrective turn costs both calls, and one that fails
after calls were answered (a refusal, no usable call twice, a provider error after a billed
answer) carries their cost on its error (`PlannerError.billed`) for the spending ledger. Real
Anthropic SDK against the fake Messages server; claude-sonnet-4-6 costs $3 / $15 per million."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from host.outbox import OutboxStore
from host.outbox.calls import OutboxCallLedger
from planner import unsettled
from planner.conversation.items import UserObservation
from planner.decision import Usage
from planner.errors import (
    PlannerError,
    PlannerRefused,
    PlannerUnavailable,
    UnreadableAnswer,
    cut_off_label,
    cut_off_of,
)
from planner.planner import Planner
from planner.prompts import SYSTEM_PROMPT
from planner.settings import PlannerSettings
from planner.tools import TOOLS
from planner.vendors import make_adapter
from planner.vendors.base import TurnRequest
from planner.vendors.observed import ObservedAdapter
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    Reply,
    ScriptedTurn,
    anthropic_error,
    anthropic_message,
    chat_completion,
    function_call,
    openai_tool_call,
    text,
    tool_use,
)

MODEL = "claude-sonnet-4-6"
TAP = {"element_id": "e17", "purpose": "open display", "expected_outcome": "Display opens"}
OFF_SCREEN = {"x": 5000, "y": 10, "purpose": "open display", "expected_outcome": "Display"}


def _planner(server: FakeModelServer, provider: str = "anthropic", model: str = MODEL) -> Planner:
    settings = _settings(server, provider, model)
    return Planner(make_adapter(settings), settings)


def _settings(
    server: FakeModelServer, provider: str = "anthropic", model: str = MODEL
) -> PlannerSettings:
    return PlannerSettings(
        provider=provider,
        anthropic_api_key=ANTHROPIC_KEY,
        anthropic_base_url=server.anthropic_base_url,
        openai_api_key=OPENAI_KEY,
        openai_base_url=server.openai_base_url,
        model=model,
        max_retries=0,
    )


def _costing(*content: dict[str, object], input_tokens: int, output_tokens: int) -> ScriptedTurn:
    return anthropic_message(*content, input_tokens=input_tokens, output_tokens=output_tokens)


async def _fails(server: FakeModelServer, planner: Planner | None = None) -> PlannerError:
    planner = planner or _planner(server)
    try:
        with pytest.raises(PlannerError) as caught:
            await planner.decide("Turn on dark theme", settings_main())
    finally:
        await planner.aclose()
    return caught.value


async def test_a_corrected_decision_costs_both_calls(fake_server: FakeModelServer) -> None:
    fake_server.script_anthropic(
        _costing(tool_use("tap", OFF_SCREEN), input_tokens=500, output_tokens=100),
        _costing(tool_use("tap", TAP), input_tokens=700, output_tokens=50),
    )
    planner = _planner(fake_server)
    try:
        decision = await planner.decide("Turn on dark theme", settings_main())
    finally:
        await planner.aclose()
    assert decision.corrective_retries == 1
    assert (decision.usage.input_tokens, decision.usage.output_tokens) == (1200, 150)
    assert decision.usage.cost_usd == pytest.approx((1200 * 3 + 150 * 15) / 1e6)


async def test_no_usable_call_twice_carries_the_cost_of_every_answered_call(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(
        *[_costing(text("Let me think."), input_tokens=500, output_tokens=100) for _ in range(4)]
    )
    err = await _fails(fake_server)
    assert "unusable tool call twice" in str(err)
    assert len(fake_server.requests) == 4
    assert err.billed is not None
    assert (err.billed.provider, err.billed.model) == ("anthropic", MODEL)
    assert (err.billed.usage.input_tokens, err.billed.usage.output_tokens) == (2000, 400)
    assert err.billed.usage.cost_usd == pytest.approx(0.012)


async def test_a_refusal_carries_the_cost_of_the_refused_answer(
    fake_server: FakeModelServer,
) -> None:
    refused = _costing(text("I can't help with that."), input_tokens=500, output_tokens=100)
    refused.stop_reason = "refusal"
    fake_server.script_anthropic(refused)
    err = await _fails(fake_server)
    assert isinstance(err, PlannerRefused)
    assert err.billed is not None and err.billed.usage.billed_tokens == 600


async def test_a_provider_error_after_a_billed_answer_carries_its_cost(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(
        _costing(text("Let me think."), input_tokens=500, output_tokens=100),
        anthropic_error(500, "api_error", "Internal server error"),
    )
    err = await _fails(fake_server)
    assert isinstance(err, PlannerUnavailable)
    assert err.billed is not None and err.billed.usage.input_tokens == 500


async def test_a_call_refused_before_any_answer_carries_no_cost(
    fake_server: FakeModelServer,
) -> None:
    fake_server.script_anthropic(anthropic_error(500, "api_error", "Internal server error"))
    err = await _fails(fake_server)
    assert isinstance(err, PlannerUnavailable) and err.billed is None


async def test_openai_chat_answers_without_a_call_carry_their_cost(
    fake_server: FakeModelServer,
) -> None:
    """The same on OpenAI's Chat Completions: every answered call's usage, cached input apart
    as the adapter counts it."""
    fake_server.script_openai(
        *[
            chat_completion("Let me think.", prompt_tokens=500, completion_tokens=100,
                            cached_tokens=200, model="gpt-4.1-mini")
            for _ in range(4)
        ]
    )  # fmt: skip
    err = await _fails(fake_server, _planner(fake_server, "openai", "gpt-4.1-mini"))
    assert "unusable tool call twice" in str(err)
    assert len(fake_server.requests) == 4
    assert err.billed is not None
    assert (err.billed.provider, err.billed.model) == ("openai", "gpt-4.1-mini")
    u = err.billed.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.output_tokens) == (1200, 800, 400)
    assert u.cost_usd > 0


async def test_openai_cache_writes_are_priced_once_at_the_write_rate(
    fake_server: FakeModelServer,
) -> None:
    """OpenAI counts the prompt tokens it wrote to the cache (`cache_write_tokens`, billed at
    1.25x input from GPT-5.6 on) inside the input total, as it does the cached ones. Responses
    left them out (priced as plain input: gpt-5.6's spend under-counted), Chat Completions
    added them on top (priced twice, as input and as writes)."""
    fake_server.script_responses(
        ScriptedTurn(
            [function_call("tap", TAP)],
            usage={
                "input_tokens": 18014,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 18011},
                "output_tokens": 20,
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        )
    )
    fake_server.script_openai(
        chat_completion(None, openai_tool_call("tap", TAP), prompt_tokens=2600,
                        cached_tokens=2000, cache_write_tokens=400, model="gpt-4.1-mini")
    )  # fmt: skip
    for model in ("gpt-5.6", "gpt-4.1-mini"):
        planner = _planner(fake_server, "openai", model)
        try:
            decision = await planner.decide("Turn on dark theme", settings_main())
        finally:
            await planner.aclose()
        u = decision.usage
        sent = (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens)
        if model == "gpt-5.6":  # $4 input, $20 output, $5 cache write per million
            assert sent == (3, 0, 18011)
            assert u.cost_usd == pytest.approx((3 * 4.0 + 20 * 20.0 + 18011 * 5.0) / 1e6)
        else:
            assert sent == (200, 2000, 400)


async def test_anthropic_one_hour_cache_writes_are_priced_at_the_one_hour_rate(
    fake_server: FakeModelServer,
) -> None:
    """The Messages reference's Usage breaks the cache writes down by lifetime
    (`cache_creation: {ephemeral_5m_input_tokens, ephemeral_1h_input_tokens}`); the pricing
    page bills a 1-hour write at 2x input, a 5-minute one at 1.25x. Every write was priced at
    the 5-minute rate: 1-hour writes (a proxy's or a workspace's `ttl: "1h"`) under-counted
    by three-eighths. claude-sonnet-4-6: $3 input, $15 output, $3.75 / $6 per million
    written for 5 minutes / 1 hour."""
    usage = {
        "input_tokens": 100,
        "output_tokens": 50,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 3000,
        "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
    }
    fake_server.script_anthropic(
        ScriptedTurn([text("Tapping."), tool_use("tap", TAP)], usage=usage)
    )
    planner = _planner(fake_server)
    try:
        decision = await planner.decide("Turn on dark theme", settings_main())
    finally:
        await planner.aclose()
    u = decision.usage
    assert (u.input_tokens, u.cache_creation_input_tokens, u.output_tokens) == (100, 3000, 50)
    expected = 100 * 3.0 + 50 * 15.0 + 1000 * 3.75 + 2000 * 6.0
    assert u.cost_usd == pytest.approx(expected / 1e6)


async def test_the_call_observer_hears_what_a_broken_stream_reported(
    fake_server: FakeModelServer,
) -> None:
    """The cloud's token and cost metrics hear each call through its observer. A stream the
    provider broke off after message_start (500 input tokens) is counted in the spending ledger
    (StreamCutOff); its observer heard a failed call with no usage, so the metrics' tokens and
    cost fell short of the ledger by that call."""
    fake_server.script_anthropic(
        ScriptedTurn(
            [text("Looking."), tool_use("tap", TAP)],
            usage={
                "input_tokens": 500,
                "output_tokens": 300,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
            fail=("overloaded_error", "Overloaded"),
        )
    )
    adapter = make_adapter(_settings(fake_server))
    assert isinstance(adapter, ObservedAdapter)
    heard: list[tuple[Usage | None, str]] = []

    class Observer:
        def call_finished(
            self,
            provider: str,
            model: str,
            seconds: float,
            usage: Usage | None,
            error: BaseException | None,
        ) -> None:
            heard.append((usage, type(error).__name__))

    adapter.observer = Observer()
    request = TurnRequest(
        system=SYSTEM_PROMPT, items=[UserObservation("Screen: settings")], tools=TOOLS, stream=True
    )
    try:
        with pytest.raises(PlannerUnavailable):
            await adapter.complete(request)
    finally:
        await adapter.aclose()
    ((usage, error),) = heard
    assert error == "PlannerUnavailable"
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (500, 1)
    assert usage.cost_usd == pytest.approx((500 * 3 + 1 * 15) / 1e6)


#: The SDK only warns (pydantic) when it serializes an answer shaped against its types, as a
#: process that does not turn warnings into errors sees it.
_SDK_WARNS = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")


def _with(reply: Reply, **changes: object) -> Reply:
    """A scripted Chat Completion with top-level fields changed (a shape the planner must
    survive: no choices, usage it cannot read)."""
    return Reply(reply.status, {**reply.body, **changes}, reply.headers)


async def _decide_with_markers(
    server: FakeModelServer, tmp_path: Path, model: str = "gpt-4.1-mini"
) -> tuple[PlannerError, OutboxStore, list[str]]:
    """A decision on OpenAI whose model calls are written down first, as a direct host does
    (the real outbox ledger): its error, the outbox and the markers written."""
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    book = OutboxCallLedger(store, "t1", 1, "l1")
    token = unsettled.ledger.set(book)
    try:
        err = await _fails(server, _planner(server, "openai", model))
    finally:
        unsettled.ledger.reset(token)
    return err, store, book.written


@_SDK_WARNS
async def test_an_answer_read_with_a_bug_is_billed_from_its_usage(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """An exception raised after the provider answered (a bug where an adapter reads an answer
    shaped as it did not expect; here a tool call that is no object) was taken for a call never
    sent: its marker was deleted and its cost vanished from every record. It now fails the
    decision as an unreadable answer, billed from the usage the answer reported, the call's
    marker on that usage (settled where it is recorded, not before)."""
    answer = chat_completion(None, prompt_tokens=500, completion_tokens=100, model="gpt-4.1-mini")
    answer.body["choices"][0]["message"]["tool_calls"] = ["not a tool call"]
    fake_server.script_openai(answer)
    err, store, written = await _decide_with_markers(fake_server, tmp_path)
    try:
        assert isinstance(err, UnreadableAnswer), repr(err)
        assert "AttributeError" in str(err)
        assert len(fake_server.requests) == 1
        billed = cut_off_of(err)
        assert billed is not None and cut_off_label(err) == "UnreadableAnswer"
        assert (billed.usage.input_tokens, billed.usage.output_tokens) == (500, 100)
        assert billed.usage.cost_usd > 0
        assert billed.usage.calls == written and len(written) == 1
        assert store.open_calls() == written, "the marker waits for the write that bills it"
    finally:
        store.close()


@pytest.mark.filterwarnings("error:Pydantic serializer warnings:UserWarning")
async def test_an_answer_the_sdk_itself_cannot_read_is_an_unreadable_answer_of_unknown_cost(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """The SDK's own `to_dict()` of an answer failed outside the planner's guard (here: its
    serializer warns of a shape against its types, an error in a process where warnings are):
    the exception escaped as an unexpected one, though the call was answered. It is now an
    unreadable answer; nothing of the answer could be read, so it is a call of unknown cost:
    its marker stays."""
    answer = chat_completion(None, prompt_tokens=500, completion_tokens=100, model="gpt-4.1-mini")
    answer.body["choices"][0]["message"]["tool_calls"] = ["not a tool call"]
    fake_server.script_openai(answer)
    err, store, written = await _decide_with_markers(fake_server, tmp_path)
    try:
        assert isinstance(err, UnreadableAnswer), repr(err)
        assert "UserWarning" in str(err) and "serializer" in str(err)
        assert len(fake_server.requests) == 1
        assert cut_off_of(err) is None and err.billed is None
        assert len(written) == 1 and store.open_calls() == written
    finally:
        store.close()


@_SDK_WARNS
async def test_an_answer_whose_usage_cannot_be_read_is_a_call_of_unknown_cost(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """The same with usage the planner cannot read: nothing says what the call cost, so its
    marker stays (a call of unknown cost, at most its bound) instead of being deleted."""
    answer = chat_completion(None, openai_tool_call("tap", TAP), model="gpt-4.1-mini")
    fake_server.script_openai(_with(answer, usage={"prompt_tokens": "many"}))
    err, store, written = await _decide_with_markers(fake_server, tmp_path)
    try:
        assert isinstance(err, UnreadableAnswer), repr(err)
        assert cut_off_of(err) is None and err.billed is None
        assert len(written) == 1 and store.open_calls() == written
    finally:
        store.close()


async def test_a_chat_completion_without_choices_fails_naming_it_with_its_cost(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """A Chat Completion with `choices: []` (a compatible server, a filter in front of one)
    was read as an answer without a tool call: asked three times more, then failed as "an
    unusable tool call twice", which named nothing of it. It fails at once, saying so, its
    usage billed."""
    answer = chat_completion("x", prompt_tokens=400, completion_tokens=0, model="gpt-4.1-mini")
    fake_server.script_openai(_with(answer, choices=[]))
    err, store, written = await _decide_with_markers(fake_server, tmp_path)
    try:
        assert isinstance(err, UnreadableAnswer), repr(err)
        assert "no choices (choices: [])" in str(err)
        assert len(fake_server.requests) == 1
        billed = cut_off_of(err)
        assert billed is not None and billed.usage.input_tokens == 400
        assert billed.usage.calls == written
    finally:
        store.close()


@_SDK_WARNS
async def test_a_streamed_answer_the_planner_cannot_read_is_billed_from_its_usage(
    fake_server: FakeModelServer,
) -> None:
    """A streamed answer whose events the planner cannot read (here a text delta with no
    text: the accumulator's join fails) was mapped as a failed call ("Anthropic call
    failed"), cut off, though the provider had answered it. Like an answer not streamed that
    cannot be read, it is now an `UnreadableAnswer`, billed from the usage the stream reported
    (input from message_start), counted as that failure, not as a stream cut off."""
    fake_server.script_anthropic(
        _costing({"type": "text", "text": None}, input_tokens=500, output_tokens=100)
    )
    adapter = make_adapter(_settings(fake_server))
    request = TurnRequest(
        system=SYSTEM_PROMPT, items=[UserObservation("Screen: settings")], tools=TOOLS, stream=True
    )
    try:
        with pytest.raises(PlannerError) as caught:
            await adapter.complete(request)
    finally:
        await adapter.aclose()
    err = caught.value
    assert isinstance(err, UnreadableAnswer), repr(err)
    assert "TypeError" in str(err)
    assert len(fake_server.requests) == 1
    billed = cut_off_of(err)
    assert billed is not None and billed.usage.input_tokens == 500
    assert cut_off_label(err) == "UnreadableAnswer"


async def test_a_try_whose_answer_was_lost_keeps_its_marker_when_the_call_is_asked_again(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """A call asked again after a try timed out (the request went out; the provider may answer
    and bill it, nothing reports what it cost) had one marker for all its tries, settled by the
    try that answered: the lost try vanished from every record. Each try now has a marker of
    its own, and the lost one's stays (cost unknown, at most its bound). Real Anthropic SDK,
    streamed; the fake server holds the first answer past the client's timeout, then answers
    the second."""
    held = threading.Event()
    fake_server.script_anthropic(
        ScriptedTurn([tool_use("tap", TAP)], hold=held),
        _costing(tool_use("tap", TAP), input_tokens=500, output_tokens=50),
    )
    settings = _settings(fake_server).model_copy(update={"max_retries": 1, "timeout_s": 1.0})
    adapter = make_adapter(settings)
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    book = OutboxCallLedger(store, "t1", 1, "l1")
    request = TurnRequest(
        system=SYSTEM_PROMPT, items=[UserObservation("Screen: settings")], tools=TOOLS, stream=True
    )
    token = unsettled.ledger.set(book)
    try:
        turn = await adapter.complete(request)
    finally:
        unsettled.ledger.reset(token)
        held.set()
        await adapter.aclose()
    try:
        assert len(fake_server.requests) == 2
        assert turn.usage.input_tokens == 500
        lost, answered = book.written
        assert turn.usage.calls == [answered]  # settled where the decision is recorded
        assert set(store.open_calls()) == {lost, answered}
    finally:
        store.close()


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_a_call_whose_connection_was_refused_leaves_no_marker(
    fake_server: FakeModelServer, tmp_path: Path, provider: str
) -> None:
    """A request whose connection could not be made never reached the provider (decision 0080:
    "a refused connection: not billed"), yet its marker stayed, "cost unknown, at most X",
    on every call made while the provider was unreachable (and, now that each try has its
    own, on each try). Real SDKs pointed at a loopback port nothing listens on, asked once
    more after the first refusal."""
    with socket.socket() as probe:  # a port just free: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    settings = _settings(fake_server, provider, "gpt-4.1-mini" if provider == "openai" else MODEL)
    settings = settings.model_copy(
        update={"anthropic_base_url": closed, "openai_base_url": closed + "/v1", "max_retries": 1}
    )
    adapter = make_adapter(settings)
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    book = OutboxCallLedger(store, "t1", 1, "l1")
    request = TurnRequest(
        system=SYSTEM_PROMPT, items=[UserObservation("Screen: settings")], tools=TOOLS
    )
    token = unsettled.ledger.set(book)
    try:
        with pytest.raises(PlannerUnavailable, match="cannot reach"):
            await adapter.complete(request)
    finally:
        unsettled.ledger.reset(token)
        await adapter.aclose()
    try:
        assert len(book.written) == 1  # one marker for the call: no try was lost
        assert store.open_calls() == []
    finally:
        store.close()
