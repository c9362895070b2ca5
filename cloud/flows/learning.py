"""The learning loop: every ended attempt once — count how its replay went, learn from success.

It runs under `cloud.supervised` ("flow-learning"), off the lease stream: a result is recorded
and acknowledged at once, and this loop (woken by the result, else on its interval) takes ended
attempts the store marks as not yet looked at, one at a time (two replicas never take the same
one; one left taken by a replica that was killed mid-learn is taken back after
`flows.RECLAIM_AFTER`), and for each:

1. if it was handed flows: counts the use on the flow it replayed (completed, or diverged and
   where; a flow diverging `flow_retire_after` attempts in a row is retired);
2. if it succeeded and was not a complete replay: synthesises a flow from its decisions (the
   decision log: the cloud's own, or those a direct-transport host shipped) and stores it with
   its embedding text (and vector, when an embedder is set).

A direct-transport host ships its decisions from its outbox in the background, so its result
can arrive before its last decisions: a succeeded attempt whose log does not end in its
`complete` yet is left "awaiting-ship", and the next decision shipped for it hands it back to
this loop (`decisions.append_shipped`, mark "shipped"), which then learns but does not count
its replay again. How a direct attempt's replay went is what its host reported with its
result (the log may still be partial), counted the first time the loop looks at it, on the
attempt as it is then (`flows.count_attempt`); a handover its host ships after that (it was
offline past its lease) is counted as it is shipped (`flows.record_shipped_divergence`).
"""

from __future__ import annotations

import asyncio
import json
import logging

from amc.v1 import types_pb2
from cloud.flows.embeddings import Embedder
from cloud.settings import CloudSettings
from cloud.store import decisions, errors, flows, states, tasks
from cloud.store.database import Store
from cloud.store.models import AttemptRow, DecisionRow
from planner.flows.replay import MODE as REPLAY_MODE
from planner.flows.synthesis import SourceStep, synthesize

log = logging.getLogger(__name__)
#: Attempts one pass looks at before it yields to the next interval.
BATCH = 20


#: The mark of a succeeded direct-transport attempt whose decisions have not all arrived.
AWAITING_SHIP = "awaiting-ship"


def replay_result(attempt: AttemptRow, rows: list[DecisionRow]) -> flows.Use:
    """How the attempt's replay went: from its decisions (cloud transport), else from what its
    host reported or shipped on the attempt (the direct transport: its shipped log may still be
    partial). A direct host says whether its replay ran to the end (`replay_completed`): one
    stopped without a divergence (a switch already set, a flow withdrawn) and finished by the
    model is not a completed replay; for a host that does not say, a succeeded attempt with
    steps replayed and no divergence is taken as one."""
    if attempt.planner_transport == types_pb2.PLANNER_TRANSPORT_DIRECT:
        rows = []
    replayed = [r for r in rows if r.planner_mode == REPLAY_MODE]
    handover = next((r for r in rows if r.replay_divergence), None)
    if replayed or handover is not None:
        # the flow it ended on (a replay may go on with another flow that shares its start)
        flow_id = (handover.flow_id if handover else replayed[-1].flow_id) or ""
        last = rows[-1] if rows else None
        completed = (
            attempt.status == states.SUCCEEDED
            and handover is None
            and last is not None
            and last.planner_mode == REPLAY_MODE
            and last.tool_name == "complete"
        )
        return flows.Use(
            flow_id,
            completed,
            (handover.flow_step or 0) if handover is not None else 0,
            (handover.replay_divergence or "") if handover is not None else "",
        )
    if attempt.replay_steps is not None or attempt.replay_diverged_step:
        diverged = attempt.replay_diverged_step or 0
        ran_to_end = (
            bool(attempt.replay_steps)  # a host from before it said: inferred, as it was
            if attempt.replay_completed is None
            else attempt.replay_completed
        )
        return flows.Use(
            attempt.flow_id or "",
            attempt.status == states.SUCCEEDED and not diverged and ran_to_end,
            diverged,
            attempt.replay_divergence or "",
        )
    return flows.Use()


def source_step(row: DecisionRow) -> SourceStep:
    """A decision row as flow synthesis reads it."""
    action = types_pb2.Action()
    if row.action_pb:
        action.ParseFromString(row.action_pb)
    target = None
    if row.target_pb:
        target = types_pb2.ElementTarget()
        target.ParseFromString(row.target_pb)
    arguments = json.loads(row.arguments_json or "{}")
    return SourceStep(
        step_index=row.step_index,
        tool_name=row.tool_name,
        arguments=arguments if isinstance(arguments, dict) else {},
        action=action,
        target=target,
        purpose=row.purpose,
        expected_outcome=row.expected_outcome,
        page=row.page,
        verdict=decisions.verdict_name(row.verdict),
        executed=row.outcome_executed,
    )


class FlowLearner:
    """One pass of the learning loop per `step()` (see the module docstring)."""

    def __init__(
        self, store: Store, settings: CloudSettings, embedder: Embedder | None = None
    ) -> None:
        self.store = store
        self.settings = settings
        self.embedder = embedder
        #: Set when a result was recorded: the loop looks at once instead of at its interval.
        self.wake = asyncio.Event()
        #: Called with each new flow's id (tests and benches wait on it).
        self.learned: list[str] = []

    async def step(self) -> None:
        for _ in range(BATCH):
            claimed = await flows.claim_ended_attempt(self.store)
            if claimed is None:
                return
            attempt, again = claimed
            try:
                state = await self.learn(attempt, counted=again)
            except Exception as exc:
                if errors.unavailable(exc):  # the database failed, not the attempt: again later
                    await flows.release_attempt(self.store, attempt.id)
                else:
                    await flows.mark_attempt(self.store, attempt.id, "error")
                raise
            await flows.mark_attempt(self.store, attempt.id, state)
            if state == AWAITING_SHIP:
                await self._recheck(attempt)

    async def _recheck(self, attempt: AttemptRow) -> None:
        """A decision shipped after `learn` read the log and before the mark found the attempt
        still taken, so its hand-back changed nothing: when the log now ends in its `complete`,
        hand the attempt back here (one shipped later hands it back itself)."""
        rows = await decisions.attempt_rows(self.store, attempt.task_id, attempt.attempt)
        if rows and rows[-1].tool_name == "complete":
            await decisions.learn_again(self.store, attempt.task_id, attempt.attempt)
            self.wake.set()

    async def learn(self, attempt: AttemptRow, *, counted: bool = False) -> str:
        """Count the attempt's replay (unless `counted`: looked at before, when its shipped log
        was still partial) and learn from it; returns the mark it leaves."""
        rows = await decisions.attempt_rows(self.store, attempt.task_id, attempt.attempt)
        if not counted:  # on the attempt as it is when counted: a divergence may ship meanwhile
            attempt = (
                await flows.count_attempt(
                    self.store,
                    attempt.id,
                    lambda now: replay_result(now, rows),
                    self.settings.flow_retire_after,
                )
                or attempt
            )
        result = replay_result(attempt, rows)
        if attempt.status != states.SUCCEEDED:
            return "ended"
        if result.completed:
            return "replayed"
        if attempt.planner_transport == types_pb2.PLANNER_TRANSPORT_DIRECT and (
            not rows or rows[-1].tool_name != "complete"
        ):
            return AWAITING_SHIP  # its host's outbox is behind: a shipped decision wakes it
        if not rows:
            return "no-decisions"
        goal = await tasks.goal(self.store, attempt.task_id)
        if goal is None:
            return "no-task"
        steps = [source_step(r) for r in rows]
        if any(s.target is None for s in steps if _names_element(s) and s.executed is not False):
            return "no-targets"  # logged before targets were kept: nothing to find again
        synthesis = synthesize(goal, steps)
        if synthesis.flow is None:
            log.info(
                "no flow learned from task %s attempt %d: %s",
                attempt.task_id,
                attempt.attempt,
                synthesis.why,
            )
            return "no-flow"
        embedding = None
        if self.embedder is not None:
            vectors = await self.embedder.embed([synthesis.flow.embedding_text])
            embedding = vectors[0] if vectors else None
        row, created = await flows.add(
            self.store,
            synthesis.flow,
            synthesis.fingerprint,
            attempt.task_id,
            attempt.attempt,
            embedding=embedding,
            embedding_model=self.embedder.model
            if embedding is not None and self.embedder
            else None,
        )
        if not created:
            return "duplicate"
        self.learned.append(row.flow_id)
        log.info(
            "learned flow %s (%d steps) from task %s attempt %d",
            row.flow_id,
            len(synthesis.flow.steps),
            attempt.task_id,
            attempt.attempt,
        )
        return "learned"


def _names_element(step: SourceStep) -> bool:
    kind = step.action.WhichOneof("kind")
    if kind == "tap":
        return step.action.tap.WhichOneof("target") == "element_id"
    return kind == "input_text" and bool(step.action.input_text.element_id)
