"""Learned flows in the store: add (one per fingerprint), read, list, status, counts; and the
flow columns of attempts (what retrieval chose, how the replay went, the learning loop's mark).

The counts move in one place, `_count` (through `count_use`, `count_attempt` and
`record_shipped_divergence`), so the rules hold on both backends: a replay that
finished counts as completed and ends the run of divergences; a divergence counts where it
happened, and a flow that diverged `retire_after` attempts in a row is retired (reversible: an
operator's enable sets it active and clears the run).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, case, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from amc.v1 import types_pb2
from cloud.store import states
from cloud.store.database import Store
from cloud.store.models import AttemptRow, FlowRow
from cloud.store.paging import newest_page, page_token, past, position, token_id, token_time

#: The longest id a page token may hold: `FlowRow.flow_id` is String(32).
FLOW_ID_LENGTH = 32

log = logging.getLogger(__name__)

ACTIVE, DISABLED, RETIRED = "active", "disabled", "retired"
#: How many flows retrieval reads at most (most recently changed first).
MAX_CANDIDATES = 2000
#: Per store, how often this process changed which flows are active or what one holds (added,
#: enabled, disabled, retired): retrieval keeps its parsed candidates while this stands still
#: (`changes`), and re-reads them after a while anyway, since other replicas change flows too.
_changes: weakref.WeakKeyDictionary[Store, int] = weakref.WeakKeyDictionary()


def changes(store: Store) -> int:
    """How many times this process changed the store's active flows (see `_changes`)."""
    return _changes.get(store, 0)


def _changed(store: Store) -> None:
    _changes[store] = changes(store) + 1


async def add(
    store: Store,
    flow: types_pb2.Flow,
    fingerprint: str,
    source_task_id: str,
    source_attempt: int,
    *,
    embedding: list[float] | None = None,
    embedding_model: str | None = None,
) -> tuple[FlowRow, bool]:
    """Store a flow; with a known fingerprint the existing flow comes back and False."""
    existing = await by_fingerprint(store, fingerprint)
    if existing is not None:
        return existing, False
    now = store.now()
    stored = types_pb2.Flow()
    stored.CopyFrom(flow)
    for name in ("flow_id", "parameters", "status", "score", "scorer", "status_reason"):
        stored.ClearField(name)
    row = FlowRow(
        flow_id=uuid.uuid4().hex[:16],
        fingerprint=fingerprint,
        goal_template=flow.goal_template,
        flow_pb=stored.SerializeToString(),
        embedding_text=flow.embedding_text,
        embedding=embedding,
        embedding_model=embedding_model,
        status=ACTIVE,
        status_reason=f"learned from task {source_task_id} attempt {source_attempt}",
        source_task_id=source_task_id,
        source_attempt=source_attempt,
        divergences_by_step={},
        created_at=now,
        updated_at=now,
    )
    try:
        async with store.write() as session:
            session.add(row)
        _changed(store)
    except IntegrityError:  # another replica stored the same path a moment ago
        existing = await by_fingerprint(store, fingerprint)
        if existing is None:
            raise
        return existing, False
    return row, True


async def by_fingerprint(store: Store, fingerprint: str) -> FlowRow | None:
    async with store.read() as session:
        return await session.scalar(select(FlowRow).where(FlowRow.fingerprint == fingerprint))


async def get(store: Store, flow_id: str) -> FlowRow | None:
    """One flow by id, or None."""
    async with store.read() as session:
        return await session.get(FlowRow, flow_id)


async def by_ids(store: Store, flow_ids: list[str]) -> list[FlowRow]:
    """The flows with these ids, in the order given (unknown ids are left out)."""
    if not flow_ids:
        return []
    async with store.read() as session:
        rows = {
            r.flow_id: r
            for r in (
                await session.scalars(select(FlowRow).where(FlowRow.flow_id.in_(flow_ids)))
            ).all()
        }
    return [rows[i] for i in flow_ids if i in rows]


async def still_active(store: Store, flow_ids: list[str]) -> set[str]:
    """Of these flows, the ones active now: one read by primary key, the check retrieval makes
    before it hands flows over from candidates it may have read up to `CANDIDATES_TTL_S` ago
    (another replica may have disabled or retired one since)."""
    if not flow_ids:
        return set()
    async with store.read() as session:
        found = await session.scalars(
            select(FlowRow.flow_id).where(FlowRow.flow_id.in_(flow_ids), FlowRow.status == ACTIVE)
        )
        return set(found.all())


async def active(store: Store, limit: int = MAX_CANDIDATES) -> list[FlowRow]:
    """Flows retrieval may choose from, most recently changed first."""
    async with store.read() as session:
        return list(
            (
                await session.scalars(
                    select(FlowRow)
                    .where(FlowRow.status == ACTIVE)
                    .order_by(FlowRow.updated_at.desc(), FlowRow.flow_id)
                    .limit(limit)
                )
            ).all()
        )


def listing(statuses: tuple[str, ...]) -> str:
    """The page tokens' listing name: ListFlows with these statuses. A token held a position
    only, and continued under another filter it silently skipped that filter's newer flows.
    "flows-made/": tokens of the listing by last change ("flows/") held a time of change, which
    read as a time made would continue at the wrong place; they are refused instead."""
    return "flows-made/" + ",".join(sorted(set(statuses)))


def encode_cursor(statuses: tuple[str, ...], row: FlowRow) -> str:
    """Opaque page token: the (created_at, flow_id) of the last flow of a page."""
    return page_token(listing(statuses), row.created_at.isoformat(), row.flow_id)


def _decode(statuses: tuple[str, ...], token: str) -> tuple[dt.datetime, str]:
    when, flow_id = position(listing(statuses), token, 2)
    return token_time(when), token_id(flow_id, FLOW_ID_LENGTH)


async def list_page(
    store: Store, statuses: tuple[str, ...], page_size: int, page_token: str
) -> tuple[list[FlowRow], str]:
    """Flows, newest first, keyset-paged on (created_at, flow_id), which never change (as
    ListTasks): paged on the time of the last change, a flow turned off or on between two
    page reads moved to the head, and was skipped, or listed again. Raises ValueError for a
    foreign page token.

    Each page is a range of an index in its order, on both backends: the position is one row
    comparison (the same test spelled with OR was a filter, and page k read the k pages before
    it again), and several statuses are one such range per status (`ix_flows_status_created_at`)
    merged, reading at most a page of each (one walk of `ix_flows_created_at_flow_id` testing
    each flow's status read every flow when the statuses asked for are rare)."""
    query = select(FlowRow)
    if page_token:
        made, flow_id = _decode(statuses, page_token)
        query = query.where(
            past((FlowRow.created_at, FlowRow.flow_id), (made, flow_id), descending=True)
        )
    stmt = newest_page(
        query, (FlowRow.created_at, FlowRow.flow_id), page_size + 1, FlowRow.status, statuses
    )
    async with store.read() as session:
        rows = list((await session.scalars(stmt)).all())
    more = len(rows) > page_size
    rows = rows[:page_size]
    return rows, (encode_cursor(statuses, rows[-1]) if more and rows else "")


async def set_status(store: Store, flow_id: str, status: str, reason: str) -> FlowRow | None:
    """Set a flow's status (an operator's disable or enable; enabling clears the run of
    divergences so a retired flow gets another chance). None for an unknown flow."""
    values: dict[str, object] = {
        "status": status,
        "status_reason": reason,
        "updated_at": store.now(),
    }
    if status == ACTIVE:
        values["consecutive_divergences"] = 0
    async with store.write() as session:
        result = await session.execute(
            update(FlowRow).where(FlowRow.flow_id == flow_id).values(**values)
        )
        if not result.rowcount:  # type: ignore[attr-defined]
            return None
    _changed(store)
    return await get(store, flow_id)


@dataclass(frozen=True, slots=True)
class Choice:
    """What retrieval decided for one attempt."""

    flow_ids: list[str]
    score: float
    scorer: str
    reason: str


def choice_columns(choice: Choice) -> dict[str, object]:
    """The attempt's columns that hold a choice (the first flow is the one handed over)."""
    return {
        "flow_id": choice.flow_ids[0] if choice.flow_ids else None,
        "flow_score": choice.score,
        "flow_scorer": choice.scorer,
        "flow_reason": choice.reason,
        "flow_candidates": list(choice.flow_ids),
    }


async def record_choice(store: Store, task_id: str, attempt: int, choice: Choice) -> None:
    """Write retrieval's decision on the attempt (the first flow is the one handed over): one
    short statement per assignment, so on SQLite on the loop's own thread
    (`Store.write_on_loop`) rather than through the worker thread and back."""
    statement = (
        update(AttemptRow)
        .where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
        .values(**choice_columns(choice))
    )
    await store.write_on_loop(lambda session: session.execute(statement))


async def candidates(store: Store, task_id: str, attempt: int) -> list[FlowRow]:
    """The flows retrieval handed to this attempt that are still active, best first (none: no
    replay). Read at every Decide, so a flow an operator disables (or the cloud retires)
    mid-replay is replayed no further: the model takes the next step."""
    rows = await by_ids(store, await handed_ids(store, task_id, attempt))
    return [row for row in rows if row.status == ACTIVE]


async def withdrawn(store: Store, ids: list[str]) -> list[str]:
    """Of these flows handed to an attempt, those no longer active (disabled, retired or
    deleted): what a direct-transport host is told with each renewal to replay no further,
    as `candidates` leaves them out on the cloud transport."""
    active = {row.flow_id for row in await by_ids(store, ids) if row.status == ACTIVE}
    return [flow_id for flow_id in ids if flow_id not in active]


async def handed_ids(store: Store, task_id: str, attempt: int) -> list[str]:
    """The ids of the flows handed to this attempt, in the order it got them."""
    async with store.read() as session:
        ids = await session.scalar(
            select(AttemptRow.flow_candidates).where(
                AttemptRow.task_id == task_id, AttemptRow.attempt == attempt
            )
        )
    return list(ids or [])


async def handed_steps(store: Store, task_id: str, attempt: int) -> dict[str, int | None]:
    """The flows handed to this attempt, id → how many steps it has (None: deleted since), what
    a host's replay report of the attempt is checked against."""
    ids = await handed_ids(store, task_id, attempt)
    steps: dict[str, int | None] = dict.fromkeys(ids)
    for row in await by_ids(store, ids):
        flow = types_pb2.Flow()
        flow.ParseFromString(row.flow_pb)
        steps[row.flow_id] = len(flow.steps)
    return steps


async def diverged_before(store: Store, task_id: str, before: int) -> int | None:
    """The latest earlier attempt of the task whose replay diverged, or None."""
    async with store.read() as session:
        return await session.scalar(
            select(AttemptRow.attempt)
            .where(
                AttemptRow.task_id == task_id,
                AttemptRow.attempt < before,
                AttemptRow.replay_diverged_step.is_not(None),
            )
            .order_by(AttemptRow.attempt.desc())
            .limit(1)
        )


async def record_replay(
    store: Store,
    task_id: str,
    attempt: int,
    *,
    flow_id: str,
    steps_replayed: int | None,
    diverged_at: int,
    reason: str,
) -> None:
    """How the attempt's replay went (the cloud transport's Decide calls, or a direct-transport
    host's report with its result; its shipped handover: `record_shipped_divergence`)."""
    values = _replay_values(flow_id, steps_replayed, diverged_at, reason)
    if not values:
        return
    async with store.write() as session:
        await session.execute(
            update(AttemptRow)
            .where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
            .values(**values)
        )


def _replay_values(
    flow_id: str, steps_replayed: int | None, diverged_at: int, reason: str
) -> dict[str, object]:
    """The attempt's replay columns to write: replayed steps so far (None: not known here,
    left as they are), the flow, and where it handed over."""
    values: dict[str, object] = {}
    if steps_replayed is not None:
        values["replay_steps"] = steps_replayed
    if flow_id:
        values["flow_id"] = flow_id
    if diverged_at:
        values.update(replay_diverged_step=diverged_at, replay_divergence=reason)
    return values


#: The mark of an attempt the learning loop looked at before its shipped log was complete, set
#: when the next decision for it is shipped (`decisions.append_shipped`): it is looked at
#: again, but its replay was counted the first time.
SHIPPED = "shipped"
#: The learning loop's marks while it looks: taken, its replay not counted yet (`WORKING`);
#: counted, in the transaction that counts it (`COUNTED`); taken again after `SHIPPED`, counted
#: before (`RELOOK`). Any mark but none and `WORKING` says the replay was counted.
WORKING, COUNTED, RELOOK = "working", "counted", "relooking"
#: The marks of an attempt the loop is looking at now.
LOOKING = (WORKING, COUNTED, RELOOK)
#: A mark of `LOOKING` taken longer ago than this (`AttemptRow.flow_taken_at`; none: taken
#: before migration 0016) was left by a loop that will not finish — its replica was killed
#: mid-learn, or its closing mark failed while the database was away — and any replica's loop
#: takes the attempt back. Far longer than a look takes (a few reads, one embedding call).
RECLAIM_AFTER = dt.timedelta(minutes=10)


def _to_take(cutoff: dt.datetime) -> ColumnElement[bool]:
    """The attempts the loop may take: not looked at, handed back, or left taken before
    `cutoff`."""
    return or_(
        AttemptRow.flow_state.is_(None),
        AttemptRow.flow_state == SHIPPED,
        and_(
            AttemptRow.flow_state.in_(LOOKING),
            or_(AttemptRow.flow_taken_at.is_(None), AttemptRow.flow_taken_at < cutoff),
        ),
    )


def hand_back(row: AttemptRow) -> None:
    """Hand a lapsed attempt the learning loop looked at already back to it, now that the
    host's result for it counts after all (a late result, a revived lease): afresh when it
    knew no replay then (it counted nothing), else to learn only (`SHIPPED`: the replay it knew
    of, a shipped handover, was counted). One it is looking at right now is left to it."""
    if row.flow_state not in (None, WORKING):
        known = row.replay_steps is not None or row.replay_diverged_step is not None
        row.flow_state = SHIPPED if known else None


async def claim_ended_attempt(
    store: Store, reclaim_after: dt.timedelta = RECLAIM_AFTER
) -> tuple[AttemptRow, bool] | None:
    """An ended attempt the learning loop has to look at, marked as taken now, and whether its
    replay was counted before (then it is only learned from): one not looked at yet (marked
    `WORKING`), one handed back after it was looked at (`SHIPPED`, marked `RELOOK`), or one
    whose mark was left more than `reclaim_after` ago (`RECLAIM_AFTER`: taken back as `WORKING`
    if it was not counted yet, else as `RELOOK`). Two replicas never take the same one: the
    UPDATE re-checks the mark and its age, and the winner's new stamp fails the loser's check."""
    for _ in range(5):
        now = store.now()
        cutoff = now - reclaim_after
        async with store.read() as session:
            row = await session.scalar(
                select(AttemptRow)
                .where(_to_take(cutoff), AttemptRow.ended_at.is_not(None))
                .order_by(AttemptRow.ended_at, AttemptRow.id)
                .limit(1)
            )
        if row is None:
            return None
        before = row.flow_state
        mark = WORKING if before in (None, WORKING) else RELOOK
        async with store.write() as session:
            taken = await session.execute(
                update(AttemptRow)
                .where(
                    AttemptRow.id == row.id,
                    AttemptRow.flow_state.is_(None)
                    if before is None
                    else AttemptRow.flow_state == before,
                    _to_take(cutoff),
                )
                .values(flow_state=mark, flow_taken_at=now)
            )
            if taken.rowcount:  # type: ignore[attr-defined]
                if before in LOOKING:
                    log.warning(
                        "flow learning: took back task %s attempt %d, left %r since %s",
                        row.task_id,
                        row.attempt,
                        before,
                        row.flow_taken_at.isoformat() if row.flow_taken_at else "before 0016",
                    )
                row.flow_state, row.flow_taken_at = mark, now
                return row, before not in (None, WORKING)
    return None


async def mark_attempt(store: Store, attempt_id: int, state: str) -> None:
    """The learning loop is done with an attempt ("done", or why it learned nothing); unless
    it was handed back meanwhile (a late result: `leases.record_result`), then it stays so."""
    async with store.write() as session:
        await session.execute(
            update(AttemptRow)
            .where(AttemptRow.id == attempt_id, AttemptRow.flow_state.in_(LOOKING))
            .values(flow_state=state[:16])
        )


async def release_attempt(store: Store, attempt_id: int) -> None:
    """Hand an attempt the learning loop took back at once, as it was (its look failed on the
    database, not on the attempt): not looked at (`WORKING`: nothing was counted), or handed
    back to learn only (`SHIPPED`: its replay was counted). Should this fail too, the mark is
    taken back after `RECLAIM_AFTER`."""
    async with store.write() as session:
        await session.execute(
            update(AttemptRow)
            .where(AttemptRow.id == attempt_id, AttemptRow.flow_state.in_(LOOKING))
            .values(
                flow_state=case((AttemptRow.flow_state == WORKING, None), else_=SHIPPED),
                flow_taken_at=None,
            )
        )


async def count_use(
    store: Store,
    flow_id: str,
    *,
    completed: bool,
    diverged_at: int,
    reason: str,
    retire_after: int,
) -> FlowRow | None:
    """Count one attempt that was handed the flow: completed by replay, diverged at a step, or
    neither (it ended otherwise). Retires the flow after `retire_after` divergences in a row."""
    async with store.write() as session:
        row, retired = await _count(
            session, store, flow_id, Use(flow_id, completed, diverged_at, reason), retire_after
        )
    if retired:
        _changed(store)
    return row


@dataclass(frozen=True, slots=True)
class Use:
    """How one attempt used a flow (`flow_id` empty: it replayed none)."""

    flow_id: str = ""
    completed: bool = False
    diverged_at: int = 0
    reason: str = ""


async def count_attempt(
    store: Store,
    attempt_id: int,
    judge: Callable[[AttemptRow], Use],
    retire_after: int,
) -> AttemptRow | None:
    """The learning loop's count of a taken attempt's replay: `judge` reads the attempt as it is
    now, its use is counted and the attempt marked `COUNTED`, in one transaction, so a
    divergence shipped meanwhile is either seen here or counted by its shipping
    (`record_shipped_divergence`), never both nor neither. The attempt, or None."""
    retired = False
    async with store.write() as session:
        attempt = await session.get(
            AttemptRow, attempt_id, with_for_update=True, populate_existing=True
        )
        if attempt is None:
            return None
        if attempt.flow_state != WORKING:  # counted already, by a loop that took it back
            return attempt
        use = judge(attempt)
        if use.flow_id:
            _, retired = await _count(session, store, use.flow_id, use, retire_after)
        attempt.flow_state = COUNTED
    if retired:
        _changed(store)
    return attempt


async def record_shipped_divergence(
    store: Store,
    task_id: str,
    attempt: int,
    use: Use,
    retire_after: int,
) -> None:
    """Write a direct-transport host's shipped handover on its attempt (`record_replay`'s
    columns) and, when the learning loop already counted that attempt's replay without it (the
    host was offline past its lease: the attempt ended, and was looked at, before its backlog
    came), count the divergence on the flow now, once: only the attempt's first divergence is
    counted here, and a use only if the loop's count had none on that flow."""
    retired = False
    async with store.write() as session:
        row = await session.scalar(
            select(AttemptRow)
            .where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
            .with_for_update()
        )
        if row is None:
            return
        late = row.replay_diverged_step is None and row.flow_state not in (None, WORKING)
        # The loop counted a use on the attempt's flow iff it found a replay report then.
        used = row.replay_steps is not None and (row.flow_id or "") == use.flow_id
        await session.execute(
            update(AttemptRow)
            .where(AttemptRow.id == row.id)
            .values(**_replay_values(use.flow_id, None, use.diverged_at, use.reason))
        )
        if late and use.flow_id:
            _, retired = await _count(
                session, store, use.flow_id, use, retire_after, new_use=not used
            )
    if retired:
        _changed(store)


async def _count(
    session: AsyncSession,
    store: Store,
    flow_id: str,
    use: Use,
    retire_after: int,
    *,
    new_use: bool = True,
) -> tuple[FlowRow | None, bool]:
    """`use` counted on the flow in `session` (`new_use` False: its use was counted before,
    without this divergence); the flow, and whether it was retired now."""
    row = await session.get(FlowRow, flow_id, with_for_update=True)
    if row is None:
        return None, False
    retired = False
    if new_use:
        row.uses += 1
    if use.completed:
        row.replays_completed += 1
        row.consecutive_divergences = 0
    if use.diverged_at:
        row.divergences += 1
        row.consecutive_divergences += 1
        by_step = dict(row.divergences_by_step or {})
        by_step[str(use.diverged_at)] = int(by_step.get(str(use.diverged_at), 0)) + 1
        row.divergences_by_step = by_step
        row.last_divergence = f"step {use.diverged_at}: {use.reason}"[:2000]
        if row.status == ACTIVE and row.consecutive_divergences >= retire_after:
            retired = True
            row.status = RETIRED
            row.status_reason = (
                f"retired after {row.consecutive_divergences} divergences in a row "
                f"(last at step {use.diverged_at})"
            )
    row.updated_at = store.now()
    return row, retired


def ended_ok(row: AttemptRow) -> bool:
    return row.status == states.SUCCEEDED
