"""A SQLite cloud database migrated to head once per test process, for tests to start from a
copy of: the cloud's startup migration then finds it at head and has nothing to do.

Migrating a fresh database runs all 25 migrations, each in its own transaction: most of a
cloud test's setup on a loaded machine. The startup migration itself still runs on the copy,
as in production (on a database at head it only reads the revision).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cloud.store.engine import upgrade_sync

_template: Path | None = None


def migrate(url: str) -> None:
    """`upgrade_sync` in a thread of its own: its `asyncio.run` leaves the calling thread's
    event loop (an async test's, pytest-asyncio's) alone."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(upgrade_sync, url).result()


def migrated_sqlite() -> Path:
    """The process's migrated SQLite file (made on first use, deleted at exit): copy it, never
    open it."""
    global _template
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="amc-test-migrated-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = folder / "cloud.sqlite3"
        migrate(f"sqlite+aiosqlite:///{path}")
        _template = path
    return _template


def migrated_sqlite_url(path: Path) -> str:
    """A copy of the migrated database at `path` (its folder made if missing), as the URL a
    cloud is given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_sqlite(), path)
    return f"sqlite+aiosqlite:///{path}"


def seeded(data_dir: Path) -> Path:
    """`data_dir` for `console.embedded.embedded_stack`, its cloud database a copy of the migrated
    one unless the folder has one already (a stack started again on it keeps its data): the
    stack's cloud then finds it at head. A folder not seeded migrates, as in production."""
    from console.embedded import CLOUD_DATABASE  # the whole stack: only for tests that run it

    database = data_dir / CLOUD_DATABASE
    if not database.exists():
        migrated_sqlite_url(database)
    return data_dir
