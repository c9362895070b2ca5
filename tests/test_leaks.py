"""The autouse check of tests/conftest.py: a test that leaves a cloud replica running fails.

The test it judges runs in a pytest of its own (the root conftest loaded as a plugin), on a
real replica (plaintext on loopback, SQLite): one test stops its replica, one does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INNER = """
from cloud.server import build_server
from cloud.settings import CloudSettings


async def _replica(tmp_path):
    server = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address="127.0.0.1:0",
            insecure=True,
        )
    )
    await server.start()
    return server


async def test_stops_its_replica(tmp_path):
    server = await _replica(tmp_path)
    await server.stop(0)


async def test_leaves_its_replica_running(tmp_path):
    await _replica(tmp_path)
"""


def test_a_test_that_leaves_a_replica_running_fails(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "gen"), str(ROOT)]),
        "AMC_CLOUD_ARTIFACT_DIR": str(tmp_path / "artifacts"),
    }
    config = ["-c", str(ROOT / "pyproject.toml"), "-p", "tests.conftest", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *config, str(tmp_path / "test_inner.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    summary = [line for line in out.splitlines() if line.startswith(("PASSED", "ERROR"))]
    assert len(summary) == 1, out + done.stderr  # -ra: errors are listed, passes are not
    assert summary[0].startswith("ERROR ::test_leaves_its_replica_running - Failed: left running")
    assert "cloud replica at 127.0.0.1:" in out
    assert out.startswith("..E "), out  # both ran; the second errs at its teardown
