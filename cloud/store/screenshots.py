"""Step screenshots' metadata: which object in the artifact store shows which step and phase.

The bytes are the artifact store's (`cloud.artifacts`); a row here says where they are, what
they are (type, size, pixels) and where the step's action acted on them. Rows go with the
decision log's retention: `expired` names what to delete from the store, `forget` the rows.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import and_, delete, not_, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from cloud.store.database import Store
from cloud.store.models import DecisionRow, StepScreenshotRow, TaskRow
from cloud.store.paging import FOREIGN, of_steps, page_token, past, position, token_int

PHASES = ("before", "after")


@dataclass(frozen=True, slots=True)
class StepRef:
    """The logged decision a screenshot belongs to."""

    decision_id: str
    step_index: int


async def step_of(
    store: Store,
    task_id: str,
    attempt: int,
    *,
    decision_id: str = "",
    host_id: str = "",
    host_decision_id: str = "",
) -> StepRef | None:
    """The decision of (task, attempt) named by the cloud's id or by a host's own id (a shipped
    decision); None when no such decision is logged."""
    query = select(DecisionRow.decision_id, DecisionRow.step_index).where(
        DecisionRow.task_id == task_id, DecisionRow.attempt == attempt
    )
    if decision_id:
        query = query.where(DecisionRow.decision_id == decision_id)
    else:
        query = query.where(
            DecisionRow.host_id == host_id, DecisionRow.host_decision_id == host_decision_id
        )
    async with store.read() as session:
        found = (await session.execute(query)).first()
    return None if found is None else StepRef(str(found[0]), int(found[1]))


async def record(store: Store, row: StepScreenshotRow) -> None:
    """Insert or replace the row of (task, attempt, step, phase): an upload again replaces it."""
    values = {c.name: getattr(row, c.name) for c in StepScreenshotRow.__table__.columns}
    keys = ("task_id", "attempt", "step_index", "phase")
    changing = {k: v for k, v in values.items() if k not in keys}
    insert = pg_insert if store.is_postgres else sqlite_insert
    statement = insert(StepScreenshotRow).values(**values)
    statement = statement.on_conflict_do_update(index_elements=list(keys), set_=changing)
    async with store.write() as session:
        await session.execute(statement)


async def get(
    store: Store, task_id: str, attempt: int, step_index: int, phase: str
) -> StepScreenshotRow | None:
    async with store.read() as session:
        return await session.get(StepScreenshotRow, (task_id, attempt, step_index, phase))


def _cursor(row: StepScreenshotRow, attempt: int, after_step: int) -> str:
    listing = of_steps(f"screenshots/{row.task_id}", attempt, after_step)
    return page_token(listing, row.attempt, row.step_index, row.phase)


def _decode(task_id: str, token: str, attempt: int, after_step: int) -> tuple[int, int, str]:
    """The position `token` holds; ValueError unless it came from this task's listing of
    `attempt` past `after_step` (ListDecisions' rule: a live view asks both the same)."""
    listing = of_steps(f"screenshots/{task_id}", attempt, after_step)
    number, step, phase = position(listing, token, 3)
    try:
        if phase not in PHASES:
            raise ValueError(phase)
        return token_int(number), token_int(step), str(phase)
    except (TypeError, ValueError) as exc:
        raise ValueError(FOREIGN) from exc


async def list_page(
    store: Store,
    task_id: str,
    attempt: int,
    page_size: int,
    page_token: str,
    after_step: int = 0,
) -> tuple[list[StepScreenshotRow], str]:
    """A task's screenshots (optionally one attempt's, past `after_step` of it) by attempt,
    step, then phase, "before" first (phases sort in reverse: "before" > "after"), read in
    the order of `ix_step_screenshots_listing`; a later page is a range of it from its
    token's step (`past`)."""
    t = StepScreenshotRow
    query = select(t).where(t.task_id == task_id)
    if attempt:
        query = query.where(t.attempt == attempt)
    if after_step:
        query = query.where(t.step_index > after_step)
    if page_token:
        a, s, p = _decode(task_id, page_token, attempt, after_step)
        # Phases sort down where steps sort up, so no one row comparison says "after": the
        # range starts at the token's step, and its phases up to the token's are left out.
        # Not `past(…) OR phase < p`: PostgreSQL read that as two ranges (a BitmapOr) and
        # sorted all the rest of the task's screenshots, a page deep in the task's last
        # attempt most of all (it prices a row comparison by its first column alone, and
        # `attempt > last` looks empty).
        query = query.where(
            past((t.attempt, t.step_index), (a, s), inclusive=True),
            not_(and_(t.attempt == a, t.step_index == s, t.phase >= p)),
        )
    query = query.order_by(t.attempt, t.step_index, t.phase.desc()).limit(page_size + 1)
    async with store.read() as session:
        rows = list((await session.scalars(query)).all())
    more = len(rows) > page_size
    rows = rows[:page_size]
    return rows, (_cursor(rows[-1], attempt, after_step) if more and rows else "")


async def expired(
    store: Store, older_than: dt.timedelta, limit: int = 1000
) -> list[tuple[str, int, int, str, str]]:
    """Screenshots of tasks that ended before now - older_than (the decision log's rule):
    (task, attempt, step, phase, object key), at most `limit`."""
    cutoff = store.now() - older_than
    async with store.read() as session:
        rows = await session.execute(
            select(
                StepScreenshotRow.task_id,
                StepScreenshotRow.attempt,
                StepScreenshotRow.step_index,
                StepScreenshotRow.phase,
                StepScreenshotRow.object_key,
            )
            .join(TaskRow, TaskRow.task_id == StepScreenshotRow.task_id)
            .where(TaskRow.finished_at.is_not(None), TaskRow.finished_at < cutoff)
            .limit(limit)
        )
        return [(str(t), int(a), int(s), str(p), str(k)) for t, a, s, p, k in rows]


async def forget(store: Store, keys: list[tuple[str, int, int, str]]) -> None:
    """Delete these rows (their objects are gone from the store already)."""
    if not keys:
        return
    t = StepScreenshotRow
    async with store.write() as session:
        await session.execute(
            delete(t).where(tuple_(t.task_id, t.attempt, t.step_index, t.phase).in_(keys))
        )
