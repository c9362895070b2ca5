"""The SQLite store's write-ahead log stays short: no commit checkpoints, the replica does, on a
timer, off the loop's thread (`Store.checkpoint`). SQLite only: PostgreSQL has no such file."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from cloud.server import build_server
from cloud.settings import CloudSettings
from cloud.store import engine
from cloud.store.database import Store
from cloud.store.engine import upgrade
from tests.support.waiting import until

PAGE = 4096
ROW = "x" * 3000  # about a page of its own per row


def _insert(session: Session) -> None:
    session.execute(text("INSERT INTO wal_probe VALUES (:b)"), {"b": ROW})


async def _store(path: Path) -> Store:
    store = Store.from_url(f"sqlite+aiosqlite:///{path}")
    await upgrade(store.engine)
    async with store.write() as session:
        await session.execute(text("CREATE TABLE wal_probe (b TEXT)"))
    return store


async def test_no_commit_checkpoints_and_a_checkpoint_lets_the_wal_start_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cut the WAL back to nothing when it starts over, so its file shows that it did.
    monkeypatch.setattr(engine, "SQLITE_WAL_SIZE_LIMIT", 0)
    store = await _store(tmp_path / "cloud.sqlite3")
    wal = tmp_path / "cloud.sqlite3-wal"
    try:
        # Commits on both kinds of connection, well past the 1,000 pages at which SQLite's
        # automatic checkpoint would have started the WAL over.
        for _ in range(700):
            await store.write_on_loop(_insert)
            async with store.write() as session:
                await session.run_sync(_insert)
        assert wal.stat().st_size > 1400 * PAGE
        await store.checkpoint()
        await store.write_on_loop(_insert)
        assert wal.stat().st_size < 50 * PAGE
        async with store.read() as session:
            assert (await session.execute(text("SELECT count(*) FROM wal_probe"))).scalar() == 1401
    finally:
        await store.close()


async def test_a_sqlite_replica_checkpoints_on_its_own(
    tmp_path: Path, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "SQLITE_WAL_SIZE_LIMIT", 0)
    path = tmp_path / "cloud.sqlite3"
    server = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{path}",
            listen_address="127.0.0.1:0",
            pki_dir=pki_dir,
            sqlite_checkpoint_seconds=0.05,
        )
    )
    await server.start()
    wal = tmp_path / "cloud.sqlite3-wal"
    try:
        async with server.store.write() as session:
            await session.execute(text("CREATE TABLE wal_probe (b TEXT)"))

        def many(session: Session) -> None:
            for _ in range(500):
                _insert(session)

        await server.store.write_on_loop(many)  # one transaction: its pages are all in the WAL
        assert wal.stat().st_size > 400 * PAGE

        async def started_over() -> bool:
            await server.store.write_on_loop(_insert)
            return wal.stat().st_size < 50 * PAGE

        await until(started_over, within=10)
    finally:
        await server.stop(0.5)
