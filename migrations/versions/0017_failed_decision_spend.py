"""failed_decision_spend: what the answered model calls of a decision that failed cost

A decision that fails after the provider answered (a refusal, no usable tool call after the
retry and the corrective turn, an answer cut off, a provider error after billed turns) logs no
decision row, and the spending ledger summed decision rows only: the task's totals, its budget,
the fleet's daily cap, GetSpend and the metrics left out exactly the calls of a misbehaving
model. Such calls get a row here (the cloud's own from Decide, a direct-transport host's from
ShipDecisions' `failed_calls`), summed by every ledger query beside the decisions', and are
added to the task's totals (no new task column: `decision_count` stays a count of decisions).

Additive: one new table with its three indexes (the day's sums read it by `created_at`, a
task's by `task_id`; a shipped record counts once per (host, host_spend_id)); code from before
it never names it. The downgrade drops the table and with it the record of those calls (the
task totals they were added to stay).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "failed_decision_spend",
        sa.Column("spend_id", sa.String(length=32), nullable=False),
        sa.Column("host_id", sa.String(length=128), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("error", sa.String(length=64), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_read_input_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_creation_input_tokens", sa.Integer(), nullable=False),
        sa.Column("thinking_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("host_spend_id", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("spend_id", name=op.f("pk_failed_decision_spend")),
    )
    op.create_index("ix_failed_decision_spend_created_at", "failed_decision_spend", ["created_at"])
    op.create_index(
        "ix_failed_decision_spend_task_id", "failed_decision_spend", ["task_id", "attempt"]
    )
    op.create_index(
        "ix_failed_decision_spend_host_spend_id",
        "failed_decision_spend",
        ["host_id", "host_spend_id"],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("ix_failed_decision_spend_host_spend_id", table_name="failed_decision_spend")
    op.drop_index("ix_failed_decision_spend_task_id", table_name="failed_decision_spend")
    op.drop_index("ix_failed_decision_spend_created_at", table_name="failed_decision_spend")
    op.drop_table("failed_decision_spend")
