"""A direct-transport host learns the fleet's daily budget and today's spending with its
assignment and each renewal (`FleetDay`), so it can check the daily cap before each model call
as Decide does on the cloud transport. A real cloud over mTLS, SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.server import build_server
from cloud.settings import CloudSettings
from cloud.store import spend
from planner.decision import Billed, Usage
from tests.cloud.cloud_harness import ScriptedHost, channel, renewal, submit, tasks_stub


async def test_a_direct_host_hears_the_fleet_s_day_with_its_assignment_and_renewals(
    make_settings: Callable[..., CloudSettings], pki_dir: Path
) -> None:
    """Cap 5,000 tokens: the direct host's assignment says nothing is spent today; once
    another host's spending of 1,000 tokens is counted, a renewal says so (the tally is read
    at most once a second, so renewals are sent until one does). A cloud-transport host hears
    nothing of it (the cloud checks for it)."""
    cloud = await build_server(make_settings(daily_max_tokens=5000))
    await cloud.start()
    direct = ScriptedHost(cloud.address, pki_dir, "a")
    viacloud = ScriptedHost(cloud.address, pki_dir, "b")
    ops = channel(cloud.address, pki_dir, "operator-ops")
    try:
        await direct.connect(["a1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        task_id = (await submit(tasks_stub(ops))).task.task_id
        a = (await direct.next("assignment")).assignment
        assert a.task_id == task_id
        day = f"{cloud.store.now().astimezone(dt.UTC):%Y-%m-%d}"
        assert a.fleet_day == lease_pb.FleetDay(
            caps=types_pb2.TaskBudget(max_tokens=5000), spent=types_pb2.Usage(), day=day
        )

        billed = Billed("anthropic", "m", Usage(900, 100, cost_usd=0.25))
        await spend.count_failed(cloud.store, "elsewhere", task_id, 1, billed, "PlannerError")
        heard = types_pb2.Usage()
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=15)
        while heard.input_tokens != 900:
            assert dt.datetime.now(dt.UTC) < deadline, "no renewal said what was spent"
            await direct.send(renewal(a))
            renewed = (await direct.next("renewed")).renewed
            assert renewed.fleet_day.caps.max_tokens == 5000
            heard = renewed.fleet_day.spent
        assert (heard.output_tokens, heard.cost_usd) == (100, 0.25)

        await viacloud.connect(["b1"])
        await submit(tasks_stub(ops))
        b = (await viacloud.next("assignment")).assignment
        assert not b.HasField("fleet_day")
        await viacloud.send(renewal(b))
        assert not (await viacloud.next("renewed")).renewed.HasField("fleet_day")
    finally:
        await direct.close()
        await viacloud.close()
        await ops.close()
        await cloud.stop(0.5)
