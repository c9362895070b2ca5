"""A replica's hint of which phones are busy survives its periodic resync with the store.

The resync read each host's live attempts and then overwrote the hint. A claim that committed
while it read was undone: the phone looked idle, the next pass offered it to a claim that
could only fail on the one-live-attempt-per-phone index, and in a burst of hellos such
misses made a pass give up on the untargeted queue before it reached the hosts that really
were idle (bench/dispatch_burst.py: hosts waited a pass, 2 s, for tasks that were queued).
A lease that ended while it read was undone the other way: a free phone looked busy until
the next resync. Both backends, a real store and the replica's own dispatcher; the resync's
read is wrapped only to let the claim or the release land while it is in flight.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import pytest

from amc.v1 import types_pb2
from cloud.events import EventBus
from cloud.lease.dispatcher import Dispatcher
from cloud.lease.session import HostSession
from cloud.store import leases, states, tasks
from cloud.store.database import Store
from tests.cloud.cloud_harness import columns_added

Read = Callable[[Store, Sequence[str]], Awaitable[dict[str, set[str]]]]


def _host(host_id: str) -> HostSession:
    session = HostSession(
        host_id=host_id,
        planner_transport=types_pb2.PLANNER_TRANSPORT_DIRECT,
        recorded=True,
        settled=True,
    )
    session.devices = {"p": types_pb2.DEVICE_STATE_ONLINE}
    return session


async def _submit(store: Store) -> str:
    view, _ = await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=600)
    )
    return view.task.task_id


def _during_read(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], Awaitable[None]]) -> None:
    """Run `meanwhile` after the resync's store read and before it applies what it read."""
    real: Read = leases.live_serials_by_host

    async def read(store: Store, host_ids: Sequence[str]) -> dict[str, set[str]]:
        found = await real(store, host_ids)
        await meanwhile()
        return found

    monkeypatch.setattr(leases, "live_serials_by_host", read)


async def test_a_claim_during_the_resync_stays_busy(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _host("h1")
    dispatcher = Dispatcher(store, EventBus(store), {"h1": session})
    await _submit(store)
    got: list[int] = []

    async def claim() -> None:
        got.append(await dispatcher.dispatch_host(session))

    _during_read(monkeypatch, claim)
    await dispatcher._resync_busy()
    assert got == [1]
    assert session.busy == {"p"}
    assert not session.has_idle()


async def test_a_lease_ended_during_the_resync_stays_free(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _host("h1")
    dispatcher = Dispatcher(store, EventBus(store), {"h1": session})
    await _submit(store)
    assert await dispatcher.dispatch_host(session) == 1
    held = set(session.granted)

    async def end() -> None:  # what the replica does when its sweep ends a host's leases
        ended = await leases.release(store, "h1", states.STREAM_LOST, only=held)
        session.mark_free(e.device_serial for e in ended)

    _during_read(monkeypatch, end)
    await dispatcher._resync_busy()
    assert session.busy == set()
    assert session.has_idle()


async def test_the_resync_still_corrects_a_wrong_hint(store: Store) -> None:
    """Nothing changed while it read: the store's word replaces the hint either way."""
    session = _host("h1")
    dispatcher = Dispatcher(store, EventBus(store), {"h1": session})
    await _submit(store)
    assert await dispatcher.dispatch_host(session) == 1
    session.busy = set()  # a hint gone wrong (a lease ended or granted on another replica)
    await dispatcher._resync_busy()
    assert session.busy == {"p"}
    session.busy = {"p", "gone"}
    await dispatcher._resync_busy()
    assert session.busy == {"p"}


async def test_an_assignment_that_never_left_the_replica_uses_no_attempt(store: Store) -> None:
    """The host's stream went away while its claim ran (a newer stream took its place, or
    the replica is shutting down): the assignment was never sent, so the attempt is handed
    back at once and does not count. A task allowed one attempt used to fail with "released:
    the host's stream closed before its assignment was sent" without ever running."""
    gone = _host("h1")
    dispatcher = Dispatcher(store, EventBus(store), {})  # the stream is no longer the host's
    view, _ = await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=1, lease_seconds=30, timeout_seconds=600)
    )
    task_id = view.task.task_id
    assert await dispatcher.dispatch_host(gone) == 1
    after = await tasks.get(store, task_id)
    assert after is not None
    assert after.task.status == states.QUEUED, after.task
    (unsent,) = after.attempts
    assert unsent.failure_reason == states.STREAM_LOST
    # Its one attempt is still to come, and it is the last one.
    here = _host("h2")
    dispatcher = Dispatcher(store, EventBus(store), {"h2": here})
    assert await dispatcher.dispatch_host(here) == 1
    ended = await leases.release(store, "h2", states.HOST_RESTARTED)
    assert [(e.attempt, e.task_status) for e in ended] == [(2, states.FAILED)]


async def test_migration_0019_adds_the_tasks_unsent_attempts_and_back(db_url: str) -> None:
    """Both backends: 0019 adds `tasks.unsent_attempts` (its server default, 0, fills the rows
    already there), its downgrade drops it, and the schema matches the models again after the
    upgrade."""
    assert await columns_added(db_url, "tasks", "0018", "0019") == {"unsent_attempts"}
