"""The direct transport in session mode: a model's answer the host's session store kept, whose
decision then failed on a later write, is not paid for twice; one whose decision gave up on it
is not gone on from. Real Anthropic and OpenAI SDKs against the fake servers, the host's real
SQLite session store."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from host.agent.loop import AgentLoop
from host.console.present import step_view
from host.planner_client import DirectPlanner
from host.timeline.record import TimelineRecord
from planner.conversation.items import (
    AssistantItem,
    AssistantText,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
)
from planner.convert import decision_from_proto, decision_to_proto
from planner.deciding import EXTRA_CALL, REJECTED
from planner.decision import MAX_TURN_ID_BYTES, Decision, ResumedFrom, Usage
from planner.errors import PlannerError
from planner.session.planner import NOT_RECORDED, SessionPlanner
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    ScriptedTurn,
    anthropic_message,
    function_call,
    message,
    reasoning,
    text,
    thinking,
    tool_use,
)

INTENT = {"purpose": "open it", "expected_outcome": "it opens"}
GOAL = "Turn on dark theme"
#: The host's disk refuses the write of the "not executed" answer to an extra call. Injected
#: as a trigger in the store's own file: SQLite has no other way to fail one chosen write.
_REFUSE_EXTRA_ANSWER = (
    "CREATE TRIGGER amc_test_refuse BEFORE INSERT ON planner_session_items"
    " WHEN NEW.body LIKE '%Not executed%'"
    " BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
)


@pytest.fixture
def fake_server() -> Iterator[FakeModelServer]:
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY, openai_key=OPENAI_KEY) as server:
        yield server


async def _attempt(
    store: SqliteSessionStore, settings: PlannerSettings, attempt: int
) -> SessionPlanner:
    return await SessionPlanner.open(
        store=store,
        task_id="t1",
        attempt=attempt,
        adapter=make_adapter(settings),
        owns_adapter=True,
    )


def _settings(server: FakeModelServer) -> PlannerSettings:
    return PlannerSettings(
        provider="anthropic",
        anthropic_api_key=ANTHROPIC_KEY,
        anthropic_base_url=server.anthropic_base_url,
        model="claude-sonnet-4-6",
        mode="session",
        max_retries=0,
    )


def _openai_settings(server: FakeModelServer, model: str = "gpt-4.1-mini") -> PlannerSettings:
    """An OpenAI model (a session speaks Responses)."""
    return PlannerSettings(
        provider="openai",
        openai_api_key=OPENAI_KEY,
        openai_base_url=server.openai_base_url,
        model=model,
        mode="session",
        max_retries=0,
    )


def _answer_begins(items: list[SessionItem]) -> int:
    """Where the conversation's first model answer begins (its first item's position)."""
    return next(n for n, i in enumerate(items) if isinstance(i, AssistantItem))


def _host_records(decision: Decision) -> tuple[Decision, str]:
    """What the direct transport keeps of `decision`: the decision the outbox ships, as the
    cloud reads it (`decision_to_proto`, then the cloud's `decision_from_proto`), and the step
    line the host console shows from the timeline record."""
    shipped = decision_from_proto(decision_to_proto(decision))
    record = TimelineRecord(task_id="t1", attempt=2, step_index=1)
    AgentLoop._fill_decision(record, decision)
    loaded = TimelineRecord.from_dict(record.to_dict())  # as the timeline stores it
    return shipped, step_view(loaded).resumed_line


async def _refused_behind_its_answer(
    path: Path, settings: PlannerSettings
) -> tuple[SqliteSessionStore, DirectPlanner]:
    """Attempt 1 of the task, whose first decision fails as the disk refuses the "not
    executed" answer to an extra call, the model's answer kept before it; the disk takes
    writes again after. The store at `path`, and attempt 1's planner (what it spent)."""
    store = SqliteSessionStore(path)
    with sqlite3.connect(path) as conn:
        conn.execute(_REFUSE_EXTRA_ANSWER)
    first = DirectPlanner(await _attempt(store, settings, 1))
    try:
        with pytest.raises(sqlite3.DatabaseError, match="disk I/O error"):
            await first.decide(GOAL, settings_main())
    finally:
        await first.aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER amc_test_refuse")
    return store, first


async def _second_attempt_decides(
    store: SqliteSessionStore, settings: PlannerSettings, spent: Usage | None = None
) -> tuple[Decision, DirectPlanner]:
    """Attempt 2's first decision (the task having spent `spent` before it), and its planner."""
    second = DirectPlanner(await _attempt(store, settings, 2), spent=spent)
    try:
        return await second.decide(GOAL, settings_main()), second
    finally:
        await second.aclose()


async def _gives_up(store: SqliteSessionStore, settings: PlannerSettings) -> None:
    """Attempt 1 of the task: its first decision fails with "unusable tool call twice"."""
    first = DirectPlanner(await _attempt(store, settings, 1))
    try:
        with pytest.raises(PlannerError, match="unusable tool call twice"):
            await first.decide(GOAL, settings_main())
    finally:
        await first.aclose()


async def test_the_next_attempt_goes_on_from_the_kept_answer_of_a_failed_decision(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """The model answered step 1 with two calls (1,000 input tokens, counted by the host as a
    failed decision's), then the disk refused the "not executed" answer to the second: the
    decision failed, and with it the attempt. The next attempt continues the conversation on
    the same screen: its decision is the kept answer's first call, without a model call and
    without counting the answer again. Before, the call was answered "not recorded" and the
    model asked the same question anew (the second scripted answer became the decision)."""
    fake_server.script_anthropic(
        anthropic_message(
            thinking("Display holds the theme."),
            text("Opening Display."),
            tool_use("tap", {"element_id": "e1", **INTENT}),
            tool_use("tap", {"element_id": "e2", **INTENT}),
            input_tokens=1000,
        ),
        anthropic_message(tool_use("press_key", {"key": "back", **INTENT}), input_tokens=2000),
    )
    settings = _settings(fake_server)
    store, first = await _refused_behind_its_answer(tmp_path / "sessions.sqlite3", settings)
    assert first.spent.input_tokens == 1000  # the answer, billed on the error

    decision, second = await _second_attempt_decides(store, settings, spent=first.spent)
    assert len(fake_server.requests) == 1, "the kept answer was asked for again"
    assert decision.tool_name == "tap" and decision.arguments == {"element_id": "e1"}
    assert decision.rationale == "Opening Display."
    assert decision.usage.input_tokens == 0
    assert second.spent.input_tokens == 1000  # once
    items = await store.load("t1", 2)
    kept, extra = [i for i in items if isinstance(i, ToolCall)]
    assert decision.extra["call_id"] == kept.call_id
    assert decision.extra["resumed_turn"] == kept.turn_id
    assert [i for i in items if isinstance(i, ToolResult)] == [
        ToolResult(extra.call_id, EXTRA_CALL, is_error=True)
    ]
    # The record says the rationale came from that earlier answer, on every path it takes.
    begins = _answer_begins(items)
    resumed = ResumedFrom(kept.turn_id, begins, await store.stored_at("t1", 1, begins))
    assert resumed.answered_at is not None
    assert items[resumed.position] == AssistantText("anthropic", kept.turn_id, "Opening Display.")
    assert decision.resumed_from == resumed
    shipped, line = _host_records(decision)
    assert shipped.resumed_from == resumed
    assert line == resumed.words() and kept.turn_id in line


async def test_a_resumed_decision_records_the_prompt_its_kept_answer_was_given_for(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """The decision that goes on from a kept answer records as its user prompt what the model
    was asked when it gave that answer (the step's observation, as the request carried it).
    Before, the prompt was rebuilt from the conversation as it stood after: the "not executed"
    answer to the extra call, written after the answer and never seen by the model before it
    answered, was in it."""
    fake_server.script_anthropic(
        anthropic_message(
            thinking("Display holds the theme."),
            tool_use("tap", {"element_id": "e1", **INTENT}),
            tool_use("tap", {"element_id": "e2", **INTENT}),
        )
    )
    settings = _settings(fake_server)
    store, _ = await _refused_behind_its_answer(tmp_path / "sessions.sqlite3", settings)
    (asked,) = fake_server.bodies("/v1/messages")
    said = asked["messages"][-1]
    assert said["role"] == "user"
    blocks = said["content"]
    sent = blocks if isinstance(blocks, str) else "\n\n".join(b["text"] for b in blocks)

    decision, _ = await _second_attempt_decides(store, settings)
    assert decision.resumed_from is not None
    assert len(fake_server.bodies("/v1/messages")) == 1  # nothing asked again
    assert decision.user_prompt == sent
    assert EXTRA_CALL not in decision.user_prompt
    shipped, _ = _host_records(decision)
    assert shipped.user_prompt == sent


async def test_a_resumed_decision_says_when_its_kept_answer_was_answered(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """The decision that goes on from a kept answer says when that answer was given: when the
    session store kept it in the attempt that asked (not when the next attempt copied the
    conversation), on the decision, as shipped to the cloud and in the host console's words.
    Before, the store kept the time and nobody could read it."""
    fake_server.script_anthropic(
        anthropic_message(
            tool_use("tap", {"element_id": "e1", **INTENT}),
            tool_use("tap", {"element_id": "e2", **INTENT}),
        )
    )
    settings = _settings(fake_server)
    path = tmp_path / "sessions.sqlite3"
    store, _ = await _refused_behind_its_answer(path, settings)
    begins = _answer_begins(await store.load("t1", 1))
    with sqlite3.connect(path) as conn:  # answered long before attempt 2 asks again
        conn.execute(
            "UPDATE planner_session_items SET created_at = '2026-03-04T05:06:07.089Z' "
            "WHERE task_id = 't1' AND attempt = 1 AND seq = ?",
            (begins,),
        )
    answered = dt.datetime(2026, 3, 4, 5, 6, 7, 89_000, tzinfo=dt.UTC)

    decision, _ = await _second_attempt_decides(store, settings)
    assert decision.resumed_from is not None
    assert decision.resumed_from.position == begins
    assert decision.resumed_from.answered_at == answered
    assert await store.stored_at("t1", 2, begins) == answered  # the copy is not the answer
    assert await store.stored_at("t1", 2, 10_000) is None
    shipped, line = _host_records(decision)
    assert shipped.resumed_from == decision.resumed_from
    assert "answered at 2026-03-04 05:06:07 UTC" in line


async def test_a_kept_answers_time_that_cannot_be_read_does_not_fail_the_decision(
    fake_server: FakeModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the store kept the answer is a note in the record. It was read after the decision
    was made: a database away then (why answers are kept at all) failed the decision, and a
    correction call made within it, already paid for, was neither counted nor kept: the step
    was paid for again. Now it is read before any call, and a failed read records "not known"."""
    fake_server.script_anthropic(
        anthropic_message(
            tool_use("tap", {"element_id": "e1", **INTENT}),
            tool_use("tap", {"element_id": "e2", **INTENT}),
        )
    )
    settings = _settings(fake_server)
    store, _ = await _refused_behind_its_answer(tmp_path / "sessions.sqlite3", settings)
    asked = len(fake_server.requests)

    async def locked(*_: object) -> None:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(store, "stored_at", locked)
    decision, _ = await _second_attempt_decides(store, settings)
    assert decision.resumed_from is not None
    assert decision.resumed_from.answered_at is None
    assert len(fake_server.requests) == asked  # gone on from the kept answer, not asked again


async def test_a_kept_answer_cut_off_at_the_output_limit_is_never_run_from_the_record(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """The same failure after an answer the output limit cut off: its calls are kept marked as
    cut off (their arguments may be incomplete, and validate all the same), so the next attempt
    does not run the first one from the record: the model is asked again."""
    fake_server.script_anthropic(
        anthropic_message(
            tool_use("tap", {"element_id": "e1", **INTENT}),
            tool_use("tap", {"element_id": "e2", **INTENT}),
            stop_reason="max_tokens",
        ),
        anthropic_message(tool_use("press_key", {"key": "back", **INTENT})),
    )
    settings = _settings(fake_server)
    store, _ = await _refused_behind_its_answer(tmp_path / "sessions.sqlite3", settings)
    assert all(c.cut_off for c in await store.load("t1", 1) if isinstance(c, ToolCall))

    decision, _ = await _second_attempt_decides(store, settings)
    assert len(fake_server.requests) == 2
    assert decision.tool_name == "press_key"
    assert decision.extra["resumed_turn"] == ""
    assert decision.resumed_from is None
    shipped, line = _host_records(decision)
    assert shipped.resumed_from is None and line == ""


async def test_a_step_whose_decision_gave_up_on_an_unusable_call_asks_the_model_afresh(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """The model's first answer named an element not on screen (corrected), its second one
    too: the decision gave up ("unusable tool call twice") and wrote nothing after the second
    answer. The next attempt asks the model afresh, the unusable call answered "not recorded",
    as before kept answers were gone on from. Before, that answer was taken for one whose
    correction a failed write lost: the decision went on from it and gave up at once, with no
    model call, on this attempt and every later one (each continues the conversation)."""
    fake_server.script_anthropic(
        anthropic_message(tool_use("tap", {"element_id": "e98", **INTENT})),
        anthropic_message(tool_use("tap", {"element_id": "e99", **INTENT})),
        anthropic_message(tool_use("tap", {"element_id": "e1", **INTENT})),
    )
    settings = _settings(fake_server)
    store = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    await _gives_up(store, settings)
    assert len(fake_server.requests) == 2

    decision, _ = await _second_attempt_decides(store, settings)
    assert len(fake_server.requests) == 3, "the model was not asked again"
    assert decision.arguments == {"element_id": "e1"}
    assert decision.corrective_retries == 0 and decision.extra["resumed_turn"] == ""
    assert decision.resumed_from is None
    items = await store.load("t1", 2)
    _, unusable, _ = [i for i in items if isinstance(i, ToolCall)]
    assert ToolResult(unusable.call_id, NOT_RECORDED) in items


async def test_answers_without_a_turn_id_are_not_taken_for_one_answer(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """An OpenAI-compatible server that sends no response id: answered without a call,
    the forced retry without one too (corrected), then an unusable call, and the decision gave
    up. The next attempt asks the model afresh. Before, the three answers, all of turn id "",
    were taken for one answer made before anything else was asked: gone on from as not yet
    corrected, it was corrected a second time (corrective_retries 1, the call "rejected")."""
    fake_server.script_responses(
        ScriptedTurn([message("Looking for Display.")], response_id=""),
        ScriptedTurn([message("Still looking.")], response_id=""),
        ScriptedTurn([function_call("tap", {"element_id": "e99", **INTENT})], response_id=""),
        ScriptedTurn([function_call("tap", {"element_id": "e1", **INTENT})], response_id=""),
    )
    settings = _openai_settings(fake_server)
    store = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    await _gives_up(store, settings)
    assert len(fake_server.requests) == 3

    decision, _ = await _second_attempt_decides(store, settings)
    assert len(fake_server.requests) == 4
    assert decision.arguments == {"element_id": "e1"}
    assert decision.corrective_retries == 0
    items = await store.load("t1", 2)
    unusable, _ = [i for i in items if isinstance(i, ToolCall)]
    results = [i for i in items if isinstance(i, ToolResult)]
    assert results == [ToolResult(unusable.call_id, NOT_RECORDED)]
    assert not any(r.output.startswith(REJECTED) for r in results)


async def test_a_kept_answer_without_a_turn_id_is_still_recorded_as_resumed(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """An OpenAI-compatible server that sends no response id answered step 1 with reasoning
    and two calls; the disk refused the "not executed" answer to the second. The next attempt
    goes on from the kept answer, and its record says so by position (`extra["resumed_turn"]`
    is "" as for a decision that asked the model). Before, nothing marked it: the record of a
    decision that asked the model, its rationale taken for an answer to its own request."""
    fake_server.script_responses(
        ScriptedTurn(
            [
                reasoning("Display."),
                function_call("tap", {"element_id": "e1", **INTENT}),
                function_call("tap", {"element_id": "e2", **INTENT}),
            ],
            response_id="",
        ),
        ScriptedTurn([function_call("press_key", {"key": "back", **INTENT})], response_id=""),
    )
    settings = _openai_settings(fake_server, "gpt-5-mini")
    store, first = await _refused_behind_its_answer(tmp_path / "sessions.sqlite3", settings)
    assert len(fake_server.requests) == 1

    decision, _ = await _second_attempt_decides(store, settings, spent=first.spent)
    assert len(fake_server.requests) == 1, "the kept answer was asked for again"
    assert decision.arguments == {"element_id": "e1"}
    assert decision.extra["resumed_turn"] == ""
    items = await store.load("t1", 2)
    begins = _answer_begins(items)
    assert decision.resumed_from == ResumedFrom("", begins, await store.stored_at("t1", 1, begins))
    shipped, line = _host_records(decision)
    assert shipped.resumed_from == decision.resumed_from
    assert "a turn without an id" in line


async def test_a_kept_answer_is_recorded_with_the_model_that_wrote_it(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """Attempt 1 ran on Claude Sonnet 4.6, whose answer was kept before the disk refused a
    write; the host came back configured for Claude Opus 4.6. The decision that goes on from
    the answer names the model that wrote its rationale and thinking (kept with its
    reasoning). Before, it named the model configured now, which was never asked."""
    fake_server.script_anthropic(
        anthropic_message(
            thinking("Display holds the theme."),
            text("Opening Display."),
            tool_use("tap", {"element_id": "e1", **INTENT}),
            tool_use("tap", {"element_id": "e2", **INTENT}),
        ),
    )
    then = _settings(fake_server).model_copy(update={"thinking": "adaptive"})
    store, _ = await _refused_behind_its_answer(tmp_path / "sessions.sqlite3", then)
    reasoning_kept = [i for i in await store.load("t1", 1) if isinstance(i, Reasoning)]
    assert [r.model for r in reasoning_kept] == ["claude-sonnet-4-6"]
    now = then.model_copy(update={"model": "claude-opus-4-6"})

    decision, _ = await _second_attempt_decides(store, now)
    assert len(fake_server.requests) == 1
    assert decision.resumed_from is not None
    assert (decision.model, decision.provider) == ("claude-sonnet-4-6", "anthropic")


async def test_a_kept_answer_names_its_writer_not_the_provider_or_model_configured_now(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """An answer kept without a model name (OpenAI's reasoning items do not keep one) is
    recorded with its provider and no model when the host came back configured otherwise:
    before, a Claude answer resumed under OpenAI read "openai / claude-sonnet-4-6" (a pair that
    never existed) and an OpenAI answer resumed after gpt-5-mini became gpt-5 named gpt-5,
    which never saw the question."""
    fake_server.script_anthropic(
        anthropic_message(
            thinking("Display holds the theme."),
            text("Opening Display."),
            tool_use("tap", {"element_id": "e1", **INTENT}),
            tool_use("tap", {"element_id": "e2", **INTENT}),
        ),
    )
    then = _settings(fake_server).model_copy(update={"thinking": "adaptive"})
    store, _ = await _refused_behind_its_answer(tmp_path / "claude.sqlite3", then)
    decision, _ = await _second_attempt_decides(store, _openai_settings(fake_server, "gpt-5"))
    assert decision.resumed_from is not None
    assert (decision.provider, decision.model) == ("anthropic", "claude-sonnet-4-6")

    fake_server.script_responses(
        ScriptedTurn(
            [
                reasoning("Display."),
                function_call("tap", {"element_id": "e1", **INTENT}),
                function_call("tap", {"element_id": "e2", **INTENT}),
            ]
        ),
    )
    mini = _openai_settings(fake_server, "gpt-5-mini")
    store, _ = await _refused_behind_its_answer(tmp_path / "gpt.sqlite3", mini)
    decision, _ = await _second_attempt_decides(store, _openai_settings(fake_server, "gpt-5"))
    assert decision.resumed_from is not None
    assert (decision.provider, decision.model) == ("openai", "")


async def test_a_kept_answer_whose_judgement_came_as_thinking_keeps_it_as_the_rationale(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """Claude Opus 5.5 (its profile's `text_as_thinking`) writes its judgement as the last
    thinking block before the call; a decision made on the answer's arrival records it as the
    rationale. The decision that goes on from the same answer, kept, does too. Before, the
    rebuilt answer lost where that text was: no rationale, and the judgement read as thinking."""
    fake_server.script_anthropic(
        anthropic_message(
            thinking("Display holds the theme."),
            thinking("Opening Display."),
            tool_use("tap", {"element_id": "e1", **INTENT}),
            tool_use("tap", {"element_id": "e2", **INTENT}),
        )
    )
    settings = _settings(fake_server).model_copy(
        update={"model": "claude-opus-5-5", "thinking": "adaptive"}
    )
    store, _ = await _refused_behind_its_answer(tmp_path / "sessions.sqlite3", settings)
    decision, _ = await _second_attempt_decides(store, settings)
    assert decision.resumed_from is not None
    assert decision.rationale == "Opening Display."
    assert [b.text for b in decision.thinking] == ["Display holds the theme."]


def test_an_overlong_turn_id_is_cut_so_the_cloud_takes_the_decision() -> None:
    """The cloud refuses a turn id past 256 bytes (a whole decision lost over its annotation);
    the host cuts it, on a character boundary."""
    mark = ResumedFrom.of("é" * 200, 7)
    assert len(mark.turn_id.encode("utf-8")) <= MAX_TURN_ID_BYTES
    assert mark.turn_id == "é" * 128 and mark.position == 7


async def test_a_kept_answer_with_the_model_s_own_reasoning_text_records_full_thinking(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """An OpenAI reasoning model answered step 1 with its reasoning text (not a summary) and
    two calls, kept before the disk refused a write. The decision that goes on from it records
    that thinking as the model's own ("full"), as a decision made on its arrival would. Before,
    the rebuilt answer read "summarized": it lost what its reasoning text was."""
    fake_server.script_responses(
        ScriptedTurn(
            [
                reasoning("Display.", content=("Display holds the theme.",)),
                function_call("tap", {"element_id": "e1", **INTENT}),
                function_call("tap", {"element_id": "e2", **INTENT}),
            ]
        ),
    )
    settings = _openai_settings(fake_server, "gpt-5-mini")
    store, _ = await _refused_behind_its_answer(tmp_path / "sessions.sqlite3", settings)

    decision, _ = await _second_attempt_decides(store, settings)
    assert len(fake_server.requests) == 1
    assert decision.resumed_from is not None
    assert [b.text for b in decision.thinking] == ["Display holds the theme."]
    assert decision.thinking_kind == "full"
