"""The test lanes (tests/support/lanes.py): a test that needs PostgreSQL, a browser or Node.js
carries the mark `make test-fast` leaves out, or fails; it cannot pass in the fast lane unmarked.

The programs below are never run: the guard refuses them before the process starts, and the
allowed case names a path that does not exist.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import lanes

MISSING = Path("/nonexistent/amc-lane-probe")


@pytest.mark.parametrize(
    ("argv", "mark"),
    [
        ([str(MISSING / "initdb"), "-D", "x"], "postgres"),
        (["runuser", "-u", "postgres", "--", str(MISSING / "pg_ctl"), "start"], "postgres"),
        ([str(MISSING / "node"), "submit_task.js"], "node"),
        (["npx", "buf", "lint"], "node"),
        ([str(MISSING / "site-packages/playwright/driver/node"), "cli.js"], "browser"),
        (["/bin/sh", "-c", "chromium --headless"], "browser"),
    ],
)
def test_an_unmarked_test_cannot_start_a_lane_program(argv: list[str], mark: str) -> None:
    with pytest.raises(lanes.LaneError, match=rf"not marked '{mark}'"):
        subprocess.run(argv, check=False)


def test_other_programs_are_not_watched() -> None:
    done = subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True)
    assert done.stdout == "ok\n"


@pytest.mark.postgres
def test_a_marked_test_may_start_its_program() -> None:
    with pytest.raises(FileNotFoundError):
        subprocess.run([str(MISSING / "initdb"), "--version"], check=False)


def test_an_unmarked_test_cannot_reach_the_postgres_fixture(request: pytest.FixtureRequest) -> None:
    """`getfixturevalue` is invisible to collection: the fixture refuses before PostgreSQL
    starts."""
    with pytest.raises(lanes.LaneError, match="not marked 'postgres'"):
        request.getfixturevalue("postgres_server")


def test_collection_marks_every_test_by_its_fixtures(request: pytest.FixtureRequest) -> None:
    """Over the session's own tests: in the full suite every user of a lane fixture carries the
    mark; in the fast lane (marked tests deselected) no selected test uses a lane fixture."""
    for item in request.session.items:
        for fixture, mark in lanes.FIXTURE_MARKS.items():
            if fixture in getattr(item, "fixturenames", ()):
                assert item.get_closest_marker(mark) is not None, (item.nodeid, mark)
