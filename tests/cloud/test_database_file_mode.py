"""A standalone cloud's SQLite database is readable by its owner only.

It holds the decision log (prompts, the model's thinking, goals): created with the umask's
0644, every local account could read it. Real SQLite file through the store's engine, named by
a path or by an SQLite URI (`file:…?uri=true`).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from cloud.settings import CloudSettings
from cloud.store.database import Store
from cloud.store.sqlite_file import sqlite_file


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_database_the_cloud_creates_is_owner_only(tmp_path: Path) -> None:
    db = tmp_path / "data" / "cloud.sqlite3"
    store = Store.from_url(f"sqlite+aiosqlite:///{db}")
    try:
        async with store.write() as session:
            await session.execute(text("CREATE TABLE t (x INTEGER)"))
            await session.execute(text("INSERT INTO t VALUES (1)"))
        assert _mode(db) == 0o600, oct(_mode(db))
        wal = db.with_name(db.name + "-wal")
        assert wal.exists() and _mode(wal) == 0o600, oct(_mode(wal))
    finally:
        await store.close()


async def test_a_database_that_exists_keeps_its_mode(tmp_path: Path) -> None:
    db = tmp_path / "cloud.sqlite3"
    db.touch(mode=0o640)
    db.chmod(0o640)
    store = Store.from_url(f"sqlite+aiosqlite:///{db}")
    try:
        async with store.write() as session:
            await session.execute(text("CREATE TABLE t (x INTEGER)"))
        assert _mode(db) == 0o640, oct(_mode(db))
    finally:
        await store.close()


async def test_an_sqlite_uri_database_is_made_at_its_path_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `?uri=true` URL names its file by the URI's path: the database is made there, owner
    only, its folder made as a plain path's is, and nothing lands in the working folder.
    Before, the engine read `file:/…/data` as a relative folder: it made `./file:/…/data`
    with an empty database file in it, while SQLite opened the URI's own path, whose folder
    was never made (the database could not be opened)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    db = tmp_path / "data" / "cloud.sqlite3"
    store = Store.from_url(f"sqlite+aiosqlite:///file:{db}?uri=true")
    try:
        async with store.write() as session:
            await session.execute(text("CREATE TABLE t (x INTEGER)"))
        assert _mode(db) == 0o600, oct(_mode(db))
    finally:
        await store.close()
    assert sorted(p.name for p in work.iterdir()) == []


def test_the_file_an_sqlite_url_names() -> None:
    """One reading for the engine, the folder check at start and the artifacts' default: an
    SQLite URI by its path (escapes decoded), none for memory, a plain name as it is (without
    `uri=true` SQLite opens a file named `file:…`)."""
    base = "sqlite+aiosqlite:///"
    assert sqlite_file(make_url(f"{base}/abs/x.sqlite3")) == Path("/abs/x.sqlite3")
    assert sqlite_file(make_url(f"{base}file:/abs/x.sqlite3?uri=true")) == Path("/abs/x.sqlite3")
    assert sqlite_file(make_url(f"{base}file:/a%20b/x?mode=rwc&uri=1")) == Path("/a b/x")
    assert sqlite_file(make_url(f"{base}file:rel/x.sqlite3?uri=true")) == Path("rel/x.sqlite3")
    assert sqlite_file(make_url(f"{base}file:///abs/x.sqlite3?uri=true")) == Path("/abs/x.sqlite3")
    assert sqlite_file(make_url(f"{base}file:m?mode=memory&cache=shared&uri=true")) is None
    assert sqlite_file(make_url(f"{base}file::memory:?uri=true")) is None
    assert sqlite_file(make_url(f"{base}file:/abs/x.sqlite3?vfs=memdb&uri=true")) is None
    assert sqlite_file(make_url(f"{base}:memory:")) is None
    assert sqlite_file(make_url("sqlite+aiosqlite://")) is None
    assert sqlite_file(make_url(f"{base}file:/abs/x")) == Path("file:/abs/x")
    assert sqlite_file(make_url("postgresql+psycopg://u@h/db")) is None


def test_the_artifacts_of_an_sqlite_uri_database_sit_beside_its_file(tmp_path: Path) -> None:
    """The artifacts' default folder is beside the file an SQLite URI names, as beside a plain
    path's: before, it was `file:/…/cloud-artifacts`, a folder under the working folder."""
    db = tmp_path / "data" / "cloud.sqlite3"
    url = f"sqlite+aiosqlite:///file:{db}?uri=true"
    settings = CloudSettings(database_url=url, artifact_dir=None)
    assert settings.resolved_artifact_dir == tmp_path / "data" / "cloud-artifacts"


@pytest.mark.parametrize("query", ["mode=ro", "mode=rw", "immutable=1"])
def test_the_engine_makes_no_file_for_a_uri_that_opens_an_existing_one_only(
    tmp_path: Path, query: str
) -> None:
    """The engine does not make an empty database for a URI SQLite would open only if it
    exists: it says the file does not exist (it made one, and the cloud ran on it)."""
    db = tmp_path / "cloud.sqlite3"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Store.from_url(f"sqlite+aiosqlite:///file:{db}?{query}&uri=true")
    assert not db.exists()


async def test_a_uri_opening_an_existing_database_only_opens_it(tmp_path: Path) -> None:
    """The same URI naming a database that exists opens it, and reads it."""
    db = tmp_path / "cloud.sqlite3"
    writer = Store.from_url(f"sqlite+aiosqlite:///{db}")
    try:
        async with writer.write() as session:
            await session.execute(text("CREATE TABLE t (x INTEGER)"))
            await session.execute(text("INSERT INTO t VALUES (7)"))
    finally:
        await writer.close()
    store = Store.from_url(f"sqlite+aiosqlite:///file:{db}?mode=ro&uri=true")
    try:
        async with store.read() as session:
            assert (await session.execute(text("SELECT x FROM t"))).scalar_one() == 7
    finally:
        await store.close()


@pytest.mark.parametrize("url", ["sqlite+aiosqlite://", "sqlite+aiosqlite:///:memory:"])
def test_the_engine_refuses_an_in_memory_database_in_words(url: str) -> None:
    """Not a TypeError about StaticPool's pool arguments: what is wrong."""
    with pytest.raises(ValueError, match="in-memory SQLite database cannot hold a cloud"):
        Store.from_url(url)
