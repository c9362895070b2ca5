"""Alembic environment: runs on a connection handed in by cloud code, or on the configured URL."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection

from cloud.store.models import Base

config = context.config
target_metadata = Base.metadata

#: Expression indexes `alembic check` cannot compare: each backend reflects the expression in
#: its own words (PostgreSQL adds casts and ELSE NULL), so it would always see a difference.
#: Their own migrations' tests read them from the catalogue instead. ix_hosts_host_id_c
#: (PostgreSQL only, migration 0027) has no declaration in the models at all.
_NOT_COMPARED = frozenset({"ix_tasks_queue", "ix_hosts_host_id_c"})


def _compared(obj: object, name: str | None, type_: str, reflected: bool, other: object) -> bool:
    """`include_object`: everything but `_NOT_COMPARED`."""
    return not (type_ == "index" and name in _NOT_COMPARED)


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_object=_compared,
        # A connection in no transaction (PostgreSQL, see cloud/store/engine.py) gets one per
        # file, so one that builds an index CONCURRENTLY commits only itself before it
        # (migrations/README.md); one in a transaction keeps that transaction (SQLite).
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_online_from_url() -> None:
    from cloud.store.engine import create_engine

    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url or pass a connection in config.attributes")
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:  # Alembic begins and commits (per file)
            await conn.run_sync(_configure_and_run)
            await conn.commit()
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
    else:
        asyncio.run(_run_online_from_url())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
