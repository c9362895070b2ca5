"""Typed tables of the cloud store. Migrations in `migrations/` must match these exactly."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
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


class Base(DeclarativeBase):
    """Declarative base with a naming convention so migrations name constraints stably."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class TaskRow(Base):
    """A unit of work. `attempt` is the current or last attempt number (0 before the first)."""

    __tablename__ = "tasks"

    task_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    goal: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    target_host_id: Mapped[str | None] = mapped_column(String(128))
    target_device_serial: Mapped[str | None] = mapped_column(String(128))
    host_id: Mapped[str | None] = mapped_column(String(128))
    device_serial: Mapped[str | None] = mapped_column(String(128))
    lease_seconds: Mapped[float] = mapped_column(Float)
    deadline: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    client_request_id: Mapped[str | None] = mapped_column(String(128), unique=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    cancel_reason: Mapped[str | None] = mapped_column(Text)
    result_summary: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    # Spending caps (SubmitTaskRequest.budget, or the cloud's defaults); 0 = no cap.
    max_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    max_cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")

    __table_args__ = (
        Index("ix_tasks_status_created_at", "status", "created_at"),
        Index("ix_tasks_created_at_task_id", "created_at", "task_id"),
        Index("ix_tasks_host_id", "host_id"),
        Index("ix_tasks_finished_at", "finished_at"),
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

    __table_args__ = (
        UniqueConstraint("task_id", "attempt"),
        # One live attempt per phone: the database refuses a second one, whatever replica tries.
        Index(
            "uq_attempts_live_device",
            "host_id",
            "device_serial",
            unique=True,
            sqlite_where=text("ended_at IS NULL"),
            postgresql_where=text("ended_at IS NULL"),
        ),
        Index("ix_attempts_live_expiry", "ended_at", "lease_expires_at"),
    )


class HostRow(Base):
    """A host that connected at least once, with its phones from the last hello or update."""

    __tablename__ = "hosts"

    host_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    devices: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    agent_version: Mapped[str] = mapped_column(String(128), default="")
    planner_transport: Mapped[int] = mapped_column(Integer, default=0)
    connected: Mapped[bool] = mapped_column(Boolean, default=False)
    # Which replica holds the stream, which stream it is, and when that replica last vouched for it
    # (a crashed replica stops vouching, so its hosts stop counting as connected).
    replica_id: Mapped[str | None] = mapped_column(String(64))
    stream_id: Mapped[str | None] = mapped_column(String(32))
    stream_alive_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    last_seen_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())


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
    # What the decision's model calls cost in US dollars (planner/prices.py); 0 for rows from
    # before migration 0007 and for models without a price.
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")

    __table_args__ = (
        UniqueConstraint("task_id", "attempt", "step_index"),
        Index("ix_decisions_created_at", "created_at"),
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
