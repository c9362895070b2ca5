"""A long task's page shows its newest steps, its earlier ones are pages of their own.

The task page rendered every decision (up to 5,000) of every attempt: 600 steps made a page of
megabytes that took more than a second. It now shows each attempt's newest 50 steps with a
link to the earlier ones, read from the cloud one page of the decision log at a time (after a
step index); the verdict counts stay the whole attempt's. Proves it against a real cloud and
the real gateway.
"""

from __future__ import annotations

import re

import httpx

from amc.v1 import types_pb2
from cloud.store import decisions
from console.gateway.pages import SHOWN_STEPS
from planner.decision import Decision, Usage
from tests.console.console_stack import Cloud, HostFactory, Operator
from tests.console.test_pages import log_in

STEPS = SHOWN_STEPS + 12


def _decision(step: int) -> Decision:
    action = types_pb2.Action(purpose=f"purpose of step {step}", expected_outcome="it opens")
    action.tap.element_id = "e6"
    return Decision(
        tool_name="tap",
        arguments={"element_id": "e6"},
        action=action,
        purpose=f"purpose of step {step}",
        expected_outcome="it opens",
        rationale="Settings is open.",
        thinking=[],
        usage=Usage(input_tokens=10, output_tokens=2),
        provider="anthropic",
        model="claude-test",
        latency_s=0.1,
        forced_retry=False,
        system_prompt="s",
        user_prompt="u",
    )


def _steps(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'<details class="step"[^>]* data-step="(\d+)"', html)]


def test_a_long_task_shows_its_newest_steps_and_pages_to_the_earlier_ones(
    anon: httpx.Client, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    host = make_host()
    task = operator.submit("Open Display, slowly", host_id=host.host_id)
    a = host.assignment()
    for step in range(1, STEPS + 1):
        cloud.loop.run(
            decisions.append(
                cloud.server.store, host.host_id, task.task_id, a.attempt, _decision(step)
            )
        )

    log_in(anon, f"/tasks/{task.task_id}")
    page = anon.get(f"/tasks/{task.task_id}").text
    hidden = STEPS - SHOWN_STEPS
    assert _steps(page) == list(range(hidden + 1, STEPS + 1))  # the newest, oldest first
    # Counted over the whole attempt (none checked: no outcome was reported).
    assert f"{STEPS} not checked yet" in page
    assert "&#34;unchecked&#34;: " + str(hidden) in page  # what live.js adds to its recount
    earlier = f"/tasks/{task.task_id}/attempts/{a.attempt}/steps?through={hidden}"
    assert f'href="{earlier}"' in page and f"{hidden} earlier steps" in page

    older = anon.get(earlier)
    assert older.status_code == 200, older.text
    assert _steps(older.text) == list(range(1, hidden + 1))
    assert "purpose of step 1<" in older.text
    assert "earlier steps" not in older.text  # the first page of the attempt
    window = anon.get(f"/tasks/{task.task_id}/attempts/{a.attempt}/steps", params={"through": 60})
    assert _steps(window.text) == list(range(60 - SHOWN_STEPS + 1, 61))
    assert f"steps?through={60 - SHOWN_STEPS}" in window.text  # and before them

    steps = f"/tasks/{task.task_id}/attempts/{a.attempt}/steps"
    assert anon.get(steps, params={"through": 0}).status_code == 422
    assert anon.get("/tasks/no-such-task/attempts/1/steps?through=5").status_code == 404
