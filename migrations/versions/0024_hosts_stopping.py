"""hosts: a host that said it is stopping (`stopping_since`, `stopping_stream_id`)

A host that stops sends `HostStopping` on its Lease stream (7520ac7): the cloud gives it no new
task and it hands back the ones it runs. Only the replica holding the stream knew: every
replica's fleet view (ListHosts, WatchHosts, the console's fleet page, `amc host list`) showed
a connected host whose phones turned idle for the seconds of its stop. The stop is now written
on the host's row: since when, and on which stream (it ends with that stream).

Additive: two nullable columns, NULL for every existing host (not stopping); no index. Code
from before it runs against the new schema (it never names the columns). The downgrade drops
them.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("stopping_since", sa.DateTime(timezone=True)),
    ("stopping_stream_id", sa.String(length=32)),
)


def upgrade() -> None:
    for name, kind in _COLUMNS:
        op.add_column("hosts", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite 3.35+), as in 0022 and 0023.
    for name, _ in reversed(_COLUMNS):
        op.drop_column("hosts", name)
