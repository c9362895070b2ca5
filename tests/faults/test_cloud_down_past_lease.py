"""The whole cloud down for longer than a lease (a slow rolling deploy, a database failover).

Real `amc cloud serve` (stopped, then started again on the same database) and `amc host run`
on the default, cloud, planner transport; the cloud's real Anthropic SDK against the fake
provider. The cloud stops while the task's second step waits for the model, and stays down
past the attempt's lease. Proves: the host pauses the attempt rather than stopping it (no
device action, no model call meanwhile); the started cloud gives the lease a new term and
resumes the assignment the host's hello names; the attempt continues and the task ends in
attempt 1, step 1 not asked again. Before, the host stopped the attempt when the lease ran
out by its clock, and attempt 2 started from scratch, asking the model again for every step.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from amc.v1 import task_service_pb2, types_pb2
from tests.support.fakes import FakeModelServer, ScriptedTurn, text, tool_use
from tests.support.processes import (
    TERMINAL,
    Fleet,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.waiting import until

INTENT = {"purpose": "make progress", "expected_outcome": "the next screen shows"}
LAUNCH = [tool_use("launch_app", {"package_name": "com.android.settings", **INTENT})]
DONE = [text("Nothing to do."), tool_use("complete", {"success": True, "reason": "ok"})]
#: The lease the cloud grants: the outage below outlasts it (it lasts until the lease ran out
#: by the host's clock). Not shorter: the started cloud gives the lease a new term of this
#: long, which a loaded 2-core machine could let run out (and the cloud sweep it) before the
#: host's hello is processed.
LEASE_S = "15"
#: The host's log line when the lease ran out by its clock (`host.lease_client._renew_loop`).
RAN_OUT = "ran out with no renewal answered"


async def test_a_cloud_down_past_the_lease_leaves_the_task_to_finish_in_attempt_1(
    tmp_path: Path, fault_pki: Path
) -> None:
    held = threading.Event()
    with FakeModelServer(anthropic_key="sk-ant-test") as fake:
        fake.script_anthropic(
            ScriptedTurn(list(LAUNCH)),
            ScriptedTurn(list(DONE), hold=held),  # step 2: asked as the cloud stops
            ScriptedTurn(list(DONE)),  # step 2 asked again on the started cloud
            # What a second attempt would ask (step 1 again, then step 2): the script lets it
            # run to its end, so a regression fails on the attempt, not on a timeout.
            ScriptedTurn(list(LAUNCH)),
            ScriptedTurn(list(DONE)),
        )
        env = {
            "AMC_PLANNER_PROVIDER": "anthropic",
            "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
            "AMC_PLANNER_ANTHROPIC_API_KEY": "sk-ant-test",
            "AMC_PLANNER_ANTHROPIC_BASE_URL": fake.anthropic_base_url,
            "AMC_PLANNER_MAX_RETRIES": "0",
            "AMC_CLOUD_DEFAULT_LEASE_SECONDS": LEASE_S,
            "AMC_CLOUD_SHUTDOWN_GRACE_SECONDS": "1",
        }
        fleet = Fleet(tmp_path, fault_pki, cloud_env=env)
        first, second = fleet.cloud("cloud-1").start(), fleet.cloud("cloud-2")
        host = fleet.host("a")
        ops = None
        try:
            await wait_serving(fleet.address, fault_pki)
            ops = operator(fleet.address, fault_pki)
            host.start()
            await wait_connected(ops, {"a"})
            request = task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme", max_attempts=3)
            task_id = (await ops.tasks.SubmitTask(request)).task.task_id
            await until(lambda: len(fake.bodies("/v1/messages")) == 2, what="step 2 is asked")
            await ops.close()
            ops = None
            assert first.proc is not None
            first.proc.send_signal(signal.SIGTERM)
            await until(lambda: not first.alive(), within=60, what="the first cloud exits")
            held.set()  # its answer goes nowhere: the call was cut off with the cloud
            await until(lambda: RAN_OUT in host.output(), within=60, what="the lease runs out")
            assert host.alive()
            second.start()
            await wait_serving(fleet.address, fault_pki)
            ops = operator(fleet.address, fault_pki)
            task = await wait_task(ops, task_id, lambda t: t.status in TERMINAL, what="ended")
        finally:
            held.set()
            if ops is not None:
                await ops.close()
            host.stop()
            first.stop()
            second.stop()
        asked = len(fake.bodies("/v1/messages"))
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task
    assert task.attempt == 1, task
    assert asked == 3  # step 1 once; step 2 cut off with the cloud, then asked again
    assert "the attempt pauses until the cloud confirms it" in host.output()
    assert "confirmed by the cloud: the attempt continues" in host.output()
