"""An in-memory decision log for tests of `PlannerServicer` outside the cloud.

It implements the servicer's `DecisionSink` (step indexes assigned per (task, attempt) under a
lock, like the store's transaction) and its `AttemptLog` (the goals of known tasks, the logged
decisions as past steps, the outcomes reported for them, first report wins). The cloud's
store-backed ports are tested against SQLite and PostgreSQL in tests/cloud; this one lets the
planner and host suites run the real servicer without a database.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import replace

from amc.v1 import types_pb2
from planner.convert import decision_to_proto
from planner.decision import Decision
from planner.steps import PastStep, StepOutcome
from planner.tools import Judgement


class MemoryDecisionLog:
    """DecisionSink + AttemptLog in memory. `rows` are (host, task, attempt, step, decision);
    `keys` maps (task, attempt, step key) to the row's position, as the store's unique key."""

    def __init__(self, goals: dict[str, str] | None = None) -> None:
        self.rows: list[tuple[str, str, int, int, Decision]] = []
        self.keys: dict[tuple[str, int, str], int] = {}
        self.goals: dict[str, str] = dict(goals or {})
        self.outcomes: dict[tuple[str, int, int], types_pb2.ActionOutcome] = {}
        self.judgements: dict[tuple[str, int, int], Judgement] = {}
        #: Learned flows handed to each (task, attempt), best first.
        self.handed: dict[tuple[str, int], list[types_pb2.Flow]] = {}
        #: The latest replay state reported per (task, attempt).
        self.replays: dict[tuple[str, int], dict[str, object]] = {}
        self._next: dict[tuple[str, int], int] = defaultdict(int)
        self._lock = asyncio.Lock()

    async def append(
        self, host_id: str, task_id: str, attempt: int, decision: Decision, step_key: str = ""
    ) -> tuple[str, int] | None:
        async with self._lock:
            await asyncio.sleep(0)  # yield inside the critical section: a race would show
            if step_key and (task_id, attempt, step_key) in self.keys:
                return None
            self._next[(task_id, attempt)] += 1
            index = self._next[(task_id, attempt)]
            self.rows.append((host_id, task_id, attempt, index, decision))
            if step_key:
                self.keys[(task_id, attempt, step_key)] = len(self.rows) - 1
            return f"dec-{len(self.rows)}", index

    async def logged(self, task_id: str, attempt: int, step_key: str) -> types_pb2.Decision | None:
        at = self.keys.get((task_id, attempt, step_key))
        if at is None:
            return None
        host_id, _, _, index, decision = self.rows[at]
        stored = replace(decision, step_index=index)
        return decision_to_proto(
            stored, decision_id=f"dec-{at + 1}", host_id=host_id, task_id=task_id, attempt=attempt
        )

    async def goal(self, task_id: str) -> str | None:
        return self.goals.get(task_id)

    async def steps(self, task_id: str, attempt: int) -> list[PastStep]:
        out = []
        for _, t, a, index, decision in self.rows:
            if (t, a) == (task_id, attempt):
                reported = self.outcomes.get((t, a, index))
                step = PastStep.from_decision(decision, index)
                out.append(
                    replace(step, outcome=StepOutcome.from_proto(reported)) if reported else step
                )
        return out

    async def record_outcome(
        self,
        task_id: str,
        attempt: int,
        outcome: types_pb2.ActionOutcome,
        *,
        checked_by_cloud: bool = False,
    ) -> None:
        self.outcomes.setdefault((task_id, attempt, outcome.step_index), outcome)

    async def record_judgement(
        self, task_id: str, attempt: int, step_index: int, judgement: Judgement
    ) -> None:
        self.judgements.setdefault((task_id, attempt, step_index), judgement)

    async def flows(self, task_id: str, goal: str, attempt: int) -> list[types_pb2.Flow]:
        return list(self.handed.get((task_id, attempt), []))

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
        state = self.replays.setdefault((task_id, attempt), {})
        state.update(flow_id=flow_id, steps_replayed=steps_replayed)
        if diverged_at:
            state.update(diverged_at=diverged_at, reason=reason)
