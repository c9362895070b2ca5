"""A list of ids as one bound parameter: `column IN (…)` that costs the same for 10 ids or 10,000.

`column.in_(ids)` renders one bound parameter per id, and SQLAlchemy and the driver bind and
convert each of them in Python on the event loop: a replica holding 10,000 host streams spent
tens of milliseconds per such query (its heartbeat, stream reconcile and busy resync), during
which no host was answered. Here the ids travel as a single parameter — a PostgreSQL array
(`= ANY(:ids)`), a JSON array on SQLite (`IN (SELECT value FROM json_each(:ids))`) — so the
statement text is constant and compiled once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from sqlalchemy import ColumnElement, String, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import InstrumentedAttribute

from cloud.store.database import Store


def among(
    store: Store,
    column: ColumnElement[str] | InstrumentedAttribute[str],
    ids: Iterable[str],
) -> ColumnElement[bool]:
    """`column IN ids` with `ids` as one bound parameter (see the module's docstring)."""
    values = list(ids)
    if store.is_postgres:
        return column == any_(bindparam(None, values, type_=ARRAY(String())))
    listed = func.json_each(bindparam(None, json.dumps(values), type_=String())).table_valued(
        "value"
    )
    return column.in_(select(listed.c.value))
