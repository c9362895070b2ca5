"""A long task's page shows its newest steps, its earlier ones are pages of their own.

The task page rendered every decision (up to 5,000) of every attempt: 600 steps made a page of
megabytes that took more than a second. It now shows each attempt's newest 50 steps with a
link to the earlier ones, read from the cloud one page of the decision log at a time (after a
step index); the verdict counts stay the whole attempt's. Proves it against a real cloud and
the real gateway.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from markupsafe import escape

from amc.v1 import types_pb2
from cloud.store import decisions
from console.gateway import create_app
from console.gateway.pages import SHOWN_STEPS
from console.settings import ConsoleSettings
from planner.decision import Decision, Usage
from tests.console.console_stack import Cloud, HostFactory, Operator, UvicornThread
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


class CountedDecisions:
    """The gateway's own ListDecisions call on its channel to the cloud, counting the
    decisions the cloud answered (a spy: every call goes to the real cloud)."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.decisions = 0

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        async def counted() -> Any:
            response = await self.call(request, **kwargs)
            self.decisions += len(response.decisions)
            return response

        return counted()


def test_a_long_task_page_reads_only_the_steps_it_shows(
    console_settings: ConsoleSettings, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """The page showed the newest 50 steps but the gateway read the attempt's whole log from
    the cloud (up to 5,000 decisions with their prompts) on every view: now one page of it,
    newest first, and the counts from the cloud's own (whole attempt's)."""
    host = make_host()
    task = operator.submit("Open Display, one page at a time", host_id=host.host_id)
    a = host.assignment()
    store = cloud.server.store
    verdicts = {
        1: types_pb2.VERDICT_MET,
        2: types_pb2.VERDICT_NOT_MET,
        STEPS: types_pb2.VERDICT_MET,
    }
    for step in range(1, STEPS + 1):
        row = cloud.loop.run(
            decisions.append(store, host.host_id, task.task_id, a.attempt, _decision(step))
        )
        if step in verdicts:
            outcome = types_pb2.ActionOutcome(
                step_index=step, executed=True, verdict=verdicts[step], evidence="seen"
            )
            assert cloud.loop.run(decisions.record_outcome_of(store, row.decision_id, outcome))

    app = create_app(console_settings)
    server = UvicornThread(app)
    base = server.start()
    try:
        stub = app.state.cloud._decisions
        spy = stub.ListDecisions = CountedDecisions(stub.ListDecisions)
        with httpx.Client(base_url=base, timeout=20) as client:
            log_in(client, f"/tasks/{task.task_id}")
            page = client.get(f"/tasks/{task.task_id}")
    finally:
        server.stop()
    assert page.status_code == 200, page.text
    hidden = STEPS - SHOWN_STEPS
    assert _steps(page.text) == list(range(hidden + 1, STEPS + 1))
    assert spy.decisions <= SHOWN_STEPS  # read 62 before
    # The whole attempt's counts; what live.js adds are the earlier steps' (1 met, 1 not met).
    assert "2 met<" in page.text and "1 not met<" in page.text
    assert f"{STEPS - 3} not checked yet" in page.text
    earlier = {"met": 1, "not met": 1, "unknown": 0, "unchecked": hidden - 2}
    assert str(escape(json.dumps(earlier, sort_keys=True))) in page.text
    assert f"{hidden} earlier steps" in page.text
    assert f"steps?through={hidden}" in page.text
