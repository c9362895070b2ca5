"""Page tokens: opaque to clients, yet they arrive from them.

A token names the listing it continues (`listing`: the RPC and, for a task's lists, the task;
ListTasks' its filter) beside the position of the last row sent, and is refused for any other:
a token of another RPC, task or filter was read as a position of this one, and the client got
a page that silently skipped rows instead of INVALID_ARGUMENT (ListTasks' and ListFlows' tokens
had the same shape, a task's ListTaskEvents token took up another task's events after that
event id).

Values read back are only what the database can compare: one decoded to a number beyond 64
bits made SQLite's driver raise OverflowError while binding it, and the caller got INTERNAL
instead of INVALID_ARGUMENT "page_token: not a page token from this server". So did an id
holding a lone surrogate (SQLite) or a NUL (PostgreSQL), and a time without a zone: a
listing's name is an unkeyed hash of its filter, so anyone can build a token of the right
listing holding anything (`token_id`, `token_time`).

A later page starts where its token says through `past`: one row comparison, which both
backends take as the start of an index range. The same test spelled as an OR of comparisons
(`a > x OR (a = x AND b > y)`) was a filter on both: page k read the k pages before it again.
A listing of several statuses is a page of each status, each a range of its own, merged
(`newest_page`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Executable,
    Select,
    SQLColumnExpression,
    literal,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.orm import InstrumentedAttribute

_INT64 = range(-(2**63), 2**63)
FOREIGN = "not a page token from this server"
ELSEWHERE = "a page token of another listing (another RPC, task, attempt or filter)"


def token_int(value: object) -> int:
    """`value` as an int a statement can bind on both backends; ValueError otherwise."""
    number: int = int(value)  # type: ignore[call-overload]
    if number not in _INT64:
        raise ValueError(f"{number} is out of range")
    return number


def token_id(value: object, longest: int) -> str:
    """`value` as an id of at most `longest` characters that a statement can bind on both
    backends; ValueError (FOREIGN) for anything no listing holds."""
    if not isinstance(value, str) or not 0 < len(value) <= longest or "\0" in value:
        raise ValueError(FOREIGN)
    try:
        value.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise ValueError(FOREIGN) from exc
    return value


def token_time(value: object) -> dt.datetime:
    """`value`, an ISO time with its zone, as an aware UTC datetime (the store's times);
    ValueError (FOREIGN) otherwise."""
    try:
        when = dt.datetime.fromisoformat(value)  # type: ignore[arg-type]
        if when.tzinfo is None:
            raise ValueError("no zone")
        return when.astimezone(dt.UTC)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(FOREIGN) from exc


def of_attempt(listing: str, attempt: int) -> str:
    """The name of `listing` (a task's steps, events or screenshots) narrowed to `attempt` (0:
    every attempt, the name as it was). Each attempt's listing is a listing of its own: a
    token of attempt 2 sent with attempt 1 was read as a position past every row of attempt 1
    (an empty last page: "nothing more"), and sent without an attempt it skipped attempt 1."""
    return f"{listing}/attempt/{attempt}" if attempt else listing


def of_steps(listing: str, attempt: int, after_step: int) -> str:
    """The name of `listing` (a task's steps or their screenshots) narrowed to `attempt` and
    to the steps past `after_step` of it (0: every step, the name as `of_attempt` gives it).
    Each `after_step` is a listing of its own: a token of the steps after 3 was read as a
    position of the steps after 0, and its next page went where neither query goes."""
    narrowed = of_attempt(listing, attempt)
    return f"{narrowed}/after/{after_step}" if after_step else narrowed


def page_token(listing: str, *position: object) -> str:
    """The token that continues `listing` after `position` (JSON values)."""
    return base64.urlsafe_b64encode(json.dumps([listing, *position]).encode()).decode()


def position(listing: str, token: str, size: int) -> list[Any]:
    """The `size` values of the position `token` holds; ValueError (FOREIGN, or ELSEWHERE for
    a token of another listing) unless `page_token(listing, …)` made it."""
    try:
        values = json.loads(base64.urlsafe_b64decode(token.encode()))
    except Exception as exc:
        raise ValueError(FOREIGN) from exc
    if not isinstance(values, list) or len(values) != size + 1 or not isinstance(values[0], str):
        raise ValueError(FOREIGN)
    if values[0] != listing:
        raise ValueError(ELSEWHERE)
    return values[1:]


def past(
    keys: Sequence[SQLColumnExpression[Any]],
    last: Sequence[object],
    *,
    descending: bool = False,
    inclusive: bool = False,
) -> ColumnElement[bool]:
    """The rows after `last` in the order of `keys` (all ascending, or all `descending`), or
    from `last` on (`inclusive`), as one row comparison an index on `keys` serves as a range
    (PostgreSQL: an Index Cond on ROW(…); SQLite: the row value in its SEARCH). Each value is
    bound with its column's type: `tuple_` alone types them from the Python values, and a time
    would skip `UTCDateTime`'s conversion (compared as given, in whatever zone it came)."""
    row = tuple_(*keys)
    # An ORM attribute answers `.type` with its column's (typing does not declare it).
    types = [getattr(key, "type", None) for key in keys]
    at = tuple_(*(literal(value, type_) for type_, value in zip(types, last, strict=True)))
    if descending:
        return row <= at if inclusive else row < at
    return row >= at if inclusive else row > at


def newest_page(
    query: Select[Any],
    keys: Sequence[InstrumentedAttribute[Any]],
    limit: int,
    column: InstrumentedAttribute[Any] | None = None,
    values: Sequence[str] = (),
) -> Executable:
    """`query`, a select of one model, newest first on `keys` (all descending), its first
    `limit` rows; with `values`, only the rows whose `column` is one of them.

    Several values are a page of each, read on its own and merged (`SELECT * FROM (… LIMIT)`:
    SQLite takes no LIMIT on an arm of a compound), each a range of an index on (`column`,
    *`keys`) in its order: `column IN (…)` was one walk of the index on `keys` testing each
    row, which read every row when the values asked for are rare, or all their rows sorted to
    give a page. Without the arms' own limits PostgreSQL may read all of them."""
    newest = [key.desc() for key in keys]
    wanted = sorted(set(values))
    if column is None or len(wanted) <= 1:
        if column is not None:
            query = query.where(*(column == value for value in wanted))
        return query.order_by(*newest).limit(limit)
    arms = (
        select(query.where(column == value).order_by(*newest).limit(limit).subquery())
        for value in wanted
    )
    merged = union_all(*arms)
    on = merged.selected_columns
    model = query.column_descriptions[0]["entity"]
    return select(model).from_statement(
        merged.order_by(*(on[key.key].desc() for key in keys)).limit(limit)
    )
