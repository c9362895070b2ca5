"""Retrieval: which learned flows a new attempt gets with its assignment, and why.

At assignment (`Dispatcher`, after the claim committed) the cloud scores the goal against the
active flows and hands over those at or above the threshold, best first (at most
`MAX_HANDED`: the same goal may have been learned from different starting screens, and the
replay starts with the first whose first step fits). The decision — the flows, the best score,
the scorer and a one-line reason — is written on the attempt, where GetTask, the consoles and
`amc task show` read it; the Decide calls of the attempt read the same flows from there.

Scorers: the local lexical one always (planner/flows/scoring.py); with `flow_scorer=openai` the
goal is embedded and compared with each flow's stored embedding (cosine) — in SQL with pgvector
when the PostgreSQL server has the `vector` extension, in Python otherwise; a flow without an
embedding, or a failed embedding call, is scored lexically. Rules every scorer obeys: opposite
wording and missing parameters make a flow unusable (`scoring.bound`).

No flow is handed over when the task asked for no replay, or when an earlier attempt of the task
diverged from a replay (the next attempt plans with the model from the start).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import text

from amc.v1 import types_pb2
from cloud.flows.embeddings import Embedder
from cloud.settings import CloudSettings
from cloud.store import convert, errors, flows
from cloud.store.database import Store
from cloud.store.leases import Settle
from cloud.store.models import FlowRow
from planner.flows import params
from planner.flows.scoring import Candidate, LexicalScorer, Scored, bound, cosine
from planner.flows.synthesis import needed_parameters

log = logging.getLogger(__name__)
MAX_HANDED = 3
#: Embedding cosines of unrelated texts sit higher than lexical scores: their own threshold.
EMBEDDING_THRESHOLD = 0.85
#: How long the active flows, read and parsed once, serve retrievals while this process changed
#: none of them (`flows.changes`): a flow learned on another replica is seen within this time.
#: One disabled or retired there is never handed out meanwhile: the flows chosen are checked
#: by one read at hand-out (`Retriever._still_active`). Reading and parsing 1,000 flows per
#: assignment was ~40 ms of the loop's CPU, a dispatch burst's bottleneck
#: (bench/flow_retrieval.py).
CANDIDATES_TTL_S = 2.0
NO_REPLAY = "the task asked for no replay"
NO_FLOW = "no flow learned yet"


@dataclass(frozen=True, slots=True)
class _Ranked:
    row: FlowRow
    scored: Scored
    scorer: str


@dataclass(frozen=True, slots=True)
class _Active:
    """The active flows as retrieval reads them, with their lexical scorer built once."""

    rows: list[FlowRow]
    scorer: LexicalScorer
    changes: int
    read_at: float


def _settled(attempt: int, no_replay: bool, any_active: bool) -> flows.Choice | None:
    """The choice when the goal does not matter, else None. A later attempt is left to
    `Retriever._choose`, which looks for an earlier one that diverged from a replay."""
    if no_replay:
        return flows.Choice([], 0.0, "", NO_REPLAY)
    if attempt == 1 and not any_active:
        return flows.Choice([], 0.0, "", NO_FLOW)
    return None


def _candidate(row: FlowRow) -> Candidate:
    flow = convert.flow(row)
    return Candidate(
        row.flow_id, row.goal_template, row.embedding_text, tuple(needed_parameters(flow))
    )


class Retriever:
    """Scores goals against the store's active flows (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        settings: CloudSettings,
        embedder: Embedder | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.settings = settings
        self.embedder = embedder
        self._pgvector: bool | None = None
        self._active: _Active | None = None
        self._clock = clock

    def threshold(self, scorer: str) -> float:
        return EMBEDDING_THRESHOLD if scorer != "lexical" else self.settings.flow_threshold

    async def for_new_attempt(
        self, task_id: str, attempt: int, goal: str, *, no_replay: bool
    ) -> list[types_pb2.Flow]:
        """Choose, record the choice on the attempt, and return the flows to hand over."""
        choice, handed = await self._choose(task_id, attempt, goal, no_replay)
        await flows.record_choice(self.store, task_id, attempt, choice)
        return handed

    async def handed(self, task_id: str, attempt: int, goal: str) -> list[types_pb2.Flow]:
        """The flows this attempt was handed (a resumed assignment, a Decide call), with the
        goal's parameter values."""
        return [
            as_handed(row, goal, 0.0, "")
            for row in await flows.candidates(self.store, task_id, attempt)
        ]

    async def _choose(
        self, task_id: str, attempt: int, goal: str, no_replay: bool
    ) -> tuple[flows.Choice, list[types_pb2.Flow]]:
        settled = _settled(attempt, no_replay, any_active=True)
        if settled is not None:
            return settled, []
        earlier = await flows.diverged_before(self.store, task_id, attempt) if attempt > 1 else None
        if earlier is not None:
            reason = f"attempt {earlier} diverged from a replay: planning with the model"
            return flows.Choice([], 0.0, "", reason), []
        active = await self.active()
        if not active.rows:
            return flows.Choice([], 0.0, "", NO_FLOW), []
        ranked = await self.rank(goal, active.rows, active.scorer)
        best = ranked[0]
        eligible = [
            r for r in ranked if r.scored.usable and r.scored.score >= self.threshold(r.scorer)
        ]
        usable = await self._still_active(eligible)
        if not usable:
            if eligible:
                reason = (
                    f"flow {eligible[0].row.flow_id} scored {eligible[0].scored.score:.2f} but "
                    "is no longer active"
                )
            elif not best.scored.usable:
                reason = (
                    f"flow {best.row.flow_id} scored {best.scored.score:.2f} but {best.scored.why}"
                )
            else:
                reason = (
                    f"best score {best.scored.score:.2f} < {self.threshold(best.scorer):.2f} "
                    f"({best.scorer}, flow {best.row.flow_id})"
                )
            return flows.Choice([], best.scored.score, best.scorer, reason), []
        top = usable[0]
        reason = f"score {top.scored.score:.2f} >= {self.threshold(top.scorer):.2f} ({top.scorer})"
        if len(usable) > 1:
            reason += f"; {len(usable) - 1} more flow(s) for other starting screens"
        handed = [as_handed(r.row, goal, r.scored.score, r.scorer) for r in usable]
        return flows.Choice(
            [r.row.flow_id for r in usable], top.scored.score, top.scorer, reason
        ), handed

    async def _still_active(self, ranked: list[_Ranked]) -> list[_Ranked]:
        """The first `MAX_HANDED` of `ranked` that are active now. The candidates may be up to
        `CANDIDATES_TTL_S` old, and an operator who disables a flow on another replica expects
        no new attempt to get it: one indexed read per assignment that hands flows over (none
        for one that hands none), and the candidates are read again at the next retrieval when
        one of them was withdrawn."""
        kept: list[_Ranked] = []
        rest = ranked
        while rest and len(kept) < MAX_HANDED:
            batch, rest = rest[: MAX_HANDED - len(kept)], rest[MAX_HANDED - len(kept) :]
            active = await flows.still_active(self.store, [r.row.flow_id for r in batch])
            kept += [r for r in batch if r.row.flow_id in active]
            if len(active) < len(batch):
                self._active = None
        return kept

    async def settle(self) -> Settle:
        """The choice a claim can write on the attempt it creates, decided without the goal
        (`leases.claim`): a task that asked for no replay, or a first attempt while no flow is
        active (every assignment of a fleet that learned none yet). The assignment then neither
        scores nor writes its choice in a second transaction, which was a seventh of the
        replica's CPU in a dispatch burst (bench/dispatch_burst.py)."""
        any_active = bool((await self.active()).rows)
        return lambda attempt, no_replay: _settled(attempt, no_replay, any_active)

    async def active(self) -> _Active:
        """The active flows and their scorer: read again when this process changed a flow or
        `CANDIDATES_TTL_S` passed, else the ones read last."""
        now, changes = self._clock(), flows.changes(self.store)
        kept = self._active
        if kept is None or kept.changes != changes or now - kept.read_at >= CANDIDATES_TTL_S:
            rows = await flows.active(self.store)
            kept = _Active(rows, LexicalScorer([_candidate(r) for r in rows]), changes, now)
            self._active = kept
        return kept

    async def rank(
        self, goal: str, rows: list[FlowRow], lexical_scorer: LexicalScorer | None = None
    ) -> list[_Ranked]:
        """Every flow's score for `goal`, best first (ties: the flow that replayed best, then
        the most recently changed). `lexical_scorer`: the one built for `rows`, if at hand."""
        lexical_scorer = lexical_scorer or LexicalScorer([_candidate(r) for r in rows])
        lexical = {s.flow_id: s for s in lexical_scorer.score(goal)}
        embedded = await self._embedding_scores(goal, rows)
        out: list[_Ranked] = []
        for row in rows:
            scored = lexical[row.flow_id]
            if row.flow_id in embedded:
                score, scorer = embedded[row.flow_id]
                scored = Scored(row.flow_id, round(score, 4), scored.values, scored.why)
                out.append(_Ranked(row, scored, scorer))
            else:
                out.append(_Ranked(row, scored, "lexical"))
        out.sort(
            key=lambda r: (
                r.scored.usable,
                r.scored.score,
                r.row.replays_completed - r.row.divergences,
                r.row.updated_at,
            ),
            reverse=True,
        )
        return out

    async def _embedding_scores(
        self, goal: str, rows: list[FlowRow]
    ) -> dict[str, tuple[float, str]]:
        if self.embedder is None:
            return {}
        model = self.embedder.model
        if not any(r.embedding and r.embedding_model == model for r in rows):
            return {}
        vectors = await self.embedder.embed([goal])
        if not vectors:
            return {}
        query = vectors[0]
        if await self._has_pgvector():
            try:
                return await self._pgvector_scores(query, model)
            except Exception as exc:  # the query path is not exercised here (docs/benchmarks.md)
                errors.report(log, "pgvector ranking failed; ranking in Python", exc)
        return {
            r.flow_id: (cosine(query, r.embedding or []), "openai-embedding")
            for r in rows
            if r.embedding and r.embedding_model == model
        }

    async def _has_pgvector(self) -> bool:
        """Whether the database is PostgreSQL with the `vector` extension installed."""
        if self._pgvector is None:
            self._pgvector = False
            if self.store.engine.dialect.name == "postgresql":
                async with self.store.read() as session:
                    found = await session.scalar(
                        text("SELECT 1 FROM pg_extension WHERE extname = 'vector'")
                    )
                self._pgvector = found is not None
        return self._pgvector

    async def _pgvector_scores(
        self, query: list[float], model: str
    ) -> dict[str, tuple[float, str]]:
        """Cosine similarity computed by pgvector: the stored JSON array is pgvector's text
        form, so it casts to `vector` as is (no extra column; no index either: a sequential
        scan, fine for thousands of flows)."""
        sql = text(
            "SELECT flow_id, 1 - (CAST(CAST(embedding AS text) AS vector) <=> "
            "CAST(:query AS vector)) AS score FROM flows "
            "WHERE status = 'active' AND embedding IS NOT NULL AND embedding_model = :model "
            "ORDER BY score DESC LIMIT :limit"
        )
        async with self.store.read() as session:
            rows = (
                await session.execute(
                    sql, {"query": json.dumps(query), "model": model, "limit": 50}
                )
            ).all()
        return {str(flow_id): (float(score), "pgvector") for flow_id, score in rows}


def as_handed(row: FlowRow, goal: str, score: float, scorer: str) -> types_pb2.Flow:
    """A flow as an assignment carries it: its steps, the goal's parameter values, its score."""
    flow = convert.flow(row)
    values, _ = bound(_candidate(row), goal)
    for name, value in (values or params.bind(row.goal_template, goal) or {}).items():
        flow.parameters[name] = value
    flow.score = score
    flow.scorer = scorer
    flow.ClearField("embedding_text")
    return flow
