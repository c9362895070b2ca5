"""host process ids and certificate revocations

Additive: `hosts.process_id` (which run of the host agent sent the last hello, so a new process
can release its dead predecessor's leases at once) and a new table `certificate_revocations`
(revoked certificate serials and revoked host ids, refused by every replica). The downgrade
drops both, and with them every revocation: run it only when going back to a release that
cannot enforce them anyway.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("hosts", sa.Column("process_id", sa.String(length=128), nullable=True))
    op.create_table(
        "certificate_revocations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("serial", sa.String(length=64), nullable=True),
        sa.Column("host_id", sa.String(length=128), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "(serial IS NULL) <> (host_id IS NULL)",
            name=op.f("ck_certificate_revocations_one_target"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_certificate_revocations")),
        sa.UniqueConstraint("serial", name=op.f("uq_certificate_revocations_serial")),
        sa.UniqueConstraint("host_id", name=op.f("uq_certificate_revocations_host_id")),
    )


def downgrade() -> None:
    op.drop_table("certificate_revocations")
    # SQLite cannot drop a column in place on every version: batch mode copies the table there
    # (and is a plain ALTER TABLE on PostgreSQL).
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("process_id")
