"""What a cloud on SQLite loads to start: `amc cloud serve` never connects with psycopg there, so
it starts without it (`cloud.store.pg_driver`).

Every fault, e2e and node test starts clouds as processes, and psycopg's import cost each
start ~50 ms. The cloud here is the real command (its settings, its SQLite store upgraded to the
newest schema, its services, its background jobs, its start-up banner); once the banner is out
the probe prints what the process has loaded and stops it as SIGTERM would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.processes import _clean_env, free_port, make_pki

#: Loaded only by what uses them: PostgreSQL's driver by a cloud on PostgreSQL.
HEAVY = ("psycopg",)

#: `amc cloud serve` itself (console.cli:main), up to its banner, then stopped by SIGTERM.
PROBE = f"""
import json, os, signal, sys
import cloud.startup

serve = cloud.startup.serve

async def probed(settings, say):
    told = []

    def banner(line):
        if not told:
            told.append(line)
            print("LOADED " + json.dumps([m for m in {HEAVY!r} if m in sys.modules]), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        say(line)

    await serve(settings, banner)

cloud.startup.serve = probed
sys.argv = ["amc", "cloud", "serve"]
from console.cli import main
main()
"""


def test_a_sqlite_cloud_starts_without_the_postgresql_driver(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", [])
    env = {
        **_clean_env(),
        "AMC_CLOUD_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'cloud.db'}",
        "AMC_CLOUD_ARTIFACT_DIR": str(tmp_path / "artifacts"),
        "AMC_CLOUD_LISTEN_ADDRESS": f"127.0.0.1:{free_port()}",
        "AMC_CLOUD_PKI_DIR": str(pki),
        "AMC_CLOUD_METRICS_ADDRESS": "off",
        "AMC_PLANNER_PROVIDER": "offline",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr)
    assert "amc cloud stopping" in done.stdout  # it served, then stopped as asked
    assert json.loads(lines[0].removeprefix("LOADED ")) == []
