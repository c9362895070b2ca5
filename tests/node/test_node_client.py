"""A Node.js client (@grpc/grpc-js + @grpc/proto-loader) submits a task over mTLS and reads it."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from cloud.server import CloudServer

SCRIPT = Path(__file__).with_name("submit_task.js")
NODE_MODULES = Path(__file__).resolve().parents[2] / "node_modules" / "@grpc" / "grpc-js"


@pytest.fixture
def node() -> str:
    found = shutil.which("node")
    if found is None or not NODE_MODULES.exists():
        pytest.fail("node and `npm ci` (node_modules/@grpc) are required for the polyglot test")
    return found


async def _run(node: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        node, str(SCRIPT), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_node_client_submits_and_reads_back(
    node: str, cloud: CloudServer, pki_dir: Path
) -> None:
    code, out, err = await _run(node, cloud.address, str(pki_dir), "ops", "Turn on dark theme")
    assert code == 0, err
    task = json.loads(out)
    assert task["goal"] == "Turn on dark theme"
    assert task["status"] == "TASK_STATUS_QUEUED"
    assert task["lease_seconds"] == 30


async def test_node_client_with_host_certificate_is_refused(
    node: str, cloud: CloudServer, pki_dir: Path, tmp_path: Path
) -> None:
    # Present a host certificate under the operator file names: PERMISSION_DENIED (code 7).
    for suffix in ("pem", "key"):
        (tmp_path / f"operator-fake.{suffix}").write_bytes(
            (pki_dir / f"host-h1.{suffix}").read_bytes()
        )
    (tmp_path / "ca.pem").write_bytes((pki_dir / "ca.pem").read_bytes())
    code, _, err = await _run(node, cloud.address, str(tmp_path), "fake", "x")
    assert code == 1
    assert "code 7" in err
