"""hosts: the leases the host's last hello named (`held_leases`)

When a host's new process connects to one replica while its previous process's stream is still
open on another (a half-open connection), the other replica finds its stream superseded and
releases the leases granted on it. It did not know which of them the new process named in its
hello (a result it kept), released those too, and the result was refused: the task ran again.
The hello now records its held leases on the host's row, in the transaction that makes the
newer stream current, and that replica spares them.

Additive: one nullable JSON column, NULL for every existing host (no hello since: nothing to
spare, as before), no index. Code from before it runs against the new schema (it never names
the column). The downgrade drops it.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("hosts", sa.Column("held_leases", sa.JSON(), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), as in 0016, 0018 and 0019.
    op.drop_column("hosts", "held_leases")
