"""The operators' console in Chromium, for issue 19: live updates patch the page in place
(keyboard focus kept, status changes announced to screen readers), the attempt history with
the live lease counting down, totals, a progress line that never contradicts the status, the
fleet's busy and idle phones, submit warnings, phones 390 px wide, and no CSP violation.

Hosts are simulated over the real LeaseService against the real cloud, so every change the
page shows came through WatchProgress / WatchHosts → server-sent events → live.js.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC
from pathlib import Path

import httpx
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from playwright.sync_api import (
    APIResponse,
    Browser,
    Locator,
    Page,
    Playwright,
    Route,
    ViewportSize,
    expect,
    sync_playwright,
)

from amc.v1 import decision_log_service_pb2, task_service_pb2, types_pb2
from cloud.store import decisions
from console.gateway import create_app
from console.settings import ConsoleSettings
from planner.decision import Decision, ThinkingBlock, Usage
from tests.cloud.test_shipping import failed_calls, unsettled_call
from tests.console.console_stack import (
    ADMIN,
    PASSWORD,
    WHOLE_FLEET,
    Cloud,
    HostFactory,
    Operator,
    UvicornThread,
    cloud_of_its_own,
    fail_after_first_change,
)
from tests.support.browser import PageReport, open_browser, overflow_x
from tests.support.flows import store_flow
from tests.support.tcp_proxy import TcpProxy
from webui.errors import UNEXPECTED

pytestmark = pytest.mark.browser

#: Generous upper bound for a live update to show (a bound, not a timing assertion).
LIVE_MS = 10_000
PHONE: ViewportSize = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    yield from open_browser(playwright)


def log_in(page: Page, gateway: str, path: str = "/tasks") -> None:
    page.goto(gateway + "/login?next=" + path)
    page.fill("input[name=username]", ADMIN)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(re.escape(gateway + path) + "$"))


@pytest.fixture
def report(browser: Browser, gateway: str) -> Iterator[PageReport]:
    """A logged-in page (1280 px wide) whose CSP violations and console errors are recorded."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    watched = PageReport(context.new_page())
    log_in(watched.page, gateway)
    try:
        yield watched
    finally:
        context.close()


@pytest.fixture
def phone(browser: Browser, gateway: str) -> Iterator[PageReport]:
    """A logged-in page 390 px wide (a phone held upright)."""
    context = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True)
    watched = PageReport(context.new_page())
    log_in(watched.page, gateway)
    try:
        yield watched
    finally:
        context.close()


def unique(goal: str) -> str:
    return f"{goal} {uuid.uuid4().hex[:8]}"


def screenshot(page: Page, name: str) -> None:
    """Save a full-page screenshot when AMC_TEST_SCREENSHOTS names a folder (for eyeballing)."""
    folder = os.environ.get("AMC_TEST_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def mark_no_reload(page: Page) -> None:
    page.evaluate("window.__amcNoReload = 'still here'")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__amcNoReload") == "still here"


def _decision(step: str) -> Decision:
    action = types_pb2.Action(purpose=f"do {step}", expected_outcome=f"{step} done")
    action.tap.element_id = "e2"
    return Decision(
        tool_name="tap",
        arguments={"element_id": "e2"},
        action=action,
        purpose=f"do {step}",
        expected_outcome=f"{step} done",
        rationale=f"{step} [is next]",
        thinking=[],
        usage=Usage(input_tokens=1200, output_tokens=300),
        provider="anthropic",
        model="claude-test",
        latency_s=0.5,
        forced_retry=False,
        system_prompt="s",
        user_prompt="u",
    )


def test_focus_stays_on_cancel_across_live_updates_and_status_is_announced(
    report: PageReport, gateway: str, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """The issue: "keyboard focus on 'Cancel task…' is lost within 2 s". Renewals, a new
    decision (the history grows) and a new step all arrive while the link has focus."""
    page = report.page
    host = make_host()
    task = operator.submit(unique("Turn on dark theme"), host_id=host.host_id)
    a = host.assignment()
    host.renew(a, 1, types_pb2.STEP_STATUS_PLANNING, "step 1: planning on Settings")
    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)
    cancel = page.locator("[data-field=cancel]")
    cancel.focus()
    expect(cancel).to_be_focused()

    for step in range(1, 4):
        cloud.loop.run(
            decisions.append(
                cloud.server.store, host.host_id, task.task_id, 1, _decision(f"s{step}")
            )
        )
        host.renew(a, step, types_pb2.STEP_STATUS_ACTING, f"step {step}: tap 'Row {step}'")
        expect(page.locator("details.step")).to_have_count(step, timeout=LIVE_MS)
        expect(page.locator("#summary [data-field=progress]")).to_have_text(
            f"step {step} · acting · tap 'Row {step}'", timeout=LIVE_MS
        )
        expect(cancel).to_be_focused()
    # The attempts block was merged too (its renewal count moved), focus still on the link.
    expect(page.locator("#attempt-1 .kind-renewals")).to_contain_text("renewed", timeout=LIVE_MS)
    expect(cancel).to_be_focused()
    # Focus inside a re-merged block (the attempt's link to its history) is found again.
    link = page.locator("#attempt-1 a", has_text="LLM history of attempt 1")
    link.focus()
    host.renew(a, 4, types_pb2.STEP_STATUS_ACTING, "step 4: tap 'Row 4'")
    expect(page.locator("#summary [data-field=progress]")).to_have_text(
        "step 4 · acting · tap 'Row 4'", timeout=LIVE_MS
    )
    # Five renewals were sent and acknowledged: one before the page opened, three in the loop.
    expect(page.locator("#attempt-1 .kind-renewals")).to_contain_text("5 times", timeout=LIVE_MS)
    expect(page.locator("#attempt-1 a", has_text="LLM history of attempt 1")).to_be_focused()

    # The end is announced politely; the cancel link goes and focus moves to the heading.
    cancel.focus()
    host.finish(a, types_pb2.TASK_STATUS_FAILED, "gave up: no such setting")
    expect(page.locator("#announcer")).to_have_text(
        "Task failed: gave up: no such setting", timeout=LIVE_MS
    )
    expect(page.locator("#announcer")).to_have_attribute("aria-live", "polite")
    expect(page.locator("[data-field=cancel]")).to_have_count(0)
    expect(page.locator("#task-title")).to_be_focused()
    # What the step did and what became of the task, separately.
    expect(page.locator("#summary [data-field=status]")).to_have_text("failed")
    expect(page.locator("#summary [data-field=progress]")).to_have_text(
        "last step 4 · acting · tap 'Row 4'"
    )
    assert_not_reloaded(page)
    report.assert_clean()


def test_the_attempt_history_counts_the_live_lease_down_and_lists_each_event(
    report: PageReport, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    page = report.page
    host = make_host()
    goal = unique("Open the clock")
    task = operator.submit(goal, host_id=host.host_id)
    a = host.assignment()
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, "step 1: tap 'Clock'")
    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    timeline = page.locator("#attempt-1 ol.timeline")
    expect(timeline.locator(".kind-assigned")).to_contain_text(
        f"assigned to {host.host_id} / emu-1"
    )
    expect(timeline.locator(".kind-renewals")).to_contain_text("lease renewed once")
    # Each event's time says its zone, as every other time on the page does.
    expect(timeline.locator(".kind-assigned time")).to_have_text(
        re.compile(r"^\d\d:\d\d:\d\d UTC$")
    )
    countdown = page.locator("#summary [data-field=lease] time")
    first = countdown.inner_text()
    assert re.fullmatch(r"in \d+ s|in \dm \d\ds", first), first
    expect(countdown).not_to_have_text(first, timeout=LIVE_MS)  # it counts down in the page
    expect(timeline.locator(".live")).to_contain_text("lease runs out in")

    page.goto(f"{gateway}/tasks/{task.task_id}/cancel")
    page.fill("input[name=reason]", "wrong [phone]")
    page.click("text=Yes, cancel the task")
    expect(timeline.locator(".kind-cancel_requested")).to_have_text(
        re.compile(rf"cancel requested by {ADMIN} via console: wrong \[phone\]$")
    )
    host.expect("revoked")
    host.finish(a, types_pb2.TASK_STATUS_CANCELLED, "stopped on request")
    expect(timeline.locator(".kind-result")).to_contain_text(
        "result: cancelled — stopped on request", timeout=LIVE_MS
    )
    expect(page.locator("#summary [data-field=lease]")).to_have_text("none live")
    expect(timeline.locator(".live")).to_have_count(0)
    expect(page.locator("[data-field=cancelled-by]")).to_have_text(
        f"Cancel asked by {ADMIN} via console."
    )
    report.assert_clean()


def test_totals_and_the_progress_line_in_the_list_and_on_the_page(
    report: PageReport, gateway: str, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    page = report.page
    host = make_host()
    tag = uuid.uuid4().hex[:8]
    task = operator.submit(f"Totals {tag}", host_id=host.host_id)
    a = host.assignment()
    for step in (1, 2):
        cloud.loop.run(
            decisions.append(
                cloud.server.store, host.host_id, task.task_id, 1, _decision(f"s{step}")
            )
        )
    host.renew(a, 2, types_pb2.STEP_STATUS_SUCCEEDED, "step 2: give up: the setting is missing")
    host.finish(a, types_pb2.TASK_STATUS_FAILED, "the setting is missing")
    page.goto(f"{gateway}/tasks?q={tag}")
    row = page.locator(f"#task-{task.task_id}")
    expect(row.locator("[data-field=status]")).to_have_text("failed")
    # Not "succeeded" on a failed task: the step's action ran, the task failed.
    expect(row.locator("[data-field=progress]")).to_have_text(
        "last step 2 · action done · give up: the setting is missing"
    )
    expect(row.locator("[data-field=totals]")).to_have_text(
        re.compile(r"^2 steps · 3\.0k tokens · ")
    )
    page.click(f"text=Totals {tag}")
    expect(page.locator("#summary [data-field=steps]")).to_have_text("2")
    expect(page.locator("#summary [data-field=decisions]")).to_have_text("2")
    expect(page.locator("#summary [data-field=tokens]")).to_contain_text("3.0k")
    expect(page.locator("#summary [data-field=tokens]")).to_contain_text("in 2.4k · out 600")
    expect(page.locator("#summary [data-field=wall]")).not_to_have_text("—")
    # The full id is shown and selectable (a terminal's prefix of it leads here too).
    expect(page.locator(".task-id")).to_have_text(task.task_id)
    page.goto(f"{gateway}/tasks/{task.task_id[:12]}")
    expect(page).to_have_url(f"{gateway}/tasks/{task.task_id}")
    report.assert_clean()


def test_a_watched_task_s_cost_and_budget_change_live_in_the_list_and_on_the_page(
    report: PageReport,
    browser: Browser,
    gateway: str,
    cloud: Cloud,
    operator: Operator,
    make_host: HostFactory,
) -> None:
    """An operator watching a running task sees what it has cost so far change, on its page
    (the cost and the budget line) and in the list's totals, without a reload."""
    page = report.page
    host = make_host()
    tag = uuid.uuid4().hex[:8]
    submitted: task_service_pb2.SubmitTaskResponse = operator.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(
            goal=f"Cost {tag}",
            target=types_pb2.TaskTarget(host_id=host.host_id),
            budget=types_pb2.TaskBudget(max_tokens=10_000, max_cost_usd=1.0),
        ),
        timeout=LIVE_MS / 1000,
    )
    task = submitted.task
    a = host.assignment()

    def step(n: int) -> None:
        priced = replace(_decision(f"s{n}"), usage=Usage(1200, 300, cost_usd=0.0125))
        cloud.loop.run(decisions.append(cloud.server.store, host.host_id, task.task_id, 1, priced))
        host.renew(a, n, types_pb2.STEP_STATUS_ACTING, f"step {n}: tap 'Row {n}'")

    step(1)
    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    expect(page.locator("#summary [data-field=cost]")).to_have_text("$0.0125")
    listing = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    log_in(listing, gateway, f"/tasks?q={tag}")
    row = listing.locator(f"#task-{task.task_id}")
    expect(row.locator("[data-field=totals]")).to_contain_text("1.5k tokens · $0.0125")
    expect(listing.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)
    mark_no_reload(listing)

    # The second step's decision is logged; a cancel asked for reloads the task for its
    # watchers, its totals with it (a renewal's progress alone carries the totals as sent).
    step(2)
    operator.tasks.CancelTask(
        task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="enough"),
        timeout=LIVE_MS / 1000,
    )
    expect(page.locator("#summary [data-field=status]")).to_have_text(
        "running · cancelling", timeout=LIVE_MS
    )
    expect(page.locator("#summary [data-field=decisions]")).to_have_text("2")
    expect(page.locator("#summary [data-field=cost]")).to_have_text("$0.0250")
    expect(page.locator("#summary [data-field=budget]")).to_have_text(
        " of the budget: 3,000 / 10,000 tokens; $0.0250 / $1.00"
    )
    expect(row.locator("[data-field=totals]")).to_contain_text(
        "2 steps · 3.0k tokens · $0.0250", timeout=LIVE_MS
    )
    assert_not_reloaded(page)
    assert_not_reloaded(listing)
    listing.context.close()
    report.assert_clean()


def test_a_task_page_shows_each_decision_s_cost_as_it_is_logged(
    report: PageReport, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    """A decision logged with nothing else about the task changing (a direct-transport host
    ships it) moves the open task page's decisions, tokens, cost and budget line, without a
    reload."""
    page = report.page
    host = make_host(types_pb2.PLANNER_TRANSPORT_DIRECT)
    submitted: task_service_pb2.SubmitTaskResponse = operator.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(
            goal=unique("Shipped cost"),
            target=types_pb2.TaskTarget(host_id=host.host_id),
            budget=types_pb2.TaskBudget(max_tokens=10_000, max_cost_usd=1.0),
        ),
        timeout=LIVE_MS / 1000,
    )
    a = host.assignment()
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, "step 1: tap 'Display'")
    page.goto(f"{gateway}/tasks/{submitted.task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    expect(page.locator("#summary [data-field=decisions]")).to_have_text("0")
    mark_no_reload(page)

    for n in (1, 2):
        usage = types_pb2.Usage(
            input_tokens=1200, output_tokens=300, cache_creation_input_tokens=500, cost_usd=0.0125
        )
        host.ship(a, f"d{n}", usage)
        expect(page.locator("#summary [data-field=decisions]")).to_have_text(
            str(n), timeout=LIVE_MS
        )
        expect(page.locator("#summary [data-field=cost]")).to_have_text(f"${0.0125 * n:.4f}")
        expect(page.locator("#summary [data-field=budget]")).to_have_text(
            f" of the budget: {2000 * n:,} / 10,000 tokens; ${0.0125 * n:.4f} / $1.00"
        )
    assert_not_reloaded(page)
    report.assert_clean()


def test_a_task_page_shows_a_call_of_unknown_cost_as_it_is_shipped_and_settled(
    report: PageReport, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    """A direct-transport host's call of unknown cost (decision 0080) appears beside the open
    task page's cost as the cloud records it, and goes once its late cost settles it, without a
    reload."""
    page = report.page
    host = make_host(types_pb2.PLANNER_TRANSPORT_DIRECT)
    submitted: task_service_pb2.SubmitTaskResponse = operator.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(
            goal=unique("Unknown cost"), target=types_pb2.TaskTarget(host_id=host.host_id)
        ),
        timeout=LIVE_MS / 1000,
    )
    a = host.assignment()
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, "step 1: tap 'Display'")
    page.goto(f"{gateway}/tasks/{submitted.task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    note = page.locator("#summary [data-field=unsettled]")
    expect(note).to_have_count(0)
    mark_no_reload(page)

    host.ship_request(
        decision_log_service_pb2.ShipDecisionsRequest(unsettled_calls=[unsettled_call(a, "c1")])
    )
    expect(note).to_have_text("1 call of unknown cost (at most $0.1600)", timeout=LIVE_MS)
    late = failed_calls(a, "f1")
    late.settles_calls.append("c1")
    host.ship_request(decision_log_service_pb2.ShipDecisionsRequest(failed_calls=[late]))
    expect(note).to_have_count(0, timeout=LIVE_MS)
    expect(page.locator("#summary [data-field=cost]")).to_have_text("$0.0030")
    assert_not_reloaded(page)
    report.assert_clean()


def test_a_task_s_token_breakdown_adds_up_to_its_total_live_and_when_loaded(
    report: PageReport, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    """The task page's tokens say the total and its parts (in, out, cache): the cache part is
    what was read from and written to the prompt cache, so the parts add up to the total, and
    the title says every count; live (after a decision) as when the page is loaded."""
    page = report.page
    host = make_host(types_pb2.PLANNER_TRANSPORT_DIRECT)
    task = operator.submit(unique("Cache writes"), host_id=host.host_id)
    a = host.assignment()
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, "step 1: tap 'Display'")
    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    usage = types_pb2.Usage(
        input_tokens=1200,
        output_tokens=300,
        cache_read_input_tokens=200,
        cache_creation_input_tokens=800,
        cost_usd=0.0125,
    )
    host.ship(a, "d1", usage)
    tokens = page.locator("#summary [data-field=tokens]")
    said = "2.5k (in 1.2k · out 300 · cache 1.0k)"
    title = "input 1200 · output 300 · cache read 200 · cache write 800 · thinking 0"
    expect(tokens).to_have_text(said, timeout=LIVE_MS)
    expect(tokens).to_have_attribute("title", title)
    page.reload()
    expect(tokens).to_have_text(said)
    expect(tokens).to_have_attribute("title", title)
    report.assert_clean()


def test_who_asked_to_cancel_and_when_the_task_finished_show_without_a_reload(
    report: PageReport, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    """An operator watching a task another operator cancels reads who asked and, once the host
    stopped, when the task finished, as a reload of the page would show them."""
    page = report.page
    host = make_host()
    task = operator.submit(unique("Cancelled by another"), host_id=host.host_id)
    a = host.assignment()
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, "step 1: tap 'Row 1'")
    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    expect(page.locator("#summary [data-field=cancelled-by]")).to_have_count(0)
    mark_no_reload(page)

    operator.tasks.CancelTask(
        task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="wrong phone"),
        timeout=LIVE_MS / 1000,
    )
    asked = operator.get(task.task_id).cancelled_by
    assert asked
    expect(page.locator("#summary [data-field=cancelled-by]")).to_have_text(
        f"Cancel asked by {asked}.", timeout=LIVE_MS
    )
    host.finish(a, types_pb2.TASK_STATUS_CANCELLED, "cancelled")
    expect(page.locator("#summary [data-field=status]")).to_have_text("cancelled", timeout=LIVE_MS)
    finished = operator.get(task.task_id).finished_at.ToDatetime(tzinfo=UTC)
    expect(page.locator("#summary [data-field=finished]")).to_have_text(
        finished.strftime("%Y-%m-%d %H:%M:%S UTC")
    )
    assert_not_reloaded(page)
    report.assert_clean()


def test_columns_do_not_jump_when_a_row_changes_live(
    report: PageReport, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    page = report.page
    host = make_host()
    tag = uuid.uuid4().hex[:8]
    task = operator.submit(f"Columns {tag}", host_id=host.host_id)
    a = host.assignment()
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, "step 1: tap")
    page.goto(f"{gateway}/tasks?q={tag}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    widths = page.eval_on_selector_all("table.tasks th", "ths => ths.map(t => t.offsetWidth)")
    long = "tap 'A much longer label that would widen an automatic column considerably' " * 2
    host.renew(a, 12, types_pb2.STEP_STATUS_ACTING, f"step 12: {long.strip()}")
    expect(page.locator(f"#task-{task.task_id} [data-field=progress]")).to_contain_text(
        "step 12", timeout=LIVE_MS
    )
    after = page.eval_on_selector_all("table.tasks th", "ths => ths.map(t => t.offsetWidth)")
    assert after == widths


def test_a_new_task_row_is_inserted_without_taking_focus_away(
    report: PageReport, gateway: str, operator: Operator
) -> None:
    """The page's rows are fetched again as its stream opens (catching up on what changed
    meanwhile, unannounced), and other tests' tasks change in the same cloud (a closed host's
    lease runs out: "…: queued"). So the task is submitted once that fetch came back (it was
    submitted at the same time: its row came with it, unannounced), and what the page said is
    every announcement, not the announcer's last words."""
    page = report.page
    catch_up = f"{gateway}/tasks"
    with page.expect_response(
        lambda r: r.url == catch_up and r.request.resource_type == "fetch", timeout=LIVE_MS
    ):
        page.goto(f"{gateway}/tasks")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)
    page.evaluate(
        """() => {
        window.__amcSaid = [];
        const announcer = document.getElementById("announcer");
        new MutationObserver(() => window.__amcSaid.push(announcer.textContent))
            .observe(announcer, { childList: true, characterData: true, subtree: true });
    }"""
    )
    page.locator("input[name=q]").focus()
    page.keyboard.type("dark")
    goal = unique("Inserted live")
    task = operator.submit(goal, host_id="no-such-host")
    expect(page.locator(f"#task-{task.task_id} [data-field=status]")).to_have_text(
        "queued", timeout=LIVE_MS
    )
    expect(page.locator("input[name=q]")).to_be_focused()
    expect(page.locator("input[name=q]")).to_have_value("dark")
    said = f"New task: {goal} (queued)"
    page.wait_for_function("said => window.__amcSaid.includes(said)", arg=said, timeout=LIVE_MS)
    assert_not_reloaded(page)
    report.assert_clean()


def test_rows_fetched_before_a_change_do_not_put_the_older_step_back(
    report: PageReport, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    """As the tasks page's stream opens it fetches its rows again; a step reported meanwhile
    comes as an event and is patched in. When that fetch, which read the rows before the step,
    came back after the event, its older copy of the row replaced the patched one: the row
    showed the step before (the browser tests' "step 4 not shown" under load) until the task
    changed again. Here the fetch is held back in the browser until after the event."""
    page = report.page
    host = make_host()
    task = operator.submit(unique("Stays on its step"), host_id=host.host_id)
    a = host.assignment()
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")
    held: list[tuple[Route, APIResponse]] = []

    def hold_the_catch_up(route: Route) -> None:
        if route.request.resource_type == "fetch" and not held:
            held.append((route, route.fetch()))  # the rows as they are now: step 1
        else:
            route.continue_()

    rows = f"{gateway}/tasks"
    page.route(rows, hold_the_catch_up)
    page.goto(rows)
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    deadline = time.monotonic() + LIVE_MS / 1000
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)  # lets Playwright run the route handler
    assert held, "the page did not fetch its rows as its stream opened"
    row = page.locator(f"#task-{task.task_id} [data-field=progress]")
    host.renew(a, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Dark theme'")
    expect(row).to_have_text("step 2 · acting · tap 'Dark theme'", timeout=LIVE_MS)
    # A new task's row is fetched once the held fetch is merged: when it shows, that is done.
    later = operator.submit(unique("Submitted after"), host_id="no-such-host")
    route, response = held[0]
    route.fulfill(response=response)
    expect(page.locator(f"#task-{later.task_id}")).to_have_count(1, timeout=LIVE_MS)
    expect(row).to_have_text("step 2 · acting · tap 'Dark theme'")
    report.assert_clean()


def test_no_tasks_match_is_not_no_tasks_yet(report: PageReport, gateway: str) -> None:
    page = report.page
    page.goto(f"{gateway}/tasks?q=nothing-has-this-{uuid.uuid4().hex}")
    expect(page.locator("#no-tasks")).to_have_text("No tasks match these filters.")


def test_an_empty_cloud_says_no_tasks_yet(browser: Browser, tmp_path: Path, pki_dir: Path) -> None:
    """An empty cloud's pages say what to do next: submit the first task, start a host (the
    fleet page said only "No host has connected yet.")."""
    with cloud_of_its_own(tmp_path, pki_dir, "empty") as (_, _server, base):
        context = browser.new_context()
        try:
            page = context.new_page()
            log_in(page, base)
            expect(page.locator("#no-tasks")).to_contain_text("No tasks yet.")
            page.goto(f"{base}/fleet")
            # An empty fleet says what to do next, not only that it is empty.
            expect(page.locator("#no-hosts")).to_have_text(
                "No host has connected yet. To add one, issue its certificate "
                "(amc certs host DIR HOST_ID) and run amc host run beside its phones with "
                "AMC_HOST_CLOUD_ADDRESS set to this cloud: it shows here as it connects."
            )
        finally:
            context.close()


def test_the_fleet_shows_busy_and_idle_phones_with_their_task(
    report: PageReport, gateway: str, operator: Operator, make_host: HostFactory, cloud: Cloud
) -> None:
    page = report.page
    page.goto(f"{gateway}/fleet?page_size={WHOLE_FLEET}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)
    host = make_host()
    card = page.locator(f"#host-{host.host_id}")
    phone_row = card.locator("tr[data-serial='emu-1']")
    expect(phone_row).to_contain_text("idle", timeout=LIVE_MS)
    goal = unique("Busy phone")
    task = operator.submit(goal, host_id=host.host_id)
    a = host.assignment()
    expect(phone_row).to_contain_text("busy", timeout=LIVE_MS)
    link = phone_row.locator("a")
    expect(link).to_have_text(goal)
    expect(link).to_have_attribute("href", f"/tasks/{task.task_id}")
    expect(card).to_contain_text("1 of 1 phone busy")
    expect(card.locator("a", has_text="tasks on this host")).to_have_attribute(
        "href", f"/tasks?host={host.host_id}"
    )
    link.focus()
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, "step 1: tap")
    host.finish(a, types_pb2.TASK_STATUS_SUCCEEDED, "done")
    expect(phone_row).to_contain_text("idle", timeout=LIVE_MS)
    assert_not_reloaded(page)
    report.assert_clean()


def test_the_fleet_filter_narrows_the_page_and_live_updates_keep_to_it(
    report: PageReport, gateway: str, make_host: HostFactory
) -> None:
    """The fleet page's Connection select lists just the disconnected hosts (or the
    connected ones), and live updates keep to the choice: on the connected page a host that
    disconnects goes and one that connects comes, without a reload."""
    page = report.page
    up, down = make_host(), make_host()
    down.close()
    page.goto(f"{gateway}/fleet?page_size=500")
    expect(page.locator(f"#host-{down.host_id}")).to_have_class(
        re.compile(r"\bdisconnected\b"), timeout=LIVE_MS
    )
    expect(page.locator(f"#host-{up.host_id}")).to_be_visible()

    page.select_option("select[name=connection]", "disconnected")
    page.click("form.filters button[type=submit]")
    expect(page).to_have_url(re.compile(r"connection=disconnected"))
    expect(page.locator(f"#host-{down.host_id}")).to_be_visible()
    expect(page.locator(f"#host-{up.host_id}")).to_have_count(0)
    expect(page.locator("#live-fleet section.card.host.connected")).to_have_count(0)
    expect(page.locator("select[name=connection]")).to_have_value("disconnected")

    page.select_option("select[name=connection]", "connected")
    page.click("form.filters button[type=submit]")
    expect(page).to_have_url(re.compile(r"connection=connected"))
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    expect(page.locator(f"#host-{up.host_id}")).to_be_visible()
    expect(page.locator(f"#host-{down.host_id}")).to_have_count(0)
    mark_no_reload(page)
    later = make_host()
    expect(page.locator(f"#host-{later.host_id}")).to_be_visible(timeout=LIVE_MS)
    up.close()
    expect(page.locator(f"#host-{up.host_id}")).to_have_count(0, timeout=LIVE_MS)
    expect(page.locator("#live-fleet section.card.host.disconnected")).to_have_count(0)
    assert_not_reloaded(page)
    report.assert_clean()


def test_the_fleet_page_watches_its_own_page_and_follows_it_when_hosts_leave(
    report: PageReport, gateway: str, cloud: Cloud
) -> None:
    """The fleet page's live stream is its page's (connection, page size, token: the cloud
    sends the changes of that page's hosts, not the fleet's). When a host leaves the page and
    a later one takes its place, past the range the stream was fixed to, the page watches
    again and hears of that host too."""
    page = report.page
    tag = uuid.uuid4().hex[:8]  # "0-…" sorts before every other host id of the session
    first, second = cloud.host(f"0-{tag}-a"), cloud.host(f"0-{tag}-b")
    streams: list[str] = []
    page.on("request", lambda r: streams.append(r.url) if "/api/hosts/events" in r.url else None)
    try:
        first.connect()
        second.connect()
        page.goto(f"{gateway}/fleet?connection=connected&page_size=1")
        expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
        expect(page.locator(f"#host-{first.host_id}")).to_be_visible()
        expect(page.locator(f"#host-{second.host_id}")).to_have_count(0)
        assert [u for u in streams if "connection=connected" in u and "page_size=1" in u]
        mark_no_reload(page)
        first.close()
        expect(page.locator(f"#host-{first.host_id}")).to_have_count(0, timeout=LIVE_MS)
        expect(page.locator(f"#host-{second.host_id}")).to_be_visible(timeout=LIVE_MS)
        second.close()  # past the first stream's range: heard only on the page's new stream
        expect(page.locator(f"#host-{second.host_id}")).to_have_count(0, timeout=LIVE_MS)
        assert_not_reloaded(page)
        report.assert_clean()
    finally:
        first.close()
        second.close()


def test_a_host_added_before_the_first_card_of_page_two_shows_on_it(
    report: PageReport, gateway: str, cloud: Cloud
) -> None:
    """Page 2 lists the hosts after page 1's last: a host that connects with an id between
    that and page 2's first card is page 2's now. The page dropped it (it sorted before the
    first card), and showed a host that ListHosts had moved to page 3."""
    page = report.page
    tag = uuid.uuid4().hex[:8]  # "0-…" sorts before every other host id of the session
    a, b, c = (cloud.host(f"0-{tag}-{name}") for name in ("a", "b", "c"))
    try:
        a.connect()
        c.connect()
        page.goto(f"{gateway}/fleet?connection=connected&page_size=1")
        expect(page.locator(f"#host-{a.host_id}")).to_be_visible()
        page.click("a[rel=next]")
        expect(page.locator(f"#host-{c.host_id}")).to_be_visible()
        expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
        mark_no_reload(page)
        b.connect()
        expect(page.locator(f"#host-{b.host_id}")).to_be_visible(timeout=LIVE_MS)
        expect(page.locator(f"#host-{c.host_id}")).to_have_count(0)
        assert_not_reloaded(page)
        report.assert_clean()
    finally:
        for host in (a, b, c):
            host.close()


def test_at_390_px_the_pages_fit_and_tables_become_cards(
    phone: PageReport, gateway: str, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """The issue measured 746 px (tasks) and 651 px (detail) at a 390 px viewport."""
    page = phone.page
    host = make_host()
    goal = unique("Turn on dark theme and then check the notification shade for new alerts")
    task = operator.submit(goal, host_id=host.host_id)
    a = host.assignment()
    cloud.loop.run(
        decisions.append(cloud.server.store, host.host_id, task.task_id, 1, _decision("s1"))
    )
    host.renew(a, 3, types_pb2.STEP_STATUS_ACTING, "step 3: tap 'Display' — open display settings")
    for name, path in (
        ("tasks", "/tasks"),
        ("detail", f"/tasks/{task.task_id}"),
        ("fleet", "/fleet"),
        ("submit", "/tasks/new"),
    ):
        page.goto(gateway + path)
        expect(page.locator("h1").first).to_be_visible()
        screenshot(page, f"390-{name}")
        assert overflow_x(page) == 0, path
    page.goto(f"{gateway}/tasks")
    # Asked again until true: the page fetches its rows again once its live stream opens,
    # and a running task's row (its wall time grew) is then a fresh element.
    row = page.locator(f"#task-{task.task_id}")
    expect(row).to_have_css("display", "block")
    expect(page.locator("table.tasks thead")).to_have_css("display", "none")
    page.wait_for_function(
        """id => {
          const td = document.querySelector("#" + id + " td[data-label=Progress]");
          return td !== null && getComputedStyle(td, "::before").content === '"Progress"';
        }""",
        arg=f"task-{task.task_id}",
    )
    page.goto(f"{gateway}/tasks/{task.task_id}")
    page.locator("details.step > summary").first.click()
    page.locator("details.prompts > summary").first.click()
    assert overflow_x(page) == 0
    phone.assert_clean()


def test_every_page_loads_inside_its_content_security_policy(
    report: PageReport, gateway: str, operator: Operator
) -> None:
    """No `data:` favicon any more: the icon is a file the policy allows, and nothing on any
    page is refused by the policy or logs an error."""
    page = report.page
    task = operator.submit(unique("CSP"), host_id="no-such-host")
    for path in ("/tasks", f"/tasks/{task.task_id}", "/fleet", "/tasks/new", "/login"):
        page.goto(gateway + path)
        expect(page.locator("h1").first).to_be_visible()
        assert report.violations() == [], path
    icon = page.locator("link[rel=icon]").get_attribute("href") or ""
    assert icon.endswith("/static/favicon.svg")
    response = page.request.get(gateway + "/static/favicon.svg")
    assert response.status == 200 and response.headers["content-type"].startswith("image/svg")
    csp = page.request.get(gateway + "/login").headers["content-security-policy"]
    assert "data:" not in csp and "img-src 'self'" in csp
    report.assert_clean()


def test_the_conversation_page_is_linked_from_the_attempt(
    report: PageReport, gateway: str, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    page = report.page
    host = make_host()
    task = operator.submit(unique("Session"), host_id=host.host_id)
    host.assignment()
    session = _decision("s1")
    session.extra = {"mode": "session"}
    cloud.loop.run(decisions.append(cloud.server.store, host.host_id, task.task_id, 1, session))
    page.goto(f"{gateway}/tasks/{task.task_id}")
    link = page.locator("#attempt-1 a", has_text="whole conversation")
    expect(link).to_have_attribute("href", f"/tasks/{task.task_id}/attempts/1/conversation")
    link.click()
    expect(page.locator("h1")).to_have_text("Conversation of attempt 1")


def test_a_live_stream_the_console_fails_says_so_instead_of_reconnecting(
    browser: Browser, console_settings: ConsoleSettings, operator: Operator
) -> None:
    """The gateway's `stream-error` event closes the page's stream and says why: the browser
    reconnected every second instead (the failure repeats), showing only "reconnecting…"."""
    app = create_app(console_settings)
    server = UvicornThread(app)
    base = server.start()
    task = operator.submit(unique("Fail the live stream"), host_id="nowhere")  # no host takes it
    fail_after_first_change(app)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        watched = PageReport(context.new_page())
        log_in(watched.page, base, f"/tasks/{task.task_id}")
        expect(watched.page.locator("#live-state")).to_have_text(
            f"{UNEXPECTED} — reload the page", timeout=LIVE_MS
        )
    finally:
        context.close()
        server.stop()


def test_a_task_page_keeps_updating_after_the_cloud_was_unreachable(
    browser: Browser, console_settings: ConsoleSettings, operator: Operator, make_host: HostFactory
) -> None:
    """A network drop between the gateway and the cloud (a proxy between them stops, then
    listens again) must not end a task page's live view. The stream's reconnect asked the cloud
    for the task first, got 503 while it was unreachable, and an EventSource refused with a
    non-200 answer never tries again: the page read "disconnected — reload the page" for good
    and showed none of the task's later steps."""
    cloud_port = int(console_settings.cloud_address.rsplit(":", 1)[1])
    proxy = TcpProxy([("127.0.0.1", cloud_port)]).start()
    settings = console_settings.model_copy(update={"cloud_address": proxy.address})
    server = UvicornThread(create_app(settings))
    base = server.start()
    host = make_host()
    task = operator.submit(unique("Ride out a network drop"), host_id=host.host_id)
    assignment = host.assignment()
    host.renew(assignment, 1, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        log_in(page, base, f"/tasks/{task.task_id}")
        expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
        mark_no_reload(page)
        # The browser's next try reaches the gateway while the cloud is out of its reach.
        stream = f"/api/tasks/{task.task_id}/events"
        with page.expect_response(lambda r: r.url.endswith(stream), timeout=LIVE_MS):
            proxy.stop()
        proxy = TcpProxy([("127.0.0.1", cloud_port)], port=proxy.port).start()
        host.renew(assignment, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Dark theme'")
        expect(page.locator(".summary [data-field=progress]")).to_have_text(
            "step 2 · acting · tap 'Dark theme'", timeout=3 * LIVE_MS
        )
        expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
        assert_not_reloaded(page)
    finally:
        context.close()
        server.stop()
        proxy.stop()


def test_long_unbroken_text_wraps_on_every_page(
    browser: Browser, gateway: str, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """Goals, results and the model's words are free text: a URL or a path has no space to
    break at. The cancel page set the goal in a plain paragraph, so a long one ran 2,000 px
    past the viewport; a result or a step's purpose and rationale did the same on the task
    page."""
    word = "https://example.com/" + "a" * 300
    host = make_host()
    task = operator.submit(unique(f"Open {word}"), host_id=host.host_id)
    a = host.assignment()
    step = _decision("s1")
    step.purpose = step.rationale = step.expected_outcome = f"open {word}"
    cloud.loop.run(decisions.append(cloud.server.store, host.host_id, task.task_id, 1, step))
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, f"tap {word}")
    running = ("/tasks", f"/tasks/{task.task_id}", f"/tasks/{task.task_id}/cancel", "/fleet")
    ended = (f"/tasks/{task.task_id}", f"/tasks/{task.task_id}/attempts/1/conversation")
    wide: ViewportSize = {"width": 1280, "height": 900}
    for viewport in (wide, PHONE):
        context = browser.new_context(viewport=viewport)
        page = context.new_page()
        log_in(page, gateway)
        for path in running:
            page.goto(gateway + path)
            page.locator("details.step > summary").evaluate_all("s => s.forEach(e => e.click())")
            assert overflow_x(page) == 0, (viewport["width"], path)
        context.close()
    host.finish(a, types_pb2.TASK_STATUS_FAILED, f"could not open {word}")
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    log_in(page, gateway)
    for path in ended:
        page.goto(gateway + path)
        assert overflow_x(page) == 0, path
    context.close()


def test_at_390_px_the_flows_pages_fit_and_their_tables_become_cards(
    phone: PageReport, gateway: str, cloud: Cloud
) -> None:
    """The flows list (8 columns) and a flow's steps (7) were plain tables: 166 and 131 px
    wider than a phone held upright."""
    page = phone.page
    goal = unique("Turn on dark theme")
    flow = cloud.loop.run(store_flow(cloud.server.store, goal=goal, task_id="t-390"))
    for path in ("/flows", f"/flows/{flow.flow_id}"):
        page.goto(gateway + path)
        expect(page.locator("h1").first).to_be_visible()
        screenshot(page, "390-" + path.strip("/").replace("/", "-"))
        assert overflow_x(page) == 0, path
        row = page.locator("table.cards tbody tr").first
        assert row.evaluate("r => getComputedStyle(r).display") == "block", path
    label = (
        page.locator("tr[data-step='1'] td")
        .nth(4)
        .evaluate("td => getComputedStyle(td, '::before').content")
    )
    assert label == '"Expected"'
    phone.assert_clean()


def test_the_tasks_page_catches_up_after_the_cloud_was_unreachable(
    browser: Browser, console_settings: ConsoleSettings, operator: Operator, make_host: HostFactory
) -> None:
    """The tasks page's stream leaves out its snapshot (every unfinished task in the cloud,
    thousands on a busy fleet): what a row missed while the stream was down comes from the
    page's own rows, fetched again when the stream opens again."""
    cloud_port = int(console_settings.cloud_address.rsplit(":", 1)[1])
    proxy = TcpProxy([("127.0.0.1", cloud_port)]).start()
    settings = console_settings.model_copy(update={"cloud_address": proxy.address})
    server = UvicornThread(create_app(settings))
    base = server.start()
    host = make_host()
    tag = uuid.uuid4().hex[:8]
    task = operator.submit(f"Catch up {tag}", host_id=host.host_id)
    assignment = host.assignment()
    host.renew(assignment, 1, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        log_in(page, base, f"/tasks?q={tag}")
        row = page.locator(f"#task-{task.task_id}")
        expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
        expect(row.locator("[data-field=status]")).to_have_text("running")
        mark_no_reload(page)
        with page.expect_response(lambda r: "/api/events" in r.url, timeout=LIVE_MS):
            proxy.stop()
        host.finish(assignment, types_pb2.TASK_STATUS_SUCCEEDED, "Display is open")
        proxy = TcpProxy([("127.0.0.1", cloud_port)], port=proxy.port).start()
        expect(row.locator("[data-field=status]")).to_have_text("succeeded", timeout=3 * LIVE_MS)
        expect(row.locator("[data-field=progress]")).to_contain_text("last step 1")
        assert_not_reloaded(page)
    finally:
        context.close()
        server.stop()
        proxy.stop()


def _utc(moment: Timestamp) -> str:
    """A moment as the pages write it in full: `2026-12-05 17:11:47 UTC`."""
    return moment.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_relative_times_say_their_moment_in_utc_and_keep_it_current(
    report: PageReport, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    """ "12s ago" says nothing about when once it is read later (a screenshot, a ticket), so
    each relative time carries its moment in UTC in its title. A task row's "Updated" had
    none at all, and live updates moved every such time's text on but left the title at the
    moment the page was drawn (the task page's Updated, a host's last seen)."""
    page = report.page
    host = make_host()
    tag = uuid.uuid4().hex[:8]
    task = operator.submit(f"Say when {tag}", host_id=host.host_id)
    a = host.assignment()
    host.renew(a, 1, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")
    page.goto(f"{gateway}/tasks?q={tag}")
    row = page.locator(f"#task-{task.task_id}")
    updated = row.locator("time[data-field=updated]")
    expect(updated).to_have_attribute("title", _utc(operator.get(task.task_id).updated_at))
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    host.renew(a, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Dark theme'")
    expect(row.locator("[data-field=progress]")).to_contain_text("step 2", timeout=LIVE_MS)
    expect(updated).to_have_attribute("title", _utc(operator.get(task.task_id).updated_at))

    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    host.renew(a, 3, types_pb2.STEP_STATUS_ACTING, "tap 'Back'")
    summary = page.locator("#summary")
    expect(summary.locator("[data-field=progress]")).to_contain_text("step 3", timeout=LIVE_MS)
    expect(summary.locator("time[data-field=updated]")).to_have_attribute(
        "title", _utc(operator.get(task.task_id).updated_at)
    )


def test_a_task_submitted_while_the_cloud_is_unreachable_keeps_its_form(
    browser: Browser, console_settings: ConsoleSettings
) -> None:
    """The submit form posted while the cloud was out of the gateway's reach answered with a
    bare "503 · UNAVAILABLE" error page: the goal the operator had typed was gone. The form now
    comes back as typed, saying it was not submitted, and submitting it again once the cloud
    answers queues the task once."""
    cloud_port = int(console_settings.cloud_address.rsplit(":", 1)[1])
    proxy = TcpProxy([("127.0.0.1", cloud_port)]).start()
    settings = console_settings.model_copy(update={"cloud_address": proxy.address})
    server = UvicornThread(create_app(settings))
    base = server.start()
    goal = unique("Typed while the cloud was away")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        log_in(page, base, "/tasks/new")
        page.fill("textarea[name=goal]", goal)
        page.fill("input[name=host_id]", "no-such-host")
        proxy.stop()
        page.click("main button[type=submit]")
        expect(page.locator("#submit-error")).to_contain_text("Not submitted")
        expect(page.locator("#submit-error")).to_contain_text("the cloud is not reachable")
        expect(page.locator("textarea[name=goal]")).to_have_value(goal)
        expect(page.locator("input[name=host_id]")).to_have_value("no-such-host")
        proxy = TcpProxy([("127.0.0.1", cloud_port)], port=proxy.port).start()
        while httpx.get(f"{base}/healthz", timeout=20).json()["cloud"] != "SERVING":
            time.sleep(0.2)  # the gateway's channel reconnects within a few seconds
        # The cloud warns of a host it never saw, then queues the task.
        page.get_by_role("button", name="Submit", exact=True).click()
        page.get_by_role("button", name="Submit anyway", exact=True).click()
        expect(page).to_have_url(re.compile(r"/tasks/[0-9a-f]{32}$"), timeout=3 * LIVE_MS)
        page.goto(f"{base}/tasks?q={goal}")
        expect(page.locator("tbody tr")).to_have_count(1)
    finally:
        context.close()
        server.stop()
        proxy.stop()


RTL_GOAL = "افتح إعدادات العرض 📱"
RTL_TEXT = "الإعدادات مفتوحة الآن، <b>اضغط</b> على العرض. 🙂"


def test_right_to_left_text_reads_right_to_left_and_html_in_it_stays_text(
    report: PageReport, gateway: str, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """A goal, rationale, purpose, expected outcome or thinking written in Arabic or Hebrew
    was laid out left to right (no element said its direction), so its full stop and emoji
    sat on the wrong side and a mixed line read out of order. Each free-text element now takes
    its direction from its text (dir="auto"): right-to-left text reads right to left, English
    stays left to right, and markup in the text is shown as text, never run."""
    page = report.page
    host = make_host()
    tag = uuid.uuid4().hex[:8]
    task = operator.submit(f"{RTL_GOAL} {tag}", host_id=host.host_id)
    a = host.assignment()
    english = _decision("s1")
    rtl = replace(
        _decision("s2"),
        rationale=RTL_TEXT,
        purpose=RTL_TEXT,
        expected_outcome=RTL_TEXT,
        thinking=[ThinkingBlock(RTL_TEXT)],
    )
    for d in (english, rtl):
        cloud.loop.run(decisions.append(cloud.server.store, host.host_id, task.task_id, 1, d))
    host.renew(a, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")

    def direction(locator: Locator) -> str:
        return str(locator.evaluate("e => e.matches(':dir(rtl)') ? 'rtl' : 'ltr'"))

    page.goto(f"{gateway}/tasks?q={tag}")
    assert direction(page.locator(f"#task-{task.task_id} td.goal a")) == "rtl"
    page.goto(f"{gateway}/tasks/{task.task_id}")
    assert direction(page.locator("h1")) == "rtl"
    first, second = page.locator("details.step").nth(0), page.locator("details.step").nth(1)
    for step in (first, second):
        step.locator("> summary").click()
        step.locator("details.thinking > summary").click()
    assert direction(first.locator("dd.prose")) == "ltr"
    assert direction(first.locator(".expected p")) == "ltr"
    for where in ("summary .purpose", "dd.prose", "dt:text('Purpose') + dd", ".expected p"):
        assert direction(second.locator(where).first) == "rtl", where
    thinking = second.locator("details.thinking pre")
    assert direction(thinking) == "rtl"
    expect(thinking).to_have_text(RTL_TEXT)  # the <b> shown as typed, not made bold
    assert second.locator("b").count() == 0
    report.assert_clean()
