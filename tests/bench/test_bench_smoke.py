"""The benchmark runner at its smoke sizes: every benchmark runs and prints its figures.

No timing is asserted (these machines are noisy); the test only checks that each benchmark ran
against its same-run baseline and printed numbers.

The benchmarks run in three runner processes at once (`GROUPS`): one after the other they took
about 140 s on CI's 2-core machine, most of it spent starting servers and waiting out fixed
intervals (a lease term, a settle), which overlap. A benchmark's figures then share the machine
with another's, which a smoke run does not read; the full run (`python -m bench`) stays serial.
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


#: Every benchmark (`bench.__main__.BENCHMARKS`), in runner processes run side by side; each
#: group mixes benchmarks that mostly wait with ones that mostly compute.
GROUPS = (
    (
        "decision_log",
        "memory",
        "dispatch_latency",
        "observability_overhead",
        "flow_retrieval",
        "fleet_watch",
        "host_heartbeat",
    ),
    ("fleet_scale", "replica_restart", "dispatch_burst", "lease_capacity"),
    ("host_overhead", "prompt_growth", "renewal_writes", "flow_replay"),
)


def test_the_groups_hold_every_benchmark_once() -> None:
    from bench.__main__ import BENCHMARKS

    names = [name for group in GROUPS for name in group]
    assert sorted(names) == sorted(BENCHMARKS)


# Every benchmark at its smoke size: under a minute on an idle 2-core machine, several under the
# suite's load, so it gets more than the suite's 300 s per test.
@pytest.mark.timeout(900)
def test_runner_smoke_prints_figures(postgres_server: PostgresServer, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    # Reuse the test session's PostgreSQL: the runner makes its own databases on it.
    env["AMC_TEST_POSTGRES_URL"] = postgres_server.url(postgres_server.admin_db)
    docs = [tmp_path / f"benchmarks-{i}.md" for i in range(len(GROUPS))]
    runners = [
        subprocess.Popen(
            [sys.executable, "-m", "bench", "--smoke", "--write", "--output", str(doc)]
            + [f"--only={name}" for name in group],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for group, doc in zip(GROUPS, docs, strict=True)
    ]
    outs: list[str] = []
    try:
        for runner in runners:
            stdout, stderr = runner.communicate(timeout=600)
            # A failed benchmark prints "== name: FAILED" and its traceback; show those, not
            # the tail.
            at = stdout.find(": FAILED\n")
            failed = stdout[at - 200 :] if at >= 0 else stdout[-4000:]
            assert runner.returncode == 0, failed[:6000] + stderr[-4000:]
            outs.append(stdout)
    finally:
        for runner in runners:
            if runner.poll() is None:
                runner.kill()
                runner.communicate()
    out = "\n".join(outs)
    print(out)  # the figures: with `pytest -s`, or in the report of a failed assertion below
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
    text = "".join(doc.read_text() for doc in docs)
    for name in (name for group in GROUPS for name in group):
        assert f"<!-- bench:{name} -->" in text, name
    assert "| metric | value |" in text
