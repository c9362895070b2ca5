"""The report in a real browser (Debian's headless Chromium through Playwright): every step is
there with its pictures loaded, the masked text shows as "•••", and opening it makes no
request at all (its images are data URIs, its style inline)."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, Request, Route, sync_playwright

from export.bundle import bundle_bytes
from export.run import Run
from host.timeline.export_source import run_from_timeline
from tests.export.conftest import HOST, T_GESTURES, Timeline
from tests.host.console.host_console_support import SECRET, T_DARK, T_SECRET

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


@pytest.fixture(scope="module")
def playwright(timeline: Timeline) -> Iterator[Playwright]:
    """Playwright's sync API keeps an event loop running in this thread, so the timeline (whose
    agent-loop runs use `asyncio.run`) is filled first."""
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    try:
        yield browser
    finally:
        browser.close()


def report_file(run: Run, folder: Path) -> Path:
    with zipfile.ZipFile(io.BytesIO(bundle_bytes(run))) as z:
        path = folder / "report.html"
        path.write_bytes(z.read("report.html"))
    return path


def visit(browser: Browser, path: Path, check: Callable[[Page], None]) -> list[str]:
    """Open `path`, run `check` on the page, and return every request that left the file
    (those to http(s) are refused before they reach the network)."""
    context = browser.new_context()
    requests: list[str] = []

    def refuse(route: Route) -> None:
        route.abort()

    def seen(request: Request) -> None:
        requests.append(request.url)

    context.route(
        "**/*",
        lambda route: route.continue_() if route.request.url == path.as_uri() else refuse(route),
    )
    page = context.new_page()
    page.on("request", seen)
    try:
        page.goto(path.as_uri(), wait_until="load")
        check(page)
    finally:
        context.close()
    return [u for u in requests if u != path.as_uri() and not u.startswith("data:")]


def test_the_check_sees_a_page_that_fetches(browser: Browser, tmp_path: Path) -> None:
    """Positive control: a page with an outside image and stylesheet is caught."""
    path = tmp_path / "leaky.html"
    path.write_text(
        '<link rel="stylesheet" href="https://example.invalid/a.css">'
        '<img src="http://127.0.0.1:9/x.png">'
    )
    seen = visit(browser, path, lambda page: None)
    assert "https://example.invalid/a.css" in seen
    assert "http://127.0.0.1:9/x.png" in seen


@pytest.mark.parametrize("task_id", [T_DARK, T_SECRET, T_GESTURES])
def test_the_report_shows_every_step_and_fetches_nothing(
    browser: Browser, timeline: Timeline, tmp_path: Path, task_id: str
) -> None:
    run = run_from_timeline(timeline.store, task_id, HOST)
    assert run is not None
    path = report_file(run, tmp_path)

    def check(page: Page) -> None:
        sections = page.locator("section.step")
        assert sections.count() == len(run.steps)
        attempts = sections.evaluate_all("els => els.map(e => Number(e.dataset.attempt))")
        numbers = sections.evaluate_all("els => els.map(e => Number(e.dataset.step))")
        assert list(zip(attempts, numbers, strict=True)) == [s.key for s in run.steps]
        assert page.locator("#goal").inner_text() == run.goal
        assert page.locator("#status").inner_text() == run.status
        for i, step in enumerate(run.steps):
            section = sections.nth(i)
            assert section.locator("[data-field=purpose]").inner_text() == (step.purpose or "—")
            assert section.locator("[data-field=thinking-kind]").count() == 1
            assert section.locator("[data-field=latency]").inner_text().endswith("ms")
        widths = page.locator("img").evaluate_all("els => els.map(e => e.naturalWidth)")
        assert widths
        assert all(w > 0 for w in widths), "an image did not load"
        text = page.locator("body").inner_text()
        assert SECRET not in text
        if task_id == T_SECRET:
            assert "type •••" in text

    assert visit(browser, path, check) == []
