"""tasks: an index of the queue by whom each task waits for

A claim looked for the oldest queued task it could take through `ix_tasks_status_created_at`,
walking every queued task in age order and skipping those targeted at other hosts or at
phones this host does not have idle. With 10,000 tasks queued for one host, every other host's
claim (each hello, each result, each dispatch pass) read all of them: 0.2 → 2.9 ms per claim
on SQLite, 1.1 → 4.1 ms on PostgreSQL. `ix_tasks_queue` keys each queued task by whom it waits for
(its target host, '' for any; NULL once it is not queued) and which phone ('' for any), then
age, so a claim reads the head of each queue it may take from (any phone, this host, this
host's idle phones, an idle phone's serial on any host) and nothing else
(`cloud.store.leases.claim`). Equalities on '' keep each queue in age order (PostgreSQL sorted
what it found by `IS NULL`), and with the status inside the first key no plan can prefer
`ix_tasks_status_created_at` and walk every queued task (PostgreSQL did, for a host with two
idle phones, on tables not yet analysed).

Not a partial index of queued tasks: on SQLite a partial index whose condition names `status`
makes every statement that binds `tasks.status` be prepared again each time it runs.

Additive: one new index, no column changes; code of either side of it runs against either
schema. Its columns never change on a renewal that keeps its task's status, so PostgreSQL's
in-place (HOT) updates of renewed tasks (migration 0014) stay in place. The downgrade drops it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_tasks_queue",
        "tasks",
        [
            sa.text("(CASE WHEN status = 'QUEUED' THEN coalesce(target_host_id, '') END)"),
            sa.text("coalesce(target_device_serial, '')"),
            "created_at",
            "task_id",
        ],
    )


def downgrade() -> None:
    op.drop_index("ix_tasks_queue", table_name="tasks")
