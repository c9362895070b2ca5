"""Headless Chromium for the consoles' browser tests: Debian's /usr/bin/chromium driven by
Playwright (Playwright never downloads a browser here), and what a page reports about itself.

`PageReport` collects what a careless page would show only in the browser's console: every
Content-Security-Policy violation (the `securitypolicyviolation` DOM event, recorded from the
first script that runs), every console error, and every failed request — so a test can say
"this page loads clean" instead of trusting the eye.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, Response

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

#: Records CSP violations in the page itself (runs before any of the page's own scripts).
_RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


def chromium(playwright: Playwright) -> Browser:
    """Debian's Chromium, headless; skips the test when it is not installed."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@dataclass
class PageReport:
    """Console errors, CSP violations and failed responses of one page (see module doc)."""

    page: Page
    console_errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.page.add_init_script(_RECORD_VIOLATIONS)
        self.page.on("console", self._console)
        self.page.on("response", self._response)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)

    def _response(self, response: Response) -> None:
        if response.status >= 400:
            self.failed.append(f"{response.status} {response.url}")

    def violations(self) -> list[str]:
        """CSP violations the current document saw."""
        found = self.page.evaluate("window.__cspViolations || []")
        return [str(v) for v in found]

    def assert_clean(self) -> None:
        """No CSP violation, no console error, no failed request so far."""
        assert self.violations() == []
        assert self.console_errors == []
        assert self.failed == []


def overflow_x(page: Page) -> int:
    """How many pixels the page is wider than its viewport (0: no horizontal scrolling)."""
    width: int = page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
    )
    viewport: int = page.evaluate("document.documentElement.clientWidth")
    return max(width - viewport, 0)


def open_browser(playwright: Playwright) -> Iterator[Browser]:
    """A browser for a module's tests, closed after them."""
    browser = chromium(playwright)
    try:
        yield browser
    finally:
        browser.close()
