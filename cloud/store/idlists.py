"""A list of ids as one bound parameter: `column IN (…)` that costs the same for 10 ids or 10,000.

`column.in_(ids)` renders one bound parameter per id, and SQLAlchemy and the driver bind and
convert each of them in Python on the event loop: a replica holding 10,000 host streams spent
tens of milliseconds per such query (its heartbeat, stream reconcile and busy resync), during
which no host was answered. Here the ids travel as a single parameter, a JSON array on both
backends (`IN (SELECT value FROM json_each(:ids))` on SQLite, `json_array_elements_text` on
PostgreSQL), so the statement text is constant and compiled once, and the ids are converted by
`json.dumps` in C: as a PostgreSQL array parameter psycopg dumped each of 10,000 ids in Python,
a stop of the event loop of tens of milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence

from sqlalchemy import ColumnElement, String, bindparam, cast, func, select
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.orm import InstrumentedAttribute

from cloud.store.database import Store

#: Ids per query for work over every host a replica holds (`chunked`).
CHUNK = 1000


def among(
    store: Store,
    column: ColumnElement[str] | InstrumentedAttribute[str],
    ids: Iterable[str],
) -> ColumnElement[bool]:
    """`column IN ids` with `ids` as one bound parameter (see the module's docstring)."""
    values = bindparam(None, json.dumps(list(ids)), type_=String())
    if store.is_postgres:
        listed = func.json_array_elements_text(cast(values, JSON)).table_valued("value")
    else:
        listed = func.json_each(values).table_valued("value")
    return column.in_(select(listed.c.value))


def chunked(ids: Sequence[str], size: int = CHUNK) -> Iterator[Sequence[str]]:
    """`ids` in slices of at most `size`, for work over every host a replica holds: each slice's
    query is awaited on its own, so the loop answers hosts between them. Converting 10,000 rows
    in one go stopped a 10,000-host replica's loop for ~70 ms every heartbeat (its stream
    reconcile, its busy resync), and the renewals waiting behind it made its ack p99."""
    for i in range(0, len(ids), size):
        yield ids[i : i + size]
