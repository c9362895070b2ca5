"""The host's outbox: durable order, the backlog it reports, and its sender against the real
cloud — waiting with backoff while the cloud is down, sending the backlog once it is back
(exactly once in the log), and setting aside what the cloud refuses for good."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import (
    artifact_service_pb2,
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    lease_service_pb2,
    task_service_pb2,
    types_pb2,
)
from cloud import pki, revocations
from cloud.server import CloudServer
from cloud.settings import CloudSettings
from host.outbox import OutboxSender, OutboxStore
from host.outbox.kinds import DECISION, FAILED_CALLS, SCREENSHOT, UNSETTLED
from host.outbox.shipments import Shipments
from planner.decide_limits import MAX_USER_PROMPT
from planner.decision import MAX_MODEL_TEXT, MAX_THINKING_BLOCK_BYTES, MAX_TYPED_TEXT, Billed, Usage
from planner.planner import Planner
from planner.prompts import build_user_prompt
from planner.scene import Scene
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
from tests.cloud.cloud_harness import ScriptedHost, channel, started, submit, tasks_stub
from tests.cloud.test_shipping import shipped
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    FakeModelServer,
    anthropic_message,
    text,
    thinking,
    tool_use,
)
from tests.support.migrated import migrated_sqlite_url
from tests.support.mtls import start_mtls
from tests.support.processes import free_port


def test_items_keep_their_order_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    store = OutboxStore(path, keep_refused=2)
    early = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    store.put(DECISION, "d1", b"decision one", now=early)
    store.put(SCREENSHOT, "d1-before", b"png")
    store.put(DECISION, "d1", b"decision one with its outcome")
    store.put(DECISION, "d2", b"decision two")
    store.close()

    store = OutboxStore(path, keep_refused=2)  # a host restart: the backlog is still there
    items = store.head(10)
    assert [(i.kind, i.item_id, i.body) for i in items] == [
        (DECISION, "d1", b"decision one"),
        (SCREENSHOT, "d1-before", b"png"),
        (DECISION, "d1", b"decision one with its outcome"),
        (DECISION, "d2", b"decision two"),
    ]
    backlog = store.backlog()
    assert (backlog.items, backlog.decisions, backlog.oldest_at, backlog.refused) == (
        4,
        2,
        early,
        0,
    )
    store.sent([items[0].seq, items[1].seq])
    store.failed([items[2].seq], "UNAVAILABLE: down")
    store.refused(items[3].seq, "FAILED_PRECONDITION: too old")
    assert [(i.item_id, i.tries) for i in store.head(10)] == [("d1", 1)]
    assert store.backlog().refused == 1
    assert store.refusals() == [(DECISION, "d2", "FAILED_PRECONDITION: too old")]
    for n in range(3):  # refusals are kept, the latest `keep_refused` of them
        store.refused(store.put(DECISION, f"r{n}", b"x"), "refused")
    assert store.backlog().refused == 2
    store.close()


def _settings(tmp_path: Path, pki_dir: Path, port: int) -> CloudSettings:
    return CloudSettings(
        database_url=migrated_sqlite_url(tmp_path / "cloud.sqlite3"),
        listen_address=f"127.0.0.1:{port}",
        pki_dir=pki_dir,
        default_lease_seconds=60,
        dispatch_interval_seconds=0.2,
        shutdown_grace_seconds=0.2,
    )


async def _until(condition: Callable[[], Any], what: str, within: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await asyncio.to_thread(condition):
        assert loop.time() < deadline, f"{what} not within {within}s"
        await asyncio.sleep(0.05)


async def test_the_backlog_waits_for_the_cloud_and_is_logged_once(tmp_path: Path) -> None:
    pki_dir = pki.ensure_embedded_pki(tmp_path, ["h1"], operator="ops")
    port = free_port()
    settings = _settings(tmp_path, pki_dir, port)
    address = f"127.0.0.1:{port}"
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    sender = OutboxSender(
        store, lambda: channel(address, pki_dir, "host-h1"), initial_s=0.05, max_s=0.5
    )
    stop = asyncio.Event()
    running: asyncio.Task[None] | None = None
    try:
        # A lease the host holds, from a cloud that then goes down.
        async with (
            started(settings, 0.2) as cloud,
            ScriptedHost(cloud.address, pki_dir, "h1") as host,
            channel(cloud.address, pki_dir, "operator-ops") as ops_ch,
        ):
            await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
            await submit(tasks_stub(ops_ch), target=types_pb2.TaskTarget(host_id="h1"))
            a = (await host.next("assignment")).assignment
        running = asyncio.create_task(sender.run(stop))
        for n in range(1, 4):
            store.put(DECISION, f"d{n}", shipped(a, f"d{n}").SerializeToString())
        store.put(DECISION, "d1", shipped(a, "d1", executed=True).SerializeToString())
        # Nothing listens: the batch stays at the head and its tries are counted.
        await _until(lambda: store.head(1)[0].tries >= 2, "retries while the cloud is down")
        assert store.backlog().items == 4
        assert sender.last_error is not None and sender.last_error.startswith("UNAVAILABLE")

        async with started(settings, 0.2) as cloud:  # back, on the same database
            sender.retry_now.set()  # what a lease stream's Welcome does
            await _until(lambda: store.backlog().items == 0, "the backlog sent")
            async with channel(cloud.address, pki_dir, "operator-ops") as ops_ch:
                rows = await decision_log_service_pb2_grpc.DecisionLogServiceStub(
                    ops_ch
                ).ListDecisions(decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id))
            assert [d.step_index for d in rows.decisions] == [1, 2, 3]
            assert rows.decisions[0].outcome.executed

            # A refusal for good (a lease this host never held) is set aside; the next goes.
            bad = shipped(a, "bad")
            bad.lease_id = "forged"
            store.put(DECISION, "bad", bad.SerializeToString())
            store.put(DECISION, "d4", shipped(a, "d4").SerializeToString())
            await _until(lambda: store.backlog().items == 0, "the good item sent")
            assert store.backlog().refused == 1
            ((kind, item, reason),) = store.refusals()
            assert (kind, item) == (DECISION, "bad")
            assert reason.startswith("FAILED_PRECONDITION: entries[0]: lease 'forged'")
    finally:
        stop.set()
        if running is not None:
            await running
        store.close()


@dataclass
class _Shipping:
    """A real cloud with a task assigned to host h1, and h1's outbox (not sending yet)."""

    cloud: CloudServer
    store: OutboxStore
    sender: OutboxSender
    host: ScriptedHost
    ops: grpc.aio.Channel
    task: lease_service_pb2.Assignment
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    running: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.running = asyncio.create_task(self.sender.run(self.stop))

    async def logged_steps(self) -> list[int]:
        """The step indexes the cloud's decision log holds for the task."""
        rows = await decision_log_service_pb2_grpc.DecisionLogServiceStub(self.ops).ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=self.task.task_id)
        )
        return [d.step_index for d in rows.decisions]


@contextlib.asynccontextmanager
async def _outbox_of_a_task(tmp_path: Path) -> AsyncIterator[_Shipping]:
    pki_dir = pki.ensure_embedded_pki(tmp_path, ["h1"], operator="ops")
    port = free_port()
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    sender = OutboxSender(
        store, lambda: channel(f"127.0.0.1:{port}", pki_dir, "host-h1"), initial_s=0.05, max_s=0.5
    )
    async with started(_settings(tmp_path, pki_dir, port), 0.2) as cloud:
        host = ScriptedHost(cloud.address, pki_dir, "h1")
        ops = channel(cloud.address, pki_dir, "operator-ops")
        try:
            await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
            await submit(tasks_stub(ops), target=types_pb2.TaskTarget(host_id="h1"))
            task = (await host.next("assignment")).assignment
            shipping = _Shipping(cloud, store, sender, host, ops, task)
            try:
                yield shipping
            finally:
                shipping.stop.set()
                if shipping.running is not None:
                    await shipping.running
        finally:
            store.close()
            await host.close()
            await ops.close()


async def test_a_revoked_certificate_keeps_the_backlog_until_it_is_accepted_again(
    tmp_path: Path,
) -> None:
    """UNAUTHENTICATED refuses the caller, not the item: a host whose certificate is revoked
    (by mistake and lifted, or until its new certificate is installed, `docs/deployment.md`)
    keeps its decisions and sends them once it is accepted again. They used to be refused for
    good one by one, their bodies wiped: the attempt's log never got them."""
    async with _outbox_of_a_task(tmp_path) as s:
        a, store = s.task, s.store
        await s.host.close()
        await revocations.revoke(s.cloud.store, host_id="h1", reason="by mistake")
        await s.cloud.revocations.refresh()
        s.start()
        store.put(DECISION, "d1", shipped(a, "d1").SerializeToString())
        store.put(DECISION, "d2", shipped(a, "d2").SerializeToString())
        await _until(
            lambda: not (tried := store.head(1)) or tried[0].tries >= 2, "tries while refused"
        )
        assert s.sender.last_error is not None
        assert s.sender.last_error.startswith("UNAUTHENTICATED")
        assert (store.backlog().items, store.backlog().refused) == (2, 0)

        await revocations.lift(s.cloud.store, host_id="h1")
        await s.cloud.revocations.refresh()
        s.sender.retry_now.set()
        await _until(lambda: store.backlog().items == 0, "the backlog sent")
        assert store.backlog().refused == 0
        assert await s.logged_steps() == [1, 2]


async def test_an_item_too_big_to_send_is_set_aside_and_the_backlog_goes_on(
    tmp_path: Path,
) -> None:
    """A screenshot over the 16 MiB a message may have (a noisy full-screen picture on a
    high-resolution phone: PNG barely compresses it) cannot be sent at all: gRPC refuses it on
    the host's side with RESOURCE_EXHAUSTED, a code the outbox waits out. It used to stay at
    the head for ever, retried with backoff, and nothing written after it (decisions,
    screenshots) ever reached the cloud, also after a restart."""
    async with _outbox_of_a_task(tmp_path) as s:
        a, store = s.task, s.store
        store.put(DECISION, "d1", shipped(a, "d1").SerializeToString())
        huge = artifact_service_pb2.UploadStepScreenshotRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            host_decision_id="d1",
            phase=artifact_service_pb2.SCREENSHOT_PHASE_BEFORE,
            content_type="image/png",
            data=b"\x89PNG\r\n\x1a\n" + bytes(17 * 1024 * 1024),
        )
        store.put(SCREENSHOT, "d1-before", huge.SerializeToString())
        store.put(DECISION, "d2", shipped(a, "d2").SerializeToString())
        s.start()
        await _until(lambda: store.backlog().items == 0, "the items after it sent")
        ((kind, item, reason),) = store.refusals()
        assert (kind, item) == (SCREENSHOT, "d1-before")
        assert "16 MiB" in reason
        assert await s.logged_steps() == [1, 2]


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INVALID_ARGUMENT])
def test_which_failures_are_retried(code: grpc.StatusCode) -> None:
    from host.outbox.sender import TRANSIENT

    assert (code in TRANSIENT) == (code == grpc.StatusCode.UNAVAILABLE)


class _FailsOnPoison(decision_log_service_pb2_grpc.DecisionLogServiceServicer):
    """A DecisionLogService that answers INTERNAL for any batch with the decision "poison"
    (a cloud's bug on that one item), RESOURCE_EXHAUSTED for one with "busy" (a rate limit,
    never lifted here), and takes the others."""

    def __init__(self) -> None:
        self.taken: list[str] = []
        self.calls = 0

    async def ShipDecisions(
        self, request: decision_log_service_pb2.ShipDecisionsRequest, context: Any
    ) -> decision_log_service_pb2.ShipDecisionsResponse:
        self.calls += 1
        ids = [e.host_decision_id for e in request.entries]
        if "poison" in ids:
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; retry later")
        if "busy" in ids:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limited")
        self.taken.extend(ids)
        return decision_log_service_pb2.ShipDecisionsResponse()


async def test_an_item_the_cloud_always_fails_on_is_set_aside_after_enough_tries(
    tmp_path: Path,
) -> None:
    """A decision the cloud answers INTERNAL for every time (a bug of the cloud's on what it
    carries) was retried for ever, and every decision and screenshot written after it waited
    behind it for good. It is now given up on after `give_up_tries` failures over `give_up_s`
    (10 and 10 minutes by default; 3 and none here), refused, and the backlog goes on; its
    neighbours in the batch are sent. A rate limit (RESOURCE_EXHAUSTED) is still waited out."""
    servicer = _FailsOnPoison()  # type: ignore[abstract]  # serves ShipDecisions only
    server = grpc.aio.server()
    decision_log_service_pb2_grpc.add_DecisionLogServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    sender = OutboxSender(
        store,
        lambda: grpc.aio.insecure_channel(f"127.0.0.1:{port}"),
        initial_s=0.01,
        max_s=0.05,
        give_up_tries=3,
        give_up_s=0.0,
    )
    a = lease_service_pb2.Assignment(task_id="t1", attempt=1, lease_id="l1")
    for item in ("d1", "poison", "d2"):
        store.put(DECISION, item, shipped(a, item).SerializeToString())
    stop = asyncio.Event()
    running = asyncio.create_task(sender.run(stop))
    try:
        await _until(lambda: store.backlog().items == 0, "the items around it sent")
        assert servicer.taken == ["d1", "d2"]
        ((kind, item, reason),) = store.refusals()
        assert (kind, item) == (DECISION, "poison")
        assert reason.startswith("INTERNAL: internal error; retry later (3 tries")

        store.put(DECISION, "busy", shipped(a, "busy").SerializeToString())
        calls = servicer.calls
        await _until(lambda: servicer.calls >= calls + 6, "tries while rate limited")
        assert (store.backlog().items, store.backlog().refused) == (1, 1)
        assert sender.last_error == "RESOURCE_EXHAUSTED: rate limited"
    finally:
        stop.set()
        await running
        store.close()
        await server.stop(None)


async def test_the_failures_on_an_item_are_counted_across_a_restart(tmp_path: Path) -> None:
    """The sender counted the cloud's failures on an item (INTERNAL, UNKNOWN) in memory: a
    host restarted gave an item the cloud always fails on another `give_up_tries` tries over
    another `give_up_s` (10 tries, 10 minutes), holding every item behind it that much longer
    after each restart. The count and the first failure's time are kept with the item."""
    servicer = _FailsOnPoison()  # type: ignore[abstract]  # serves ShipDecisions only
    server = grpc.aio.server()
    decision_log_service_pb2_grpc.add_DecisionLogServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    path = tmp_path / "outbox.sqlite3"

    def sender(store: OutboxStore, give_up_tries: int) -> OutboxSender:
        return OutboxSender(
            store,
            lambda: grpc.aio.insecure_channel(f"127.0.0.1:{port}"),
            initial_s=0.01,
            max_s=0.05,
            give_up_tries=give_up_tries,
            give_up_s=0.0,
        )

    store = OutboxStore(path)
    a = lease_service_pb2.Assignment(task_id="t1", attempt=1, lease_id="l1")
    store.put(DECISION, "poison", shipped(a, "poison").SerializeToString())
    stop = asyncio.Event()
    running = asyncio.create_task(sender(store, give_up_tries=1000).run(stop))
    try:
        await _until(lambda: servicer.calls >= 2, "the cloud failed on it twice")
    finally:
        stop.set()
        await running  # the try under way ends and is counted
        store.close()
    before = servicer.calls
    store = OutboxStore(path)  # the host restarted
    assert [i.tries for i in store.head(10)] == [before]
    stop = asyncio.Event()
    running = asyncio.create_task(sender(store, give_up_tries=before + 2).run(stop))
    try:
        await _until(lambda: store.backlog().refused == 1, "the item given up on")
        assert servicer.calls == before + 2  # two more tries, not before + 2 more
        ((_, _, reason),) = store.refusals()
        assert reason.startswith(f"INTERNAL: internal error; retry later ({before + 2} tries")
    finally:
        stop.set()
        await running
        store.close()
        await server.stop(None)


def test_an_outbox_an_older_host_wrote_is_read_and_counted(tmp_path: Path) -> None:
    """A file from before the failure count was kept with the items gets its columns when
    opened; its items are still there, in order, and sent as before."""
    path = tmp_path / "outbox.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executescript(
            """
            CREATE TABLE outbox (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                kind TEXT NOT NULL,
                item_id TEXT NOT NULL,
                body BLOB NOT NULL,
                created_at TEXT NOT NULL,
                state TEXT NOT NULL DEFAULT 'pending',
                tries INTEGER NOT NULL DEFAULT 0,
                last_error TEXT
            );
            INSERT INTO outbox (kind, item_id, body, created_at, tries)
            VALUES ('decision', 'd1', x'01', '2026-01-01T00:00:00+00:00', 3);
            """
        )
    store = OutboxStore(path)
    try:
        (item,) = store.head(10)
        assert (item.item_id, item.tries, item.suspect, item.suspect_since) == ("d1", 3, 0, None)
        first = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
        store.failed([item.seq], "INTERNAL: x", suspect_at=first)
        store.failed([item.seq], "INTERNAL: x", suspect_at=first + dt.timedelta(seconds=5))
        store.failed([item.seq], "UNAVAILABLE: down")
        (item,) = store.head(10)
        assert (item.tries, item.suspect, item.suspect_since) == (6, 2, first)
        store.forgive([item.seq])
        (item,) = store.head(10)
        assert (item.tries, item.suspect, item.suspect_since) == (6, 0, None)
    finally:
        store.close()
    OutboxStore(path).close()  # opened again: nothing left to add


async def test_a_prompt_the_screenshot_note_takes_past_the_limit_is_cut_not_refused(
    tmp_path: Path,
) -> None:
    """A direct-transport decision records the prompt as the model read it: a note where a
    screenshot the provider could not take would have been (~250 bytes), then the prompt. A
    prompt just under ShipDecisions' 512 KiB went over it with the note, and the cloud refused
    the shipment: the step never reached the decision log. It is cut to the limit instead,
    saying so, as the host's other oversize texts are."""
    with FakeModelServer() as model:
        model.script_anthropic(anthropic_message(text("Open Display."), tool_use("tap", _TAP)))
        settings = PlannerSettings(
            provider="anthropic",
            model="claude-sonnet-4-6",
            anthropic_api_key=ANTHROPIC_KEY,
            anthropic_base_url=model.anthropic_base_url,
            max_retries=0,
            send_screenshot=True,
        )
        planner = Planner(make_adapter(settings), settings)
        scene, goal = settings_main(), "Turn on dark theme"
        history = [_long_step(0)]
        history = [_long_step(MAX_USER_PROMPT - 100 - len(_prompt(goal, scene, history)))]
        assert len(_prompt(goal, scene, history)) == MAX_USER_PROMPT - 100
        unreadable = b"\x89PNG\r\n\x1a\n" + bytes(6 * 1024 * 1024)  # over Anthropic's 5 MB
        try:
            decision = await planner.decide(goal, scene, history, unreadable)
        finally:
            await planner.aclose()
    assert decision.user_prompt.startswith("[No screenshot this step")
    assert len(decision.user_prompt.encode()) > MAX_USER_PROMPT

    async with _outbox_of_a_task(tmp_path) as s:
        a = s.task
        Shipments(s.store, "direct").decision(a.task_id, a.attempt, a.lease_id, decision, str)
        s.start()
        await _until(lambda: s.store.backlog().items == 0, "the decision sent")
        assert s.store.refusals() == []
        rows = await decision_log_service_pb2_grpc.DecisionLogServiceStub(s.ops).ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id)
        )
    (logged,) = rows.decisions
    size = len(decision.user_prompt.encode())
    assert len(logged.user_prompt.encode()) <= MAX_USER_PROMPT
    head, marker = logged.user_prompt.rsplit("\n\n", 1)
    assert decision.user_prompt.startswith(head)
    assert marker == (
        f"[… cut here: the prompt the model read is {size:,} bytes, over the {MAX_USER_PROMPT:,} "
        "the decision log keeps; the host's own timeline has all of it]"
    )


_TAP = {"element_id": "e17", "purpose": "open display", "expected_outcome": "Display opens"}


def _long_step(padding: int) -> dict[str, Any]:
    """A compact history record whose rationale takes `padding` more bytes of the prompt."""
    return {
        "page": "com.android.settings: Settings",
        "action": {"tool": "swipe", "direction": "up"},
        "rationale": "Still looking for Display." + "." * padding,
        "success": True,
    }


def _prompt(goal: str, scene: Scene, history: list[dict[str, Any]]) -> bytes:
    return build_user_prompt(goal, scene, history).encode()


async def test_a_thinking_block_or_rationale_over_the_decision_log_s_limit_is_cut_not_refused(
    tmp_path: Path,
) -> None:
    """A thinking block and the text before the call are the model's own, at any length: with
    a 20,000-token budget Claude may write past the 64 KiB ShipDecisions takes of one (the
    cloud keeps its own decisions' whole). The cloud refused the shipment, and the step never
    reached the decision log. They are cut to the limit instead, saying so."""
    thought = "Display holds the theme; the list scrolls. " * 1600  # 68,800 bytes
    said = "Settings is open. " * 4000  # 72,000 bytes
    with FakeModelServer() as model:
        model.script_anthropic(
            anthropic_message(thinking(thought), text(said), tool_use("tap", _TAP))
        )
        settings = PlannerSettings(
            provider="anthropic",
            model="claude-sonnet-4-6",
            anthropic_api_key=ANTHROPIC_KEY,
            anthropic_base_url=model.anthropic_base_url,
            max_retries=0,
            thinking="budget",
            thinking_budget_tokens=20000,
        )
        planner = Planner(make_adapter(settings), settings)
        try:
            decision = await planner.decide("Turn on dark theme", settings_main())
        finally:
            await planner.aclose()
    assert [b.text for b in decision.thinking] == [thought]

    async with _outbox_of_a_task(tmp_path) as s:
        a = s.task
        Shipments(s.store, "direct").decision(a.task_id, a.attempt, a.lease_id, decision, str)
        s.start()
        await _until(lambda: s.store.backlog().items == 0, "the decision sent")
        assert s.store.refusals() == []
        rows = await decision_log_service_pb2_grpc.DecisionLogServiceStub(s.ops).ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id)
        )
    ((logged,),) = [d.thinking for d in rows.decisions]
    assert len(logged.text.encode()) <= MAX_THINKING_BLOCK_BYTES
    head, marker = logged.text.rsplit("\n\n", 1)
    assert thought.startswith(head)
    assert marker == (
        f"[… cut here: this thinking block is {len(thought):,} bytes, over the "
        f"{MAX_THINKING_BLOCK_BYTES:,} the decision log keeps; the host's own timeline has all "
        "of it]"
    )
    assert len(rows.decisions[0].rationale.encode()) <= MAX_MODEL_TEXT
    head, marker = rows.decisions[0].rationale.rsplit("\n\n", 1)
    assert said.startswith(head)
    assert marker.startswith(f"[… cut here: this rationale is {len(said.strip()):,} bytes")


async def test_a_text_typed_over_the_decision_log_s_limit_is_shipped_whole(
    tmp_path: Path,
) -> None:
    """What the host typed is shipped whole past the 64 KiB the decision log keeps of the
    model's other texts (`MAX_TYPED_TEXT`): cut, the record said another text than the phone
    got. Today's planner refuses a text over 4,000 characters before it is typed
    (planner/tools.py); an outbox written by a host from before that limit still holds such
    decisions, stood in for here by a decision whose text is replaced after the model's short
    answer."""
    typed = "A long note for the form. " * 3000  # 78,000 bytes
    with FakeModelServer() as model:
        model.script_anthropic(
            anthropic_message(
                tool_use(
                    "input_text",
                    {
                        "text": "short",
                        "purpose": "fill the note",
                        "expected_outcome": "Note filled",
                    },
                )
            )
        )
        settings = PlannerSettings(
            provider="anthropic",
            model="claude-sonnet-4-6",
            anthropic_api_key=ANTHROPIC_KEY,
            anthropic_base_url=model.anthropic_base_url,
            max_retries=0,
        )
        planner = Planner(make_adapter(settings), settings)
        try:
            decision = await planner.decide("Write the note", settings_main())
        finally:
            await planner.aclose()
    decision.arguments["text"] = typed
    decision.action.input_text.text = typed

    async with _outbox_of_a_task(tmp_path) as s:
        a = s.task
        Shipments(s.store, "direct").decision(a.task_id, a.attempt, a.lease_id, decision, str)
        s.start()
        await _until(lambda: s.store.backlog().items == 0, "the decision sent")
        assert s.store.refusals() == []
        rows = await decision_log_service_pb2_grpc.DecisionLogServiceStub(s.ops).ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id)
        )
    (logged,) = [d.action.input_text.text for d in rows.decisions]
    assert len(typed.encode()) > MAX_MODEL_TEXT
    assert logged == typed


class _CloudBeforeFailedCalls(decision_log_service_pb2_grpc.DecisionLogServiceServicer):
    """ShipDecisions as a cloud from before `failed_calls` answered it (its check, verbatim:
    the field is unknown to it, so a request carrying only failed calls has no entries). A
    stand-in: an older cloud cannot run beside this code in one process."""

    def __init__(self) -> None:
        self.calls = 0

    async def ShipDecisions(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if not request.entries:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "entries: at least one")
        return decision_log_service_pb2.ShipDecisionsResponse()


@contextlib.asynccontextmanager
async def _older_cloud(pki_dir: Path, port: int) -> AsyncIterator[_CloudBeforeFailedCalls]:
    servicer = _CloudBeforeFailedCalls()  # type: ignore[abstract]  # serves ShipDecisions only
    server = grpc.aio.server()
    decision_log_service_pb2_grpc.add_DecisionLogServiceServicer_to_server(servicer, server)
    await start_mtls(server, pki_dir, port)
    try:
        yield servicer
    finally:
        await server.stop(0.2)


async def test_failed_calls_an_older_cloud_cannot_take_wait_for_a_newer_one(
    tmp_path: Path,
) -> None:
    """A direct host ships a failed decision's billed calls to a cloud from before
    `failed_calls`, which refuses the request as one without entries. They are neither refused
    for good (lost) nor tried again and again: set aside, while the decision written after
    them goes; once the cloud is upgraded (the lease stream welcomed again) they are sent and
    counted in the task's totals."""
    pki_dir = pki.ensure_embedded_pki(tmp_path, ["h1"], operator="ops")
    port = free_port()
    settings = _settings(tmp_path, pki_dir, port)
    address = f"127.0.0.1:{port}"
    async with started(
        settings, 0.2
    ) as cloud:  # a lease of h1's, from the cloud before its downgrade
        host = ScriptedHost(cloud.address, pki_dir, "h1")
        ops_ch = channel(cloud.address, pki_dir, "operator-ops")
        await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        await submit(tasks_stub(ops_ch), target=types_pb2.TaskTarget(host_id="h1"))
        a = (await host.next("assignment")).assignment
        await host.close()
        await ops_ch.close()
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    shipments = Shipments(store, "direct")
    sender = OutboxSender(
        store, lambda: channel(address, pki_dir, "host-h1"), initial_s=0.05, max_s=0.5
    )
    billed = Billed("anthropic", "claude-sonnet-4-6", Usage(2000, 400, cost_usd=0.012))
    shipments.failed_calls(a.task_id, a.attempt, a.lease_id, billed, "PlannerError")
    store.put(DECISION, "d1", shipped(a, "d1").SerializeToString())
    stop = asyncio.Event()
    running = asyncio.create_task(sender.run(stop))
    try:
        async with _older_cloud(pki_dir, port) as older:
            await _until(lambda: older.calls >= 2, "the failed calls and the decision tried")
            await _until(lambda: store.head(1) == [], "nothing left in line")
            assert older.calls == 2, "tried once, not again and again"
            backlog = store.backlog()
            assert (backlog.items, backlog.refused) == (1, 0), "kept, not refused"
            sender.cloud_back()  # a welcome from the same older cloud: one more try, no loop
            await _until(lambda: older.calls == 3, "tried once more after the welcome")
            await _until(lambda: store.head(1) == [], "set aside again")
            assert store.backlog().refused == 0

        async with started(settings, 0.2) as cloud:  # upgraded, on the same database
            sender.cloud_back()  # what a lease stream's Welcome does
            await _until(lambda: store.backlog().items == 0, "the failed calls sent")
            ops_ch = channel(cloud.address, pki_dir, "operator-ops")
            try:
                got = await tasks_stub(ops_ch).GetTask(
                    task_service_pb2.GetTaskRequest(task_id=a.task_id)
                )
            finally:
                await ops_ch.close()
            usage = got.task.totals.usage
            assert (usage.input_tokens, usage.output_tokens) == (2000, 400)
            assert store.backlog().refused == 0
    finally:
        stop.set()
        await running
        store.close()


async def test_a_call_s_marker_goes_with_its_record_or_ships_as_unknown_then_settled(
    tmp_path: Path,
) -> None:
    """The direct transport's call markers (decision 0080) live beside the outbox: one goes in
    the same write as the decision that reports its call; one whose call ended unknown moves
    into the outbox as an unsettled call (the record the ledger wrote before the call); and
    a late answer's failed-calls record names it, so the cloud settles it when counted."""
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    try:
        shipments = Shipments(store, "direct")
        assert shipments.call_ledger("t1", 1, "") is None  # no lease: nothing ships
        assert Shipments(store, "cloud").call_ledger("t1", 1, "l1") is None
        ledger = shipments.call_ledger("t1", 1, "l1")
        assert ledger is not None
        bound = Usage(input_tokens=12_000, output_tokens=8_192, cost_usd=0.16)
        answered = await ledger.opened("anthropic", "claude-sonnet-4-6", bound)
        lost = await ledger.opened("anthropic", "claude-sonnet-4-6", bound)
        assert store.open_calls() == [answered, lost]

        store.put(DECISION, "d1", b"decision", settles=[answered])
        assert store.open_calls() == [lost]
        assert len(shipments.release_calls([answered, lost])) == 1
        assert store.open_calls() == []
        item = store.head(10)[-1]
        assert (item.kind, item.item_id) == (UNSETTLED, lost)
        call = decision_log_service_pb2.ShippedUnsettledCall.FromString(item.body)
        assert (call.task_id, call.attempt, call.lease_id) == ("t1", 1, "l1")
        assert (call.at_most.input_tokens, call.at_most.cost_usd) == (12_000, 0.16)

        late = Usage(input_tokens=500, output_tokens=100, cost_usd=0.003)
        late.calls.append(lost)
        shipments.failed_calls("t1", 1, "l1", Billed("anthropic", "m", late), "CancelledError")
        item = store.head(10)[-1]
        record = decision_log_service_pb2.ShippedFailedCalls.FromString(item.body)
        assert list(record.settles_calls) == [lost]
    finally:
        store.close()


async def test_a_late_cost_drops_the_unknown_cost_record_an_older_cloud_set_aside(
    tmp_path: Path,
) -> None:
    """A host upgraded before its cloud: the cloud refuses the new "unknown cost" record, which
    is set aside, then counts the late answer's failed-calls record without reading whom it
    settles. Once the cloud is upgraded the set-aside record came back and the call showed as
    of unknown cost for good, though its cost was counted (found by review). The record that
    settles a call now drops that call's unshipped unknown-cost record with its marker."""
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    try:
        shipments = Shipments(store, "direct")
        ledger = shipments.call_ledger("t1", 1, "l1")
        assert ledger is not None
        bound = Usage(input_tokens=12_000, output_tokens=8_192, cost_usd=0.16)
        lost = await ledger.opened("anthropic", "claude-sonnet-4-6", bound)
        assert len(shipments.release_calls([lost])) == 1
        (unknown,) = [i for i in store.head(10) if i.kind == UNSETTLED]
        store.set_aside([unknown.seq], "an older cloud: entries: at least one")

        late = Usage(input_tokens=500, output_tokens=100, cost_usd=0.003)
        late.calls.append(lost)
        shipments.failed_calls("t1", 1, "l1", Billed("anthropic", "m", late), "CancelledError")
        store.bring_back()
        assert [i.kind for i in store.head(10)] == [FAILED_CALLS]
    finally:
        store.close()


async def test_an_item_of_a_kind_this_host_does_not_ship_is_refused_and_the_rest_go(
    tmp_path: Path,
) -> None:
    """A host downgraded over an outbox a newer host wrote meets items of a kind it does not
    know (this stop's `unsettled_call` to the one before it): the sender raised KeyError on the
    first and shipped nothing more, for good. Such an item is now refused (kept, marked, never
    sent) and the backlog goes on."""
    servicer = _FailsOnPoison()  # type: ignore[abstract]  # serves ShipDecisions only
    server = grpc.aio.server()
    decision_log_service_pb2_grpc.add_DecisionLogServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    sender = OutboxSender(
        store, lambda: grpc.aio.insecure_channel(f"127.0.0.1:{port}"), initial_s=0.01, max_s=0.05
    )
    a = lease_service_pb2.Assignment(task_id="t1", attempt=1, lease_id="l1")
    store.put("a_kind_from_a_newer_host", "n1", b"\x08\x01")
    store.put(DECISION, "d1", shipped(a, "d1").SerializeToString())
    stop = asyncio.Event()
    running = asyncio.create_task(sender.run(stop))
    try:
        await _until(lambda: store.backlog().items == 0 or running.done(), "the decision sent")
        assert servicer.taken == ["d1"]
        ((kind, item, reason),) = store.refusals()
        assert (kind, item) == ("a_kind_from_a_newer_host", "n1")
        assert "not a kind this host ships" in reason
    finally:
        stop.set()
        await running
        store.close()
        await server.stop(None)


async def test_a_record_the_cloud_refuses_alone_is_set_aside_and_its_batch_is_sent(
    tmp_path: Path,
) -> None:
    """A cloud that takes a batch but refuses one of its records alone (the text typed past
    what a record keeps: `ShipDecisionsResponse.refused`) answers OK. The sender marked every
    item of the batch sent, the refused one among them: the host's record of what the cloud
    never took said nothing. That item is now marked refused with the cloud's reason (never
    sent again), the others sent, in that one call."""
    async with _outbox_of_a_task(tmp_path) as s:
        huge = shipped(s.task, "d2", "input_text")
        huge.decision.action.input_text.text = "x" * (MAX_TYPED_TEXT + 1)
        huge.decision.action.input_text.sensitive = False
        s.store.put(DECISION, "d1", shipped(s.task, "d1").SerializeToString())
        s.store.put(DECISION, "d2", huge.SerializeToString())
        s.store.put(DECISION, "d3", shipped(s.task, "d3").SerializeToString())
        s.start()
        await _until(lambda: s.store.backlog().items == 0, "the batch sent")
        assert await s.logged_steps() == [1, 2]
        assert s.store.refusals() == [
            (
                DECISION,
                "d2",
                f"INVALID_ARGUMENT: entries[1].decision.action.input_text.text: "
                f"{MAX_TYPED_TEXT + 1} bytes; at most {MAX_TYPED_TEXT}",
            )
        ]
