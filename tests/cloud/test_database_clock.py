"""A replica whose clock is minutes off its PostgreSQL server's is refused at start.

Replicas hold one another's lease expiries against their own clocks (`Store.now`): a replica
minutes ahead would requeue every lease the others keep (their tasks then run on two phones),
one minutes behind would keep a dead host's work that much longer. `ClockWatch` sees only a
replica's own steps. Real PostgreSQL and a real replica; the replica's clock is moved (as in
test_clock_gaps.py: a real clock cannot be set without root and without moving every other
process's). Before, the replica started and served whatever its clock said.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from typing import Any

import pytest

from cloud import metrics
from cloud.server import build_server
from cloud.startup import explain
from cloud.store import leases
from cloud.store.database import Store
from tests.cloud.test_renewal_writes import HALF, _item, _lease

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize(("minutes", "side"), [(3, "ahead of"), (-3, "behind")])
async def test_a_replica_minutes_off_the_database_is_refused_and_ends_no_lease(
    store: Store, make_settings: Any, monkeypatch: pytest.MonkeyPatch, minutes: int, side: str
) -> None:
    live = await _lease(store)  # another replica's host holds it
    real = Store.now
    monkeypatch.setattr(Store, "now", staticmethod(lambda: real() + dt.timedelta(minutes=minutes)))
    server = await build_server(make_settings())
    try:
        with pytest.raises(RuntimeError, match="clock is") as refused:
            await server.start()
    finally:
        await server.stop(0)  # (a start that fails has stopped already: then nothing to do)
        monkeypatch.setattr(Store, "now", staticmethod(real))
    line = explain(refused.value)
    assert line is not None and line.startswith(
        f"this machine's clock is 180 s {side} the database server's"
    ), line
    assert "synchronise it (NTP)" in line, line
    (renewed,) = await leases.renew_batch(store, [_item(live)], HALF)
    assert renewed.expires_at is not None, renewed  # its lease is as it was


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_replica_whose_clock_drifts_after_start_says_so_once_and_serves_on(
    make_settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The check ran at start only: a replica whose clock drifted later went on misjudging
    other replicas' leases with nothing said. Now the `database-clock` job repeats it every
    minute (its step is called here rather than waited for): an error once when the offset
    passes the limit, a line once when it is back, the offset as a metric, and the replica
    keeps serving (the module's docstring says why)."""
    server = await build_server(make_settings(metrics_enabled=True))
    await server.start()
    real = Store.now
    try:
        job = next(j for j in server._jobs if j.get_name() == "database-clock")
        watch = server.database_clock
        with caplog.at_level(logging.WARNING, logger="cloud.lease.database_clock"):
            await watch.step()  # in time: nothing to say
            monkeypatch.setattr(
                Store, "now", staticmethod(lambda: real() + dt.timedelta(minutes=3))
            )
            await watch.step()
            await watch.step()  # still off: said once
            drifted = metrics.REGISTRY.get_sample_value("amc_cloud_database_clock_offset_seconds")
            monkeypatch.setattr(Store, "now", staticmethod(real))
            await watch.step()
            await watch.step()
        said = [
            (r.levelno, r.getMessage())
            for r in caplog.records
            if r.name == "cloud.lease.database_clock"
        ]
        assert [level for level, _ in said] == [logging.ERROR, logging.WARNING], said
        # 180 s less the query's round trip (179.9 under load): the figure, not its last digit
        ahead = re.search(r"clock is now ([\d.]+) s ahead of the database server's", said[0][1])
        assert ahead and 179 < float(ahead.group(1)) <= 181, said
        assert "it keeps serving: synchronise its clock (NTP)" in said[0][1], said
        assert "within 5 s of the database server's again" in said[1][1], said
        assert drifted is not None and 179 < drifted < 181, drifted
        assert not job.done()  # the replica serves on, the job with it
        assert abs(watch.offset_s) < 5
    finally:
        monkeypatch.setattr(Store, "now", staticmethod(real))
        await server.stop(0)
