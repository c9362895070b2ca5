"""The test processes run the cycle collector less often than CPython's default (tests/conftest.py
GC_THRESHOLD): its full collections over a worker's grown heap were a sixth of its CPU."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path


def test_the_test_process_collects_cycles_less_often_but_still_collects_them() -> None:
    threshold, *_ = gc.get_threshold()
    assert threshold >= 10_000, threshold  # CPython's default is 700
    assert gc.isenabled()


def test_a_resource_a_test_leaks_in_a_cycle_fails_that_test(tmp_path: Path) -> None:
    """With the raised threshold, a socket a test dropped inside a reference cycle was found
    only when a later test's allocations ran the collector: the ResourceWarning
    (`filterwarnings = error`) failed that later test. The young generation is collected as
    each test ends (`young_cycles_collected`), so the test that leaked fails itself."""
    (tmp_path / "test_leak.py").write_text(
        textwrap.dedent(
            """
            import socket

            def test_leaks():
                held = [socket.socket()]
                held.append(held)
                del held
                _ = [[] for _ in range(3000)]

            def test_after():
                _ = [[] for _ in range(30000)]
            """
        )
    )
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "--rootdir", str(tmp_path)),
            *("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:asyncio"),
            *("-p", "tests.conftest", "-W", "error::pytest.PytestUnraisableExceptionWarning"),
            *("-W", "error::ResourceWarning"),
            str(tmp_path / "test_leak.py"),
        ],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "ERROR at teardown of test_leaks" in done.stdout, done.stdout + done.stderr
    assert "2 passed, 1 error" in done.stdout, done.stdout  # test_after is not blamed
