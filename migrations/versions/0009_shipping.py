"""shipping: decisions from the direct transport, step screenshots' keys, hosts' outbox backlog

Additive. `decisions` gains the transport that made each row ("cloud" for every row before:
only the cloud logged decisions then) and the host's own id of a shipped decision (NULL for the
cloud's), unique per host so a resend is found, never logged twice. `step_screenshots` holds
where each step screenshot lives in the artifact store (the image never enters the database).
`hosts` gains the outbox backlog each host last reported. The downgrade drops all of it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HOST_COLUMNS = (
    "outbox_items",
    "outbox_decisions",
    "outbox_refused",
    "outbox_oldest_at",
    "outbox_reported_at",
)


def upgrade() -> None:
    op.add_column(
        "decisions",
        sa.Column(
            "planner_transport", sa.String(length=16), server_default="cloud", nullable=False
        ),
    )
    op.add_column("decisions", sa.Column("host_decision_id", sa.String(length=64), nullable=True))
    op.create_index(
        "ix_decisions_host_decision_id",
        "decisions",
        ["host_id", "host_decision_id"],
        unique=True,
    )
    op.create_table(
        "step_screenshots",
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=8), nullable=False),
        sa.Column("decision_id", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.String(length=128), nullable=False),
        sa.Column("object_key", sa.Text(), nullable=False),
        sa.Column("content_type", sa.String(length=32), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("target_left", sa.Integer(), nullable=True),
        sa.Column("target_top", sa.Integer(), nullable=True),
        sa.Column("target_right", sa.Integer(), nullable=True),
        sa.Column("target_bottom", sa.Integer(), nullable=True),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "task_id", "attempt", "step_index", "phase", name=op.f("pk_step_screenshots")
        ),
    )
    for name in HOST_COLUMNS[:3]:
        op.add_column("hosts", sa.Column(name, sa.Integer(), server_default="0", nullable=False))
    for name in HOST_COLUMNS[3:]:
        op.add_column("hosts", sa.Column(name, sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # SQLite cannot drop a column in place on every version: batch mode copies the table there
    # (and is a plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("hosts") as batch:
        for name in reversed(HOST_COLUMNS):
            batch.drop_column(name)
    op.drop_table("step_screenshots")
    op.drop_index("ix_decisions_host_decision_id", table_name="decisions")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("host_decision_id")
        batch.drop_column("planner_transport")
