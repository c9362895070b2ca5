"""A host process frozen with SIGSTOP mid-task (a paused VM, a closed laptop lid, a GC stall),
its stream left open: the cloud's keepalive (30 s + 10 s) has not given up on it yet.

Proves: the freeze costs the task the attempt it was running, not the rest of them. The cloud
hands the frozen host no new work while it stays silent, and once the host is let go it is
heard from at once (its own clock stopped the attempt: it sends that attempt's retryable result,
even when it reads the cloud's expiry revoke first), runs the task again and finishes it.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from amc.v1 import fleet_service_pb2, types_pb2
from console.client import OperatorClient
from tests.support.processes import (
    TERMINAL,
    Fleet,
    dark_theme_running,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.waiting import until

#: Longer than the two 2.5 s leases of the task's attempts left (2 and 3), with the sweeps and
#: dispatch passes between them: long enough for every attempt to run out on the frozen host,
#: had it been handed each of them (with the hold left out of dispatch, all three ran out on
#: it and the task failed). 12 s before: 5 s of each run waited for nothing.
FREEZE_S = 7.0
#: How soon the hold ends once the host is let go: well inside what was left of its window.
HEARD_WITHIN_S = 15.0


async def _held_back(ops: OperatorClient) -> types_pb2.HostHold | None:
    """Why the fleet view says host a gets no new task (None: it does)."""
    listed = await ops.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
    host: types_pb2.Host = next(h for h in listed.hosts if h.host_id == "a")
    return host.held_back if host.HasField("held_back") else None


async def _not_held(ops: OperatorClient) -> bool:
    return await _held_back(ops) is None


async def test_a_host_frozen_mid_task_costs_it_one_attempt_and_finishes_it(
    tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(tmp_path, fault_pki)
    address = fleet.address
    cloud = fleet.cloud().start()
    host = fleet.host("a", settle_delay_s=1.0)
    ops = None
    stopped = False
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        host.start()
        await wait_connected(ops, {"a"})
        task_id = await dark_theme_running(ops, "a")
        assert host.proc is not None
        host.proc.send_signal(signal.SIGSTOP)
        stopped = True
        await wait_task(
            ops, task_id, lambda t: t.attempts[0].failure_reason != "", what="attempt 1 expired"
        )
        # The fleet view says why the connected host gets no work, and for which task.
        client = ops

        async def held() -> bool:
            return await _held_back(client) is not None

        await until(held, what="the fleet view shows the hold")
        hold = await _held_back(ops)
        assert hold is not None and (hold.task_id, hold.attempt) == (task_id, 1), hold
        await asyncio.sleep(FREEZE_S)  # the freeze goes on: what the cloud does meanwhile
        host.proc.send_signal(signal.SIGCONT)
        stopped = False
        # Let go, the host says so at once (the retryable result of the attempt its own clock
        # stopped), whichever it reads first, that or the cloud's expiry revoke: the hold ends
        # then, not at the end of its window (40 s from the expiry, ~32 s from here).
        await until(
            lambda: _not_held(client), within=HEARD_WITHIN_S, what="the hold ends once let go"
        )
        done = await wait_task(ops, task_id, lambda t: t.status in TERMINAL, what="finished")
        reasons = [(a.attempt, a.host_id, a.failure_reason) for a in done.attempts]
        assert done.status == types_pb2.TASK_STATUS_SUCCEEDED, (reasons, host.output()[-3000:])
        assert reasons[0][2] == "lease expired"
        assert len(done.attempts) == 2, reasons  # the frozen attempt, then the one that ran
        assert await _held_back(ops) is None  # heard from again: no longer held back
    finally:
        if stopped and host.proc is not None:
            host.proc.send_signal(signal.SIGCONT)
        if ops is not None:
            await ops.close()
        host.stop()
        cloud.stop()
