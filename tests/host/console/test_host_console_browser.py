"""The host console in a real browser: Debian's headless Chromium driven by Playwright (sync).

The app runs under a real uvicorn server in a thread on 127.0.0.1 port 0, over the store the
real agent loop filled; the browser logs in with the one-time token and reads the timeline.
Playwright never downloads a browser here: it drives `/usr/bin/chromium`.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi import FastAPI
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from host.console import ConsoleServer, HostConsoleSettings, create_app, serve_console
from host.runner import build_host, serve_host, start_virtual_phones
from host.timeline.store import TimelineStore
from tests.host.console.host_console_support import (
    DARK,
    HOST_ID,
    LONG_STEPS,
    SECRET,
    T_DARK,
    T_LEGACY,
    T_LONG,
    T_SECRET,
    WITHIN_S,
    Filled,
    Gate,
    StoreOnly,
    UvicornThread,
    fill_long_attempt,
    host_settings,
    long_step,
)
from tests.host.lease_fake import start_fake_cloud
from tests.support.browser import PageReport, overflow_x
from tests.support.loop_thread import LoopThread

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Where a copy of the timeline screenshot goes for a person to look at (optional).
SCREENSHOT_COPY_ENV = "AMC_HOST_CONSOLE_SCREENSHOT"
#: Generous upper bound for a live change to show (a bound, not a timing assertion).
LIVE_MS = 15_000
T = TypeVar("T")


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture(scope="module")
def served(filled: Filled) -> Iterator[tuple[str, FastAPI]]:
    """(base URL, app) of the console served by a real uvicorn in a thread."""
    app = create_app(filled.state)
    server = UvicornThread(app)
    base = server.start()
    try:
        yield base, app
    finally:
        server.stop()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


def _token(served: tuple[str, FastAPI]) -> str:
    token: str = served[1].state.login_token.current
    return token


def log_in(page: Page, served: tuple[str, FastAPI], path: str) -> None:
    """Open `path`, get sent to the login form, log in with the current token, land on `path`."""
    base = served[0]
    page.goto(base + path)
    expect(page).to_have_url(re.compile(re.escape(base) + r"/login\?next="))
    page.fill("input[name=token]", _token(served))
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(re.escape(base + path) + "$"))


def _loaded_width(page: Page, selector: str) -> int:
    img = page.locator(selector)
    img.scroll_into_view_if_needed()
    page.wait_for_function(
        "(sel) => { const i = document.querySelector(sel); return i && i.complete; }",
        arg=selector,
    )
    width: int = img.evaluate("(i) => i.naturalWidth")
    return width


def test_timeline_shows_before_and_after_screenshots(
    page: Page, served: tuple[str, FastAPI], filled: Filled, tmp_path: Path
) -> None:
    log_in(page, served, f"/tasks/{T_DARK}")
    expect(page.locator("h1")).to_have_text("Turn on dark theme")
    steps = page.locator("section.step")
    expect(steps).to_have_count(len(filled.store.steps(T_DARK, 1)))

    step = page.locator("#step-3")
    expect(step.locator(".line")).to_have_text("tap 'Display'")
    for which in ("before", "after"):
        width = _loaded_width(page, f"#step-3 img[data-shot={which}]")
        assert width > 0, f"{which} screenshot did not load"
    # Before and after are different screens (the tap opened the Display page).
    before = step.locator("img[data-shot=before]").get_attribute("src")
    after = step.locator("img[data-shot=after]").get_attribute("src")
    assert before != after

    # Thinking is collapsed until opened; the redacted block says so.
    thinking = step.locator("details.thinking")
    expect(thinking.locator(".redacted")).to_be_hidden()
    thinking.locator("summary").click()
    expect(thinking.locator(".redacted")).to_be_visible()
    expect(thinking).to_contain_text("the row is there")

    prompts = step.locator("details.prompts")
    prompts.locator("summary").click()
    expect(prompts).to_contain_text("Turn on dark theme")

    # The get_ui_tree step: a tree of nodes that opens, with the full JSON below it.
    tree = page.locator("#step-2 details.ui-tree")
    expect(tree).to_have_attribute("open", "")
    first_branch = tree.locator("ul.tree details").first
    first_branch.locator("summary").first.click()
    expect(first_branch.locator("ul li").first).to_be_visible()
    expect(tree.locator("pre.tree-json")).to_contain_text('"id"')

    step.scroll_into_view_if_needed()
    shot = tmp_path / "timeline.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 0
    copy = os.environ.get(SCREENSHOT_COPY_ENV)
    if copy:
        shutil.copy(shot, copy)


def test_secret_is_dots_in_the_browser(page: Page, served: tuple[str, FastAPI]) -> None:
    log_in(page, served, f"/tasks/{T_SECRET}")
    expect(page.locator("#step-3 .line")).to_have_text("type •••")
    assert SECRET not in page.content()


def test_legacy_record_renders_with_its_one_screenshot(
    page: Page, served: tuple[str, FastAPI]
) -> None:
    log_in(page, served, f"/tasks/{T_LEGACY}")
    expect(page.locator("#step-1 .noshot")).to_have_text("no screenshot recorded")
    assert _loaded_width(page, "#step-1 img[data-shot=after]") > 0


def test_now_page_polls_and_tasks_link_to_timelines(
    page: Page, served: tuple[str, FastAPI]
) -> None:
    log_in(page, served, "/now")
    expect(page.locator("#live-state")).to_have_attribute("data-state", "on")
    expect(page.locator("#phones")).to_contain_text("no cloud connection configured")
    page.click("nav a[href='/tasks']")
    page.click(f"tr[data-task-id='{T_DARK}'] td.goal a")
    expect(page.locator("h1")).to_have_text("Turn on dark theme")


def test_a_poll_refused_for_an_ended_session_says_so_and_links_the_login(
    page: Page, served: tuple[str, FastAPI]
) -> None:
    """The session ends (here its cookie is gone: as after a logout in another tab or a console
    restart): the next poll is refused 401, and the page says "session ended — log in again",
    linked to the login that brings the operator back to it, and stays. Before, it reloaded at
    once and the login form came up with no word of why."""
    base = served[0]
    log_in(page, served, "/now")
    expect(page.locator("#live-state")).to_have_attribute("data-state", "on")
    page.context.clear_cookies()
    state = page.locator("#live-state")
    expect(state).to_have_text("session ended — log in again", timeout=LIVE_MS)
    expect(state).to_have_attribute("data-state", "off")
    link = state.locator("a[data-field=log-in-again]")
    expect(link).to_have_attribute("href", "/login?next=%2Fnow")
    expect(page).to_have_url(base + "/now")
    link.click()
    page.fill("input[name=token]", _token(served))
    page.click("button[type=submit]")
    expect(page).to_have_url(base + "/now")


class LiveHost:
    """A real host and its console in their own event loop on a thread (as `amc host run
    --console` runs them), fed by the in-test LeaseService, for the browser to watch."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.thread = LoopThread("live-host")
        self.loop = self.thread.loop
        self.stop_event: asyncio.Event | None = None
        self.planner: Gate | None = None
        self.console: ConsoleServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._cleanup: list[Callable[[], Awaitable[None]]] = []
        self.call(self._start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.thread.run(coro, WITHIN_S)

    async def _start(self) -> None:
        cloud = await start_fake_cloud(self.tmp_path / "pki", HOST_ID)
        self._cleanup.append(lambda: cloud.server.stop(grace=None))
        self.fake = cloud.cloud
        virtual, settings = start_virtual_phones(
            host_settings(self.tmp_path, cloud.port, cloud.pki_dir)
        )
        self._cleanup.append(lambda: asyncio.to_thread(virtual.stop))
        self.planner = Gate(list(DARK))
        app = build_host(settings, planner=self.planner)
        self.app = app
        self.stop_event = asyncio.Event()
        ready: asyncio.Future[ConsoleServer] = asyncio.get_running_loop().create_future()
        self._tasks.append(asyncio.create_task(serve_host(app, self.stop_event)))
        self._tasks.append(
            asyncio.create_task(
                serve_console(
                    app,
                    HostConsoleSettings(bind_port=0),
                    stop=self.stop_event,
                    announce=lambda _: None,
                    ready=ready.set_result,
                )
            )
        )
        self.console = await asyncio.wait_for(ready, WITHIN_S)
        await asyncio.wait_for(app.lease.wait_connected(), WITHIN_S)

    def assign(self, task_id: str, serial: str, goal: str) -> None:
        self.call(self.fake.assign(task_id, serial, goal))

    def think(self, task_id: str, attempt: int, delta: str) -> None:
        """Feed live thinking as a streaming session planner on this host would."""
        self.loop.call_soon_threadsafe(self.app.thinking.sink(task_id, attempt), delta)

    def open_gate(self) -> None:
        assert self.planner is not None
        self.loop.call_soon_threadsafe(self.planner.opened.set)

    async def _stop(self) -> None:
        if self.planner is not None:
            self.planner.opened.set()
        if self.stop_event is not None:
            self.stop_event.set()
        for task in self._tasks:
            await task
        for cleanup in reversed(self._cleanup):
            await cleanup()

    def close(self) -> None:
        try:
            self.call(self._stop())
        finally:
            self.thread.stop(WITHIN_S)


@pytest.fixture
def live_host(tmp_path: Path) -> Iterator[LiveHost]:
    host = LiveHost(tmp_path)
    try:
        yield host
    finally:
        host.close()


def test_now_and_timeline_update_live_while_a_task_runs(page: Page, live_host: LiveHost) -> None:
    console = live_host.console
    assert console is not None
    base = console.url
    page.goto(base + "/now")
    page.fill("input[name=token]", console.login_token.current)
    page.click("button[type=submit]")
    expect(page).to_have_url(base + "/now")
    row = page.locator("tr[data-serial='emulator-5556']")
    expect(row).to_contain_text("idle")
    page.evaluate("window.__notReloaded = true")

    live_host.assign("live-b1", "emulator-5556", "Turn on dark theme")
    expect(row).to_contain_text("step 2 · planning", timeout=LIVE_MS)
    expect(row).to_contain_text("Turn on dark theme")
    assert page.evaluate("window.__notReloaded === true")

    # Open the running task: one step so far, then the rest arrive without a reload.
    row.locator("a").click()
    expect(page.locator("[data-field=status]")).to_have_text("running")
    expect(page.locator("section.step")).to_have_count(1)
    page.locator("#step-1 details.prompts summary").click()  # opened, and must stay open
    page.evaluate("window.__notReloaded = true")
    # While step 2 is planned, the model's streamed thinking shows (direct session mode).
    thinking = page.locator("[data-field=thinking-box]")
    expect(thinking).to_be_hidden()
    live_host.think("live-b1", 1, "Display is the second row; ")
    live_host.think("live-b1", 1, "tap it.")
    expect(thinking).to_be_visible(timeout=LIVE_MS)
    expect(page.locator("[data-field=thinking]")).to_have_text(
        "Display is the second row; tap it.", timeout=LIVE_MS
    )
    # The console unreachable (its polls fail): the page says so instead of looking live,
    # and says "running" again once a poll gets through.
    note = page.locator("[data-field=live-note]")
    expect(note).to_have_text("Running: new steps appear below as the host records them.")
    page.route("**/live?*", lambda route: route.abort())
    expect(note).to_contain_text("Offline: this console cannot be reached", timeout=LIVE_MS)
    page.unroute("**/live?*")
    expect(note).to_have_text(
        "Running: new steps appear below as the host records them.", timeout=LIVE_MS
    )
    live_host.open_gate()
    expect(page.locator("section.step")).to_have_count(4, timeout=LIVE_MS)
    expect(page.locator("[data-field=status]")).to_have_text("succeeded", timeout=LIVE_MS)
    expect(note).to_contain_text("Ended: ")
    expect(thinking).to_be_hidden()  # the live view is gone with the attempt
    assert page.evaluate("window.__notReloaded === true")
    expect(page.locator("#step-1 details.prompts")).to_have_attribute("open", "")
    for which in ("before", "after"):
        assert _loaded_width(page, f"#step-3 img[data-shot={which}]") > 0


def test_the_tap_marker_sits_on_the_tapped_element_and_no_page_breaks_the_policy(
    browser: Browser, served: tuple[str, FastAPI]
) -> None:
    """The tap is drawn where it landed (the marker's centre over the element's centre in the
    rendered screenshot), and every page loads inside the console's Content-Security-Policy:
    the favicon is a file now, not a `data:` URL the policy refused on every page."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    report = PageReport(context.new_page())
    page = report.page
    try:
        log_in(page, served, f"/tasks/{T_DARK}")
        for path in ("/now", "/tasks", f"/tasks/{T_SECRET}", f"/tasks/{T_DARK}"):
            page.goto(served[0] + path)
            expect(page.locator("h1").first).to_be_visible()
            assert report.violations() == [], path
        _loaded_width(page, "#step-3 img[data-shot=before]")
        tap = served[1].state.host.store.steps(T_DARK, 1)[2]  # what this console serves
        x, y = tap.result["point"]
        img = page.locator("#step-3 img[data-shot=before]").bounding_box()
        dot = page.locator("#step-3 svg.marker circle").first.bounding_box()
        assert img is not None and dot is not None
        # The screenshot is drawn "contain" inside its box: its scale and offsets.
        natural = page.locator("#step-3 img[data-shot=before]").evaluate(
            "(i) => [i.naturalWidth, i.naturalHeight]"
        )
        scale = min(img["width"] / natural[0], img["height"] / natural[1])
        left = img["x"] + (img["width"] - natural[0] * scale) / 2
        top = img["y"] + (img["height"] - natural[1] * scale) / 2
        centre = (dot["x"] + dot["width"] / 2, dot["y"] + dot["height"] / 2)
        assert abs(centre[0] - (left + x * scale)) < 3
        assert abs(centre[1] - (top + y * scale)) < 3
        report.assert_clean()
    finally:
        context.close()


def test_at_390_px_the_pages_fit_and_the_tasks_table_becomes_cards(
    browser: Browser, served: tuple[str, FastAPI]
) -> None:
    """A phone held upright (390 px) scrolled the host console sideways: the tasks table's
    eight columns made the page 703 px wide, and a step's screenshots and OCR bounds widened
    its one-column grid past the screen. The tasks table now becomes labelled cards, as the
    cloud console's do, and every step (each of its details opened) fits."""
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True
    )
    report = PageReport(context.new_page())
    page = report.page
    try:
        log_in(page, served, "/tasks")
        row = page.locator(f"tr[data-task-id='{T_DARK}']")
        expect(row).to_have_css("display", "block")
        expect(page.locator("table.tasks thead")).to_have_css("display", "none")
        assert overflow_x(page) == 0, "/tasks"
        for path in ("/now", f"/tasks/{T_DARK}", f"/tasks/{T_SECRET}", f"/tasks/{T_LEGACY}"):
            page.goto(served[0] + path)
            expect(page.locator("h1").first).to_be_visible()
            page.evaluate(
                "document.querySelectorAll('details:not(.prompts)')"
                ".forEach(d => { d.open = true; })"
            )
            assert overflow_x(page) == 0, path
        report.assert_clean()
    finally:
        context.close()


def test_the_phones_show_the_host_paused_while_its_data_folder_cannot_be_written(
    page: Page, live_host: LiveHost
) -> None:
    """While the host cannot write its data folder it takes no work and the cloud hears every
    phone OFFLINE, yet its own page showed them online and idle, with nothing saying why no
    task came. The panel now says the host is paused and why, each phone "paused"; once a
    write works again they are online."""
    console = live_host.console
    folder = live_host.app.lease.data_folder
    assert console is not None and folder is not None
    page.goto(console.url + "/now")
    page.fill("input[name=token]", console.login_token.current)
    page.click("button[type=submit]")
    row = page.locator("tr[data-serial='emulator-5554']")
    expect(row.locator(".pill")).to_have_text("online")

    why = folder.failed(HOST_ID, "[Errno 28] No space left on device")
    paused = page.locator("[data-field=paused]")
    expect(paused).to_have_text(f"No phone takes work: {why}", timeout=LIVE_MS)
    expect(row.locator(".pill")).to_have_text("paused")

    assert folder.probe()  # the folder (the test's tmp_path) takes the write
    expect(paused).to_have_count(0, timeout=LIVE_MS)
    expect(row.locator(".pill")).to_have_text("online")


def test_a_long_running_attempt_shows_its_newest_steps_live_and_loads_prompts_when_opened(
    page: Page, tmp_path: Path
) -> None:
    """A running attempt of 62 steps: the page shows the newest 50 (no prompt in it), a step's
    prompts load when opened, a 63rd step arrives live, and the 12 earlier ones are a page of
    their own whose steps' prompts load the same way."""
    store = TimelineStore(tmp_path / "timeline.sqlite3", tmp_path / "artifacts")
    fill_long_attempt(store)
    app = create_app(StoreOnly(store))
    server = UvicornThread(app)
    base = server.start()
    try:
        log_in(page, (base, app), f"/tasks/{T_LONG}")
        steps = page.locator("section.step")
        expect(steps).to_have_count(50)
        expect(page.locator("#step-13")).to_have_count(1)
        assert "prompt of step" not in page.content()
        prompts = page.locator("#step-62 details.prompts")
        prompts.locator("summary").click()
        expect(prompts.locator(".prompts-body")).to_contain_text("user prompt of step 62")
        expect(prompts.locator(".prompts-body")).to_contain_text("system prompt of step 62")

        page.evaluate("window.__notReloaded = true")
        store.append_step(long_step(LONG_STEPS + 1))
        expect(steps).to_have_count(51, timeout=LIVE_MS)
        expect(page.locator("[data-field=steps]")).to_have_text(str(LONG_STEPS + 1))
        # The summary's counts and cost follow it (step 63 is a third: not met).
        expect(page.locator("[data-field=verdict-counts]")).to_contain_text("21 not met")
        expect(page.locator("[data-field=cost]")).to_have_text("756 tokens · $0.0630")
        assert page.evaluate("window.__notReloaded === true")
        expect(prompts).to_have_attribute("open", "")  # still open, still loaded
        expect(prompts).to_contain_text("user prompt of step 62")
        fresh = page.locator("#step-63 details.prompts")
        fresh.locator("summary").click()
        expect(fresh).to_contain_text("user prompt of step 63")

        page.locator("[data-field=earlier] a").click()
        expect(page.locator("h1")).to_have_text("Attempt 1, steps 1 to 12")
        expect(steps).to_have_count(12)
        early = page.locator("#step-5 details.prompts")
        early.locator("summary").click()
        expect(early).to_contain_text("user prompt of step 5")
        expect(early).not_to_contain_text("prompt of step 6")
    finally:
        server.stop()
        store.close()
