"""A standalone cloud's SQLite database is readable by its owner only.

It holds the decision log (prompts, the model's thinking, goals): created with the umask's
0644, every local account could read it. Real SQLite file through the store's engine.
"""

from __future__ import annotations

import stat
from pathlib import Path

from sqlalchemy import text

from cloud.store.database import Store


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
