"""A claim whose commit outcome is unknown (the database went away mid-commit): the replica
looks on those phones again on its next pass and sends the lease the claim did create.

Both backends, a real store and the replica's own dispatcher; the claim is wrapped only to
fail after its real commit (what a connection cut between the COMMIT and its answer does),
and the look is wrapped only to let the host's stream end while it is in flight.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy.exc import OperationalError

from amc.v1 import types_pb2
from cloud.events import EventBus
from cloud.lease.dispatcher import Dispatcher
from cloud.lease.session import Closing, HostSession
from cloud.store import leases, states, tasks
from cloud.store.database import Store


def _host(host_id: str) -> HostSession:
    session = HostSession(
        host_id=host_id,
        planner_transport=types_pb2.PLANNER_TRANSPORT_DIRECT,
        recorded=True,
        settled=True,
    )
    session.devices = {"p": types_pb2.DEVICE_STATE_ONLINE}
    return session


async def _unsure_claim(
    store: Store, dispatcher: Dispatcher, session: HostSession, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A max_attempts=1 task claimed for `session`'s phone by a claim that committed and then
    raised, as a cut connection does: the dispatcher cannot tell whether it committed."""
    view, _ = await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=1, lease_seconds=30, timeout_seconds=600)
    )
    real = leases.claim

    async def cut(*args: object, **kwargs: object) -> leases.Claimed | None:
        await real(*args, **kwargs)  # type: ignore[arg-type]
        raise OperationalError("COMMIT", {}, Exception("server closed the connection"))

    with monkeypatch.context() as m:
        m.setattr(leases, "claim", cut)
        assert await dispatcher.dispatch_host(session) == 0
    assert session.unsure_serials == {"p"}
    assert not session.granted and session.outbox.empty()
    return view.task.task_id


def _during_look(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], None]) -> None:
    """Run `meanwhile` after the look for the unsure claims' leases and before their send."""
    real = leases.live_attempts_on

    async def look(store: Store, host_id: str, serials: set[str]) -> list[leases.Claimed]:
        found = await real(store, host_id, serials)
        meanwhile()
        return found

    monkeypatch.setattr(leases, "live_attempts_on", look)


async def test_an_unsure_claim_that_committed_is_sent_on_the_next_pass(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _host("h1")
    dispatcher = Dispatcher(store, EventBus(store), {"h1": session})
    task_id = await _unsure_claim(store, dispatcher, session, monkeypatch)
    await dispatcher.dispatch_pass()
    sent = session.outbox.get_nowait()
    assert not isinstance(sent, Closing) and sent.WhichOneof("kind") == "assignment"
    assert (sent.assignment.task_id, sent.assignment.attempt) == (task_id, 1)
    assert session.busy == {"p"} and not session.unsure_serials
    assert {h.task_id for h in session.granted} == {task_id}


@pytest.mark.parametrize("how", ["closed", "replaced"])
async def test_an_unsure_claim_whose_stream_went_away_before_its_send_uses_no_attempt(
    store: Store, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The host's stream ended (or a newer stream of the host took its place) while the
    replica looked for what an unsure claim created. The send was dropped on the closed
    stream, and the lease was left to run out: the task stayed ASSIGNED to work no host
    received, and then a max_attempts=1 task failed. Now it is handed back unused, as a
    claim whose stream went away mid-claim is: QUEUED again, its attempt ended as never
    sent."""
    session = _host("h1")
    sessions = {"h1": session}
    dispatcher = Dispatcher(store, EventBus(store), sessions)
    task_id = await _unsure_claim(store, dispatcher, session, monkeypatch)

    def away() -> None:
        if how == "closed":
            session.closed = True
        else:  # the newer stream's hello read the phone busy: the unsure lease was live
            sessions["h1"] = _host("h1")
            sessions["h1"].set_busy({"p"})

    _during_look(monkeypatch, away)
    async with session.dispatch_lock:
        assert await dispatcher._send_unsure(session)
    after = await tasks.get(store, task_id)
    assert after is not None
    assert after.task.status == states.QUEUED, after.task
    assert [a.failure_reason for a in after.attempts] == [states.STREAM_LOST]
    assert not session.granted
    # The host's stream now (a newer one) may have the phone again at once, not only after
    # the next busy resync.
    assert sessions["h1"].has_idle()
