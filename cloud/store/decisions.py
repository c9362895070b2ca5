"""The decision log: append with a cloud-assigned step index, read paged, prune after retention.

It is also the attempt's memory for typed Decide calls: `attempt_steps` gives the earlier
decisions as `planner.steps.PastStep`s, and `record_outcome` writes the outcome a host reports
for one of them (once: a retried report changes nothing). Every row keeps its tokens and cost:
`cloud/store/spend.py` sums them.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from amc.v1 import types_pb2
from cloud.store.database import Store
from cloud.store.models import DecisionRow, TaskRow
from planner.decision import Decision
from planner.steps import PastStep, StepOutcome, stored_arguments

_APPEND_RETRIES = 20


async def append(
    store: Store, host_id: str, task_id: str, attempt: int, decision: Decision
) -> DecisionRow:
    """Append one decision; its step index is max+1 within (task, attempt).

    Two concurrent appends may compute the same index; the unique constraint refuses the second,
    which retries. So indexes have no gaps and no repeats on either backend.
    """
    arguments = stored_arguments(decision)
    thinking = [{"text": b.text, "redacted": b.redacted} for b in decision.thinking]
    last_error: Exception | None = None
    for _ in range(_APPEND_RETRIES):
        try:
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
                    arguments_json=arguments,
                    action_pb=_masked_action(decision),
                    rationale=decision.rationale,
                    thinking=thinking,
                    purpose=decision.purpose,
                    expected_outcome=decision.expected_outcome,
                    input_tokens=decision.usage.input_tokens,
                    output_tokens=decision.usage.output_tokens,
                    cache_read_input_tokens=decision.usage.cache_read_input_tokens,
                    cache_creation_input_tokens=decision.usage.cache_creation_input_tokens,
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
                    observation_pb=_observation(decision),
                )
                session.add(row)
                await session.flush()
            return row
        except IntegrityError as exc:
            last_error = exc
    raise RuntimeError("could not assign a step index") from last_error


def _masked_action(decision: Decision) -> bytes:
    action = type(decision.action)()
    action.CopyFrom(decision.action)
    if decision.sensitive and action.WhichOneof("kind") == "input_text":
        action.input_text.text = "•••"
    return action.SerializeToString()


def _observation(decision: Decision) -> bytes | None:
    """What the log keeps of the decision's screen: everything but the OCR blocks (raw text
    boxes the planner never shows the model, and the bulk of an observation)."""
    if decision.observation is None:
        return None
    kept = type(decision.observation)()
    kept.CopyFrom(decision.observation)
    kept.ClearField("ocr_blocks")
    return kept.SerializeToString()


def _cursor(row: DecisionRow) -> str:
    return base64.urlsafe_b64encode(json.dumps([row.attempt, row.step_index]).encode()).decode()


def _decode(token: str) -> tuple[int, int]:
    try:
        attempt, step = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(attempt), int(step)
    except Exception as exc:
        raise ValueError("not a page token from this server") from exc


async def list_page(
    store: Store, task_id: str, attempt: int, page_size: int, page_token: str
) -> tuple[list[DecisionRow], str]:
    """Decisions of a task (optionally one attempt) by attempt, then step index."""
    stmt = select(DecisionRow).where(DecisionRow.task_id == task_id)
    if attempt:
        stmt = stmt.where(DecisionRow.attempt == attempt)
    if page_token:
        a, s = _decode(page_token)
        stmt = stmt.where(
            or_(
                DecisionRow.attempt > a,
                and_(DecisionRow.attempt == a, DecisionRow.step_index > s),
            )
        )
    stmt = stmt.order_by(DecisionRow.attempt, DecisionRow.step_index).limit(page_size + 1)
    async with store.read() as session:
        rows = list((await session.scalars(stmt)).all())
    more = len(rows) > page_size
    rows = rows[:page_size]
    return rows, (_cursor(rows[-1]) if more and rows else "")


def past_step(row: DecisionRow) -> PastStep:
    """A logged decision as the planner's history remembers it."""
    outcome = (
        StepOutcome(row.outcome_executed, row.outcome_error or "", row.outcome_driver_output or "")
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
    )


async def attempt_steps(store: Store, task_id: str, attempt: int) -> list[PastStep]:
    """Every decision of one attempt, in step order, with the outcomes reported so far."""
    async with store.read() as session:
        rows = (
            await session.scalars(
                select(DecisionRow)
                .where(DecisionRow.task_id == task_id, DecisionRow.attempt == attempt)
                .order_by(DecisionRow.step_index)
            )
        ).all()
    return [past_step(r) for r in rows]


async def record_outcome(
    store: Store, task_id: str, attempt: int, outcome: types_pb2.ActionOutcome
) -> bool:
    """Record a reported outcome on the decision it names; False when that decision already
    has one (a retried report) or does not exist."""
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
            )
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


async def get(store: Store, decision_id: str) -> DecisionRow | None:
    """One decision by id."""
    async with store.read() as session:
        return await session.get(DecisionRow, decision_id)


async def prune(
    store: Store, older_than: dt.timedelta, batch_size: int = 1000, max_batches: int = 1000
) -> int:
    """Delete decisions of tasks that ended before now - older_than, in small transactions.

    Each batch is its own short transaction so writers are never blocked for long.
    """
    cutoff = store.now() - older_than
    total = 0
    for _ in range(max_batches):
        async with store.write() as session:
            ids = (
                await session.scalars(
                    select(DecisionRow.decision_id)
                    .join(TaskRow, TaskRow.task_id == DecisionRow.task_id)
                    .where(TaskRow.finished_at.is_not(None), TaskRow.finished_at < cutoff)
                    .limit(batch_size)
                )
            ).all()
            if not ids:
                break
            await session.execute(delete(DecisionRow).where(DecisionRow.decision_id.in_(ids)))
            total += len(ids)
        if len(ids) < batch_size:
            break
    return total
