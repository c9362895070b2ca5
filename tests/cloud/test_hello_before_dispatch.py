"""No dispatch reaches a host before its hello has settled the leases it re-announces.

`LeaseManager.open` registers a session before its hello's batch settles; a dispatch pass in
that window (the periodic tick, or a queue wake from anywhere) saw a host with no busy phone.
When the host's lease had lapsed and been swept while it was away, the pass claimed the task's
next attempt for the very phone the hello was about to resume it on: the hello's attempt was
then superseded, and the work the phone had done lost. Real Lease streams and store, the pass
forced into the window (the real batcher's 5 ms window makes the race rare, not impossible).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.server import CloudServer
from cloud.store import leases as leases_mod
from tests.cloud.cloud_harness import ScriptedHost, lapse, submit


@pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_pass_while_the_hello_settles_leaves_its_lapsed_lease_to_it(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h1's lease of a ran out and was swept while h1 was away; h1 reconnects naming a. A
    dispatch pass run as the hello's batch starts gives h1 nothing; the hello resumes a in
    the same attempt, and nothing else is assigned on p1."""
    async with ScriptedHost(cloud.address, pki_dir, "h1") as first:
        await first.connect(["p1"], process_id="p")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"), max_attempts=3)
        a = (await first.next("assignment")).assignment
    for _ in range(200):
        if "h1" not in cloud.leases.sessions:
            break
        await asyncio.sleep(0.05)
    assert "h1" not in cloud.leases.sessions
    await lapse(cloud.store, a.task_id, a.attempt)
    await cloud.leases.sweeper.sweep()

    real = leases_mod.settle_hellos
    passes: list[int] = []

    async def pass_first(store: Any, items: Any) -> Any:
        if not passes:  # the session is registered, its hello not settled
            passes.append(1)
            await cloud.leases.dispatcher.dispatch_pass()
        return await real(store, items)

    monkeypatch.setattr(leases_mod, "settle_hellos", pass_first)
    held = [
        lease_pb.HeldAssignment(
            task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, device_serial="p1"
        )
    ]
    async with ScriptedHost(cloud.address, pki_dir, "h1") as again:
        await again.connect(["p1"], held, process_id="p")
        got = [await again.next(wait=10)]
        while True:
            try:
                got.append(await again.next(wait=1.5))
            except TimeoutError:
                break
    assert passes == [1]
    resumed = [m.assignment for m in got if m.HasField("assignment") and m.assignment.resumed]
    assert [(r.task_id, r.attempt) for r in resumed] == [(a.task_id, a.attempt)], got
    assert not [m for m in got if m.HasField("revoked")], got
