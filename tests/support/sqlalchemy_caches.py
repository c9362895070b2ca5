"""SQLAlchemy's process-wide caches that keep every test's engine dialect alive, and their
clearing between tests.

The ORM's mappers compile their flush statements into an LRU cache per mapper (100 entries),
keyed by (dialect, statement); PostgreSQL's dialect class memoises its reflection queries in
`functools.lru_cache`s keyed by the dialect instance. A replica has one engine for its life,
so in production both hold one dialect. A test process builds a new engine per test: each
entry pins a disposed engine's dialect and, through it, its compiled statements and type
processors (2,000-2,500 objects per cloud test), so a worker's heap grew by ~170,000 objects
over tests/cloud/test_lease_flow.py alone and every full collection walked them. Clearing the
caches only costs a recompile the next test's new dialect needed anyway.
"""

from __future__ import annotations

import functools

from sqlalchemy.dialects.postgresql.base import PGDialect

from cloud.store.models import Base


def forget_dialects() -> None:
    """Empty the caches above, so the dialects of disposed engines can be freed. Safe while a
    session-wide replica runs in another thread: both caches tolerate concurrent removal,
    and an emptied entry is compiled again."""
    for mapper in Base.registry.mappers:
        mapper._compiled_cache.clear()
    for member in vars(PGDialect).values():
        if isinstance(member, functools._lru_cache_wrapper):
            member.cache_clear()
