"""The console in a real browser: Debian's headless Chromium driven by Playwright (sync API).

The app runs under a real uvicorn server in a thread, wired to the real cloud; hosts are
simulated over the real LeaseService, so every change the page shows came through
WatchProgress → server-sent events → live.js, never a reload.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from amc.v1 import lease_service_pb2, types_pb2
from cloud import pki as cloud_pki
from cloud.store import decisions
from console.gateway.history import DIRECT_TRANSPORT, NO_DECISION_YET
from console.gateway.pages import SHOWN_STEPS
from planner.decision import Decision, ThinkingBlock, Usage
from tests.console.console_stack import (
    ADMIN,
    API_TOKEN,
    PASSWORD,
    VIEWER,
    VIEWER_PASSWORD,
    WHOLE_FLEET,
    Cloud,
    HostFactory,
    Operator,
    SimHost,
)
from tests.console.test_step_pages import _decision as long_step
from tests.support.browser import open_browser

pytestmark = pytest.mark.browser

#: Generous upper bound for a live update to show (a bound, not a timing assertion).
LIVE_MS = 10_000


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    yield from open_browser(playwright)


def log_in(page: Page, gateway: str, path: str = "/tasks") -> None:
    page.goto(gateway + path)
    page.fill("input[name=username]", ADMIN)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(re.escape(gateway + path) + "$"))


@pytest.fixture
def page(browser: Browser, gateway: str) -> Iterator[Page]:
    """A logged-in page in a fresh browser context."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log_in(page, gateway)
    try:
        yield page
    finally:
        context.close()


def unique(goal: str) -> str:
    return f"{goal} {uuid.uuid4().hex[:8]}"


def mark_no_reload(page: Page) -> None:
    """Leave a marker in the page's JS state; a reload would wipe it."""
    page.evaluate("window.__amcNoReload = 'still here'")


def screenshot(page: Page, name: str) -> None:
    """Save a full-page screenshot when AMC_TEST_SCREENSHOTS names a folder (for eyeballing)."""
    folder = os.environ.get("AMC_TEST_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__amcNoReload") == "still here"


def test_no_session_redirects_to_login_then_back(browser: Browser, gateway: str) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(gateway + "/fleet")
        expect(page).to_have_url(re.compile(r"/login\?next=%2Ffleet$"))
        page.fill("input[name=username]", ADMIN)
        page.fill("input[name=password]", "wrong password")
        page.click("button[type=submit]")
        expect(page.locator(".alert")).to_have_text("Wrong username or password.")
        log_in(page, gateway, "/fleet")
        expect(page.locator("h1")).to_have_text("Fleet")
    finally:
        context.close()


def test_running_task_badge_changes_without_reload(
    page: Page, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    host = make_host()
    tag = uuid.uuid4().hex[:8]
    task = operator.submit(f"Turn on dark theme {tag}", host_id=host.host_id)
    assignment = host.assignment()
    host.renew(assignment, 3, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")

    page.goto(f"{gateway}/tasks?q={tag}")
    row = page.locator(f"tr[data-task-id='{task.task_id}']")
    expect(row.locator("[data-field=progress]")).to_have_text("step 3 · acting · tap 'Display'")
    expect(row.locator("[data-field=attempt]")).to_have_text("attempt 1 of 3")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)

    host.renew(assignment, 4, types_pb2.STEP_STATUS_ACTING, "tap 'Dark theme'")
    expect(row.locator("[data-field=progress]")).to_have_text(
        "step 4 · acting · tap 'Dark theme'", timeout=LIVE_MS
    )
    expect(row.locator("[data-field=status]")).to_have_text("running")
    assert_not_reloaded(page)
    screenshot(page, "tasks")

    page.click(f"text=Turn on dark theme {tag}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    summary = page.locator(".summary")
    expect(summary.locator("[data-field=progress]")).to_have_text(
        "step 4 · acting · tap 'Dark theme'"
    )
    mark_no_reload(page)
    host.renew(assignment, 5, types_pb2.STEP_STATUS_SUCCEEDED, "tap 'Dark theme' done")
    expect(summary.locator("[data-field=progress]")).to_have_text(
        "step 5 · action done · tap 'Dark theme' done", timeout=LIVE_MS
    )
    host.finish(assignment, types_pb2.TASK_STATUS_SUCCEEDED, "Dark theme is on")
    expect(page.locator(".summary [data-field=status]")).to_have_text("succeeded", timeout=LIVE_MS)
    expect(page.locator(".summary [data-field=result]")).to_have_text("Dark theme is on")
    expect(page.locator("a", has_text="Cancel task")).to_have_count(0)
    assert_not_reloaded(page)


def test_open_a_step_and_expand_its_thinking(
    page: Page, gateway: str, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    host = make_host()
    goal = unique("Open Display settings")
    task = operator.submit(goal, host_id=host.host_id)
    assignment = host.assignment()
    host.renew(assignment, 1, types_pb2.STEP_STATUS_PLANNING, "planning")

    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    expect(page.locator("[data-field=history-note]")).to_have_text(NO_DECISION_YET)
    mark_no_reload(page)

    first = host.decide(assignment, goal)  # the offline provider: a rationale, no thinking
    host.renew(assignment, 1, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")
    steps = page.locator("details.step")
    expect(steps).to_have_count(1, timeout=LIVE_MS)  # same step index, new step status

    # The offline provider never thinks; a provider with extended thinking returns readable
    # and redacted blocks. Append such a decision through the cloud's own decision-log store,
    # then report the step, as the cloud planner path would.
    thinking = Decision(
        tool_name="tap",
        arguments={"element_id": "e7"},
        action=types_pb2.Action(
            tap=types_pb2.TapAction(element_id="e7"),
            purpose="switch dark theme on",
            expected_outcome="the Dark theme switch is on",
        ),
        purpose="switch dark theme on",
        expected_outcome="the Dark theme switch is on",
        rationale="Display settings are open. Now the Dark theme switch.",
        thinking=[
            ThinkingBlock("The switch labelled Dark theme is e7; it is off."),
            ThinkingBlock("", redacted=True),
        ],
        usage=Usage(input_tokens=1500, output_tokens=120, thinking_tokens=80),
        provider="anthropic",
        model="claude-test",
        latency_s=1.25,
        forced_retry=True,
        system_prompt="system prompt text",
        user_prompt="user prompt text",
    )
    cloud.loop.run(
        decisions.append(
            cloud.server.store, host.host_id, task.task_id, assignment.attempt, thinking
        )
    )
    host.renew(assignment, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Dark theme'")
    expect(steps).to_have_count(2, timeout=LIVE_MS)  # the history refreshed itself
    assert_not_reloaded(page)

    step1, step2 = steps.nth(0), steps.nth(1)
    expect(step1.locator("> summary")).to_contain_text("step 1")
    expect(step1.locator("> summary")).to_contain_text(first.tool_name)
    step1.locator("> summary").click()
    expect(step1.locator("dd").first).to_have_text(first.rationale)
    step1.locator("details.thinking > summary").click()
    expect(step1.locator("details.thinking")).to_contain_text("no thinking for this step")

    expect(step2.locator("> summary")).to_contain_text("forced retry")
    step2.locator("> summary").click()
    thinking_box = step2.locator("details.thinking")
    expect(thinking_box.locator("pre")).not_to_be_visible()
    thinking_box.locator("> summary").click()
    expect(thinking_box.locator("pre")).to_have_text(
        "The switch labelled Dark theme is e7; it is off."
    )
    expect(thinking_box.locator(".redacted")).to_contain_text("redacted")
    expect(step2).to_contain_text("the Dark theme switch is on")
    prompts = step2.locator("details.prompts")
    expect(prompts.locator("pre").first).not_to_be_visible()
    prompts.locator("> summary").click()
    expect(prompts.locator("pre").first).to_have_text("system prompt text")

    screenshot(page, "task-detail")

    # A link to a step opens that step on a fresh page.
    other = page.context.new_page()
    other.goto(f"{gateway}/tasks/{task.task_id}#step-{first.decision_id}")
    expect(other.locator(f"#step-{first.decision_id}")).to_have_attribute("open", "")
    expect(other.locator("details.step").nth(1)).not_to_have_attribute("open", "")
    other.close()


def test_direct_transport_task_says_why_history_is_empty(
    page: Page, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    host = make_host(types_pb2.PLANNER_TRANSPORT_DIRECT)
    task = operator.submit(unique("Open the clock"), host_id=host.host_id)
    assignment = host.assignment()
    host.renew(assignment, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Clock'")
    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("[data-field=history-note]")).to_have_text(DIRECT_TRANSPORT)


def test_cancel_a_running_task_with_confirmation(
    page: Page, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    host = make_host()
    task = operator.submit(unique("Call mom"), host_id=host.host_id)
    assignment = host.assignment()
    host.renew(assignment, 1, types_pb2.STEP_STATUS_PERCEIVING, "looking")

    page.goto(f"{gateway}/tasks/{task.task_id}")
    page.click("text=Cancel task…")
    expect(page.locator("h1")).to_have_text("Cancel this task?")
    screenshot(page, "cancel")
    page.fill("input[name=reason]", "wrong phone")
    page.click("text=Yes, cancel the task")

    expect(page).to_have_url(f"{gateway}/tasks/{task.task_id}")
    status = page.locator(".summary [data-field=status]")
    expect(status).to_have_text("running · cancelling")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)

    revoked = host.expect("revoked").revoked
    assert revoked.reason == lease_service_pb2.REVOKE_REASON_CANCELLED
    host.finish(assignment, types_pb2.TASK_STATUS_CANCELLED, "stopped on request")
    expect(status).to_have_text("cancelled", timeout=LIVE_MS)
    assert_not_reloaded(page)


def test_keep_it_running_leaves_the_task_alone(
    page: Page, gateway: str, operator: Operator
) -> None:
    task = operator.submit(unique("Queued forever"), host_id="no-such-host")
    page.goto(f"{gateway}/tasks/{task.task_id}/cancel")
    page.click("text=No, keep it running")
    expect(page).to_have_url(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator(".summary [data-field=status]")).to_have_text("queued")
    assert operator.get(task.task_id).status == types_pb2.TASK_STATUS_QUEUED


def test_form_without_csrf_token_is_403(page: Page, gateway: str, operator: Operator) -> None:
    page.goto(f"{gateway}/tasks/new")
    goal = unique("Forged submit")
    page.fill("textarea[name=goal]", goal)
    page.fill("input[name=host_id]", "no-such-host")
    page.evaluate("document.querySelector('main input[name=csrf_token]').remove()")
    with page.expect_response(f"{gateway}/tasks/new") as response:
        page.click("main button[type=submit]")
    assert response.value.status == 403
    expect(page.locator(".alert")).to_contain_text("CSRF")

    # With the token the same form works: the cloud warns about the unknown host first, and
    # "Submit anyway" lands on the new task.
    page.goto(f"{gateway}/tasks/new")
    page.fill("textarea[name=goal]", goal)
    page.fill("input[name=host_id]", "no-such-host")
    page.click("main button[type=submit]")
    expect(page.locator("#submit-warnings")).to_contain_text(
        "host no-such-host has never connected to this cloud"
    )
    page.click("text=Submit anyway")
    expect(page.locator("h1")).to_have_text(goal)
    expect(page.locator(".summary [data-field=status]")).to_have_text("queued")


def test_fleet_shows_hosts_phones_and_transport(
    page: Page, gateway: str, make_host: HostFactory
) -> None:
    host = make_host(types_pb2.PLANNER_TRANSPORT_DIRECT)
    page.goto(f"{gateway}/fleet?page_size={WHOLE_FLEET}")
    card = page.locator(f"section[data-host-id='{host.host_id}']")
    expect(card).to_contain_text("connected")
    expect(card).to_contain_text("planner: direct")
    expect(card.locator("td").first).to_have_text("emu-1")
    # Today's spending counts what cloud/store/spend.py sums: every billed call, a direct
    # host's shipped decisions and failed decisions' calls too (it said "decisions planned by
    # the cloud").
    expect(page.locator("[data-field=spend-today] h2")).to_have_text(
        "Model spending today UTC, every billed model call: decisions planned by the cloud or "
        "shipped by direct-transport hosts, and failed decisions' calls"
    )
    screenshot(page, "fleet")


def test_fleet_shows_a_host_connect_then_disconnect_without_reload(
    page: Page, gateway: str, make_host: HostFactory
) -> None:
    page.goto(f"{gateway}/fleet?page_size={WHOLE_FLEET}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)

    host = make_host()
    card = page.locator(f"section[data-host-id='{host.host_id}']")
    state = card.locator("h2 .pill").first
    expect(state).to_have_text("connected", timeout=LIVE_MS)
    expect(card.locator("td").first).to_have_text("emu-1")
    seen = card.locator("time[data-field=last-seen]")
    expect(seen).to_have_text("now")
    screenshot(page, "fleet-live")

    host.close()
    expect(state).to_have_text("disconnected", timeout=LIVE_MS)
    expect(card).to_have_class(re.compile(r"\bdisconnected\b"))
    expect(seen).to_have_text(re.compile(r"^\d+s ago$"))
    assert_not_reloaded(page)


def test_a_page_of_the_fleet_takes_a_host_that_connects_onto_it_live(
    page: Page, gateway: str, cloud: Cloud
) -> None:
    """The fleet page pages (by id, as ListHosts); its live updates still place a host that
    connects: onto the first page, pushing the one there to the next page, when its id sorts
    first."""
    tag = uuid.uuid4().hex[:8]
    hosts: list[SimHost] = []

    def connect(host_id: str) -> SimHost:
        cloud_pki.write_host_cert(cloud.pki, host_id)
        host = SimHost(cloud.address, cloud.pki, host_id)
        hosts.append(host)
        host.connect()
        return host

    # First in the whole shared cloud's fleet, by code point: other tests' hosts that sort
    # early are "0-<hex tag>-…", and "0-0-" sorts before each of them ('-' < any hex digit).
    try:
        later = connect(f"0-0-{tag}-b")
        page.goto(f"{gateway}/fleet?page_size=1")
        cards = page.locator("#live-fleet section.host")
        expect(cards).to_have_count(1)
        expect(page.locator(f"section[data-host-id='{later.host_id}']")).to_be_visible()
        expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
        mark_no_reload(page)

        first = connect(f"0-0-{tag}-a")
        expect(page.locator(f"section[data-host-id='{first.host_id}']")).to_be_visible(
            timeout=LIVE_MS
        )
        expect(cards).to_have_count(1)
        expect(page.locator("#fleet-pager a[rel=next]")).to_be_visible()
        assert_not_reloaded(page)
    finally:
        for host in hosts:
            host.close()


def test_new_task_appears_on_the_first_page_without_reload(
    page: Page, gateway: str, operator: Operator
) -> None:
    page.goto(f"{gateway}/tasks")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)
    task = operator.submit(unique("Appears live"), host_id="no-such-host")
    row = page.locator(f"tr[data-task-id='{task.task_id}']")
    expect(row.locator("[data-field=status]")).to_have_text("queued", timeout=LIVE_MS)
    expect(row.locator("[data-field=attempt]")).to_have_text("not assigned yet (3 allowed)")
    assert_not_reloaded(page)


def test_task_page_shows_the_model_thinking_live(
    page: Page, gateway: str, operator: Operator, make_host: HostFactory, cloud: Cloud
) -> None:
    """Thinking enters through the cloud's real event bus, as the Decide service's streaming
    model call publishes it (that source is tested against the Anthropic SDK in
    tests/cloud/test_planner_sessions.py; this console stack plans offline, which does not
    stream): WatchProgress(include_thinking) → SSE `thinking` events → live.js."""
    host = make_host()
    task = operator.submit(unique("Turn on dark theme"), host_id=host.host_id)
    assignment = host.assignment()
    host.renew(assignment, 1, types_pb2.STEP_STATUS_PLANNING, "asking the model")
    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    box = page.locator("#live-thinking")
    expect(box).to_be_hidden()
    mark_no_reload(page)

    def think(delta: str) -> None:
        bus = cloud.server.bus
        cloud.loop.loop.call_soon_threadsafe(bus.thinking, task.task_id, assignment.attempt, delta)

    think("The Settings list is open; ")
    think("Display is second <b>from</b> the top.")
    expect(box).to_be_visible(timeout=LIVE_MS)
    expect(box.locator("[data-field=thinking]")).to_have_text(
        "The Settings list is open; Display is second <b>from</b> the top.", timeout=LIVE_MS
    )
    screenshot(page, "live-thinking")

    # The step is decided and acted on: the live text gives way to the stored record.
    host.renew(assignment, 1, types_pb2.STEP_STATUS_ACTING, "tap 'Display'")
    expect(box).to_be_hidden(timeout=LIVE_MS)
    assert_not_reloaded(page)


def test_a_form_posted_after_logging_out_elsewhere_leads_to_the_login_and_back(
    page: Page, gateway: str, operator: Operator
) -> None:
    """Logging out in one tab (or the console restarting, which ends every session) took the
    session's CSRF token with it, so the cancel confirmation still open in another tab
    answered "403 missing or invalid CSRF token": nothing happened, and the page blamed a
    token instead of saying the operator must log in again. A form posted without a session
    now leads to the login and back to the page it was posted from; nothing is done."""
    task = operator.submit(unique("Queued forever"), host_id="no-such-host")
    page.goto(f"{gateway}/tasks/{task.task_id}/cancel")
    other = page.context.new_page()
    other.goto(f"{gateway}/tasks")
    other.click("text=Log out")
    expect(other).to_have_url(re.compile(r"/login$"))
    other.close()

    page.fill("input[name=reason]", "stale tab")
    page.click("text=Yes, cancel the task")
    expect(page.locator("h1")).to_have_text("Log in")
    assert operator.get(task.task_id).status == types_pb2.TASK_STATUS_QUEUED
    page.fill("input[name=username]", ADMIN)
    page.fill("input[name=password]", PASSWORD)
    page.click("main button[type=submit]")
    expect(page).to_have_url(f"{gateway}/tasks/{task.task_id}/cancel")
    expect(page.locator("h1")).to_have_text("Cancel this task?")
    # What was typed comes back (the browser's own Origin marks the post as the console's).
    expect(page.locator("#cancel-restored")).to_contain_text("Not cancelled yet")
    expect(page.locator("input[name=reason]")).to_have_value("stale tab")
    assert operator.get(task.task_id).status == types_pb2.TASK_STATUS_QUEUED


def test_an_ended_task_can_be_submitted_again_from_its_page(
    page: Page, gateway: str, operator: Operator, make_host: HostFactory
) -> None:
    """A task that failed (or was cancelled, or succeeded) could only be run again by typing
    its goal and target into the submit form anew: its page had no way to retry it. "Submit
    again…" opens the form filled in from the task (goal, host, phone, attempts, no replay),
    and submitting it queues a new task; the ended one stays as it was."""
    host = make_host()
    goal = unique("Turn on airplane mode")
    task = operator.submit(goal, host_id=host.host_id, max_attempts=1)
    assignment = host.assignment()
    host.finish(assignment, types_pb2.TASK_STATUS_FAILED, "airplane mode switch not found")
    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator(".summary [data-field=status]")).to_have_text("failed")
    page.click("text=Submit again…")
    expect(page.locator("h1")).to_have_text("Submit a task")
    expect(page.locator("textarea[name=goal]")).to_have_value(goal)
    expect(page.locator("input[name=host_id]")).to_have_value(host.host_id)
    expect(page.locator("input[name=max_attempts]")).to_have_value("1")
    page.click("main button[type=submit]")
    expect(page.locator("h1")).to_have_text(goal)
    expect(page).not_to_have_url(f"{gateway}/tasks/{task.task_id}")
    again = host.assignment()
    assert again.task_id != task.task_id and again.goal == goal
    assert operator.get(task.task_id).status == types_pb2.TASK_STATUS_FAILED
    # A running task has nothing to submit again yet; once it ends, the link appears live.
    page.goto(f"{gateway}/tasks/{again.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    expect(page.locator("text=Submit again…")).to_have_count(0)
    host.finish(again, types_pb2.TASK_STATUS_FAILED, "still not found")
    expect(page.locator("a[data-field=again]")).to_have_attribute(
        "href", f"/tasks/new?again={again.task_id}", timeout=LIVE_MS
    )
    # An unknown task is the cloud's 404; what is not a task id at all is the gateway's 422.
    response = page.goto(f"{gateway}/tasks/new?again={'0' * 32}")
    assert response is not None and response.status == 404
    response = page.goto(f"{gateway}/tasks/new?again=no-such-task")
    assert response is not None and response.status == 422


def test_a_host_field_suggests_the_hosts_whose_id_holds_what_is_typed(
    page: Page, gateway: str, cloud: Cloud
) -> None:
    """The submit form's host field no longer lists the whole fleet: it starts with one page
    of hosts, and as the operator types it suggests the hosts whose id holds the text (and
    their phones in the phone field), fetched as it goes, without a reload."""
    tag = uuid.uuid4().hex[:8]
    hosts: list[SimHost] = []
    try:
        for name in ("a", "b"):
            host_id = f"pick-{tag}-{name}"
            cloud_pki.write_host_cert(cloud.pki, host_id)
            hosts.append(SimHost(cloud.address, cloud.pki, host_id, serials=(f"ph-{tag}-{name}",)))
            hosts[-1].connect()
        page.goto(f"{gateway}/tasks/new")
        mark_no_reload(page)
        page.locator("input[name=host_id]").press_sequentially(tag.upper())
        options = page.locator("#host-ids option")
        expect(options).to_have_count(2, timeout=LIVE_MS)
        assert [options.nth(i).get_attribute("value") for i in range(2)] == [
            h.host_id for h in hosts
        ]
        phones = page.locator("#phone-serials option")
        expect(phones).to_have_count(2)
        assert phones.nth(1).get_attribute("value") == f"ph-{tag}-b"
        expect(page.locator("input[name=host_id]")).to_be_focused()
        assert_not_reloaded(page)
    finally:
        for host in hosts:
            host.close()


def test_a_new_step_fetches_the_steps_after_the_last_shown_not_the_page(
    page: Page, gateway: str, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """A running task's page fetched itself whole on every live change (its whole decision log
    with it: 13 kB a step and growing). A step of the attempt it shows now fetches that
    attempt's card and its steps from the last one shown on: the new step is appended in
    order, an open step stays open, focus stays, and the verdict counts follow."""
    host = make_host()
    goal = unique("Open Display settings")
    task = operator.submit(goal, host_id=host.host_id)
    assignment = host.assignment()
    for n in (1, 2):
        host.decide(assignment, goal)
        host.renew(assignment, n, types_pb2.STEP_STATUS_ACTING, f"step {n}")

    page.goto(f"{gateway}/tasks/{task.task_id}")
    steps = page.locator(f"#steps-{assignment.attempt} details.step")
    expect(steps).to_have_count(2)
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)
    fetched: list[str] = []
    page.on("request", lambda r: fetched.append(r.url) if r.resource_type == "fetch" else None)
    steps.nth(0).locator("> summary").click()
    page.locator(".step-no").nth(1).focus()

    host.decide(assignment, goal)
    host.renew(assignment, 3, types_pb2.STEP_STATUS_ACTING, "step 3")
    expect(steps).to_have_count(3, timeout=LIVE_MS)
    expect(steps.nth(2).locator("> summary")).to_contain_text("step 3")
    expect(steps.nth(0)).to_have_attribute("open", "")
    expect(page.locator(".step-no").nth(1)).to_be_focused()
    assert_not_reloaded(page)
    drawn = page.context.new_page()  # the counts as the server draws them over every step
    drawn.goto(f"{gateway}/tasks/{task.task_id}")
    expected = " ".join(drawn.locator(".verdict-counts").inner_text().split())
    expect(page.locator(f"#steps-{assignment.attempt} .verdict-counts")).to_have_text(expected)
    page_url = f"{gateway}/tasks/{task.task_id}"
    assert page_url not in fetched, fetched
    assert any(
        u.startswith(f"{page_url}/live?attempt={assignment.attempt}&after_step=") for u in fetched
    ), fetched


def test_the_first_tab_offers_to_skip_the_header_to_the_page_s_content(
    page: Page, gateway: str
) -> None:
    """Every page put the header's six links and buttons before its own content, so a keyboard
    or screen-reader user tabbed through them on each page to reach a task's filter or form.
    The first Tab now lands on "Skip to content", shown while focused, which moves focus into
    the page's main content."""
    page.goto(f"{gateway}/tasks")
    page.keyboard.press("Tab")
    skip = page.locator(":focus")
    expect(skip).to_have_text("Skip to content")
    expect(skip).to_be_in_viewport()
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Submit a task")


def test_text_holding_unicode_line_separators_still_updates_the_page_live(
    page: Page, gateway: str, operator: Operator, make_host: HostFactory, cloud: Cloud
) -> None:
    """U+2028, U+2029 and U+0085 end a line for Python's str.splitlines but not for
    server-sent events, and JSON keeps them unescaped: an event holding one (a phone's label in
    the progress line, the model's thinking) went out as two `data:` lines, which the browser
    joins with a newline, inside a JSON string: the page's JSON.parse failed, and that change
    never showed."""
    host = make_host()
    task = operator.submit(unique("Read the label"), host_id=host.host_id)
    assignment = host.assignment()
    host.renew(assignment, 1, types_pb2.STEP_STATUS_PLANNING, "asking the model")
    page.goto(f"{gateway}/tasks/{task.task_id}")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    progress = page.locator(".summary [data-field=progress]")
    mark_no_reload(page)

    host.renew(assignment, 2, types_pb2.STEP_STATUS_ACTING, "tap 'Wi\u2028Fi\u0085on'")
    expect(progress).to_contain_text("step 2", timeout=LIVE_MS)
    assert progress.evaluate("e => e.textContent").endswith("tap 'Wi\u2028Fi\u0085on'")

    bus = cloud.server.bus
    cloud.loop.loop.call_soon_threadsafe(
        bus.thinking, task.task_id, assignment.attempt, "one\u2029two"
    )
    thinking = page.locator("#live-thinking [data-field=thinking]")
    expect(thinking).to_be_visible(timeout=LIVE_MS)
    assert thinking.evaluate("e => e.textContent") == "one\u2029two"
    assert_not_reloaded(page)


def test_a_long_task_page_shows_its_newest_steps_live_and_loads_prompts_when_opened(
    page: Page, gateway: str, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    """The task page shows an attempt's newest SHOWN_STEPS steps (it rendered all of them, with
    every prompt inline: 600 steps made a 5 MB page). A new step still appears live, the
    verdict counts stay the whole attempt's (the earlier steps' counted in), and a step's
    prompts arrive when its "Prompts" is opened."""
    host = make_host()
    goal = unique("Open Display settings, at length")
    task = operator.submit(goal, host_id=host.host_id)
    assignment = host.assignment()

    def step(n: int) -> None:
        cloud.loop.run(
            decisions.append(
                cloud.server.store, host.host_id, task.task_id, assignment.attempt, long_step(n)
            )
        )
        host.renew(assignment, n, types_pb2.STEP_STATUS_ACTING, f"step {n}")

    for n in range(1, SHOWN_STEPS + 3):
        step(n)
    page.goto(f"{gateway}/tasks/{task.task_id}")
    steps = page.locator(f"#steps-{assignment.attempt} details.step")
    expect(steps).to_have_count(SHOWN_STEPS)
    expect(steps.nth(0).locator("> summary")).to_contain_text("step 3")
    expect(page.locator(f"#earlier-{assignment.attempt}")).to_contain_text("2 earlier steps")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    mark_no_reload(page)

    step(SHOWN_STEPS + 3)
    expect(steps).to_have_count(SHOWN_STEPS + 1, timeout=LIVE_MS)
    newest = steps.nth(SHOWN_STEPS)
    expect(newest.locator("> summary")).to_contain_text(f"step {SHOWN_STEPS + 3}")
    assert_not_reloaded(page)
    drawn = page.context.new_page()  # the counts as the server draws them over every step
    drawn.goto(f"{gateway}/tasks/{task.task_id}")
    expected = " ".join(drawn.locator(".verdict-counts").inner_text().split())
    assert f"{SHOWN_STEPS + 3} not checked yet" in expected
    expect(page.locator(f"#steps-{assignment.attempt} .verdict-counts")).to_have_text(expected)

    newest.locator("> summary").click()
    prompts = newest.locator("details.prompts")
    prompts.locator("> summary").click()
    expect(prompts.locator("pre").first).to_have_text("s")
    expect(prompts.locator("pre").nth(1)).to_have_text("u")

    # The earlier steps are a page of their own, whose steps open and load their prompts too.
    page.locator(f"#earlier-{assignment.attempt} a").click()
    expect(page.locator("h1")).to_have_text(f"Attempt {assignment.attempt}, steps 1 to 2")
    first = page.locator("details.step").first
    expect(first.locator("> summary")).to_contain_text("step 1")
    first.locator("> summary").click()
    first.locator("details.prompts > summary").click()
    expect(first.locator("details.prompts pre").nth(1)).to_have_text("u")


def test_a_viewer_sees_no_submit_or_cancel_control_not_even_once_a_task_ends(
    browser: Browser, gateway: str, operator: Operator
) -> None:
    """A viewer login's pages draw no Submit link and no Cancel button, and live.js, which
    adds "Submit again…" to a task page when its task ends, adds none to a viewer's."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        page.goto(gateway + "/tasks")
        page.fill("input[name=username]", VIEWER)
        page.fill("input[name=password]", VIEWER_PASSWORD)
        page.click("button[type=submit]")
        expect(page).to_have_url(re.compile(re.escape(gateway + "/tasks") + "$"))
        expect(page.locator("header")).to_contain_text("(viewer)")
        expect(page.locator('a[href^="/tasks/new"]')).to_have_count(0)

        task = operator.submit(unique("Watched by a viewer"), host_id="no-such-host")
        page.goto(f"{gateway}/tasks/{task.task_id}")
        status = page.locator(".summary [data-field=status]")
        expect(status).to_have_text("queued")
        expect(page.locator("[data-field=cancel]")).to_have_count(0)
        expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        with httpx.Client(base_url=gateway, headers=headers, timeout=20) as api:
            cancelled = api.post(f"/api/tasks/{task.task_id}/cancel", json={"reason": "test"})
            assert cancelled.status_code == 200, cancelled.text
        expect(status).to_have_text("cancelled", timeout=LIVE_MS)
        expect(page.locator("[data-field=again]")).to_have_count(0)
        expect(page.locator('a[href^="/tasks/new"]')).to_have_count(0)
    finally:
        context.close()


def test_a_live_page_whose_session_ended_in_another_tab_says_so_and_links_the_login(
    page: Page, gateway: str
) -> None:
    """Logging out in another tab (or the console restarting) closes a live page's stream,
    which said only "disconnected — reload the page". It now says the operator is logged out
    and links the login, which leads back to this page."""
    page.goto(f"{gateway}/fleet?page_size=5")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
    other = page.context.new_page()
    other.goto(f"{gateway}/tasks")
    other.click("text=Log out")
    expect(other).to_have_url(re.compile(r"/login$"))
    other.close()

    expect(page.locator("#live-state")).to_have_text("logged out — log in again", timeout=LIVE_MS)
    page.locator("[data-field=log-in-again]").click()
    page.fill("input[name=username]", ADMIN)
    page.fill("input[name=password]", PASSWORD)
    page.click("main button[type=submit]")
    expect(page).to_have_url(f"{gateway}/fleet?page_size=5")
    expect(page.locator("#live-state")).to_have_text("live", timeout=LIVE_MS)
