"""A cloud stopped or killed while a host's task waits on the model, then started again.

The fault tests of a cloud outage mid-task (`tests/faults/test_cloud_down_past_lease.py`,
`test_cloud_stopped_mid_decide.py`, `test_cloud_killed_mid_call.py`) all run one shape: a cloud
planning with the real Anthropic SDK against the fake provider, host "a" connected, a task
submitted and the model asked; then the test's own fault to the first cloud; then a second
cloud on the same port and database, and the task's end. Said once here, so that each test
shows only its fault and what it proves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from amc.v1 import task_service_pb2, types_pb2
from console.client import OperatorClient
from tests.support.fakes import FakeModelServer
from tests.support.processes import (
    TERMINAL,
    AmcProcess,
    Fleet,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.waiting import until

MODEL = "claude-sonnet-4-6"
#: The host asks a stopped cloud again quickly (the stream's reconnects, not the product's
#: backoff): the retry lands on the second cloud as soon as it serves.
FAST_PLANNER_WAIT = {
    "AMC_HOST_PLANNER_WAIT_INITIAL_S": "0.05",
    "AMC_HOST_PLANNER_WAIT_MAX_S": "0.2",
}


def anthropic_cloud_env(fake: FakeModelServer, lease_s: str, **more: str) -> dict[str, str]:
    """A cloud that plans with the real Anthropic SDK against `fake` (no SDK retries: the host's
    retry is what these tests watch) and grants leases of `lease_s`; `more` on top."""
    return {
        "AMC_PLANNER_PROVIDER": "anthropic",
        "AMC_PLANNER_MODEL": MODEL,
        "AMC_PLANNER_ANTHROPIC_API_KEY": "sk-ant-test",
        "AMC_PLANNER_ANTHROPIC_BASE_URL": fake.anthropic_base_url,
        "AMC_PLANNER_MAX_RETRIES": "0",
        "AMC_CLOUD_DEFAULT_LEASE_SECONDS": lease_s,
        **more,
    }


def anthropic_usage(input_tokens: int) -> dict[str, int]:
    """What the fake provider reports a call used: `input_tokens` in, 50 out, no cache."""
    return {
        "input_tokens": input_tokens,
        "output_tokens": 50,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


@dataclass
class CloudOutage:
    """The fleet's processes: `first` cloud (started), `second` (started by `restart`), host
    "a"; `ops` an operator client of the cloud serving now (None while none is)."""

    fleet: Fleet
    first: AmcProcess
    second: AmcProcess
    host: AmcProcess
    ops: OperatorClient | None = None

    async def submit(self, asked: Callable[[], bool], what: str) -> str:
        """Host "a" connected, "Turn on dark theme" (three attempts) submitted, until `asked()`
        (the provider has been called as the test needs); the task's id. The operator client
        is closed after: the first cloud's fault comes next."""
        fault_pki = self.fleet.pki_dir
        await wait_serving(self.fleet.address, fault_pki)
        self.ops = operator(self.fleet.address, fault_pki)
        self.host.start()
        await wait_connected(self.ops, {"a"})
        request = task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme", max_attempts=3)
        task_id: str = (await self.ops.tasks.SubmitTask(request)).task.task_id
        await until(asked, what=what)
        await self._close_ops()
        return task_id

    async def restart(self) -> OperatorClient:
        """The second cloud started and serving; an operator client of it."""
        self.second.start()
        await wait_serving(self.fleet.address, self.fleet.pki_dir)
        self.ops = operator(self.fleet.address, self.fleet.pki_dir)
        return self.ops

    async def ended(self, task_id: str) -> types_pb2.Task:
        """The task once it ended, as the serving cloud says."""
        assert self.ops is not None, "no cloud serving: restart() first"
        return await wait_task(self.ops, task_id, lambda t: t.status in TERMINAL, what="ended")

    async def _close_ops(self) -> None:
        if self.ops is not None:
            await self.ops.close()
            self.ops = None


@asynccontextmanager
async def cloud_outage(
    tmp_path: Path,
    fault_pki: Path,
    cloud_env: dict[str, str],
    *,
    database_url: str = "",
    host_extra: dict[str, str] | None = None,
) -> AsyncIterator[CloudOutage]:
    """The fleet of `tmp_path` with its first cloud started; every process stopped and the
    operator client closed on the way out, whatever the test did to them."""
    fleet = Fleet(tmp_path, fault_pki, database_url=database_url, cloud_env=cloud_env)
    outage = CloudOutage(
        fleet,
        first=fleet.cloud("cloud-1").start(),
        second=fleet.cloud("cloud-2"),
        host=fleet.host("a", extra=host_extra or {}),
    )
    try:
        yield outage
    finally:
        await outage._close_ops()
        outage.host.stop()
        outage.first.stop()
        outage.second.stop()
