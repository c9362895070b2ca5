"""The decision log: append with a cloud-assigned step index, read paged, prune after retention.

It is also the attempt's memory for typed Decide calls: `attempt_steps` gives the earlier
decisions as `planner.steps.PastStep`s, and `record_outcome` writes the outcome a host reports
for one of them (once: a retried report changes nothing). Every row keeps its tokens and cost:
`cloud/store/spend.py` sums them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import load_only
from sqlalchemy.sql.dml import Update

from amc.v1 import types_pb2
from cloud.store import flows, spend
from cloud.store.database import Store
from cloud.store.models import AttemptRow, DecisionRow, FailedDecisionSpendRow, TaskRow
from cloud.store.paging import FOREIGN, of_steps, page_token, past, position, token_int
from planner.convert import masked_action
from planner.decision import Decision, Usage
from planner.session.step_planner import call_id_of
from planner.steps import PastStep, StepOutcome, noted, stored_arguments, unknown_verdict
from planner.tools import Judgement
from planner.verify import VerdictName, verdict_from_proto

_APPEND_RETRIES = 20


class StepKeyTaken(Exception):
    """The attempt already logged a decision under this step key."""


async def append(
    store: Store,
    host_id: str,
    task_id: str,
    attempt: int,
    decision: Decision,
    step_key: str | None = None,
    on_totals: Callable[[spend.TaskSpent], None] | None = None,
) -> DecisionRow:
    """Append one decision the cloud made; its step index is max+1 within (task, attempt).
    `on_totals` hears the task's totals as counted with it (`spend.add_to_task_totals`; heard
    before the commit: the caller's to keep for after it, should this return).

    Two concurrent appends may compute the same index; the unique constraint refuses the second,
    which retries. So indexes have no gaps and no repeats on either backend. With a `step_key`
    the attempt already has a decision for (a retried Decide raced its original), nothing is
    written and `StepKeyTaken` is raised: that decision is the step's (`by_step_key`).
    """
    last_error: Exception | None = None
    for _ in range(_APPEND_RETRIES):
        try:
            return await _insert(
                store,
                host_id,
                task_id,
                attempt,
                decision,
                "cloud",
                None,
                step_key=step_key,
                on_totals=on_totals,
            )
        except IntegrityError as exc:
            if step_key and await by_step_key(store, task_id, attempt, step_key) is not None:
                raise StepKeyTaken(step_key) from exc
            last_error = exc
    raise RuntimeError("could not assign a step index") from last_error


async def by_step_key(
    store: Store, task_id: str, attempt: int, step_key: str
) -> DecisionRow | None:
    """The decision an attempt logged under a host's step key, if any."""
    async with store.read() as session:
        return await session.scalar(
            select(DecisionRow).where(
                DecisionRow.task_id == task_id,
                DecisionRow.attempt == attempt,
                DecisionRow.step_key == step_key,
            )
        )


class ShippedElsewhere(ValueError):
    """A host decision id that names a decision of another attempt (the host reused an id)."""


async def append_shipped(
    store: Store,
    host_id: str,
    task_id: str,
    attempt: int,
    host_decision_id: str,
    decision: Decision,
    outcome: types_pb2.ActionOutcome | None,
    *,
    retire_after: int,
    on_totals: Callable[[spend.TaskSpent], None] | None = None,
) -> tuple[DecisionRow, bool]:
    """Log a decision a host made on the direct transport, once per (host, host decision id):
    (the row, whether it had been logged before). A resend changes nothing but a first outcome.
    `on_totals` as for `append` (not heard for a resend: it counts nothing).

    A shipped handover is written on the attempt, and counted on its flow when the learning
    loop looked at the attempt before it came (`flows.record_shipped_divergence`; a flow
    diverging `retire_after` attempts in a row is retired). The step index is assigned as for
    the cloud's own decisions. A resend racing its original
    (another replica) loses on the unique index and finds the winner's row on its next turn.
    What logging it hands on (`_hand_on`) is written after the insert, in writes of its own: a
    resend of a `complete` or of a handover writes it again, should the database have failed
    between the two.
    """
    last_error: Exception | None = None
    for _ in range(_APPEND_RETRIES):
        existing = await _shipped(store, host_id, host_decision_id)
        if existing is not None:
            if (existing.task_id, existing.attempt) != (task_id, attempt):
                raise ShippedElsewhere(
                    f"host_decision_id {host_decision_id!r} already names a decision of task "
                    f"{existing.task_id!r} attempt {existing.attempt}"
                )
            if outcome is not None and await record_outcome_of(
                store, existing.decision_id, outcome
            ):
                existing = await get(store, existing.decision_id) or existing
            if existing.tool_name == "complete" or decision.replay_divergence:
                await _hand_on(store, task_id, attempt, decision, retire_after)
            return existing, True
        try:
            row = await _insert(
                store,
                host_id,
                task_id,
                attempt,
                decision,
                "direct",
                host_decision_id,
                outcome,
                on_totals=on_totals,
            )
        except IntegrityError as exc:
            last_error = exc
            continue
        await _hand_on(store, task_id, attempt, decision, retire_after)
        return row, False
    raise RuntimeError("could not assign a step index") from last_error


async def _hand_on(
    store: Store, task_id: str, attempt: int, decision: Decision, retire_after: int
) -> None:
    """After a shipped decision is logged: its replay handover on its attempt (counted on its
    flow if the learning loop already looked at the attempt), and the attempt handed back to
    the learning loop if it was left waiting for its log."""
    if decision.replay_divergence and decision.flow_step:
        # Written when logged, as Decide does for the cloud's own: an attempt that ends
        # without a result (the host crashed, the lease ran out) would otherwise leave
        # its next attempt handed the same flow, the divergence uncounted.
        await flows.record_shipped_divergence(
            store,
            task_id,
            attempt,
            flows.Use(decision.flow_id, False, decision.flow_step, decision.replay_divergence),
            retire_after,
        )
    await learn_again(store, task_id, attempt)


async def learn_again(store: Store, task_id: str, attempt: int) -> None:
    """Hand an attempt the learning loop left waiting for its shipped decisions back to it
    (after each shipped decision, and by the loop itself when one landed while it looked)."""
    async with store.write() as session:
        await session.execute(
            update(AttemptRow)
            .where(
                AttemptRow.task_id == task_id,
                AttemptRow.attempt == attempt,
                AttemptRow.flow_state == "awaiting-ship",  # cloud.flows.learning.AWAITING_SHIP
            )
            .values(flow_state=flows.SHIPPED)  # its replay was counted
        )


async def _shipped(store: Store, host_id: str, host_decision_id: str) -> DecisionRow | None:
    async with store.read() as session:
        return await session.scalar(
            select(DecisionRow).where(
                DecisionRow.host_id == host_id, DecisionRow.host_decision_id == host_decision_id
            )
        )


async def _insert(
    store: Store,
    host_id: str,
    task_id: str,
    attempt: int,
    decision: Decision,
    transport: str,
    host_decision_id: str | None,
    outcome: types_pb2.ActionOutcome | None = None,
    step_key: str | None = None,
    on_totals: Callable[[spend.TaskSpent], None] | None = None,
) -> DecisionRow:
    """One row at the next step index of (task, attempt), masked; IntegrityError when another
    writer took that index (or that host decision id) first."""
    thinking = [{"text": b.text, "redacted": b.redacted} for b in decision.thinking]
    judged = decision.previous_step
    resumed = decision.resumed_from
    async with store.write() as session:
        current = await session.scalar(
            select(func.coalesce(func.max(DecisionRow.step_index), 0)).where(
                DecisionRow.task_id == task_id, DecisionRow.attempt == attempt
            )
        )
        row = DecisionRow(
            decision_id=uuid.uuid4().hex,
            host_id=host_id,
            task_id=task_id,
            attempt=attempt,
            step_index=int(current or 0) + 1,
            provider=decision.provider,
            model=decision.model,
            system_prompt=decision.system_prompt,
            user_prompt=decision.user_prompt,
            tool_name=decision.tool_name,
            arguments_json=stored_arguments(decision),
            action_pb=masked_action(decision).SerializeToString(),
            rationale=decision.rationale,
            thinking=thinking,
            purpose=decision.purpose,
            expected_outcome=decision.expected_outcome,
            input_tokens=decision.usage.input_tokens,
            output_tokens=decision.usage.output_tokens,
            cache_read_input_tokens=decision.usage.cache_read_input_tokens,
            cache_creation_input_tokens=decision.usage.cache_creation_input_tokens,
            cache_creation_1h_input_tokens=decision.usage.cache_creation_1h_input_tokens,
            thinking_tokens=decision.usage.thinking_tokens,
            latency_seconds=decision.latency_s,
            forced_retry=decision.forced_retry,
            corrective_retries=decision.corrective_retries,
            created_at=store.now(),
            planner_mode=decision.planner_mode,
            page=decision.page,
            target=decision.target,
            thinking_kind=decision.thinking_kind,
            retry_kind=decision.retry_kind,
            output_truncated=decision.output_truncated,
            cost_usd=decision.usage.cost_usd,
            planner_transport=transport,
            host_decision_id=host_decision_id,
            observation_pb=_observation(decision),
            step_key=step_key or None,
            previous_verdict=judged.verdict if judged is not None else None,
            previous_note=judged.note if judged is not None else None,
            target_pb=decision.target_descriptor.SerializeToString()
            if decision.target_descriptor is not None
            else None,
            flow_id=decision.flow_id or None,
            flow_step=decision.flow_step or None,
            replay_divergence=decision.replay_divergence or None,
            flow_set_aside=decision.flow_set_aside or None,
            call_id=call_id_of(decision) or None,
            resumed_position=resumed.position if resumed is not None else None,
            resumed_turn_id=resumed.turn_id if resumed is not None else None,
            resumed_answered_at=resumed.answered_at if resumed is not None else None,
        )
        if outcome is not None:
            for name, value in _outcome_values(outcome).items():
                setattr(row, name, value)
        session.add(row)
        await session.flush()
        totals = await spend.add_to_task_totals(session, task_id, decision.usage, decisions=1)
        if totals is not None and on_totals is not None:
            on_totals(totals)
        if transport == "direct" and judged is not None:
            # The model's judgement of the step before, in the same transaction (Decide
            # records it for the cloud's own decisions; a host ships its decisions in order).
            await session.execute(_judge(task_id, attempt, row.step_index - 1, judged))
    return row


def _judge(task_id: str, attempt: int, step_index: int, judgement: Judgement) -> Update:
    """Set the model's judgement of decision `step_index` unless one is set (the first wins)."""
    return (
        update(DecisionRow)
        .where(
            DecisionRow.task_id == task_id,
            DecisionRow.attempt == attempt,
            DecisionRow.step_index == step_index,
            DecisionRow.model_verdict.is_(None),
        )
        .values(model_verdict=judgement.verdict, model_note=judgement.note)
    )


def _observation(decision: Decision) -> bytes | None:
    """What the log keeps of the decision's screen: everything but the OCR blocks (raw text
    boxes the planner never shows the model, and the bulk of an observation)."""
    if decision.observation is None:
        return None
    kept = type(decision.observation)()
    kept.CopyFrom(decision.observation)
    kept.ClearField("ocr_blocks")
    return kept.SerializeToString()


def cursor(
    row: DecisionRow, newest_first: bool = False, attempt: int = 0, after_step: int = 0
) -> str:
    """The page token of the decisions after `row` (before it, `newest_first`) in the listing
    of `attempt` (0: every attempt) past `after_step` (0: every step)."""
    listing = _listing(row.task_id, newest_first, attempt, after_step)
    return page_token(listing, row.attempt, row.step_index)


def _listing(task_id: str, newest_first: bool, attempt: int, after_step: int) -> str:
    """A listing's name in its tokens: one of the other order was read as a position of this
    one, and its next page skipped or repeated steps instead of INVALID_ARGUMENT; so was one
    of another attempt (`of_attempt`), and one of another `after_step`: a newest-first token
    of the steps after 3 sent with after_step 0 went on below step 4 (steps the query it came
    from never held), and one of every step sent with after_step 10 started that query past
    the token's step, skipping its steps from 11 up to there. Without `after_step` the name
    is as it was (tokens given before still work)."""
    return of_steps(f"decisions/{task_id}" + ("/newest" * newest_first), attempt, after_step)


def _decode(
    task_id: str, token: str, newest_first: bool, attempt: int, after_step: int
) -> tuple[int, int]:
    number, step = position(_listing(task_id, newest_first, attempt, after_step), token, 2)
    try:
        return token_int(number), token_int(step)
    except (TypeError, ValueError) as exc:
        raise ValueError(FOREIGN) from exc


async def list_page(
    store: Store,
    task_id: str,
    attempt: int,
    page_size: int,
    page_token: str,
    after_step: int = 0,
    newest_first: bool = False,
) -> tuple[list[DecisionRow], str]:
    """Decisions of a task (optionally one attempt, past `after_step` of it) by attempt, then
    step index (both descending, `newest_first`); a later page is a range of the (task_id,
    attempt, step_index) unique index from its token (`past`)."""
    keys = (DecisionRow.attempt, DecisionRow.step_index)
    stmt = select(DecisionRow).where(DecisionRow.task_id == task_id)
    if attempt:
        stmt = stmt.where(DecisionRow.attempt == attempt)
    if after_step:
        stmt = stmt.where(DecisionRow.step_index > after_step)
    if page_token:
        last = _decode(task_id, page_token, newest_first, attempt, after_step)
        stmt = stmt.where(past(keys, last, descending=newest_first))
    order = [k.desc() for k in keys] if newest_first else list(keys)
    stmt = stmt.order_by(*order).limit(page_size + 1)
    async with store.read() as session:
        rows = list((await session.scalars(stmt)).all())
    more = len(rows) > page_size
    rows = rows[:page_size]
    return rows, (cursor(rows[-1], newest_first, attempt, after_step) if more and rows else "")


@dataclass(frozen=True)
class StepCounts:
    """An attempt's step count and its device steps' verdicts (`step_counts`)."""

    attempt: int
    decisions: int
    verdicts: Counter[VerdictName | None]


#: Tools that do nothing to the screen: no verdict is counted for them.
_NOT_DEVICE_STEPS = ("complete", "get_ui_tree")


async def step_counts(store: Store, task_id: str, attempt: int = 0) -> list[StepCounts]:
    """Per attempt (`attempt` only, or every one with a decision), by attempt: how many
    decisions it logged and how many of its device steps have each verdict (None: not
    checked yet), as one grouped count: a console showing the newest steps of a long attempt
    read every decision of it to count them."""
    device = DecisionRow.tool_name.not_in(_NOT_DEVICE_STEPS)
    stmt = select(
        DecisionRow.attempt,
        DecisionRow.verdict,
        func.count(),
        func.count().filter(device),
    ).where(DecisionRow.task_id == task_id)
    if attempt:
        stmt = stmt.where(DecisionRow.attempt == attempt)
    stmt = stmt.group_by(DecisionRow.attempt, DecisionRow.verdict)
    totals: dict[int, int] = {}
    verdicts: dict[int, Counter[VerdictName | None]] = {}
    async with store.read() as session:
        for number, verdict, logged, checked in (await session.execute(stmt)).all():
            totals[number] = totals.get(number, 0) + logged
            verdicts.setdefault(number, Counter())[verdict_name(verdict)] += checked
    return [StepCounts(n, totals[n], verdicts[n]) for n in sorted(totals)]


def past_step(row: DecisionRow) -> PastStep:
    """A logged decision as the planner's history remembers it."""
    outcome = (
        StepOutcome(
            row.outcome_executed,
            row.outcome_error or "",
            row.outcome_driver_output or "",
            verdict_name(row.verdict),
            row.verdict_evidence or "",
        )
        if row.outcome_executed is not None
        else None
    )
    return PastStep(
        step_index=row.step_index,
        page=row.page,
        tool_name=row.tool_name,
        arguments_json=row.arguments_json,
        target=row.target,
        purpose=row.purpose,
        expected_outcome=row.expected_outcome,
        rationale=row.rationale,
        outcome=outcome,
        mode=row.planner_mode,
        flow_id=row.flow_id or "",
        flow_step=row.flow_step or 0,
        call_id=row.call_id or "",
    )


def verdict_name(value: str | None) -> VerdictName | None:
    """A stored verdict as the planner names it (None: not checked, or an unknown word)."""
    for name in ("met", "not_met", "unknown"):
        if value == name:
            return name
    return None


#: What the planner's memory of a step (`past_step`) and the learning loop (a flow's steps, how
#: a replay went) read of a decision: not its prompts, thinking or observation, which are most
#: of a row's bytes. Every Decide reads all earlier decisions of its attempt, so with them a
#: 100-step attempt read its prompts 5,050 times over.
_STEP_COLUMNS = (
    DecisionRow.step_index,
    DecisionRow.page,
    DecisionRow.tool_name,
    DecisionRow.arguments_json,
    DecisionRow.action_pb,
    DecisionRow.target,
    DecisionRow.target_pb,
    DecisionRow.purpose,
    DecisionRow.expected_outcome,
    DecisionRow.rationale,
    DecisionRow.outcome_executed,
    DecisionRow.outcome_error,
    DecisionRow.outcome_driver_output,
    DecisionRow.verdict,
    DecisionRow.verdict_evidence,
    DecisionRow.planner_mode,
    DecisionRow.flow_id,
    DecisionRow.flow_step,
    DecisionRow.replay_divergence,
    DecisionRow.call_id,
)


async def attempt_rows(store: Store, task_id: str, attempt: int) -> list[DecisionRow]:
    """Every decision row of one attempt, in step order, with only `_STEP_COLUMNS` loaded
    (reading another column of these rows raises: it was never loaded)."""
    async with store.read() as session:
        return list(
            (
                await session.scalars(
                    select(DecisionRow)
                    .options(load_only(*_STEP_COLUMNS, raiseload=True))
                    .where(DecisionRow.task_id == task_id, DecisionRow.attempt == attempt)
                    .order_by(DecisionRow.step_index)
                )
            ).all()
        )


async def attempt_steps(store: Store, task_id: str, attempt: int) -> list[PastStep]:
    """Every decision of one attempt, in step order, with the outcomes reported so far."""
    return [past_step(r) for r in await attempt_rows(store, task_id, attempt)]


async def record_outcome(
    store: Store,
    task_id: str,
    attempt: int,
    outcome: types_pb2.ActionOutcome,
    *,
    checked_by_cloud: bool = False,
) -> bool:
    """Record a reported outcome, with its verdict, on the decision it names; False when that
    decision already has one (a retried report) or does not exist. `checked_by_cloud`: the
    cloud ran the checker because the host sent no verdict."""
    verdict = verdict_from_proto(outcome.verdict)
    async with store.write() as session:
        result = await session.execute(
            update(DecisionRow)
            .where(
                DecisionRow.task_id == task_id,
                DecisionRow.attempt == attempt,
                DecisionRow.step_index == outcome.step_index,
                DecisionRow.outcome_executed.is_(None),
            )
            .values(
                outcome_executed=outcome.executed,
                outcome_error=outcome.error,
                outcome_driver_output=outcome.driver_output,
                verdict=verdict,
                # Kept without a verdict too: it may say why there is none (a host's verdict
                # this cloud does not know, `planner.steps.unknown_verdict`).
                verdict_evidence=outcome.evidence or None,
                verdict_by_cloud=checked_by_cloud and verdict is not None,
            )
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def _outcome_values(outcome: types_pb2.ActionOutcome) -> dict[str, object]:
    """The columns a host's reported outcome fills, its checker's verdict included (one this
    cloud does not know is kept as not judged, its evidence saying so, as Decide records it)."""
    read, unknown = unknown_verdict(outcome)
    if unknown:
        noted(read, unknown, "")
    verdict = verdict_from_proto(read.verdict)
    return {
        "outcome_executed": outcome.executed,
        "outcome_error": outcome.error,
        "outcome_driver_output": outcome.driver_output,
        "verdict": verdict,
        "verdict_evidence": read.evidence or None,
    }


async def record_outcome_of(
    store: Store, decision_id: str, outcome: types_pb2.ActionOutcome
) -> bool:
    """`record_outcome` for a decision named by its id (a shipped decision's later outcome)."""
    async with store.write() as session:
        result = await session.execute(
            update(DecisionRow)
            .where(DecisionRow.decision_id == decision_id, DecisionRow.outcome_executed.is_(None))
            .values(**_outcome_values(outcome))
        )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def record_judgement(
    store: Store, task_id: str, attempt: int, step_index: int, judgement: Judgement
) -> bool:
    """Record the model's judgement of decision `step_index` (given with the next decision);
    the first judgement wins, like the first outcome."""
    async with store.write() as session:
        result = await session.execute(_judge(task_id, attempt, step_index, judgement))
        return bool(result.rowcount)  # type: ignore[attr-defined]


async def get(store: Store, decision_id: str) -> DecisionRow | None:
    """One decision by id."""
    async with store.read() as session:
        return await session.get(DecisionRow, decision_id)


async def prune(
    store: Store, older_than: dt.timedelta, batch_size: int = 1000, max_batches: int = 1000
) -> int:
    """Delete decisions of tasks that ended before now - older_than, in small transactions,
    and the records of those tasks' failed decisions' calls (their cost stays in the task's
    totals). Each task's row counts what went and says when (`pruned`): a reader of the log
    must be able to say why it is empty while the task's totals are not.

    Each batch is its own short transaction so writers are never blocked for long.
    """
    cutoff = store.now() - older_than
    ended = select(TaskRow.task_id).where(
        TaskRow.finished_at.is_not(None), TaskRow.finished_at < cutoff
    )
    failed = FailedDecisionSpendRow
    async with store.write() as session:
        counts = (
            await session.execute(
                select(failed.task_id, func.count())
                .where(failed.task_id.in_(ended))
                .group_by(failed.task_id)
            )
        ).all()
        if counts:
            gone = [task_id for task_id, _ in counts]
            await session.execute(delete(failed).where(failed.task_id.in_(gone)))
            await _count_pruned(session, "pruned_failed_decisions", counts, store.now())
    total = 0
    for _ in range(max_batches):
        async with store.write() as session:
            found = (
                await session.execute(
                    select(DecisionRow.decision_id, DecisionRow.task_id)
                    .join(TaskRow, TaskRow.task_id == DecisionRow.task_id)
                    .where(TaskRow.finished_at.is_not(None), TaskRow.finished_at < cutoff)
                    .limit(batch_size)
                )
            ).all()
            if not found:
                break
            ids = [decision_id for decision_id, _ in found]
            await session.execute(delete(DecisionRow).where(DecisionRow.decision_id.in_(ids)))
            per_task = Counter(task_id for _, task_id in found)
            await _count_pruned(session, "pruned_decisions", per_task.items(), store.now())
            total += len(ids)
        if len(found) < batch_size:
            break
    return total


async def _count_pruned(
    session: AsyncSession, column: str, counts: Iterable[Any], now: dt.datetime
) -> None:
    """Add each (task id, rows just deleted) of `counts` to `column` of the task's row, in
    the transaction that deleted them, and mark when."""
    counter = getattr(TaskRow, column)
    for task_id, n in counts:
        await session.execute(
            update(TaskRow)
            .where(TaskRow.task_id == task_id)
            .values({column: counter + int(n), "pruned_at": now})
            .execution_options(synchronize_session=False)
        )


@dataclass(frozen=True, slots=True)
class Pruned:
    """What the retention pass deleted of a task's log: `decisions`, `failed_decisions` (the
    call records of decisions that failed), when it last deleted some (`at`), and what the
    deleted rows cost (`usage`: the task's totals less what its log still holds)."""

    decisions: int
    failed_decisions: int
    at: dt.datetime
    usage: Usage
    unsettled_calls: int = 0
    """Markers of calls of unknown cost deleted (`unsettled.prune`): no total counts them."""
    unsettled_at_most: Usage = field(default_factory=Usage)
    """The most those calls can have cost (their bounds summed)."""


async def pruned(store: Store, task_id: str) -> Pruned | None:
    """What retention deleted of the task's log, or None when it deleted nothing."""
    async with store.read() as session:
        row = (
            await session.execute(
                select(
                    TaskRow.pruned_decisions,
                    TaskRow.pruned_failed_decisions,
                    TaskRow.pruned_at,
                    TaskRow.pruned_unsettled_calls,
                    TaskRow.pruned_unsettled_input_tokens,
                    TaskRow.pruned_unsettled_output_tokens,
                    TaskRow.pruned_unsettled_cost_usd,
                    TaskRow.input_tokens,
                    TaskRow.output_tokens,
                    TaskRow.cache_read_tokens,
                    TaskRow.cache_write_tokens,
                    TaskRow.thinking_tokens,
                    TaskRow.cost_usd,
                ).where(TaskRow.task_id == task_id)
            )
        ).first()
        if row is None or row[2] is None:
            return None
        left = await spend.spent_in(session, task_id)
    totals = spend.usage_of([v or 0 for v in row[7:]])
    at_most = Usage(
        input_tokens=int(row[4] or 0), output_tokens=int(row[5] or 0), cost_usd=float(row[6] or 0)
    )
    return Pruned(int(row[0]), int(row[1]), row[2], _less(totals, left), int(row[3] or 0), at_most)


def _less(total: Usage, part: Usage) -> Usage:
    """`total` less `part`, field by field, never below 0 (sums of floats may differ a hair)."""
    i, o, cr, cw, th, cost = (
        max(0, getattr(total, name) - getattr(part, name)) for name in spend.FIGURES
    )
    return Usage(int(i), int(o), int(cr), int(cw), int(th), float(cost))
