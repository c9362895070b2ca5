"""Paths of the Node example host that no whole run reaches, checked through
tests/node/host_parts.js: host.js required as a module, its parts driven directly, in a real
Node process (no cloud is needed: nothing it checks sends anything)."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path
from typing import Any

from host.devices.virtual.adb_server import VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.lease_client import backoff_delay
from tests.node.test_node_host import HOST_ID, node
from tests.support.processes import make_pki

__all__ = ["node"]

SCRIPT = Path(__file__).with_name("host_parts.js")


async def test_a_stuck_attempt_whose_lease_was_revoked_is_handed_back_without_a_crash(
    node: str, tmp_path: Path
) -> None:
    """A stopping host hands back an attempt still stuck after the grace. When the cloud had
    revoked that lease meanwhile (an operator's cancel), the lease was no longer `held`, and
    `handBack` read its task id from `held.get(...)`, undefined: a TypeError, and host.js
    exited 1 instead of answering. It now answers the cancel as the attempt would have:
    CANCELLED, with the operator's words, not retryable."""
    pki = make_pki(tmp_path / "pki", [HOST_ID])
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AMC_HOST_CERTS_DIR": str(pki),
        "AMC_HOST_ID": HOST_ID,
        "AMC_HOST_DATA_DIR": str(tmp_path / "host-data"),
        "AMC_HOST_STOP_GRACE_S": "0.1",
    }
    proc = await asyncio.create_subprocess_exec(
        node,
        str(SCRIPT),
        "hand-back-revoked",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    said = err.decode()
    outcome = json.loads(out.decode().strip().splitlines()[-1])
    assert proc.returncode == 0, (outcome, said)
    assert outcome["error"] is None, (outcome, said)
    assert outcome["running"] == 0, said
    assert outcome["result"] == {
        "task_id": "t1",
        "attempt": 1,
        "lease_id": "lease-t1-1",
        "status": "TASK_STATUS_CANCELLED",
        "summary": "wrong phone",
        "retryable": False,
    }, said


async def test_actions_with_values_the_host_does_not_know_are_refused_saying_which(
    node: str, tmp_path: Path
) -> None:
    """A cloud newer than the host's contract can send values it has no name for. grpc-js
    decodes an unknown `Key` as its number, and host.js ran `input keyevent undefined` on the
    phone (some builds inject KEYCODE_UNKNOWN and report success); a tap with no target threw
    a JavaScript TypeError ("Cannot read properties of null"); an action of no kind it knows
    was "unsupported action undefined". As the Python host (host/agent/actions.py) refuses
    them, host.js now refuses each before anything reaches the phone, saying what it got."""
    pki = make_pki(tmp_path / "pki", [HOST_ID])
    phone = VirtualPhone("emulator-5554")
    adb = VirtualAdbServer([phone])
    adb_port = await adb.start()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AMC_HOST_CERTS_DIR": str(pki),
        "AMC_HOST_ID": HOST_ID,
        "AMC_HOST_DATA_DIR": str(tmp_path / "host-data"),
        "ADB_PORT": str(adb_port),
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            node,
            str(SCRIPT),
            "unknown-values",
            phone.serial,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await adb.stop()
    said = err.decode()
    errors = json.loads(out.decode().strip().splitlines()[-1])
    assert proc.returncode == 0, (errors, said)
    assert errors == {
        "key": "unknown key 9: this host presses KEY_BACK, KEY_HOME, KEY_ENTER, KEY_DELETE",
        "kind": "unsupported action: none this host knows (a newer cloud's?)",
        "tap": "tap without a target",
    }, said


async def test_a_disk_fault_told_while_the_data_folder_is_probed_keeps_the_host_paused(
    node: str, tmp_path: Path
) -> None:
    """A host paused on its data folder probes it; while the probe's write is under way,
    another write fails on the disk (the kernel's own ENOSPC, from /dev/full). Before, the
    fault was ignored (`diskRefused` returned at once while paused) and the probe that then
    worked cleared the pause: the host went back to work on a disk that had just refused a
    write. As the Python host (27856d2), it now counts every fault and stays paused when one
    came during the probe; the next probe follows as after a failed one."""
    pki = make_pki(tmp_path / "pki", [HOST_ID])
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AMC_HOST_CERTS_DIR": str(pki),
        "AMC_HOST_ID": HOST_ID,
        "AMC_HOST_DATA_DIR": str(tmp_path / "host-data"),
    }
    proc = await asyncio.create_subprocess_exec(
        node,
        str(SCRIPT),
        "fault-during-probe",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    said = err.decode()
    outcome = json.loads(out.decode().strip().splitlines()[-1])
    assert proc.returncode == 0, (outcome, said)
    assert outcome == {"paused": True, "still_paused": True}, said


async def _parts(node: str, tmp_path: Path, check: str, **settings: str) -> dict[str, Any]:
    """What `host_parts.js check` printed, host.js's environment `settings` besides."""
    pki = make_pki(tmp_path / "pki", [HOST_ID])
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AMC_HOST_CERTS_DIR": str(pki),
        "AMC_HOST_ID": HOST_ID,
        "AMC_HOST_DATA_DIR": str(tmp_path / "host-data"),
        **settings,
    }
    proc = await asyncio.create_subprocess_exec(
        node, str(SCRIPT), check, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (out, err)
    outcome: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return outcome


class _AtCeiling(random.Random):
    """A random source whose every draw is the top of its range: a delay is its ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def test_the_reconnect_backoff_ceilings_are_the_python_hosts(
    node: str, tmp_path: Path
) -> None:
    """The ceilings of host.js's reconnect backoff are `backoff_delay`'s for the same state.
    Failures in a row count as the Python host's `run` counts them: the first failed
    connection waits up to 2 x initial (host.js: 1 x, one doubling behind all along), a lost
    stream the cloud had welcomed up to 1 x. The lease bound is `_lease_left`'s: only running
    attempts whose lease was not revoked count (host.js counted a finished attempt's lease,
    its result waiting), a lease already run out brings it to the floor (host.js left it out),
    a paused attempt counts a whole lease. And AMC_HOST_PROGRESS_RENEW_MIN_INTERVAL_S is read
    (host.js renewed at most once a second whatever it said)."""
    rng = _AtCeiling()
    python = [backoff_delay(n, 0.5, 30.0, rng) * 1000 for n in (1, 2, 3, 0, 1, 40)]
    got = await _parts(
        node, tmp_path, "backoff-ceilings", AMC_HOST_PROGRESS_RENEW_MIN_INTERVAL_S="2.5"
    )
    assert [*got["failed"], got["afterWelcome"], got["failedAgain"], got["capped"]] == python
    assert got["finished"] == backoff_delay(6, 0.5, 30.0, rng) * 1000 == 30000
    assert got["leaseLeft"] == backoff_delay(6, 0.5, 30.0, rng, lease_left=8.0) * 1000 == 4000
    assert got["ranOut"] == backoff_delay(6, 0.5, 30.0, rng, lease_left=-1.0) * 1000 == 50
    assert got["paused"] == backoff_delay(6, 0.5, 30.0, rng, lease_left=30.0) * 1000 == 15000
    assert got["revokedLease"] == 30000
    assert got["renewMinMs"] == 2500
