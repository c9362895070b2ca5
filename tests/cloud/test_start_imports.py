"""What a cloud loads to start: `amc cloud serve` on SQLite never connects with psycopg, so
it starts without it (`cloud.store.pg_driver`); on a database already at head it checks that
without Alembic (`cloud.store.schema_head`).

Every fault, e2e and node test starts clouds as processes: psycopg's import cost each start
~50 ms, Alembic's (with Mako and Pygments) ~130 ms. The cloud here is the real command (its
settings, its SQLite store upgraded to the newest schema, its services, its background jobs,
its start-up banner); once the banner is out the probe prints what the process has loaded and
stops it as SIGTERM would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.migrated import migrated_sqlite_url
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


def _loaded_at_start(tmp_path: Path, database_url: str, heavy: tuple[str, ...]) -> list[str]:
    """Which of `heavy` `amc cloud serve` on `database_url` has loaded by its banner."""
    pki = make_pki(tmp_path / "pki", [])
    env = {
        **_clean_env(),
        "AMC_CLOUD_DATABASE_URL": database_url,
        "AMC_CLOUD_ARTIFACT_DIR": str(tmp_path / "artifacts"),
        "AMC_CLOUD_LISTEN_ADDRESS": f"127.0.0.1:{free_port()}",
        "AMC_CLOUD_PKI_DIR": str(pki),
        "AMC_CLOUD_METRICS_ADDRESS": "off",
        "AMC_PLANNER_PROVIDER": "offline",
    }
    probe = PROBE.replace(repr(HEAVY), repr(heavy))
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr)
    assert "amc cloud stopping" in done.stdout  # it served, then stopped as asked
    loaded: list[str] = json.loads(lines[0].removeprefix("LOADED "))
    return loaded


def test_a_sqlite_cloud_starts_without_the_postgresql_driver(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cloud.db'}"
    assert _loaded_at_start(tmp_path, url, HEAVY) == []


#: Loaded only to change a schema: Alembic, and through it Mako and Pygments (~130 ms a start).
MIGRATING = ("alembic", "mako", "pygments")


def test_a_cloud_on_a_database_at_head_starts_without_alembic(tmp_path: Path) -> None:
    """Every replica after the first and every restart finds its database at head: it checks
    that without importing Alembic (`cloud.store.schema_head`)."""
    url = migrated_sqlite_url(tmp_path / "cloud.db")
    assert _loaded_at_start(tmp_path, url, MIGRATING) == []


def test_a_cloud_on_an_empty_database_migrates_it_with_alembic(tmp_path: Path) -> None:
    """The probe sees Alembic where it is needed: a first start migrates."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cloud.db'}"
    assert "alembic" in _loaded_at_start(tmp_path, url, MIGRATING)
