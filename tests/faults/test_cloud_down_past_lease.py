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

from amc.v1 import types_pb2
from tests.support.cloud_outage import anthropic_cloud_env, cloud_outage
from tests.support.fakes import FakeModelServer, ScriptedTurn, text, tool_use
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
        env = anthropic_cloud_env(fake, LEASE_S, AMC_CLOUD_SHUTDOWN_GRACE_SECONDS="1")
        async with cloud_outage(tmp_path, fault_pki, env) as run:
            first, host = run.first, run.host
            try:
                task_id = await run.submit(
                    lambda: len(fake.bodies("/v1/messages")) == 2, what="step 2 is asked"
                )
                assert first.proc is not None
                first.proc.send_signal(signal.SIGTERM)
                await until(lambda: not first.alive(), within=60, what="the first cloud exits")
                held.set()  # its answer goes nowhere: the call was cut off with the cloud
                await until(lambda: RAN_OUT in host.output(), within=60, what="the lease runs out")
                assert host.alive()
                await run.restart()
                task = await run.ended(task_id)
            finally:
                held.set()
        asked = len(fake.bodies("/v1/messages"))
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task
    assert task.attempt == 1, task
    assert asked == 3  # step 1 once; step 2 cut off with the cloud, then asked again
    assert "the attempt pauses until the cloud confirms it" in host.output()
    assert "confirmed by the cloud: the attempt continues" in host.output()
