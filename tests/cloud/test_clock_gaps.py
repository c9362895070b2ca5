"""A replica whose wall clock steps forward, or that stood still, treats the gap as an outage
(cloud/lease/clock.py), on both backends: with no other replica alive, live leases get a new
term before any renewal or sweep holds their expiry against the clock. A `.ci/run` lost every
lease of a benchmark so, when its virtual machine was restored from a snapshot mid-run.

The steps are made by moving the store's clock (`Store.now`, the clock every expiry is held
against) and, for a standstill, the watch's monotonic clock: a real clock cannot be stepped
from a test without root and without disturbing every other process on the machine."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pytest

from cloud.events import EventBus
from cloud.lease.batcher import RenewalBatcher
from cloud.lease.clock import ClockWatch
from cloud.server import build_server
from cloud.settings import CloudSettings
from cloud.store import leases
from cloud.store.database import Store
from cloud.store.ports import StoreLeaseGate
from tests.cloud.test_renewal_writes import HALF, _item, _lease, _row
from tests.support.waiting import until


def _shift(store: Store, monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """A function that moves `store`'s wall clock to real time + the given seconds."""
    real = Store.now

    def to(seconds: float) -> None:
        monkeypatch.setattr(store, "now", lambda: real() + dt.timedelta(seconds=seconds))

    return to


async def _alone() -> bool:
    return False


async def _not_alone() -> bool:
    return True


async def test_a_step_forward_gives_live_leases_a_new_term_before_any_renewal(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = await _lease(store)
    watch = ClockWatch(store, _alone, gap_s=5.0)
    batcher = RenewalBatcher(store, EventBus(store), 0.0, 500, HALF, clock=watch)
    batcher.start()
    try:
        _shift(store, monkeypatch)(3600.0)  # the machine was restored from an hour-old snapshot
        out = await batcher.renew(_item(c))
        assert out.expires_at is not None, out  # accepted: the lease got a new term first
        assert out.expires_at >= store.now() + dt.timedelta(seconds=29)
    finally:
        await batcher.stop()
    assert watch.outages == 1
    assert await leases.sweep_expired(store) == []
    assert (await _row(store, c.task_id)).ended_at is None


async def test_without_the_watch_the_same_step_loses_the_lease(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the step alone makes the renewal refused and the sweep end the lease."""
    c = await _lease(store)
    batcher = RenewalBatcher(store, EventBus(store), 0.0, 500, HALF)
    batcher.start()
    try:
        _shift(store, monkeypatch)(3600.0)
        out = await batcher.renew(_item(c))
        assert out.expires_at is None
    finally:
        await batcher.stop()
    (ended,) = await leases.sweep_expired(store)
    assert ended.task_id == c.task_id


async def test_a_replica_that_stood_still_gives_a_new_term(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both clocks moved a minute between two checks (a paused virtual machine, SIGSTOP):
    no host could be heard meanwhile."""
    c = await _lease(store)
    mono = [1000.0]
    watch = ClockWatch(store, _alone, gap_s=5.0, monotonic=lambda: mono[0])
    mono[0] += 60.0
    _shift(store, monkeypatch)(60.0)
    await watch.settled()
    assert watch.outages == 1
    assert await leases.sweep_expired(store) == []
    row = await _row(store, c.task_id)
    assert row.lease_expires_at is not None
    assert row.lease_expires_at >= store.now() + dt.timedelta(seconds=29)


async def test_small_gaps_change_nothing(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    c = await _lease(store)
    before = (await _row(store, c.task_id)).lease_expires_at
    mono = [1000.0]
    watch = ClockWatch(store, _alone, gap_s=5.0, monotonic=lambda: mono[0])
    shift = _shift(store, monkeypatch)
    shift(3.0)  # an NTP step below the gap
    await watch.settled()
    mono[0] += 4.0  # a busy loop that checked four seconds later, one of them the tick's
    await watch.settled()
    shift(0.0)  # and one back
    await watch.settled()
    assert watch.outages == 0
    assert (await _row(store, c.task_id)).lease_expires_at == before


async def test_a_step_back_keeps_each_live_lease_s_time_left(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An hour's step back (an NTP correction, a snapshot of the future put right) left every
    stored expiry an hour further off by the new clock: a renewal kept it (far enough) and told
    the host "an hour and 30 s left", and a host that died then held its task for an hour more
    than its lease. The step comes off live leases, so each keeps the time it had left."""
    c = await _lease(store)
    before = (await _row(store, c.task_id)).lease_expires_at
    assert before is not None
    watch = ClockWatch(store, _alone, gap_s=5.0)
    batcher = RenewalBatcher(store, EventBus(store), 0.0, 500, HALF, clock=watch)
    batcher.start()
    try:
        _shift(store, monkeypatch)(-3600.0)
        out = await batcher.renew(_item(c))
        assert out.expires_at is not None, out
        assert out.expires_at <= store.now() + dt.timedelta(seconds=31)
    finally:
        await batcher.stop()
    row = await _row(store, c.task_id)
    assert row.lease_expires_at is not None
    assert row.lease_expires_at <= before - dt.timedelta(seconds=3600 - 1)
    assert watch.outages == 0  # no new term: nothing was lost


async def test_with_another_replica_alive_a_step_back_changes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The others kept their clocks; their sweeps hold the stored expiries against them."""
    c = await _lease(store)
    before = (await _row(store, c.task_id)).lease_expires_at
    watch = ClockWatch(store, _not_alone, gap_s=5.0)
    _shift(store, monkeypatch)(-3600.0)
    await watch.settled()
    assert (await _row(store, c.task_id)).lease_expires_at == before


async def test_with_another_replica_alive_nothing_is_extended(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other replicas kept their clocks and swept as usual (a step here is this clock being
    put right): their view stands."""
    c = await _lease(store)
    watch = ClockWatch(store, _not_alone, gap_s=5.0)
    _shift(store, monkeypatch)(3600.0)
    await watch.settled()
    assert watch.outages == 0
    (ended,) = await leases.sweep_expired(store)
    assert ended.task_id == c.task_id


async def test_a_replica_s_sweeps_wait_for_the_new_term(
    db_url: str, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole replica: its sweep job runs every 50 ms, and its clock steps ten minutes while
    a lease is live; the sweep finds the new term, not an expired lease. (Deadlines are points
    in wall-clock time and stay: an hour's step would pass this task's.)"""
    settings = CloudSettings(
        database_url=db_url,
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        sweep_interval_seconds=0.05,
    )
    server = await build_server(settings)
    await server.start()
    try:
        c = await _lease(server.store)
        _shift(server.store, monkeypatch)(600.0)
        await until(lambda: server.leases.clock.outages > 0, 10, "the new term")
        await server.leases.sweeper.sweep()  # and one more sweep, for certain
        row = await _row(server.store, c.task_id)
        assert row.ended_at is None
    finally:
        await server.stop(0)


async def test_planner_decide_checks_its_lease_after_the_clock_settled(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PlannerDecide's lease check (`StoreLeaseGate`) waits for the new term too; without the
    watch the same step makes the lease look gone and the Decide is refused."""
    c = await _lease(store)
    watch = ClockWatch(store, _alone, gap_s=5.0)
    _shift(store, monkeypatch)(600.0)
    assert not await StoreLeaseGate(store).is_live("h1", c.task_id, c.attempt, c.lease_id)
    gate = StoreLeaseGate(store, watch.settled)
    assert await gate.is_live("h1", c.task_id, c.attempt, c.lease_id)
    assert watch.outages == 1
