"""Async engine creation and migrations for SQLite (embedded) and PostgreSQL (deployments)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, StaticPool, event, text
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import migrations
from cloud.store.pool import DEFAULT_POOL_SIZE, pool_split
from cloud.store.schema_head import at_head
from cloud.store.sqlite_file import sqlite_file, sqlite_in_memory, sqlite_opens_existing_only

if TYPE_CHECKING:
    # Alembic is imported where it runs, not here: a start on a database already at head never
    # needs it (`cloud.store.schema_head`), and importing it costs every cloud process ~130 ms.
    from alembic.config import Config

SQLITE_BUSY_TIMEOUT_MS = 10_000
#: How long a statement on the event loop's own thread may wait for SQLite
#: (`sqlite_loop_connection`): the loop stands still meanwhile, so briefly, and the caller goes
#: the usual way instead. In-process writers are serialised before SQLite sees them, so only
#: another process's write makes a write wait; a WAL reader rarely waits at all.
SQLITE_LOOP_TIMEOUT_MS = 20
#: PostgreSQL advisory lock held (for the migrating connection's session) while a replica
#: migrates, so replicas started at once on a fresh database migrate one after the other, not
#: into each other.
MIGRATION_LOCK_KEY = 0x616D63  # "amc"
#: How long a replica waits between tries of that lock (`_run`).
MIGRATION_LOCK_POLL_S = 0.2
#: How often a replica waiting for that lock says so in its log.
MIGRATION_WAIT_LOG_S = 30.0

log = logging.getLogger(__name__)
#: Alembic's own loggers say each migration it runs (twenty-five lines on a fresh database, the
#: first thing `amc up` showed) and each plugin it sets up as it loads; below DEBUG the upgrade
#: says it in one line of ours instead.
_ALEMBIC_STEPS = logging.getLogger("alembic.runtime")


def normalize_url(url: str) -> str:
    """Accept plain `sqlite:///`/`postgresql://` URLs and pick the async drivers we ship."""
    parsed = make_url(url)
    if parsed.drivername in ("sqlite", "sqlite+pysqlite"):
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


#: A WAL that grew in a burst is cut back to this size when it starts over (bytes).
SQLITE_WAL_SIZE_LIMIT = 64 * 1024 * 1024


class RollbackOnClose(sqlite3.Connection):
    """A SQLite connection that rolls back its transaction when it is closed.

    A write whose task is cancelled in the middle of a statement (a host's stream killed while
    its result, screenshot or decisions were being stored) makes SQLAlchemy invalidate the
    connection: it is closed without a rollback, on the assumption that closing ends the
    transaction. SQLite ends it only once every statement of the connection is finalized;
    while a cursor still lives (held by the cancelled call's frames until the garbage
    collector frees them) the closed connection stays a "zombie" that keeps its transaction
    and the database's write lock, and every other write of the replica failed with "database
    is locked" until the process ended (a `.ci/run` saw it; `tests/cloud/test_store_cancel.py`).
    Rolled back first, it holds nothing however long the cursor lives."""

    def close(self) -> None:
        if self.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.rollback()
        super().close()


def _create_owner_only(path: Path) -> None:
    """Create a SQLite database file that does not exist yet readable by its owner only.

    It holds the decision log: the prompts, the model's thinking, the goals. SQLite created it
    with the process's umask (0644 as a rule), readable by every local account; its WAL and
    shared-memory files take the database file's mode. An empty file is an empty database.
    A file that exists keeps its mode: an operator may have chosen it. A folder it cannot be
    made in (read-only, no permission) is left to SQLite's own open, whose failure the start
    names ("cannot open the database …")."""
    with contextlib.suppress(OSError):  # FileExistsError among them
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    _sqlite_checkpoint_policy(cursor)
    cursor.close()


def _sqlite_checkpoint_policy(cursor: Any) -> None:
    """No connection checkpoints on its commits: `Store.checkpoint` does, on a timer.

    SQLite's automatic checkpoint runs inside the commit of whichever connection crosses 1,000
    WAL pages. The loop's connection, which makes nearly every write, had it off (a checkpoint
    syncs the file), so the other connections did it on their rarer commits, inside the store's
    write lock: under renewals alone nobody did, and the WAL grew by ~8 MB a second at 2,000
    hosts (446 MB in the lease benchmark's two minutes); the next such commit then copied all
    of it with the lock held. The WAL is also cut back to `SQLITE_WAL_SIZE_LIMIT` when it
    starts over, so a burst does not keep its disk.
    """
    cursor.execute("PRAGMA wal_autocheckpoint=0")
    cursor.execute(f"PRAGMA journal_size_limit={SQLITE_WAL_SIZE_LIMIT}")


#: Why an in-memory SQLite database is refused (`sqlite_file.sqlite_in_memory`).
IN_MEMORY_REFUSAL = (
    "an in-memory SQLite database cannot hold a cloud: each of its connections would see a "
    "database of its own, and the fleet's tasks and leases would vanish at its stop"
)


def create_engine(url: str, pool_size: int = DEFAULT_POOL_SIZE) -> AsyncEngine:
    """Async engine with SQLite set to WAL + busy timeout, or a pooled psycopg 3 engine that
    opens `pool_size` connections at most (`cloud.store.pool`; SQLite's pool is its own: one
    replica, no server to share).

    Both hide statement parameters from error messages: they hold goals and summaries, and an
    error's text ends up in logs."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        parsed = make_url(url)
        if sqlite_in_memory(parsed):
            raise ValueError(IN_MEMORY_REFUSAL)
        database = sqlite_file(parsed)
        if database is not None and sqlite_opens_existing_only(parsed):
            if not database.exists():
                raise FileNotFoundError(f"the SQLite database file {database} does not exist")
        elif database is not None:
            database.parent.mkdir(parents=True, exist_ok=True)
            _create_owner_only(database)
        engine = create_async_engine(
            url,
            pool_size=8,
            max_overflow=8,
            hide_parameters=True,
            connect_args={"factory": RollbackOnClose},
        )
        event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
        return engine
    kept, overflow = pool_split(pool_size)
    return create_async_engine(
        url, pool_size=kept, max_overflow=overflow, pool_pre_ping=True, hide_parameters=True
    )


def _sqlite_loop_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_LOOP_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    _sqlite_checkpoint_policy(cursor)
    cursor.close()


def sqlite_loop_connection(engine: AsyncEngine) -> Engine | None:
    """One synchronous connection to `engine`'s SQLite file for the event loop's own thread:
    the renewal batch's read and its short write transactions; None for PostgreSQL or an
    in-memory database.

    aiosqlite runs every statement in a worker thread: the statement, its cursor and the result
    each cross threads, and with the loop busy the worker waits for the GIL at each crossing
    (up to the 5 ms switch interval). A batch of renewals took 45 ms (p50) that way for about a
    millisecond of SQLite's work, and the renewals waiting on it made the acknowledgement tail
    (bench/lease_capacity.py). With synchronous=NORMAL a WAL commit does not sync, and this
    connection never checkpoints (`Store.checkpoint` does, off the loop's thread), so its
    transactions do not wait on the disk.
    `Store.write_on_loop` takes the store's write lock first (no in-process writer holds
    SQLite's), so only another process can make it wait, for at most `SQLITE_LOOP_TIMEOUT_MS`,
    after which the work runs through the async engine; a read that waits that long (a WAL
    reader waits only in rare cases) is made through the async engine too.

    Reads and writes share the connection because SQLite keeps a connection's page cache
    across its own commits but drops it when another connection wrote: a separate reader
    re-read every page of the batch's rows (through the WAL) after each write batch, 12-23 us
    per row against 7-9 us here. Everything on it runs to completion inside one callback of
    the loop (no await within a transaction), so a read never sees a write half done.
    """
    return _sqlite_loop_engine(engine, _sqlite_loop_on_connect)


def _sqlite_loop_engine(
    engine: AsyncEngine, on_connect: Callable[[Any, Any], None]
) -> Engine | None:
    """One pysqlite connection to `engine`'s SQLite file, set up by `on_connect`, usable from the
    loop's thread; None for PostgreSQL or an in-memory database (a second connection would see
    another, empty, database)."""
    url = engine.url
    if engine.dialect.name != "sqlite" or not url.database or url.database == ":memory:":
        return None
    sync = create_sync_engine(
        url.set(drivername="sqlite+pysqlite"),
        poolclass=StaticPool,
        connect_args={"check_same_thread": False},
        hide_parameters=True,
    )
    event.listen(sync, "connect", on_connect)
    return sync


class SchemaMismatch(RuntimeError):
    """The database's schema is behind the one this code's migrations end at, and this start
    may not bring it there (migrations at start turned off: the replica served, and its calls
    failed on missing columns and tables). A database *ahead* of it (a newer release migrated
    it) is served with a warning instead: migrations are additive."""

    def __init__(self, current: str | None, head: str) -> None:
        self.current = current
        self.head = head
        at = f"migration {current}" if current else "no migration (empty)"
        super().__init__(f"the database is at {at}, older than this amc's newest, {head}")


def _schema(connection: Connection, cfg: Config) -> tuple[str | None, str, bool]:
    """The database's revision, this code's head, and whether this code knows the revision."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(cfg)
    head = script.get_current_head()
    assert head is not None, "the migrations have one head"
    current = MigrationContext.configure(connection).get_current_revision()
    known = current is None or any(r.revision == current for r in script.walk_revisions())
    return current, head, known


def alembic_config(url: str | None = None) -> Config:
    """Alembic configured in code: the scripts are the `migrations` package; no alembic.ini."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if url is not None:
        # ConfigParser interpolation: a literal % must be doubled.
        cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def _run_with_connection(connection: Connection, action: str, revision: str) -> None:
    """Run `action` on `connection`. On PostgreSQL the connection is in no transaction and
    Alembic begins and commits one per migration file: a migration that builds an index
    CONCURRENTLY (migrations/README.md) commits the transaction before it
    (`autocommit_block`), which Alembic refuses inside a transaction begun outside it."""
    if action in ("upgrade", "verify") and at_head(connection):
        return  # nothing to upgrade, nothing to refuse: the usual start, without Alembic
    with _quiet_steps():  # Alembic's plugins say they were set up (INFO) as it loads
        from alembic import command
        from alembic.runtime.migration import MigrationContext

    own = connection.dialect.name == "postgresql"
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    if action in ("upgrade", "verify"):
        with _quiet_steps():
            before, head, known = _schema(connection, cfg)
        if not known:
            # Migrations are additive (migrations/README.md): this code runs on the schema a
            # newer release left, as an older replica must during a rolling deploy or after a
            # rollback. Refused, a restarted older replica stayed down until the database was
            # downgraded. Nothing to upgrade: this code has no script to get there from.
            log.warning(
                "the database is at migration %s, newer than this amc's newest, %s: a newer"
                " release migrated it; serving on it (migrations are additive), but run that"
                " release here soon",
                before,
                head,
            )
            return
        if action == "verify" and before != head:
            raise SchemaMismatch(before, head)
    if action == "upgrade":
        with _quiet_steps():
            if own:
                connection.commit()  # Alembic must find no transaction begun
            command.upgrade(cfg, revision)
            after = MigrationContext.configure(connection).get_current_revision()
        if after != before:
            log.info("database schema upgraded from %s to %s", before or "empty", after)
    elif action == "verify":
        pass
    elif action == "downgrade":
        command.downgrade(cfg, revision)
    elif action == "check":
        with warnings.catch_warnings():
            # SQLite's reflection skips expression indexes (ix_tasks_queue), which the check
            # leaves out on every backend anyway (migrations/env.py).
            warnings.filterwarnings("ignore", "Skipped unsupported reflection of expression")
            warnings.filterwarnings("ignore", "autogenerate skipping metadata-specified expr")
            command.check(cfg)
    else:  # pragma: no cover - programming error
        raise ValueError(action)
    if own:
        connection.commit()


@contextlib.contextmanager
def _quiet_steps() -> Iterator[None]:
    """Alembic's per-migration lines only when our own logging asks for DEBUG."""
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    level = _ALEMBIC_STEPS.level
    _ALEMBIC_STEPS.setLevel(logging.WARNING)
    try:
        yield
    finally:
        _ALEMBIC_STEPS.setLevel(level)


async def _run(engine: AsyncEngine, action: str, revision: str) -> None:
    if engine.dialect.name != "postgresql":
        async with engine.begin() as conn:
            await conn.run_sync(_run_with_connection, action, revision)
        return
    key = {"key": MIGRATION_LOCK_KEY}
    async with engine.connect() as conn:  # Alembic's own transactions, one per file
        # Held for the session, between no transactions; tried, not waited for: a replica
        # blocked in pg_advisory_lock holds a snapshot, and CREATE INDEX CONCURRENTLY in the
        # migrating one waits for every older snapshot of the database to end.
        waited = 0.0
        while not (await conn.execute(text("SELECT pg_try_advisory_lock(:key)"), key)).scalar():
            await conn.commit()
            if waited % MIGRATION_WAIT_LOG_S < MIGRATION_LOCK_POLL_S:
                # Said, not silent: a migration that hangs in another replica (an index build
                # waiting for a long transaction) holds this one's start as long.
                log.warning(
                    "waiting %.0f s for another replica's migration of this database"
                    " (PostgreSQL advisory lock %d); it serves once that ends",
                    waited,
                    MIGRATION_LOCK_KEY,
                )
            await asyncio.sleep(MIGRATION_LOCK_POLL_S)
            waited += MIGRATION_LOCK_POLL_S
        await conn.commit()
        try:
            await conn.run_sync(_run_with_connection, action, revision)
        finally:
            await conn.rollback()  # what a failed migration left begun
            await conn.execute(text("SELECT pg_advisory_unlock(:key)"), key)
            await conn.commit()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """`alembic upgrade` on the engine's database (runs at server start)."""
    await _run(engine, "upgrade", revision)


async def verify(engine: AsyncEngine) -> None:
    """Raise `SchemaMismatch` unless the database is at this code's newest migration (a start
    with migrations off). Under the migration lock on PostgreSQL: a replica migrating it now
    is waited for."""
    await _run(engine, "verify", "head")


async def downgrade(engine: AsyncEngine, revision: str = "base") -> None:
    """`alembic downgrade` on the engine's database."""
    await _run(engine, "downgrade", revision)


async def check(engine: AsyncEngine) -> None:
    """`alembic check`: raises when the models and the migrated schema differ."""
    await _run(engine, "check", "head")


def upgrade_sync(url: str, revision: str = "head") -> None:
    """Blocking helper for CLIs that migrate before serving."""

    async def go() -> None:
        engine = create_engine(url)
        try:
            await upgrade(engine, revision)
        finally:
            await engine.dispose()

    asyncio.run(go())
