"""Whether a database is already at this code's newest migration, known without Alembic.

Nearly every cloud start finds its database at head (every replica after the first, every
restart), and Alembic found that out at a price: importing it loads Mako and, through Mako,
Pygments and its lexers (~130 ms of CPU), and `upgrade` at head still loads every migration
script and runs `env.py` (~40 ms more). Here the head is read from the scripts' own
`revision`/`down_revision` lines and the database's from `alembic_version`; anything this
cannot read with certainty (a merge, a branch, a line in another shape) answers "not known",
and the caller asks Alembic as before.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from sqlalchemy import Connection, inspect, text

import migrations

#: Alembic's default version table, which `migrations/env.py` keeps.
VERSION_TABLE = "alembic_version"

_REVISION = re.compile(r'^revision(?:\s*:[^=\n]*)?\s*=\s*"([^"\n]+)"\s*$', re.MULTILINE)
_DOWN_REVISION = re.compile(
    r'^down_revision(?:\s*:[^=\n]*)?\s*=\s*(?:"([^"\n]+)"|(None))\s*$', re.MULTILINE
)


@functools.cache
def script_head(versions: Path | None = None) -> str | None:
    """The one revision no script revises, read from `migrations/versions`; None when the
    scripts are not a single line this parse is sure of (Alembic then decides)."""
    folder = versions or Path(migrations.__file__).parent / "versions"
    revisions: set[str] = set()
    revised: set[str] = set()
    for script in folder.glob("*.py"):
        if script.name.startswith((".", "_")):  # an editor's lock file (`.#0035_….py`, a
            continue  # dangling link), `__init__.py`: Alembic reads neither
        try:
            source = script.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None  # Alembic decides (a start failed on such a file)
        revision = _REVISION.findall(source)
        down = _DOWN_REVISION.findall(source)
        if len(revision) != 1 or len(down) != 1:
            return None  # a merge (a tuple), two assignments, another shape: not sure
        revisions.add(revision[0])
        if down[0][0]:
            revised.add(down[0][0])
    heads = revisions - revised
    if len(heads) != 1 or not revised <= revisions:
        return None
    return heads.pop()


def stored_revision(connection: Connection) -> str | None:
    """The database's one revision in `alembic_version`; None when the table is missing, empty
    or holds several (branches)."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    rows = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    return str(rows[0][0]) if len(rows) == 1 else None


def at_head(connection: Connection) -> bool:
    """True only when the database certainly is at this code's newest migration."""
    head = script_head()
    return head is not None and stored_revision(connection) == head
