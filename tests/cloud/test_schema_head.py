"""The head check a cloud start makes without Alembic (`cloud.store.schema_head`).

Proves, on SQLite and PostgreSQL: the head read from the scripts is Alembic's own; a database
at head is known to be so, one empty or at an older migration or at one this code does not
know is not (the start then asks Alembic, which upgrades, refuses or warns as before); and
scripts this parse is not sure of (a merge, two heads) answer "not known" rather than a guess.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from cloud.store.database import Store
from cloud.store.engine import alembic_config, downgrade, upgrade
from cloud.store.schema_head import at_head, script_head, stored_revision

_HEAD_SCRIPT = ScriptDirectory.from_config(alembic_config()).get_revision("head")
assert _HEAD_SCRIPT is not None and isinstance(_HEAD_SCRIPT.down_revision, str)
HEAD = _HEAD_SCRIPT.revision
BEFORE_HEAD = _HEAD_SCRIPT.down_revision


def test_the_scripts_head_is_alembics() -> None:
    assert script_head() == HEAD


async def _read(store: Store) -> tuple[str | None, bool]:
    async with store.engine.connect() as conn:
        return await conn.run_sync(lambda c: (stored_revision(c), at_head(c)))


async def test_a_database_at_head_is_known_to_be(store: Store) -> None:
    assert await _read(store) == (HEAD, True)


@pytest.mark.empty_database
async def test_an_empty_database_is_not_at_head(db_url: str) -> None:
    store = Store.from_url(db_url)
    try:
        assert await _read(store) == (None, False)
        await upgrade(store.engine)  # the start then migrates it, through Alembic
        assert await _read(store) == (HEAD, True)
    finally:
        await store.close()


async def test_an_older_or_unknown_revision_is_not_at_head(store: Store) -> None:
    await downgrade(store.engine, BEFORE_HEAD)
    assert await _read(store) == (BEFORE_HEAD, False)
    await upgrade(store.engine)
    assert await _read(store) == (HEAD, True)
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = '9999_newer'"))
    assert await _read(store) == ("9999_newer", False)


def _script(folder: Path, name: str, revision: str, down: str) -> None:
    (folder / f"{name}.py").write_text(
        f'revision: str = "{revision}"\ndown_revision: str | None = {down}\n', encoding="utf-8"
    )


def test_scripts_it_is_not_sure_of_have_no_head(tmp_path: Path) -> None:
    line = tmp_path / "line"
    line.mkdir()
    _script(line, "a", "0001", "None")
    _script(line, "b", "0002", '"0001"')
    assert script_head(line) == "0002"

    branched = tmp_path / "branched"
    branched.mkdir()
    _script(branched, "a", "0001", "None")
    _script(branched, "b", "0002", '"0001"')
    _script(branched, "c", "0003", '"0001"')
    assert script_head(branched) is None

    merged = tmp_path / "merged"
    merged.mkdir()
    _script(merged, "a", "0001", "None")
    _script(merged, "b", "0002", '("0001", "0003")')
    assert script_head(merged) is None


def test_an_editors_lock_file_among_the_scripts_is_passed_over(tmp_path: Path) -> None:
    """Emacs keeps `.#name.py` beside a file being edited, a link to nowhere, which Alembic
    never reads: reading it failed `amc cloud serve`'s start (FileNotFoundError). A script
    that cannot be read is Alembic's to judge."""
    _script(tmp_path, "a", "0001", "None")
    _script(tmp_path, "b", "0002", '"0001"')
    (tmp_path / ".#b.py").symlink_to(tmp_path / "gone@host.1234")
    assert script_head(tmp_path) == "0002"
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    _script(unreadable, "a", "0001", "None")
    (unreadable / "b.py").write_bytes(b'revision = "\xff"\n')
    assert script_head(unreadable) is None
