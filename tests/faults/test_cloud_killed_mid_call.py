"""The cloud SIGKILLed while a host's PlannerDecide waits for the model (decision 0080).

Real `amc cloud serve` and `amc host run` (cloud planner transport), the cloud's real Anthropic
SDK against the fake provider, which holds its answer. The kill leaves the provider's call
billed and nothing in the process to count it. Proves: the call's trace outlives the process:
GetTask says one call's cost is unknown, with a bound at least what the provider billed, beside
totals that count only what providers reported; the call the next replica makes for the host's
retry is recorded and settled. Before, the killed call left no trace at all.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from amc.v1 import decision_log_service_pb2, types_pb2
from planner.decision import Usage
from planner.prices import PriceTable
from tests.support.cloud_outage import (
    FAST_PLANNER_WAIT,
    MODEL,
    anthropic_cloud_env,
    anthropic_usage,
    cloud_outage,
)
from tests.support.fakes import FakeModelServer, ScriptedTurn, text, tool_use
from tests.support.postgres import PostgresServer

DONE = [text("Nothing to do."), tool_use("complete", {"success": True, "reason": "ok"})]
#: The attempt's lease. The host counts it from its last answered renewal, here the attempt's
#: start (the kill comes before the first renewal), and stops the attempt when it runs out
#: unrenewed: attempt 2 would then make the retry's call. It must outlast the second cloud's
#: start, which `wait_serving` allows 90 s (30 s at load 20, as test_cloud_stopped_mid_decide).
LEASE_S = "300"


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_call_the_killed_cloud_made_is_left_unsettled_with_its_bound(
    tmp_path: Path, fault_pki: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    held = threading.Event()
    database_url, server = "", None
    if backend == "postgres":
        server = request.getfixturevalue("postgres_server")
        assert isinstance(server, PostgresServer)
        database_url = server.create_database(
            "amc_fault_killed_call", template=request.getfixturevalue("migrated_postgres")
        )
    with FakeModelServer(anthropic_key="sk-ant-test") as fake:
        fake.script_anthropic(
            ScriptedTurn(list(DONE), usage=anthropic_usage(1000), hold=held),  # billed, never heard
            ScriptedTurn(list(DONE), usage=anthropic_usage(2000)),  # the retry's, on the next cloud
        )
        env = anthropic_cloud_env(fake, LEASE_S)
        async with cloud_outage(
            tmp_path, fault_pki, env, database_url=database_url, host_extra=FAST_PLANNER_WAIT
        ) as run:
            try:
                task_id = await run.submit(
                    lambda: len(fake.bodies("/v1/messages")) == 1, what="the model is asked"
                )
                run.first.kill()
                held.set()  # the provider answers (and bills) a caller that is gone
                ops = await run.restart()
                task = await run.ended(task_id)
                log = await ops.decisions.ListDecisions(
                    decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
                )
            finally:
                held.set()
        asked = len(fake.bodies("/v1/messages"))
    if server is not None:
        server.drop_database(database_url)
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task
    assert asked == 2
    assert [(d.step_index, d.usage.input_tokens) for d in log.decisions] == [(1, 2000)]
    assert task.totals.usage.input_tokens == 2000  # reported figures only, as before
    unsettled = task.totals.unsettled
    assert unsettled.calls == 1, task.totals  # the killed call; the retry's is settled
    assert [a.unsettled.calls for a in task.attempts] == [1]  # on its attempt too
    assert task.attempts[0].unsettled.at_most == unsettled.at_most
    billed = Usage(input_tokens=1000, output_tokens=50)
    assert unsettled.at_most.input_tokens >= billed.input_tokens
    assert unsettled.at_most.output_tokens >= billed.output_tokens
    assert unsettled.at_most.cost_usd >= PriceTable().cost(MODEL, billed) > 0
