"""What a database failure is, said without its text.

A driver's message carries the database's host and port, the SQL and, unless the engine hides
them, its parameters (goals, summaries). None of that may reach a client or a log line, so
failures are told apart by their type and SQLSTATE only: `unavailable` (the database cannot be
reached or is restarting: the caller should retry) or any other database error (a bug or a
constraint: retrying does not help). `describe` is the one safe way to name one in a log.

The few causes an operator can act on (a full disk, a read-only database file or folder, no
connection left) are named in plain words from the driver's codes (SQLite's result name,
PostgreSQL's SQLSTATE, read from psycopg's `sqlstate` or its `diag`), never its text: without
them a full disk was logged as a bare "OperationalError" for as long as it lasted, and nothing
said what to free or fix. A connection the server refuses at its limit is the exception: it is
refused before any session exists and libpq gives that failure no SQLSTATE (psycopg 3.3, libpq
18: `sqlstate`, `diag` and `pgresult` are all empty), so it is told by the server's fixed words,
in English or in any language its translations ship (`pg_refusals`, from the server's own
catalogues): a server whose `lc_messages` was German was not recognised at all.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator

from sqlalchemy import exc as sa_exc

from cloud.store import pg_driver
from cloud.store.pg_refusals import TRANSLATED

#: What a client is told while the database cannot be reached.
UNAVAILABLE_MESSAGE = "the cloud's database is unavailable; retry"

_UNAVAILABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,  # no pool connection within the pool's timeout
    sa_exc.DisconnectionError,
    sqlite3.OperationalError,  # "database is locked", a disk that went away
    ConnectionError,
)
_DATABASE = (sa_exc.SQLAlchemyError, sqlite3.Error)

#: What an operator can fix, by SQLite result name (extended ones by their primary's prefix)
#: or PostgreSQL SQLSTATE.
_CAUSES = {
    "SQLITE_FULL": "the disk is full",
    "SQLITE_READONLY": "the database file or its folder is read-only",
    "SQLITE_CANTOPEN": "the database file cannot be opened (its folder gone or not writable?)",
    "SQLITE_IOERR": "the disk failed a read or write (full, or the file size limit?)",
    "53100": "the disk is full",
    "25006": "the database is read-only",
    "53400": (
        "a limit of the database server's configuration was reached"
        " (configuration_limit_exceeded): its log names the setting to raise"
    ),
    "57P03": (
        "the database server is starting up, shutting down or recovering: it accepts"
        " connections again once that ends"
    ),
}
#: A server that refuses a new connection at its limit says so before any session exists, and
#: libpq gives such a failure no SQLSTATE (53300): told apart by the server's fixed words
#: (max_connections; the non-superuser's reserve; a role's or database's CONNECTION LIMIT), in
#: English or translated. Only the words are matched: the text, which names the host and the
#: role, is never repeated.
_REFUSED_CONNECTION = (
    "too many clients already",
    "remaining connection slots are reserved",
    "too many connections for",
    *(words for phrases in TRANSLATED.values() for words in phrases),
)
_NO_CONNECTION_LEFT = (
    "the database server has no connection left for this replica (max_connections, or the"
    " role's or database's CONNECTION LIMIT, counts every replica's pool): raise the limit or"
    " run fewer replicas"
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or during, each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _database_types() -> tuple[type[BaseException], ...]:
    """What a database error is: SQLAlchemy's, sqlite3's, and psycopg's once it is loaded
    (`pg_driver`: a cloud on SQLite does not import it)."""
    pg = pg_driver.loaded()
    return _DATABASE if pg is None else (*_DATABASE, pg.Error)


def _unavailable_types() -> tuple[type[BaseException], ...]:
    """The errors that mean the database cannot be reached, psycopg's once it is loaded."""
    pg = pg_driver.loaded()
    return _UNAVAILABLE if pg is None else (*_UNAVAILABLE, pg.OperationalError, pg.InterfaceError)


def database_error(exc: BaseException) -> BaseException | None:
    """The database error behind `exc` (itself or one it was raised from), if any."""
    kinds = _database_types()
    return next((e for e in _chain(exc) if isinstance(e, kinds)), None)


#: SQLite result names of a statement that is wrong, not of a database out of reach: SQLite
#: raises all of them as `OperationalError` too ("no such column", a syntax error), which read
#: as "unavailable", and background writes retried a bug for as long as they were wanted.
_SQLITE_NOT_TRANSIENT = frozenset(
    {"SQLITE_ERROR", "SQLITE_MISMATCH", "SQLITE_MISUSE", "SQLITE_RANGE", "SQLITE_TOOBIG"}
)


def unavailable(exc: BaseException) -> bool:
    """True when `exc` means the database cannot be reached right now (retry later)."""
    found = database_error(exc)
    if found is None:
        return False
    drivers = [*_chain(found), getattr(found, "orig", None)]
    sqlite = next((e for e in drivers if isinstance(e, sqlite3.Error)), None)
    if getattr(sqlite, "sqlite_errorname", None) in _SQLITE_NOT_TRANSIENT:
        return False
    if isinstance(found, sa_exc.DBAPIError) and found.connection_invalidated:
        return True
    kinds = _unavailable_types()
    return any(isinstance(e, kinds) for e in _chain(found))


def describe(exc: BaseException) -> str:
    """A database error's kind without its text: types and SQLSTATE, e.g.
    "OperationalError (psycopg.OperationalError, SQLSTATE 57P01)"."""
    found = database_error(exc) or exc
    parts: list[str] = []
    original = getattr(found, "orig", None)
    if isinstance(original, BaseException):
        parts.append(f"{type(original).__module__.split('.')[0]}.{type(original).__name__}")
    driver = original if isinstance(original, BaseException) else found
    state = sqlstate(driver)
    if state:
        parts.append(f"SQLSTATE {state}")
    name = getattr(driver, "sqlite_errorname", None)  # e.g. SQLITE_READONLY_DIRECTORY
    if isinstance(name, str):
        parts.append(name)
    said = cause(exc)
    inner = f" ({', '.join(parts)})" if parts else ""
    return f"{type(found).__name__}{inner}" + (f": {said}" if said else "")


def cause(exc: BaseException) -> str | None:
    """In plain words, what an operator can fix about the database error behind `exc` (a full
    disk, a read-only file or folder), from its SQLSTATE or SQLite result name; else None."""
    found = database_error(exc) or exc
    original = getattr(found, "orig", None)
    driver = original if isinstance(original, BaseException) else found
    state = sqlstate(driver)
    pg = pg_driver.loaded()
    if state == "53300" or (
        pg is not None
        and isinstance(driver, pg.OperationalError)
        and state is None
        and any(words in str(driver) for words in _REFUSED_CONNECTION)
    ):
        return _NO_CONNECTION_LEFT
    if isinstance(state, str) and state in _CAUSES:
        return _CAUSES[state]
    name = getattr(driver, "sqlite_errorname", None)
    if isinstance(name, str):
        return next((c for k, c in _CAUSES.items() if name.startswith(k)), None)
    return None


def sqlstate(driver: BaseException) -> str | None:
    """The SQLSTATE of a driver's error: psycopg's `sqlstate`, else its diagnostic's (the same
    field of the server's error, kept apart on some paths); None for SQLite or a failure the
    server never answered with a code (a refused connection)."""
    state = getattr(driver, "sqlstate", None)
    if isinstance(state, str) and state:
        return state
    diag = getattr(driver, "diag", None)
    state = getattr(diag, "sqlstate", None) if diag is not None else None
    return state if isinstance(state, str) and state else None


def report(logger: logging.Logger, what: str, exc: BaseException, *args: object) -> None:
    """Log a failure: a database error as one scrubbed line (no text, SQL or parameters, and no
    traceback, whose frames would repeat them), anything else with its traceback."""
    if database_error(exc) is None:
        logger.error(what, *args, exc_info=exc, stacklevel=2)
        return
    kind = "database unavailable" if unavailable(exc) else "database error"
    logger.warning(f"{what}: {kind}: %s", *args, describe(exc), stacklevel=2)
