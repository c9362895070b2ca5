"""hosts: new work held back from a host that may be frozen (`held_*`)

A lease that runs out on a stream that is still open holds new work back from that host until
it is heard from, or until its stream has outlived the keepalive window (b4b5d5b). The hold
lived only in the memory of the replica holding the stream, so the operators' fleet view (on
any replica) showed a connected host with idle phones and said nothing of why it got no work.
The hold is now written on the host's row: since when, until when, for which task and attempt
and on which stream.

Additive: five nullable columns, NULL for every existing host (not held, as after any start
before it); no index. Code from before it runs against the new schema (it never names the
columns). The downgrade drops them.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("held_since", sa.DateTime(timezone=True)),
    ("held_until", sa.DateTime(timezone=True)),
    ("held_task_id", sa.String(length=32)),
    ("held_attempt", sa.Integer()),
    ("held_stream_id", sa.String(length=32)),
)


def upgrade() -> None:
    for name, kind in _COLUMNS:
        op.add_column("hosts", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite 3.35+), as in 0016, 0018 to 0020 and 0022.
    for name, _ in reversed(_COLUMNS):
        op.drop_column("hosts", name)
