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
from typing import Any

import pytest

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
