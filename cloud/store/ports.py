"""The planner service's ports (LeaseGate, DecisionSink, AttemptLog, SessionStore) on the store."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from amc.v1 import types_pb2
from cloud import metrics
from cloud.store import convert, decisions, errors, flows, leases, sessions, spend, tasks
from cloud.store.database import Store
from planner.conversation.items import (
    AssistantText,
    Reasoning,
    SessionItem,
    ToolCall,
    dumps_item,
    item_type,
    loads_item,
)
from planner.decision import Billed, Decision, Usage
from planner.steps import PastStep
from planner.tools import Judgement
from telemetry import tracing

log = logging.getLogger(__name__)


class StoreLeaseGate:
    """`is_live`: the planner checks the caller's lease before it spends any tokens, once the
    replica's clock is settled (`clock_settled`: `cloud.lease.clock.ClockWatch.settled`, so a
    lease is not held against a wall clock that just stepped forward)."""

    def __init__(
        self, store: Store, clock_settled: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._store = store
        self._clock_settled = clock_settled

    async def is_live(self, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool:
        if self._clock_settled is not None:
            await self._clock_settled()
        return await leases.is_live(self._store, host_id, task_id, attempt, lease_id)


class StoreDecisionSink:
    """`append`: one decision row with a cloud-assigned, gap-free step index per (task, attempt);
    `logged`: the decision already logged under a host's step key (a retried Decide); `failed`:
    the calls of a decision that failed (`SpendLog`). `on_spent` hears what each logged decision
    and each failed one cost (the fleet's daily spending); `on_counted`, once it is committed,
    whose totals it moved (`EventBus.decisions_counted`: the task's watchers show them)."""

    def __init__(
        self,
        store: Store,
        on_spent: Callable[[Usage], None] | None = None,
        on_counted: spend.OnCounted | None = None,
    ) -> None:
        self._store = store
        self._on_spent = on_spent
        self._on_counted = on_counted

    async def append(
        self, host_id: str, task_id: str, attempt: int, decision: Decision, step_key: str = ""
    ) -> tuple[str, int] | None:
        with tracing.span(
            "decision log write", {"amc.task_id": task_id, "amc.attempt": attempt}
        ) as span:
            heard: list[spend.TaskSpent] = []  # the totals counted, committed once it returns
            try:
                row = await decisions.append(
                    self._store,
                    host_id,
                    task_id,
                    attempt,
                    decision,
                    step_key or None,
                    on_totals=heard.append,
                )
            except decisions.StepKeyTaken:
                return None
            tracing.set_attributes(span, {"amc.step": row.step_index})
        await self._counted(task_id, decision.usage, heard)
        return row.decision_id, row.step_index

    async def logged(self, task_id: str, attempt: int, step_key: str) -> types_pb2.Decision | None:
        row = await decisions.by_step_key(self._store, task_id, attempt, step_key)
        return None if row is None else convert.decision(row)

    async def failed(
        self, host_id: str, task_id: str, attempt: int, billed: Billed, error: str
    ) -> None:
        """`SpendLog`: the calls of a decision that failed, in the ledger and the task's totals
        (and heard by `on_spent`, like a logged decision's)."""
        heard: list[spend.TaskSpent] = []
        await spend.count_failed(
            self._store, host_id, task_id, attempt, billed, error, on_totals=heard.append
        )
        await self._counted(task_id, billed.usage, heard)

    async def _counted(self, task_id: str, usage: Usage, totals: list[spend.TaskSpent]) -> None:
        if self._on_spent is not None:
            self._on_spent(usage)
        if self._on_counted is not None:
            await self._on_counted([task_id], totals[-1:])


FlowsHanded = Callable[[str, int, str], Awaitable[list[types_pb2.Flow]]]
"""(task id, attempt, goal) -> the learned flows the attempt was handed (cloud.flows)."""


class StoreAttemptLog:
    """`goal`, `steps`, `record_outcome`, `record_judgement`, `flows`, `record_replay`: the
    task row, the decision log and the attempt's flow columns as an attempt's memory, so a host
    sends only what it sees."""

    def __init__(self, store: Store, handed: FlowsHanded | None = None) -> None:
        self._store = store
        self._handed = handed

    async def goal(self, task_id: str) -> str | None:
        return await tasks.goal(self._store, task_id)

    async def steps(self, task_id: str, attempt: int) -> list[PastStep]:
        return await decisions.attempt_steps(self._store, task_id, attempt)

    async def record_outcome(
        self,
        task_id: str,
        attempt: int,
        outcome: types_pb2.ActionOutcome,
        *,
        checked_by_cloud: bool = False,
    ) -> None:
        await decisions.record_outcome(
            self._store, task_id, attempt, outcome, checked_by_cloud=checked_by_cloud
        )

    async def record_judgement(
        self, task_id: str, attempt: int, step_index: int, judgement: Judgement
    ) -> None:
        await decisions.record_judgement(self._store, task_id, attempt, step_index, judgement)

    async def flows(self, task_id: str, goal: str, attempt: int) -> list[types_pb2.Flow]:
        if self._handed is None:
            return []
        return await self._handed(task_id, attempt, goal)

    async def record_replay(
        self,
        task_id: str,
        attempt: int,
        *,
        flow_id: str,
        steps_replayed: int,
        diverged_at: int,
        reason: str,
    ) -> None:
        await flows.record_replay(
            self._store,
            task_id,
            attempt,
            flow_id=flow_id,
            steps_replayed=steps_replayed,
            diverged_at=diverged_at,
            reason=reason,
        )
        if diverged_at:
            metrics.current().flow_divergences.inc()
        else:
            metrics.current().flow_steps_replayed.inc()


#: How long the append of a model's turn waits for a database it cannot reach (a restart).
MODEL_TURN_WAIT_S = 30.0
_MODEL_OUTPUT = (Reasoning, AssistantText, ToolCall)


class StoreSessionStore:
    """`SessionStore` over the cloud database, for one Decide call.

    It remembers how long each conversation was when this call read it and writes after that
    point only, so a second call continuing the same conversation meanwhile makes this call's
    append fail (`SessionConflict`) instead of interleaving two model turns. Make one per call.

    A model's turn the database cannot take right now (it restarts) is written again until it
    can, for up to `MODEL_TURN_WAIT_S`: the provider answered and billed it, and the plan
    carrying it is kept for the host's retry (`planner.step_once`) only if it ends. Failed at
    once, as before, the plan failed with the database's error: the answer was neither kept
    nor counted (its call left "of unknown cost") and the retry asked the model again. Other
    items (an observation, before any call) fail at once: the host asks again.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._next: dict[tuple[str, int], int] = {}

    async def load(self, task_id: str, attempt: int) -> list[SessionItem]:
        bodies = await sessions.load(self._store, task_id, attempt)
        self._next[(task_id, attempt)] = len(bodies)
        return [loads_item(body) for body in bodies]

    async def append(self, task_id: str, attempt: int, items: Sequence[SessionItem]) -> None:
        key = (task_id, attempt)
        if key not in self._next:
            self._next[key] = await sessions.length(self._store, task_id, attempt)
        rows = [(item_type(i), dumps_item(i)) for i in items]
        paid = any(isinstance(i, _MODEL_OUTPUT) for i in items)
        deadline, pause = time.monotonic() + MODEL_TURN_WAIT_S, 0.1
        while True:
            try:
                await sessions.append(self._store, task_id, attempt, self._next[key], rows)
                break
            except Exception as exc:
                if not (paid and errors.unavailable(exc)) or time.monotonic() > deadline:
                    raise
                log.warning(
                    "the model's turn for task %s attempt %d waits for the database (%s)",
                    task_id,
                    attempt,
                    errors.describe(exc),
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
        self._next[key] += len(rows)

    async def latest_attempt(self, task_id: str, *, before: int) -> int | None:
        return await sessions.latest_attempt(self._store, task_id, before)

    async def stored_at(self, task_id: str, attempt: int, seq: int) -> dt.datetime | None:
        return await sessions.stored_at(self._store, task_id, attempt, seq)
