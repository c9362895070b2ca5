"""Typed tables of the cloud store. Migrations in `migrations/` must match these exactly."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes on every backend (SQLite stores naive UTC text, which sorts right)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


def sqlite_text(at: dt.datetime) -> str:
    """An aware datetime as `UTCDateTime` stores it on SQLite (naive UTC, SQLAlchemy's text),
    for statements that bind it themselves (the hot paths that bypass SQLAlchemy's binding).
    `isoformat` with UTC as is: half the cost of `strftime` (a heartbeat formats one per host)."""
    utc = at if at.tzinfo is dt.UTC else at.astimezone(dt.UTC)
    return utc.replace(tzinfo=None).isoformat(" ", "microseconds")


class Base(DeclarativeBase):
    """Declarative base with a naming convention so migrations name constraints stably."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


#: `ix_tasks_queue`'s keys: whom a queued task waits for (its target host, '' for any; NULL once
#: it is not queued) and which phone ('' for any). `cloud.store.leases.claim` looks tasks up by
#: these very expressions: an expression index serves only a query that repeats it.
QUEUE_KEY = (
    text("(CASE WHEN status = 'QUEUED' THEN coalesce(target_host_id, '') END)"),
    text("coalesce(target_device_serial, '')"),
)


class TaskRow(Base):
    """A unit of work. `attempt` is the current or last attempt number (0 before the first)."""

    __tablename__ = "tasks"

    task_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    goal: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    # Attempts whose assignment provably never reached a host (the stream was gone before it
    # was sent): handed back at once, they do not count against `max_attempts` (0019).
    unsent_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    target_host_id: Mapped[str | None] = mapped_column(String(128))
    target_device_serial: Mapped[str | None] = mapped_column(String(128))
    host_id: Mapped[str | None] = mapped_column(String(128))
    device_serial: Mapped[str | None] = mapped_column(String(128))
    lease_seconds: Mapped[float] = mapped_column(Float)
    deadline: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    client_request_id: Mapped[str | None] = mapped_column(String(128), unique=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    cancel_reason: Mapped[str | None] = mapped_column(Text)
    # Submitted with no_replay: every step is planned by the model (migration 0010).
    no_replay: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    result_summary: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    # The operator who asked to cancel (their certificate's name); NULL when nobody did.
    cancelled_by: Mapped[str | None] = mapped_column(String(256))
    # Token usage of every decision logged for the task, summed as each is appended (kept when
    # the decision log is pruned): the task's totals.
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cache_write_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    thinking_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    decision_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Spending caps (SubmitTaskRequest.budget, or the cloud's defaults); 0 = no cap.
    max_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    max_cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # What the retention pass deleted of the task's decision log (migration 0022): decisions,
    # failed decisions' call records, and when it last deleted some. The totals above still
    # count them; these say why the log no longer shows them.
    pruned_decisions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    pruned_failed_decisions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    pruned_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    # The markers of calls of unknown cost it deleted (migration 0030): how many, and the most
    # those calls can have cost (their `at_most_*` summed). Their cost is still unknown.
    pruned_unsettled_calls: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    pruned_unsettled_input_tokens: Mapped[int] = mapped_column(
        BigInteger, default=0, server_default="0"
    )
    pruned_unsettled_output_tokens: Mapped[int] = mapped_column(
        BigInteger, default=0, server_default="0"
    )
    pruned_unsettled_cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")

    __table_args__ = (
        Index("ix_tasks_status_created_at", "status", "created_at"),
        Index("ix_tasks_created_at_task_id", "created_at", "task_id"),
        # ListTasks' order by one status, a range of it per status (migration 0029).
        Index("ix_tasks_status_created_at_task_id", "status", "created_at", "task_id"),
        Index("ix_tasks_host_id", "host_id"),
        Index("ix_tasks_finished_at", "finished_at"),
        # The queue a claim reads, by whom a task waits for (any phone, a host, a phone): a
        # claim reads the head of each queue it may take from, never the tasks queued for
        # other hosts or phones (migration 0015, `cloud.store.leases.claim`). Keyed by
        # expressions: "any" is '' (equalities keep each queue in age order, where PostgreSQL
        # sorted what it found by `IS NULL`), and the status is folded into the first key, so
        # no plan can prefer `ix_tasks_status_created_at` and walk every queued task. Not
        # partial: on SQLite a partial index whose condition names `status` makes every
        # statement that binds `tasks.status` be prepared again each time it runs.
        Index("ix_tasks_queue", *QUEUE_KEY, "created_at", "task_id"),
        # Room on each page for renewals' in-place (HOT) updates (migration 0014).
        {"postgresql_with": {"fillfactor": 80}},
    )


class AttemptRow(Base):
    """One lease on one phone. The lease (id, expiry) and the latest progress live here.

    Progress columns are overwritten by every accepted renewal and by the final result; they are a
    snapshot, not a history.
    """

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.task_id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    host_id: Mapped[str] = mapped_column(String(128))
    device_serial: Mapped[str] = mapped_column(String(128))
    lease_id: Mapped[str] = mapped_column(String(32))
    lease_expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    failure_reason: Mapped[str | None] = mapped_column(Text)
    result_status: Mapped[str | None] = mapped_column(String(16))
    result_summary: Mapped[str | None] = mapped_column(Text)
    planner_transport: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    step_index: Mapped[int | None] = mapped_column(Integer)
    step_status: Mapped[int | None] = mapped_column(Integer)
    summary: Mapped[str | None] = mapped_column(String(256))
    progress_updated_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    # The host's step limit for this attempt (Progress.max_steps); NULL when it did not say.
    max_steps: Mapped[int | None] = mapped_column(Integer)
    # The host's result arrived after the lease ran out, before another attempt started, and was
    # accepted (leases/results.py): what the host finished counts instead of running again.
    late_result: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Learned flows (migration 0010): what retrieval decided at assignment (the flow handed
    # over, its score and scorer, why, and every candidate handed over, best first), how the
    # replay went, and whether the learning loop has looked at the ended attempt (NULL: not
    # yet; "done").
    flow_id: Mapped[str | None] = mapped_column(String(32))
    flow_score: Mapped[float | None] = mapped_column(Float)
    flow_scorer: Mapped[str | None] = mapped_column(String(32))
    flow_reason: Mapped[str | None] = mapped_column(Text)
    flow_candidates: Mapped[list[str] | None] = mapped_column(JSON)
    replay_steps: Mapped[int | None] = mapped_column(Integer)
    replay_diverged_step: Mapped[int | None] = mapped_column(Integer)
    replay_divergence: Mapped[str | None] = mapped_column(Text)
    # A direct-transport host's word that its replay ran to the flow's end (migration 0036;
    # FlowReplayReport.completed): a replay stopped without a divergence and finished by the
    # model is no completed replay. NULL: not said (the cloud transport, an older host).
    replay_completed: Mapped[bool | None] = mapped_column(Boolean)
    flow_state: Mapped[str | None] = mapped_column(String(16))
    # When the learning loop took the attempt (migration 0016): a mark it left older than
    # `flows.RECLAIM_AFTER` (its replica was killed mid-learn) is taken back.
    flow_taken_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    # Renewals are summarised here rather than recorded one by one (lease_events has the rest).
    renewals: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    first_renewed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    last_renewed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("task_id", "attempt"),
        Index("ix_attempts_flow_state", "flow_state", "ended_at"),
        # One live attempt per phone: the database refuses a second one, whatever replica tries.
        Index(
            "uq_attempts_live_device",
            "host_id",
            "device_serial",
            unique=True,
            sqlite_where=text("ended_at IS NULL"),
            postgresql_where=text("ended_at IS NULL"),
        ),
        # The expiry sweep's walk of live leases. Partial, so that `ended_at IS NULL` alone never
        # sends a query naming a few tasks or hosts through every live attempt (migration 0013).
        Index(
            "ix_attempts_live_expiry",
            "lease_expires_at",
            sqlite_where=text("ended_at IS NULL"),
            postgresql_where=text("ended_at IS NULL"),
        ),
        # Room on each page for renewals' in-place (HOT) updates (migration 0014).
        {"postgresql_with": {"fillfactor": 80}},
    )


class LeaseEventRow(Base):
    """One event of a task's lease history (append-only): assigned, resumed, revoked, expired,
    deadline exceeded, cancel requested, cancelled, result, requeued (`cloud/store/lease_events`).

    Written in the transaction that made the change it records, so the history and the state
    never disagree. `attempt` is 0 for an event before the first attempt.
    """

    __tablename__ = "lease_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.task_id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(24))
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    host_id: Mapped[str | None] = mapped_column(String(128))
    device_serial: Mapped[str | None] = mapped_column(String(128))
    operator: Mapped[str | None] = mapped_column(String(256))
    reason: Mapped[str | None] = mapped_column(Text)
    result_status: Mapped[str | None] = mapped_column(String(16))
    task_status: Mapped[str | None] = mapped_column(String(16))

    __table_args__ = (Index("ix_lease_events_task_id_id", "task_id", "id"),)


class HostRow(Base):
    """A host that connected at least once, with its phones from the last hello or update."""

    __tablename__ = "hosts"

    # On PostgreSQL also indexed as `host_id COLLATE "C"`, ListHosts' order (migration 0027:
    # ix_hosts_host_id_c, not declared here, SQLite having no such collation).
    host_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    devices: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    agent_version: Mapped[str] = mapped_column(String(128), default="")
    planner_transport: Mapped[int] = mapped_column(Integer, default=0)
    connected: Mapped[bool] = mapped_column(Boolean, default=False)
    # Which replica holds the stream, which stream it is, and when the stream opened (its hello;
    # replicas before migration 0032 also wrote it every heartbeat). The replica vouches for its
    # streams with its own row (`ReplicaRow`), so a beat writes one row, not one per host; a
    # crashed replica stops vouching, so its hosts stop counting as connected.
    replica_id: Mapped[str | None] = mapped_column(String(64))
    stream_id: Mapped[str | None] = mapped_column(String(32))
    stream_alive_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    last_seen_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    # Which run of the host agent sent the last hello (`HostHello.process_id`; None for an
    # agent that does not say): a hello naming another one comes from a new process.
    process_id: Mapped[str | None] = mapped_column(String(128))
    # The leases the last hello named, as [task id, attempt, lease id] (None: no hello since
    # migration 0020): a replica whose older stream of the host was superseded spares them.
    held_leases: Mapped[list[list[Any]] | None] = mapped_column(JSON)
    # The host's outbox backlog as it last reported it (OutboxBacklog); reported_at NULL: never.
    outbox_items: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    outbox_decisions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    outbox_refused: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    outbox_oldest_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    outbox_reported_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    # New work held back from the host (`HostSession.lapsed`): a lease of it, of this task and
    # attempt, ran out at `held_since` while its stream `held_stream_id` stayed open; the hold
    # ends at `held_until` unless the host is heard from first (NULL: not held). Kept here so
    # the fleet view of every replica shows it, not only the one holding the stream.
    held_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    held_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    held_task_id: Mapped[str | None] = mapped_column(String(32))
    held_attempt: Mapped[int | None] = mapped_column(Integer)
    held_stream_id: Mapped[str | None] = mapped_column(String(32))
    # The latest write of the hold or its end that landed: of which stream, and its number
    # (the replica's, rising per stream). An older write of the same stream, still on its
    # way, lands no more (`hosts.hold`, `hosts.unhold`; migration 0034; NULL: none yet).
    hold_write_stream_id: Mapped[str | None] = mapped_column(String(32))
    hold_write_number: Mapped[int | None] = mapped_column(BigInteger)
    # The host said it is stopping (`HostStopping`) at `stopping_since` on its stream
    # `stopping_stream_id` (NULL: not stopping); it ends with that stream (migration 0024).
    stopping_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    stopping_stream_id: Mapped[str | None] = mapped_column(String(32))


class ReplicaRow(Base):
    """A replica that holds host streams, and when it last vouched for them (every host
    heartbeat). A host row that names it and says connected counts as connected while this is
    fresh (cloud/store/hosts.py): one write a beat whatever the replica's hosts (migration 0032).
    A replica deletes its row when it stops; a replica starting after an outage of the whole
    cloud deletes those of the replicas that died with it."""

    __tablename__ = "replicas"

    replica_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    vouched_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


class RevocationRow(Base):
    """A revoked client certificate (by serial, lowercase hex) or a whole revoked host id.

    Exactly one of `serial` and `host_id` is set. Every replica refuses a revoked certificate,
    or any certificate of a revoked host, on its next call and drops its open streams.
    """

    __tablename__ = "certificate_revocations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    serial: Mapped[str | None] = mapped_column(String(64), unique=True)
    host_id: Mapped[str | None] = mapped_column(String(128), unique=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    revoked_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())

    __table_args__ = (CheckConstraint("(serial IS NULL) <> (host_id IS NULL)", name="one_target"),)


class DispatchHoldRow(Base):
    """Why every replica holds new tasks back from hosts (cloud/dispatch_holds.py): one row per
    kind of hold, read by every replica each dispatch pass and at start, so a hold one replica
    found holds on all of them and survives a restart."""

    __tablename__ = "dispatch_holds"

    # "provider_down", "key_refused" or "daily_budget".
    reason: Mapped[str] = mapped_column(String(32), primary_key=True)
    # What was seen, for operators (the provider's error, the budget's words; never a secret).
    detail: Mapped[str] = mapped_column(Text, default="")
    set_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    # The replica (its event-bus id) that found it.
    set_by: Mapped[str] = mapped_column(String(64), default="")
    # When a replica probes the provider next (None for the daily budget: the tally decides).
    next_probe_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())


class DecisionRow(Base):
    """One planner decision (append-only). Screenshots are never stored."""

    __tablename__ = "decisions"

    decision_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    host_id: Mapped[str] = mapped_column(String(128))
    task_id: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    step_index: Mapped[int] = mapped_column(Integer)
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    system_prompt: Mapped[str] = mapped_column(Text)
    user_prompt: Mapped[str] = mapped_column(Text)
    tool_name: Mapped[str] = mapped_column(String(64))
    arguments_json: Mapped[str] = mapped_column(Text)
    action_pb: Mapped[bytes | None] = mapped_column()
    rationale: Mapped[str | None] = mapped_column(Text)
    thinking: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    purpose: Mapped[str] = mapped_column(Text, default="")
    expected_outcome: Mapped[str] = mapped_column(Text, default="")
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cache_read_input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cache_creation_input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # The part of those written to the 1-hour cache (priced apart: `Usage.cost_usd`).
    cache_creation_1h_input_tokens: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0"
    )
    thinking_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    forced_retry: Mapped[bool] = mapped_column(Boolean, default=False)
    corrective_retries: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    # "compact" or "session" (user_prompt is then the step's addition to the conversation).
    planner_mode: Mapped[str] = mapped_column(
        String(16), default="compact", server_default="compact"
    )
    # What the decision saw and what became of it (typed Decide requests; see planner/steps.py):
    # the page it was made on, the label of the element its action names, and the outcome the
    # host reported with its next call (NULL until then, and for rows of prompt-based requests).
    page: Mapped[str] = mapped_column(Text, default="", server_default="")
    target: Mapped[str | None] = mapped_column(Text)
    outcome_executed: Mapped[bool | None] = mapped_column(Boolean)
    outcome_error: Mapped[str | None] = mapped_column(Text)
    outcome_driver_output: Mapped[str | None] = mapped_column(Text)
    # "full" | "summarized" | "omitted" | "redacted" | "none"; "" for rows from before 0004.
    thinking_kind: Mapped[str] = mapped_column(String(16), default="", server_default="")
    # "none" | "forced" | "nudge"; "" for rows from before 0004.
    retry_kind: Mapped[str] = mapped_column(String(16), default="", server_default="")
    output_truncated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The screen the decision was made on: `amc.v1.ScreenObservation` bytes without OCR blocks
    # (NULL before 0006 and for prompt-based requests). Never a screenshot.
    observation_pb: Mapped[bytes | None] = mapped_column()
    # The host's name for the planning step (DecideRequest.step_key; NULL when it sent none): a
    # retried Decide with the same key gets this row back instead of planning again.
    step_key: Mapped[str | None] = mapped_column(String(64))
    # "cloud" (Decide made it) or "direct" (a host made it and shipped it); rows from before
    # 0009 were all the cloud's.
    planner_transport: Mapped[str] = mapped_column(
        String(16), default="cloud", server_default="cloud"
    )
    # The host's own id of a shipped decision (NULL for the cloud's): a resend finds it here.
    host_decision_id: Mapped[str | None] = mapped_column(String(64))
    # Verification (migration 0010): the checker's verdict on this decision's expected outcome
    # ("met" | "not_met" | "unknown"; NULL until reported) with its evidence and whether the
    # cloud ran it (the host sent none); the model's judgement of it (from the next decision);
    # this decision's own judgement of the step before it.
    verdict: Mapped[str | None] = mapped_column(String(16))
    verdict_evidence: Mapped[str | None] = mapped_column(Text)
    verdict_by_cloud: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    model_verdict: Mapped[str | None] = mapped_column(String(16))
    model_note: Mapped[str | None] = mapped_column(Text)
    previous_verdict: Mapped[str | None] = mapped_column(String(16))
    previous_note: Mapped[str | None] = mapped_column(Text)
    # The semantic target of the element the action names (amc.v1.ElementTarget, serialized).
    target_pb: Mapped[bytes | None] = mapped_column(LargeBinary)
    # A replayed step: its flow and 1-based step; the decision that took over from a replay:
    # the flow step that diverged and why.
    flow_id: Mapped[str | None] = mapped_column(String(32))
    flow_step: Mapped[int | None] = mapped_column(Integer)
    replay_divergence: Mapped[str | None] = mapped_column(Text)
    # The decision where a replay set its flow aside uncounted (a switch already set, the phone
    # part-way through it; migration 0037): why, with `flow_id`/`flow_step`. No divergence.
    flow_set_aside: Mapped[str | None] = mapped_column(Text)
    # What the decision's model calls cost in US dollars (planner/prices.py); 0 for rows from
    # before migration 0012 and for models without a price.
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # Session mode (migration 0018): the conversation's id of this decision's tool call, so the
    # next step answers that call and no other (NULL: compact, replayed, shipped, older rows).
    call_id: Mapped[str | None] = mapped_column(Text)
    # Migration 0033: set when the decision went on from a model answer an earlier decision of
    # the step kept (and was billed for) before failing on a write, instead of asking again:
    # where that answer begins in the attempt's conversation, and the provider's id of it (""
    # when it sent none). NULL position: any other decision (and rows from before 0033).
    resumed_position: Mapped[int | None] = mapped_column(Integer)
    resumed_turn_id: Mapped[str | None] = mapped_column(Text)
    # Migration 0035: when that answer was answered (its session store kept it); NULL when the
    # store did not say, on any other decision, and on rows from before 0035.
    resumed_answered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("task_id", "attempt", "step_index"),
        # NULLs never collide (both backends): only keyed decisions are unique per step key.
        UniqueConstraint("task_id", "attempt", "step_key", name="uq_decisions_step_key"),
        Index("ix_decisions_created_at", "created_at"),
        # Each shipped decision is logged once per host, whatever replica a resend reaches.
        Index("ix_decisions_host_decision_id", "host_id", "host_decision_id", unique=True),
    )


class FailedDecisionSpendRow(Base):
    """What the answered model calls of a decision that failed cost (migration 0017): no
    decision row is logged for it, yet the provider billed every answered call, so the
    spending ledger (`cloud/store/spend.py`) sums these rows beside the decisions'. The usage
    columns are named as the decisions' are."""

    __tablename__ = "failed_decision_spend"

    spend_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    host_id: Mapped[str] = mapped_column(String(128))
    task_id: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    # The planner error's class ("PlannerRefused", "PlannerError", "PlannerUnavailable", …): why
    # no decision came of the calls (its message went to the host as the Decide status).
    error: Mapped[str] = mapped_column(String(64))
    input_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    cache_read_input_tokens: Mapped[int] = mapped_column(Integer)
    cache_creation_input_tokens: Mapped[int] = mapped_column(Integer)
    thinking_tokens: Mapped[int] = mapped_column(Integer)
    cost_usd: Mapped[float] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    # The host's own id of a record it shipped (direct transport; NULL for the cloud's own):
    # a resend finds it here.
    host_spend_id: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_failed_decision_spend_created_at", "created_at"),
        Index("ix_failed_decision_spend_task_id", "task_id", "attempt"),
        # Each shipped record counts once per host, whatever replica a resend reaches.
        Index("ix_failed_decision_spend_host_spend_id", "host_id", "host_spend_id", unique=True),
    )


class UnsettledCallRow(Base):
    """A model call the cloud started whose cost is not recorded yet (decision 0080): written
    before the call, deleted in the transaction that records what the provider reported of it
    (its decision row, or its failed decision's calls), or as soon as it fails unbilled. A row
    that stays is a call under way, one cancelled or cut off with nothing reported, or one whose
    process died during it: its cost is unknown, at most `at_most_*`.
    Not part of the spending ledger (`cloud/store/spend.py` sums reported figures only)."""

    __tablename__ = "unsettled_calls"

    call_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    host_id: Mapped[str] = mapped_column(String(128))
    task_id: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    # The bound (`planner.unsettled.at_most`): input tokens from the request's size, output
    # tokens from the most it may have asked for, the cost at the model's highest rates.
    at_most_input_tokens: Mapped[int] = mapped_column(Integer)
    at_most_output_tokens: Mapped[int] = mapped_column(Integer)
    at_most_cost_usd: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_unsettled_calls_task_id", "task_id", "attempt"),)


class HostCallRow(Base):
    """A call a direct host shipped as of unknown cost or settled by a failed_calls record,
    by its key (`unsettled.host_call_key`), whichever came first; `settled_at` once settled.
    A marker is settled by deleting it, so a resend of the unsettled call arriving after its
    record (out of order, after a reconnect) looked new and was recorded again beside its
    cost counted. Both writes take this row first, so on PostgreSQL they wait on each other
    rather than each missing the other's uncommitted write. Pruned with the task's markers."""

    __tablename__ = "host_calls"

    call_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(32))
    settled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_host_calls_task_id", "task_id"),)


class StepScreenshotRow(Base):
    """Where one step screenshot lives in the artifact store, and what it is. The image itself
    is never in the database: `object_key` names it in the store (a file or a bucket object)."""

    __tablename__ = "step_screenshots"

    task_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    step_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    # "before" | "after"
    phase: Mapped[str] = mapped_column(String(8), primary_key=True)
    decision_id: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[str] = mapped_column(String(128))
    object_key: Mapped[str] = mapped_column(Text)
    content_type: Mapped[str] = mapped_column(String(32))
    size_bytes: Mapped[int] = mapped_column(Integer)
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    # Bounds of the element the step's action named (ActionMarks.target); NULL when none.
    target_left: Mapped[int | None] = mapped_column(Integer)
    target_top: Mapped[int | None] = mapped_column(Integer)
    target_right: Mapped[int | None] = mapped_column(Integer)
    target_bottom: Mapped[int | None] = mapped_column(Integer)
    uploaded_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


# ListStepScreenshots' order: by attempt and step, "before" first, which is the phases' text
# order reversed; the primary key's index holds them ascending (migration 0028).
Index(
    "ix_step_screenshots_listing",
    StepScreenshotRow.task_id,
    StepScreenshotRow.attempt,
    StepScreenshotRow.step_index,
    StepScreenshotRow.phase.desc(),
)


class SessionItemRow(Base):
    """One item of a session-mode conversation (planner/conversation/items.py), as its exact JSON.

    The cloud keeps these for the cloud planner transport so a new attempt, on any host and any
    replica, continues the same conversation. `seq` is 0-based per (task, attempt); the primary
    key refuses a second writer of the same position, which is how a concurrent continuation
    of one conversation is detected. Screenshots are never part of an item.
    """

    __tablename__ = "planner_session_items"

    task_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_type: Mapped[str] = mapped_column(String(32))
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


class TaskSecretRow(Base):
    """One secret parameter of a task (SubmitTaskRequest.secrets), encrypted (`cloud/secrets.py`).

    Written at submit, read only to build the assignment for the lease holder, deleted when the
    task ends (the sweeper) and with the task. `value` is a Fernet token: never the plain value.
    """

    __tablename__ = "task_secrets"

    task_id: Mapped[str] = mapped_column(
        ForeignKey("tasks.task_id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


class FlowRow(Base):
    """A learned flow (migration 0010): the steps of an attempt that succeeded, replayable
    without the model. `flow_pb` is the `amc.v1.Flow` with its steps (its counts and status
    are the columns here, which change); `fingerprint` makes the same path learned twice one
    flow. `embedding` is the embedding vector of `embedding_text` as a JSON list when an
    embedding provider made one (PostgreSQL with pgvector ranks it in SQL, see
    cloud/flows/retrieval.py)."""

    __tablename__ = "flows"

    flow_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    goal_template: Mapped[str] = mapped_column(Text)
    flow_pb: Mapped[bytes] = mapped_column(LargeBinary)
    embedding_text: Mapped[str] = mapped_column(Text)
    embedding: Mapped[list[float] | None] = mapped_column(JSON)
    embedding_model: Mapped[str | None] = mapped_column(String(128))
    # "active" | "disabled" (an operator) | "retired" (diverged too often in a row)
    status: Mapped[str] = mapped_column(String(16))
    status_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    source_task_id: Mapped[str] = mapped_column(String(32))
    source_attempt: Mapped[int] = mapped_column(Integer)
    uses: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    replays_completed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    divergences: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    consecutive_divergences: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # flow step (as a string key) -> divergences there
    divergences_by_step: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    last_divergence: Mapped[str] = mapped_column(Text, default="", server_default="")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_flows_status_updated_at", "status", "updated_at"),
        # ListFlows' order, unfiltered and by one status (migration 0026).
        Index("ix_flows_created_at_flow_id", "created_at", "flow_id"),
        Index("ix_flows_status_created_at", "status", "created_at", "flow_id"),
    )
