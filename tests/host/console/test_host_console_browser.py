"""The host console in a real browser: Debian's headless Chromium driven by Playwright (sync).

The app runs under a real uvicorn server in a thread on 127.0.0.1 port 0, over the store the
real agent loop filled; the browser logs in with the one-time token and reads the timeline.
Playwright never downloads a browser here: it drives `/usr/bin/chromium`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from host.console import create_app
from tests.host.console.host_console_support import (
    SECRET,
    T_DARK,
    T_LEGACY,
    T_SECRET,
    Filled,
    UvicornThread,
)

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
def served(filled: Filled) -> Iterator[tuple[str, object]]:
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


def _token(served: tuple[str, object]) -> str:
    token: str = served[1].state.login_token.current  # type: ignore[attr-defined]
    return token


def log_in(page: Page, served: tuple[str, object], path: str) -> None:
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
    page: Page, served: tuple[str, object], filled: Filled, tmp_path: Path
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


def test_secret_is_dots_in_the_browser(page: Page, served: tuple[str, object]) -> None:
    log_in(page, served, f"/tasks/{T_SECRET}")
    expect(page.locator("#step-3 .line")).to_have_text("type •••")
    assert SECRET not in page.content()


def test_legacy_record_renders_with_its_one_screenshot(
    page: Page, served: tuple[str, object]
) -> None:
    log_in(page, served, f"/tasks/{T_LEGACY}")
    expect(page.locator("#step-1 .noshot")).to_have_text("no screenshot recorded")
    assert _loaded_width(page, "#step-1 img[data-shot=after]") > 0


def test_now_page_polls_and_tasks_link_to_timelines(page: Page, served: tuple[str, object]) -> None:
    log_in(page, served, "/now")
    expect(page.locator("#live-state")).to_have_attribute("data-state", "on")
    expect(page.locator("#phones")).to_contain_text("no cloud connection configured")
    page.click("nav a[href='/tasks']")
    page.click(f"tr[data-task-id='{T_DARK}'] td.goal a")
    expect(page.locator("h1")).to_have_text("Turn on dark theme")
