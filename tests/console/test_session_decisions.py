"""How the console shows a decision made in session mode: the prompt logged for the step is
only what it added to the conversation, and the page and the API say so."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import replace

import httpx

from amc.v1 import types_pb2
from cloud.store import decisions, unsettled
from cloud.store.ports import StoreSessionStore
from planner.conversation.items import (
    AssistantText,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)
from planner.decision import Decision, ResumedFrom, ThinkingBlock, Usage
from planner.history import MASK
from tests.console.console_stack import Cloud, HostFactory, Operator
from tests.console.test_pages import log_in
from tests.support.tracing import memory_exporter


def _decision(mode: str) -> Decision:
    action = types_pb2.Action(purpose="open Display", expected_outcome="Display opens")
    action.tap.element_id = "e6"
    return Decision(
        tool_name="tap",
        arguments={"element_id": "e6"},
        action=action,
        purpose="open Display",
        expected_outcome="Display opens",
        rationale="Settings is open.",
        thinking=[ThinkingBlock("Display is e6.")],
        usage=Usage(input_tokens=100, output_tokens=20),
        provider="anthropic",
        model="claude-test",
        latency_s=1.5,
        forced_retry=False,
        system_prompt="session system prompt",
        user_prompt="Current screen: Settings",
        extra={"mode": mode} if mode == "session" else {},
    )


def test_session_decisions_are_labelled_on_the_page_and_in_the_api(
    anon: httpx.Client, api: httpx.Client, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    host = make_host()
    task = operator.submit("Open Display", host_id=host.host_id)
    a = host.assignment()
    for mode in ("compact", "session"):
        cloud.loop.run(
            decisions.append(
                cloud.server.store, host.host_id, task.task_id, a.attempt, _decision(mode)
            )
        )

    listed = api.get(f"/api/tasks/{task.task_id}/decisions").json()
    assert [d["planner_mode"] for d in listed["decisions"]] == ["compact", "session"]

    log_in(anon, f"/tasks/{task.task_id}")
    page = anon.get(f"/tasks/{task.task_id}").text
    # Each step's prompts are a page of their own, loaded when opened: inline, a task of 600
    # steps made a 5 MB page.
    assert "session system prompt" not in page and "Current screen: Settings" not in page
    compact, session = (
        anon.get(f"/decisions/{d['decision_id']}/prompts") for d in listed["decisions"]
    )
    for d, shown in zip(listed["decisions"], (compact, session), strict=True):
        assert f'href="/decisions/{d["decision_id"]}/prompts"' in page
        assert shown.status_code == 200, shown.text
        assert "session system prompt" in shown.text and "Current screen: Settings" in shown.text
        assert f"/tasks/{task.task_id}#step-{d['decision_id']}" in shown.text  # back to the step
    assert "Observation added" not in compact.text  # the session step, not the compact one
    assert session.text.count("Observation added") == 1
    assert "Session mode: the model saw the whole conversation" in session.text
    assert anon.get("/decisions/no-such-decision/prompts").status_code == 404


def test_the_whole_conversation_of_a_session_attempt_reads_in_order(
    anon: httpx.Client, api: httpx.Client, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    host = make_host()
    task = operator.submit("Type the PIN", host_id=host.host_id)
    a = host.assignment()
    items: list[SessionItem] = [
        UserObservation("Goal: Type the PIN\nCurrent screen: <form>", condensed="form"),
        Reasoning("anthropic", "msg_1", text="The PIN field is e3.", signature="SIG" * 40),
        AssistantText("anthropic", "msg_1", "Type it <now>."),
        ToolCall("anthropic", "msg_1", "toolu_1", "input_text", {"text": MASK, "sensitive": True}),
        ToolResult("toolu_1", '{"ok":true}'),
        Reasoning("anthropic", "msg_2", redacted_data="opaque"),
    ]
    cloud.loop.run(StoreSessionStore(cloud.server.store).append(task.task_id, a.attempt, items))
    cloud.loop.run(
        decisions.append(
            cloud.server.store, host.host_id, task.task_id, a.attempt, _decision("session")
        )
    )

    got = api.get(f"/api/tasks/{task.task_id}/attempts/{a.attempt}/conversation").json()
    assert [i["kind"] for i in got["items"]] == [
        "observation",
        "reasoning",
        "assistant_text",
        "tool_call",
        "tool_result",
        "reasoning",
    ]
    assert got["items"][3]["arguments"] == {"text": MASK, "sensitive": True}
    assert got["items"][5]["redacted"] and not got["items"][5]["text"]
    assert "SIG" not in str(got) and "opaque" not in str(got)
    assert api.get(f"/api/tasks/{task.task_id}/attempts/0/conversation").status_code == 422
    assert api.get("/api/tasks/nope/attempts/1/conversation").status_code == 404

    log_in(anon, f"/tasks/{task.task_id}")
    link = f"/tasks/{task.task_id}/attempts/{a.attempt}/conversation"
    assert link in anon.get(f"/tasks/{task.task_id}").text  # a session attempt links to it
    page = anon.get(link).text
    assert "The PIN field is e3." in page and "Type it &lt;now&gt;." in page  # escaped
    assert "redacted — the provider returned this reasoning encrypted" in page


def test_the_thinking_kind_is_a_word_on_the_page_never_a_blank(
    anon: httpx.Client, api: httpx.Client, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """A signature-only block (Claude Opus 4.7 without summarized display) reads "omitted by
    the provider", not "redacted" and not an empty box; a decision from before the field says
    its kind was not recorded."""
    host = make_host()
    task = operator.submit("Open Display", host_id=host.host_id)
    a = host.assignment()
    omitted = _decision("session")
    omitted.thinking = [ThinkingBlock("")]
    omitted.thinking_kind = "omitted"
    omitted.retry_kind, omitted.forced_retry = "nudge", True
    older = _decision("compact")
    older.thinking_kind = ""  # type: ignore[assignment]  # as a row logged before 0005 reads
    for decision in (omitted, older):
        cloud.loop.run(
            decisions.append(cloud.server.store, host.host_id, task.task_id, a.attempt, decision)
        )
    items: list[SessionItem] = [
        UserObservation("Current screen: Settings"),
        Reasoning("anthropic", "msg_1", text="", signature="SIG" * 10),
    ]
    cloud.loop.run(StoreSessionStore(cloud.server.store).append(task.task_id, a.attempt, items))

    listed = api.get(f"/api/tasks/{task.task_id}/decisions").json()["decisions"]
    assert [d["thinking_kind"] for d in listed] == [
        "thinking omitted by the provider",
        "thinking kind not recorded",
    ]
    assert [d["retry_kind"] for d in listed] == ["nudge", "none"]
    log_in(anon, f"/tasks/{task.task_id}")
    page = anon.get(f"/tasks/{task.task_id}").text
    assert "Thinking · thinking omitted by the provider" in page
    assert "omitted by the provider: it returned no text for this block" in page
    assert "nudged retry" in page and "redacted thinking" not in page
    conversation = api.get(f"/api/tasks/{task.task_id}/attempts/{a.attempt}/conversation")
    reasoning = conversation.json()["items"][1]
    assert (reasoning["omitted"], reasoning["redacted"]) == (True, False)


def test_an_attempt_the_task_never_had_has_no_conversation_page(
    anon: httpx.Client, api: httpx.Client, operator: Operator, make_host: HostFactory
) -> None:
    """Attempt 7 of a task that ran once answered 200 with no items, and its page said the
    attempt "was planned in compact mode, on the direct transport or past the retention"
    (none of which was true: there is no such attempt), as if a mistyped link were a record.
    It is the 404 of any other id the console does not know, naming the attempts there are."""
    host = make_host()
    task = operator.submit("Open the clock", host_id=host.host_id)
    host.assignment()
    assert api.get(f"/api/tasks/{task.task_id}/attempts/1/conversation").status_code == 200
    missing = api.get(f"/api/tasks/{task.task_id}/attempts/7/conversation")
    assert missing.status_code == 404
    assert missing.json()["detail"] == f"task {task.task_id} has no attempt 7 (it has 1)"
    log_in(anon, f"/tasks/{task.task_id}")
    page = anon.get(f"/tasks/{task.task_id}/attempts/7/conversation")
    assert page.status_code == 404
    assert f"task {task.task_id} has no attempt 7 (it has 1)" in page.text
    queued = operator.submit("Wait for a host", host_id="nowhere")
    none = api.get(f"/api/tasks/{queued.task_id}/attempts/1/conversation")
    assert none.status_code == 404
    assert none.json()["detail"] == f"task {queued.task_id} has no attempt 1 (it has none yet)"


def test_the_conversation_endpoint_leaves_the_attempt_check_to_the_cloud(
    api: httpx.Client, operator: Operator, make_host: HostFactory
) -> None:
    """The gateway read the task (GetTask) to refuse an attempt it never had, a check
    GetConversation makes itself with the same words: two places to keep alike, and a second
    call to the cloud for every conversation. The cloud's own NOT_FOUND is the 404 now; the
    cloud runs in this process, so its server spans say which calls the gateway made."""
    host = make_host()
    task = operator.submit("Open the clock", host_id=host.host_id)
    host.assignment()
    spans = memory_exporter()
    missing = api.get(f"/api/tasks/{task.task_id}/attempts/7/conversation")
    assert (missing.status_code, missing.json()["detail"]) == (
        404,
        f"task {task.task_id} has no attempt 7 (it has 1)",
    )
    # The server ends its span after the client has its answer: wait for the span, then look.
    deadline = time.monotonic() + 10
    while True:
        asked = [s.name for s in spans.get_finished_spans() if s.name.startswith("/amc.v1.")]
        if asked or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert asked == ["/amc.v1.DecisionLogService/GetConversation"]


def test_a_step_s_token_count_includes_its_cache_writes(
    anon: httpx.Client, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """A step's "N tokens" left out the tokens written to the prompt cache (billed, at a higher
    rate), while the task's totals and its token budget count them: the steps did not add up
    to the total."""
    host = make_host()
    task = operator.submit("Open Display", host_id=host.host_id)
    a = host.assignment()
    made = replace(
        _decision("compact"),
        usage=Usage(
            input_tokens=100,
            output_tokens=20,
            cache_read_input_tokens=3,
            cache_creation_input_tokens=4000,
        ),
    )
    cloud.loop.run(
        decisions.append(cloud.server.store, host.host_id, task.task_id, a.attempt, made)
    )
    log_in(anon, f"/tasks/{task.task_id}")
    page = anon.get(f"/tasks/{task.task_id}").text
    assert "4,123 tokens · " in page
    # Thousands separated and with their unit, as the task's totals are ("4123 tok" and a
    # bare "4000" beside "Cache write" read as a different kind of number).
    assert "<th>Cache write</th><td>4,000 tokens</td>" in page
    assert "<th>Latency</th><td>1,500 ms</td>" in page


def test_a_call_of_unknown_cost_is_said_on_the_task_page_and_its_attempt(
    anon: httpx.Client, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """A model call a cloud died during (decision 0080) was in GetTask and `amc task show`
    but not on the task page: the totals line that named it is the tasks list's, whose
    listing never carries it, so the page read as fully accounted for."""
    host = make_host()
    task = operator.submit("Open Display", host_id=host.host_id)
    a = host.assignment()
    ledger = unsettled.StoreCallLedger(cloud.server.store, host.host_id, task.task_id, a.attempt)
    bound = Usage(input_tokens=9000, output_tokens=1000, cost_usd=0.042)
    cloud.loop.run(ledger.opened("anthropic", "claude-sonnet-4-6", bound))
    log_in(anon, f"/tasks/{task.task_id}")
    page = anon.get(f"/tasks/{task.task_id}").text
    cost = page.split("<dt>Cost</dt>", 1)[1].split("</dd>", 1)[0]
    assert "1 call of unknown cost (at most $0.0420)" in cost
    card = page.split(f'id="attempt-{a.attempt}"', 1)[1].split("</section>", 1)[0]
    assert "1 call of unknown cost (at most $0.0420)" in card


def test_a_decision_resumed_from_a_kept_answer_says_so_on_the_page_and_in_the_api(
    anon: httpx.Client, api: httpx.Client, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """Two decisions went on from answers an earlier decision kept before it failed on a
    write, one from a provider that sends no turn id; a third asked the model. The API gives
    each resumed one the answer's id and position, the page marks it and says where its
    rationale came from; the third has none. Before, nothing told them apart."""
    host = make_host()
    task = operator.submit("Open Display", host_id=host.host_id)
    a = host.assignment()
    named, unnamed, asked = (_decision("session") for _ in range(3))
    answered = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    named.resumed_from = ResumedFrom("msg_kept_1", 3, answered)
    unnamed.resumed_from = ResumedFrom("", 7)  # its store did not say when
    for decision in (named, unnamed, asked):
        cloud.loop.run(
            decisions.append(cloud.server.store, host.host_id, task.task_id, a.attempt, decision)
        )

    listed = api.get(f"/api/tasks/{task.task_id}/decisions").json()["decisions"]
    shown = [d["resumed_from"] for d in listed]
    assert [(r["turn_id"], r["position"]) if r else None for r in shown] == [
        ("msg_kept_1", 3),
        ("", 7),
        None,
    ]
    assert shown[1]["words"] == ResumedFrom("", 7).words()
    # When the named answer was answered, in the JSON and in the badge's words.
    assert dt.datetime.fromisoformat(shown[0]["answered_at"]) == answered
    assert shown[1]["answered_at"] is None
    assert shown[0]["words"] == ResumedFrom("msg_kept_1", 3, answered).words()
    log_in(anon, f"/tasks/{task.task_id}")
    page = anon.get(f"/tasks/{task.task_id}").text
    assert page.count('data-field="resumed"') == 2
    assert "turn msg_kept_1, at item 3 of the conversation" in page
    assert "counted from 0, answered at 2026-03-04 05:06:07 UTC" in page
    assert "a turn without an id, at item 7 of the conversation" in page
