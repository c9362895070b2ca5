"""decisions: the part of the cache writes that went to the 1-hour cache
(`amc.v1.Usage.cache_creation_1h_input_tokens`)

A 1-hour cache write costs 2x input, a 5-minute one 1.25x: a decision's cost was priced from
the split Anthropic reports, but only the total writes were kept, so the log could not show why
a step cost what it did. `cache_creation_1h_input_tokens` keeps the 1-hour part.

Additive: one column with a server default of 0 (a decision logged before it wrote nothing it
knows of to the 1-hour cache), which code from before it never names. The downgrade drops it.

Revision ID: 0039
Revises: 0037
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0039"
down_revision: str | None = "0037"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "decisions",
        sa.Column(
            "cache_creation_1h_input_tokens", sa.Integer(), server_default="0", nullable=False
        ),
    )


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), as in 0018, 0035 and 0037: a batch copy would lose
    # 0015's expression index on SQLite.
    op.drop_column("decisions", "cache_creation_1h_input_tokens")
