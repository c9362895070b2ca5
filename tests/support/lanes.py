"""The test lanes: which tests need PostgreSQL, a browser or Node.js, so `make test-fast` can leave
them out and still trust that what it runs needs none of them.

A mark comes from what a test uses, not from its author's memory:
- at collection, a test whose fixtures include one of `FIXTURE_MARKS` gets that mark;
- while a test sets up or runs, starting one of those programs (PostgreSQL's initdb/pg_ctl, node,
  Playwright's driver, Chromium) without the matching mark raises at once (an audit hook on
  `subprocess.Popen`), in the full suite too, so an unmarked test fails before it can land in the
  fast lane. Teardown is not watched: the session's PostgreSQL stops in whichever test ends last.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence

import pytest

#: Fixture name → the mark a test using it (directly or through other fixtures) gets.
FIXTURE_MARKS = {
    "postgres_server": "postgres",
    "postgres_session": "postgres",
    "playwright": "browser",
    "node": "node",
}
#: Program (file name) → the mark a test starting it needs.
PROGRAM_MARKS = {
    "initdb": "postgres",
    "pg_ctl": "postgres",
    "postgres": "postgres",
    "node": "node",
    "npm": "node",
    "npx": "node",
    "chromium": "browser",
}

_current: pytest.Item | None = None
_installed = False


def mark_by_fixtures(items: Iterable[pytest.Item]) -> None:
    """Give each test the marks its fixtures call for."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        for fixture, mark in FIXTURE_MARKS.items():
            if fixture in names and item.get_closest_marker(mark) is None:
                item.add_marker(mark)


def watch(item: pytest.Item | None) -> None:
    """The test whose setup or call runs now (None: nothing is watched)."""
    global _current
    _current = item


def require(item: pytest.Item, mark: str, what: str) -> None:
    """Fail `item` unless it carries `mark` (for uses no fixture name reveals)."""
    if item.get_closest_marker(mark) is None:
        raise LaneError(
            f"{item.nodeid} uses {what} but is not marked {mark!r}: add @pytest.mark.{mark} "
            f"(or use a fixture that marks it: see tests/support/lanes.py)"
        )


class LaneError(RuntimeError):
    """A test needs a program its marks do not admit."""


def needed_mark(argv: Sequence[str]) -> str | None:
    """The lane mark a command line needs, if any (Playwright's bundled node is the browser)."""
    for arg in argv:
        for word in arg.split():
            if "/playwright/driver/" in word:
                return "browser"
            mark = PROGRAM_MARKS.get(os.path.basename(word))
            if mark is not None:
                return mark
    return None


def _words(executable: object, args: object) -> list[str]:
    found = [executable] if executable is not None else []
    if isinstance(args, str | bytes | os.PathLike):
        found.append(args)
    elif isinstance(args, Iterable):
        found.extend(args)
    return [os.fsdecode(a) for a in found if isinstance(a, str | bytes | os.PathLike)]


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event != "subprocess.Popen" or _current is None:
        return
    mark = needed_mark(_words(args[0], args[1]))
    if mark is not None:
        require(_current, mark, f"a program of the {mark} lane ({_words(args[0], args[1])})")


def install_guard() -> None:
    """Watch every subprocess a test starts (once per process: audit hooks cannot be removed)."""
    global _installed
    if not _installed:
        sys.addaudithook(_audit)
        _installed = True
