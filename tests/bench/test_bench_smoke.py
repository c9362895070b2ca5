"""The benchmark runner at its smoke sizes: every benchmark runs and prints its figures.

No timing is asserted (these machines are noisy); the test only checks that each benchmark ran
against its same-run baseline and printed numbers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.postgres


# Every benchmark at its smoke size, one after the other: about 2 minutes on an idle 2-core
# machine, so it gets more than the suite's 300 s per test.
@pytest.mark.timeout(900)
def test_runner_smoke_prints_figures(postgres_server: PostgresServer, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    # Reuse the test session's PostgreSQL: the runner makes its own databases on it.
    env["AMC_TEST_POSTGRES_URL"] = postgres_server.url(postgres_server.admin_db)
    doc = tmp_path / "benchmarks.md"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--write", "--output", str(doc)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout
    # A failed benchmark prints "== name: FAILED" and its traceback; show those, not the tail.
    failed = out[out.find(": FAILED\n") - 200 :] if ": FAILED\n" in out else out[-4000:]
    assert done.returncode == 0, failed[:6000] + done.stderr[-4000:]
    for title in (
        "Lease capacity",
        "Memory",
        "Dispatch latency",
        "Dispatch burst",
        "Replica restart",
        "Flow retrieval at assignment",
        "Fleet scale (PostgreSQL)",
        "Decision log at scale",
        "Prompt growth",
        "Host per-step overhead",
    ):
        assert f"== {title}" in out, title
    # Figures with their baselines and ratios.
    assert re.search(r"renewals/s\s+[\d,.]+ /s\s+vs HTTP/JSON [\d,.]+ = x[\d.]+", out)
    assert re.search(r"vs bare gRPC echo [\d,.]+ = x[\d.]+", out)
    assert re.search(r"cloud KiB per idle stream .* KiB", out)
    assert re.search(r"submit → assignment p99\s+[\d.]+ ms", out)
    assert re.search(r"SQLite leases confirmed\s+12\s+\(of 12; refused 0;", out)
    assert "exactly once met" in out
    assert re.search(r"CPU per retrieval, candidates kept\s+[\d.]+ ms\s+vs read and parsed", out)
    assert re.search(r"last assignment after the last hello\s+[\d,.]+ ms", out)
    assert re.search(r"scale: renewals acknowledged\s+[\d,]+", out)
    assert re.search(r"replicas: two replicas, closed-loop renewals/s\s+[\d,.]+ /s", out)
    assert re.search(r"PostgreSQL: new progress, WAL per renewal\s+[\d,]+ B\s+vs expiry moved", out)
    assert re.search(r"ListDecisions .* p50, .*[\d.]+ ms", out)
    assert "FAILED" not in out
    text = doc.read_text()
    assert "<!-- bench:lease_capacity -->" in text
    assert "| metric | value |" in text
