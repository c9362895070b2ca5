"""verdicts and learned flows

Additive. `decisions` gains the checker's verdict on the decision's expected outcome (and its
evidence, and whether the cloud ran the check because the host sent none), the model's
judgement of it (given with the next decision) and this decision's judgement of the step before
it, the semantic target of the element it names (a serialized `amc.v1.ElementTarget`), and for a
replayed step its flow and position (on the decision that took over from a replay: the flow
step that diverged and why). `tasks` gains `no_replay`. `attempts` gains what retrieval decided
(flow, score, scorer, reason, the candidate flows in order) and how the replay went, and
`flow_state` (NULL until the cloud's learning loop has looked at the ended attempt). A new
`flows` table holds the learned flows with their embedding text, optional embedding vector
(JSON), status and counts. Rows written before read as "not checked, no flow"; attempts that
had already ended are marked as seen by the learning loop (they kept no targets to learn
from). The downgrade drops the table and the columns.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _decision_columns() -> tuple[sa.Column[object], ...]:
    return (
        sa.Column("verdict", sa.String(length=16), nullable=True),
        sa.Column("verdict_evidence", sa.Text(), nullable=True),
        sa.Column("verdict_by_cloud", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("model_verdict", sa.String(length=16), nullable=True),
        sa.Column("model_note", sa.Text(), nullable=True),
        sa.Column("previous_verdict", sa.String(length=16), nullable=True),
        sa.Column("previous_note", sa.Text(), nullable=True),
        sa.Column("target_pb", sa.LargeBinary(), nullable=True),
        sa.Column("flow_id", sa.String(length=32), nullable=True),
        sa.Column("flow_step", sa.Integer(), nullable=True),
        sa.Column("replay_divergence", sa.Text(), nullable=True),
    )


def _attempt_columns() -> tuple[sa.Column[object], ...]:
    return (
        sa.Column("flow_id", sa.String(length=32), nullable=True),
        sa.Column("flow_score", sa.Float(), nullable=True),
        sa.Column("flow_scorer", sa.String(length=32), nullable=True),
        sa.Column("flow_reason", sa.Text(), nullable=True),
        sa.Column("flow_candidates", sa.JSON(), nullable=True),
        sa.Column("replay_steps", sa.Integer(), nullable=True),
        sa.Column("replay_diverged_step", sa.Integer(), nullable=True),
        sa.Column("replay_divergence", sa.Text(), nullable=True),
        sa.Column("flow_state", sa.String(length=16), nullable=True),
    )


def upgrade() -> None:
    for column in _decision_columns():
        op.add_column("decisions", column)
    for column in _attempt_columns():
        op.add_column("attempts", column)
    op.add_column(
        "tasks", sa.Column("no_replay", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.create_index("ix_attempts_flow_state", "attempts", ["flow_state", "ended_at"])
    # Attempts that ended before this migration cannot teach a flow (their decisions kept no
    # semantic targets): the learning loop need not read them all once.
    op.execute(sa.text("UPDATE attempts SET flow_state = 'before-0007' WHERE ended_at IS NOT NULL"))
    op.create_table(
        "flows",
        sa.Column("flow_id", sa.String(length=32), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("goal_template", sa.Text(), nullable=False),
        sa.Column("flow_pb", sa.LargeBinary(), nullable=False),
        sa.Column("embedding_text", sa.Text(), nullable=False),
        sa.Column("embedding", sa.JSON(), nullable=True),
        sa.Column("embedding_model", sa.String(length=128), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.Text(), server_default="", nullable=False),
        sa.Column("source_task_id", sa.String(length=32), nullable=False),
        sa.Column("source_attempt", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), server_default="0", nullable=False),
        sa.Column("replays_completed", sa.Integer(), server_default="0", nullable=False),
        sa.Column("divergences", sa.Integer(), server_default="0", nullable=False),
        sa.Column("consecutive_divergences", sa.Integer(), server_default="0", nullable=False),
        sa.Column("divergences_by_step", sa.JSON(), nullable=False),
        sa.Column("last_divergence", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("flow_id", name=op.f("pk_flows")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_flows_fingerprint")),
    )
    op.create_index("ix_flows_status_updated_at", "flows", ["status", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_flows_status_updated_at", table_name="flows")
    op.drop_table("flows")
    op.drop_index("ix_attempts_flow_state", table_name="attempts")
    # SQLite cannot drop a column in place on every version: batch mode copies the table there
    # (and is a plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("no_replay")
    with op.batch_alter_table("attempts") as batch:
        for column in reversed(_attempt_columns()):
            batch.drop_column(column.name)
    with op.batch_alter_table("decisions") as batch:
        for column in reversed(_decision_columns()):
            batch.drop_column(column.name)
