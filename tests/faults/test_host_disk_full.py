"""A host whose data folder fills up while it runs a task.

Real `amc cloud serve` and `amc host run` (cloud planner transport), the host's data folder on a
30 MiB tmpfs of its own (mounting needs root; skipped elsewhere). The folder is filled to the last
byte while the host runs "Turn on dark theme", and emptied once the fleet shows the host's phone
kept out of work. Proves: the attempt ends retryable with a summary that names the host's data
folder; the host then takes no work (its phone OFFLINE, the task queued, no attempt used) until
a probe write there succeeds; then the task's second attempt runs and succeeds.

Before 344e059 the attempt that met the full disk ("OSError: [Errno 28] No space left on
device") failed the task for good. After it, the host still took the task's next attempts while
its folder was full and failed each within milliseconds ("database or disk is full" from the
timeline's first write), so a loaded test that freed the space only after seeing the first
attempt end found all 10 used up.
"""

from __future__ import annotations

from pathlib import Path

from amc.v1 import fleet_service_pb2, task_service_pb2, types_pb2
from tests.support.processes import (
    TERMINAL,
    Fleet,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.tmpfs import fill, tmpfs
from tests.support.waiting import until


async def test_a_full_data_folder_fails_the_attempt_not_the_task(
    tmp_path: Path, fault_pki: Path
) -> None:
    with tmpfs(tmp_path / "host-a", "size=30m") as data:  # the folder `Fleet.host("a")` gives
        await _fill_mid_task(tmp_path, fault_pki, data)


async def _fill_mid_task(tmp_path: Path, fault_pki: Path, data: Path) -> None:
    fleet = Fleet(tmp_path, fault_pki, cloud_env={"AMC_CLOUD_DEFAULT_LEASE_SECONDS": "10"})
    cloud = fleet.cloud().start()
    host = fleet.host("a", settle_delay_s=0.5, extra={"AMC_HOST_DATA_DIR_PROBE_S": "0.5"})
    ops = None
    try:
        await wait_serving(fleet.address, fault_pki)
        ops = operator(fleet.address, fault_pki)
        host.start()
        await wait_connected(ops, {"a"})
        request = task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme", max_attempts=10)
        task_id = (await ops.tasks.SubmitTask(request)).task.task_id
        await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_RUNNING and t.progress.step_index >= 1,
            what="running",
        )
        filler = fill(data)
        first = await wait_task(
            ops,
            task_id,
            lambda t: (
                t.status in TERMINAL
                or (bool(t.attempts) and t.attempts[0].status != types_pb2.TASK_STATUS_RUNNING)
            ),
            what="the first attempt ended",
        )
        client = ops

        async def kept_out() -> bool:
            hosts = await client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
            states = [d.state for h in hosts.hosts if h.host_id == "a" for d in h.devices]
            return states == [types_pb2.DEVICE_STATE_OFFLINE]

        await until(kept_out, what="the host's phone kept out of work while its folder is full")
        said = "takes no work until a write there succeeds"
        await until(lambda: said in host.output(), what="the host's log says why")
        filler.unlink()
        task = await wait_task(ops, task_id, lambda t: t.status in TERMINAL, what="ended")
    finally:
        if ops is not None:
            await ops.close()
        host.stop()
        cloud.stop()
    # Every attempt's end, and what the host said, for a run that did not recover.
    reasons = [
        (a.attempt, types_pb2.TaskStatus.Name(a.status), a.failure_reason) for a in task.attempts
    ]
    assert first.attempts[0].status == types_pb2.TASK_STATUS_FAILED, first
    reason = first.attempts[0].failure_reason
    assert "host a cannot write its data folder (" in reason, reason  # ENOSPC or SQLITE_FULL
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, (reasons, host.output()[-6000:])
    # The host took no attempt while its folder was full: the first met it, the second ran.
    assert len(task.attempts) == 2, (reasons, host.output()[-6000:])
