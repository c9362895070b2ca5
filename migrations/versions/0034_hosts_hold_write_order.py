"""hosts: the order of the latest hold write (`hold_write_stream_id`, `hold_write_number`)

The replica holding a host's stream writes the host's hold (new work held back) and its end
on the host's row, each retried in the background while another transaction holds the row.
An older such write still on its way (waiting for a pooled connection, or for the row) could
land after a newer one: an end of a hold erased a newer hold, and the fleet view showed no
hold while new work was held back. Each write now carries its number (the replica's, counted
per stream) and lands only if no newer write of the same stream landed before it, compared in
the UPDATE itself.

Additive: two nullable columns, NULL for every existing host (no write numbered yet: the next
one lands); no index. Code from before it runs against the new schema (it never names the
columns). The downgrade drops them.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("hold_write_stream_id", sa.String(length=32)),
    ("hold_write_number", sa.BigInteger()),
)


def upgrade() -> None:
    for name, kind in _COLUMNS:
        op.add_column("hosts", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite 3.35+), as in 0024.
    for name, _ in reversed(_COLUMNS):
        op.drop_column("hosts", name)
