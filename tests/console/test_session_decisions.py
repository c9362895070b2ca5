"""How the console shows a decision made in session mode: the prompt logged for the step is
only what it added to the conversation, and the page and the API say so."""

from __future__ import annotations

import httpx

from amc.v1 import types_pb2
from cloud.store import decisions
from planner.decision import Decision, ThinkingBlock, Usage
from tests.console.console_stack import Cloud, HostFactory, Operator
from tests.console.test_pages import log_in


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
    assert page.count("Observation added") == 1  # the session step, not the compact one
    assert "Session mode: the model saw the whole conversation" in page
