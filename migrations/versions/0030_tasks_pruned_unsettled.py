"""tasks: what the retention pass deleted of a task's calls of unknown cost

The retention pass deletes the markers of calls whose cost was never recorded (decision 0080)
with the decision log of tasks that ended long enough ago. A marker says "cost unknown, at most
X"; deleted, it left no count anywhere: the task's log said what retention deleted of its
decisions and failed decisions' calls, but not that calls of unknown cost had been there. The
task's row now counts them, and the most they could have cost, as it counts the rest.

Additive: four columns with a default of 0 (no call pruned), no index. Code from before it runs
against the new schema (it never names the columns). The downgrade drops them.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("pruned_unsettled_calls", sa.Integer()),
    ("pruned_unsettled_input_tokens", sa.BigInteger()),
    ("pruned_unsettled_output_tokens", sa.BigInteger()),
    ("pruned_unsettled_cost_usd", sa.Float()),
)


def upgrade() -> None:
    for name, kind in _COLUMNS:
        op.add_column("tasks", sa.Column(name, kind, nullable=False, server_default="0"))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite 3.35+), as in 0022 and 0024.
    for name, _ in reversed(_COLUMNS):
        op.drop_column("tasks", name)
