"""Fixtures of the fault suite: one fleet PKI for the session, a working folder per test."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from tests.support.processes import make_pki

HOST_IDS = ["a", "b", "c", "d"]


@pytest.fixture(scope="session")
def fault_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("fault-pki"), HOST_IDS)


#: How much of each process's log a failed fault test shows (its last lines).
LOG_TAIL_LINES = 80


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed fault test shows the end of each `amc` process's log (`AmcProcess.log_path`,
    in the test's folder): CI keeps no files, and a fault seen once under load was otherwise
    unexplainable from the assertion alone."""
    report = yield
    if report.failed and isinstance(item, pytest.Function):
        folder = item.funcargs.get("tmp_path")
        if isinstance(folder, Path):
            for log in sorted(folder.glob("*.log")):
                lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                report.sections.append((f"{log.name} (last lines)", "\n".join(lines)))
    return report
