"""The cloud stopped (SIGTERM, a rolling deploy) while a host's PlannerDecide waits for the model.

Real `amc cloud serve` and `amc host run` (cloud planner transport), the cloud's real Anthropic
SDK against the fake provider, which holds its answer. The stop cancels the Decide; the plan it
started outlives the handler. Proves: a model call answered while the replica stops is logged
(the host's retry on the next replica is answered from the log: the model is asked, and paid,
once), and one still unanswered when the grace runs out is cut off and counted with what the
provider reported of it. Before, the planner and the database closed under the plan a moment
after the handlers went: the answer was neither logged nor counted, and the retry asked again.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from amc.v1 import decision_log_service_pb2, task_service_pb2, types_pb2
from tests.support.cloud_outage import (
    FAST_PLANNER_WAIT,
    anthropic_cloud_env,
    anthropic_usage,
    cloud_outage,
)
from tests.support.fakes import FakeModelServer, ScriptedTurn, text, tool_use
from tests.support.postgres import PostgresServer
from tests.support.processes import Fleet, operator, wait_connected, wait_serving
from tests.support.waiting import until

WAITING = "model call(s) in flight"
CUT_OFF = "waiting up to 1 s to count them"
DONE = [text("Nothing to do."), tool_use("complete", {"success": True, "reason": "ok"})]
#: The attempt's lease. The host counts it from its last answered renewal, here the attempt's
#: start (the stop comes before the first renewal). It used to stop the attempt when it ran out
#: unrenewed, and attempt 2 asked the model again; now it pauses it until the started cloud
#: resumes it (`tests/faults/test_cloud_down_past_lease.py`), but this test is about the
#: stopping cloud's log, not the lease: the lease outlasts the whole outage, the stop's grace,
#: the first cloud's exit and the second's start (30 s on a machine at load 20, once 60 s;
#: `wait_serving` allows a start 90 s).
LEASE_S = "300"


async def _stop_mid_decide(
    tmp_path: Path, fault_pki: Path, fake: FakeModelServer, held: threading.Event, *, grace: str
) -> tuple[types_pb2.Task, decision_log_service_pb2.ListDecisionsResponse, str]:
    """Run a task until its first Decide waits on the held model call, SIGTERM the cloud, let
    the call go once the stopping cloud waits for it (or after it exited), start the cloud
    again and wait for the task to end: the task, its decision log, the first cloud's log."""
    env = anthropic_cloud_env(fake, LEASE_S, AMC_CLOUD_SHUTDOWN_GRACE_SECONDS=grace)
    async with cloud_outage(tmp_path, fault_pki, env, host_extra=FAST_PLANNER_WAIT) as run:
        first = run.first
        task_id = await run.submit(
            lambda: len(fake.bodies("/v1/messages")) == 1, what="the model is asked"
        )
        assert first.proc is not None
        first.proc.send_signal(signal.SIGTERM)
        # The stopping cloud waits for the call (or, after the grace, for it to be counted):
        # the model answers then.
        said = WAITING if grace != "1" else CUT_OFF
        await until(lambda: said in first.output(), within=60, what="the stop waits")
        held.set()
        await until(lambda: not first.alive(), within=60, what="the first cloud exits")
        ops = await run.restart()
        task = await run.ended(task_id)
        log = await ops.decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
        return task, log, first.output()


async def test_a_decide_answered_while_the_cloud_stops_is_logged_and_not_asked_again(
    tmp_path: Path, fault_pki: Path
) -> None:
    held = threading.Event()
    with FakeModelServer(anthropic_key="sk-ant-test") as fake:
        fake.script_anthropic(
            ScriptedTurn(list(DONE), usage=anthropic_usage(1000), hold=held),
            ScriptedTurn(list(DONE), usage=anthropic_usage(2000)),  # a second call: asked again
        )
        # The handler stop waits out the whole grace (the call is held until the stopping
        # cloud says it waits for it), so the grace is the default 5 s, not more.
        task, log, first = await _stop_mid_decide(tmp_path, fault_pki, fake, held, grace="5")
        asked = len(fake.bodies("/v1/messages"))
    assert "planned after its caller went away: complete logged" in first
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task
    assert asked == 1
    assert [(d.step_index, d.usage.input_tokens) for d in log.decisions] == [(1, 1000)]
    assert (task.totals.decisions, task.totals.usage.input_tokens) == (1, 1000)
    assert task.totals.unsettled.calls == 0  # its cost is known: nothing left unsettled


async def test_a_decide_still_unanswered_when_the_stop_gives_up_is_counted_when_answered(
    tmp_path: Path, fault_pki: Path
) -> None:
    held = threading.Event()
    with FakeModelServer(anthropic_key="sk-ant-test") as fake:
        fake.script_anthropic(  # compact mode: not streamed, the answer comes once cut off
            ScriptedTurn(list(DONE), usage=anthropic_usage(1000), hold=held),
            ScriptedTurn(list(DONE), usage=anthropic_usage(2000)),
        )
        task, log, first = await _stop_mid_decide(tmp_path, fault_pki, fake, held, grace="1")
        asked = len(fake.bodies("/v1/messages"))
    assert "planned after its caller went away" not in first
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task
    assert asked == 2
    assert [(d.step_index, d.usage.input_tokens) for d in log.decisions] == [(1, 2000)]
    cut = [(f.attempt, f.usage.input_tokens) for f in log.failed_calls]
    assert cut == [(1, 1000)], log.failed_calls
    assert task.totals.usage.input_tokens == 3000
    assert task.totals.unsettled.calls == 0  # counted late, still settled with its record


LOGGING = "decision(s) to be logged"


def _blocked_writers(watcher: psycopg.Connection[tuple[int, ...]]) -> int:
    """Sessions of this database waiting on a lock (the cloud's decision write)."""
    row = watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    ).fetchone()
    return row[0] if row else 0


@pytest.mark.postgres
async def test_a_decision_still_being_logged_when_the_stop_cancels_its_decide_is_logged(
    tmp_path: Path, fault_pki: Path, postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """The model answers, and the decision's write waits (here on a lock the test holds on the
    decision log) when the stop's grace runs out and cancels the Decide. The stopping cloud
    waits for that write before it exits: the decision is in the log with what it cost, and
    no call is left of unknown cost (the host's retry on the next process is answered from the
    log, as the first test shows). Before, the stop waited only for plans still asking the
    model: the write was cut off as the process exited, and the retry paid the model again."""
    held = threading.Event()
    url = postgres_server.create_database("amc_fault_logging", template=migrated_postgres)
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with FakeModelServer(anthropic_key="sk-ant-test") as fake:
        fake.script_anthropic(ScriptedTurn(list(DONE), usage=anthropic_usage(1000), hold=held))
        env = anthropic_cloud_env(fake, "60", AMC_CLOUD_SHUTDOWN_GRACE_SECONDS="3")
        fleet = Fleet(tmp_path, fault_pki, database_url=url, cloud_env=env)
        cloud, host = fleet.cloud("cloud-1").start(), fleet.host("a")
        with (
            psycopg.connect(dsn) as locker,
            psycopg.connect(dsn, autocommit=True) as watcher,
        ):
            try:
                await wait_serving(fleet.address, fault_pki)
                ops = operator(fleet.address, fault_pki)
                try:
                    host.start()
                    await wait_connected(ops, {"a"})
                    request = task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme")
                    task_id = (await ops.tasks.SubmitTask(request)).task.task_id
                finally:
                    await ops.close()
                await until(lambda: len(fake.bodies("/v1/messages")) == 1, what="model asked")
                locker.execute("LOCK TABLE decisions IN EXCLUSIVE MODE")
                held.set()  # answered: the decision's write waits on the lock
                await until(lambda: _blocked_writers(watcher) > 0, what="the write waits")
                assert cloud.proc is not None
                cloud.proc.send_signal(signal.SIGTERM)
                await until(
                    lambda: LOGGING in cloud.output() or not cloud.alive(),
                    within=60,
                    what="the stopping cloud waits for the write, or exits",
                )
                locker.rollback()  # the write goes on, if anything still waits for it
                await until(lambda: not cloud.alive(), within=60, what="the cloud exits")
            finally:
                held.set()
                host.stop()
                cloud.stop()
            logged = watcher.execute(
                "SELECT step_index, input_tokens FROM decisions WHERE task_id = %s", (task_id,)
            ).fetchall()
            unknown = watcher.execute("SELECT count(*) FROM unsettled_calls").fetchone()
    postgres_server.drop_database(url)
    assert logged == [(1, 1000)]
    assert unknown == (0,)
