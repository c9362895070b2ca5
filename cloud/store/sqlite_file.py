"""The file an SQLite database URL names, an SQLite URI's (`file:…?uri=true`) included."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:  # SQLAlchemy costs a host's settings ~1.5 s at import (`cloud.settings`)
    from sqlalchemy.engine import URL

#: The spellings of a true `uri` query value SQLAlchemy's SQLite drivers accept.
_TRUE = frozenset({"true", "yes", "on", "y", "t", "1"})


def sqlite_file(url: URL) -> Path | None:
    """The database file `url` names; None when it is not SQLite or names none (in memory).

    With `?uri=true` the database part is an SQLite URI: `file:/abs/dir/x.sqlite3` names
    `/abs/dir/x.sqlite3` (percent-escapes decoded, as SQLite does), and `file::memory:`, a
    `mode=memory` or a `vfs=memdb` query (SQLAlchemy keeps the URI's query in `url.query`)
    names no file.
    Read as a path, `file:/abs/dir` was a folder `file:` in the working folder: the engine
    made it there, with an empty database file in it, the folder check at start and the
    artifacts' default folder looked there too, while SQLite opened the URI's own path.
    Without `uri=true` SQLite takes the name as it is, `file:` and all."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database
    if database in (None, "", ":memory:"):
        return None
    if database.startswith("file:") and _uri(url):
        uri = urlsplit(database)
        path = unquote(uri.path)
        if path in ("", ":memory:") or url.query.get("mode") == "memory":
            return None
        if url.query.get("vfs") == "memdb":  # a memory database under that name, no file
            return None
        return Path(path)
    return Path(database)


def sqlite_in_memory(url: URL) -> bool:
    """Whether `url` is an in-memory SQLite database (`sqlite://`, `:memory:`, `file::memory:`,
    `mode=memory` or `vfs=memdb` with `uri=true`), which a cloud cannot serve from: each of its
    connections (the pool's, the loop's own, the migrations') would open a database of its own,
    empty, or with a shared cache one whose tables lock each other's writers; and all of it,
    the fleet's hosts, tasks and leases, would be gone at the stop while hosts still ran those
    leases."""
    return url.get_backend_name() == "sqlite" and sqlite_file(url) is None


def sqlite_opens_existing_only(url: URL) -> bool:
    """Whether `url` is an SQLite URI that only opens a database that exists: `mode=ro` (or
    `mode=rw`) or `immutable=1`. SQLite refuses a `mode=ro`/`mode=rw` URI naming a missing
    file (an `immutable=1` one gets an empty file, read-only); the engine made an empty file
    for each first, and the cloud then failed on the empty database."""
    if url.get_backend_name() != "sqlite" or not _uri(url):
        return False
    mode = url.query.get("mode", "")
    immutable = url.query.get("immutable", "")
    return (isinstance(mode, str) and mode in ("ro", "rw")) or (
        isinstance(immutable, str) and immutable.strip().lower() in _TRUE
    )


def sqlite_read_only(url: URL) -> bool:
    """Whether `url` is an SQLite URI that opens its database read-only (`mode=ro` or
    `immutable=1`): no cloud can serve from one, as it writes from its first moment."""
    if url.get_backend_name() != "sqlite" or not _uri(url):
        return False
    immutable = url.query.get("immutable", "")
    return url.query.get("mode") == "ro" or (
        isinstance(immutable, str) and immutable.strip().lower() in _TRUE
    )


def _uri(url: URL) -> bool:
    value = url.query.get("uri", "")
    if not isinstance(value, str):  # given twice: a tuple, which the driver refuses itself
        return False
    return value.strip().lower() in _TRUE
