"""The autouse teardown of tests/conftest.py frees a disposed engine's dialect, which
SQLAlchemy's mapper statement cache kept alive (tests/support/sqlalchemy_caches.py)."""

from __future__ import annotations

import datetime as dt
import gc
import weakref
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from cloud.store.models import Base, LeaseEventRow
from tests.support import sqlalchemy_caches


async def _dialect_of_a_disposed_engine(path: Path) -> weakref.ref[object]:
    """A real SQLite engine that flushed one ORM row (the mapper compiles and caches the
    INSERT for this engine's dialect), disposed as a test's cloud disposes its store."""
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        async with AsyncSession(engine) as session, session.begin():
            session.add(
                LeaseEventRow(task_id="t", attempt=0, kind="assigned", at=dt.datetime.now(dt.UTC))
            )
        return weakref.ref(engine.dialect)
    finally:
        await engine.dispose()


async def test_a_disposed_engines_dialect_is_freed_once_the_caches_forget_it(
    tmp_path: Path,
) -> None:
    dialect = await _dialect_of_a_disposed_engine(tmp_path / "cache.db")
    gc.collect()
    assert dialect() is not None, (
        "SQLAlchemy no longer keeps a disposed engine's dialect in its mapper cache: "
        "tests/support/sqlalchemy_caches.py may be unneeded"
    )
    sqlalchemy_caches.forget_dialects()
    gc.collect()
    assert dialect() is None, [type(r).__qualname__ for r in gc.get_referrers(dialect())]
