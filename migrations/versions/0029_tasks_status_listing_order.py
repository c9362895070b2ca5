"""tasks: an index in ListTasks' order by status (status, created_at, task_id)

ListTasks pages newest first on (created_at, task_id). Filtered by several statuses it was
one walk of `ix_tasks_created_at_task_id` testing each task's status (every task of the walk
read when the statuses asked for are rare) or, PostgreSQL's other choice, every task of those
statuses read and sorted to give fifty. It now reads a page of each status and merges them
(`cloud.store.paging.newest_page`, as ListFlows does); each is a range of this index in its
order. `ix_tasks_status_created_at` stops at the time, so each status's page was sorted again
on the task id (PostgreSQL: an Incremental Sort; SQLite: "USE TEMP B-TREE FOR RIGHT PART OF
ORDER BY").

Additive: one index; code from before it runs unchanged against the new schema. The
downgrade drops it. `ix_tasks_status_created_at` stays (a prefix of this one: a later
release may drop it). On PostgreSQL it is built and dropped CONCURRENTLY
(migrations/README.md): a running fleet writes tasks all the time.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from migrations import online

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_tasks_status_created_at_task_id"
COLUMNS = ["status", "created_at", "task_id"]


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # writes to tasks go on meanwhile
        online.create_index(INDEX, f"tasks ({', '.join(COLUMNS)})")
    else:
        op.create_index(INDEX, "tasks", COLUMNS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        online.drop_index(INDEX)
    else:
        op.drop_index(INDEX, table_name="tasks")
