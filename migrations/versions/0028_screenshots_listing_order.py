"""step_screenshots: an index in ListStepScreenshots' order (attempt, step, phase DESC)

ListStepScreenshots lists a task's screenshots by attempt, step, then phase with "before"
first, which is the phases' text order reversed. The only index of the table, its primary
key, holds the phases ascending, so no index served the order: PostgreSQL sorted each step's
phases over the key's walk (an Incremental Sort; a full Sort of the task's screenshots where
the planner would not take one), SQLite the same ("USE TEMP B-TREE FOR RIGHT PART OF ORDER
BY"). This index holds them in the listing's order, and each page is a range of it.

Additive: one index; code from before it runs unchanged against the new schema. The
downgrade drops it. On PostgreSQL it is built and dropped CONCURRENTLY (migrations/README.md):
hosts upload screenshots while a fleet upgrades.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations import online

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_step_screenshots_listing"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # uploads go on meanwhile
        online.create_index(INDEX, "step_screenshots (task_id, attempt, step_index, phase DESC)")
    else:
        op.create_index(
            INDEX,
            "step_screenshots",
            ["task_id", "attempt", "step_index", sa.text("phase DESC")],
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        online.drop_index(INDEX)
    else:
        op.drop_index(INDEX, table_name="step_screenshots")
