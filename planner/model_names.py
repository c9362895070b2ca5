"""Which row of a model table (profiles, prices) a model id falls under.

The tables list name prefixes ("gpt-5.1", "claude-opus-4-1") so a dated or sized model
("gpt-5.1-2025-11-13", "gpt-4.1-mini") finds its family's row. A bare prefix also matched
another model whose version merely starts with the same characters: `gpt-5.10` took
gpt-5.1's profile (refusing efforts 5.10 takes) and price, `claude-opus-4-10` was billed as
Opus 4.1. A row therefore matches only at a boundary of the id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: What may follow a row in a model id: a size, a variant or a date ("-mini", "-20250514").
BOUNDARY = "-"
#: A row ending in one of these names a series, and matches whatever version follows
#: ("gpt-5." stands for every GPT-5 version after 5.1).
SERIES_END = "-."


def falls_under(model: str, row: str) -> bool:
    """`model` is `row` itself, or `row` followed by a boundary (or `row` names a series)."""
    if not row or not model.startswith(row):
        return False
    rest = model[len(row) :]
    return not rest or rest[0] in BOUNDARY or row[-1] in SERIES_END


def longest_row(model: str, rows: Iterable[str]) -> str | None:
    """The longest of `rows` that `model` falls under, or None."""
    matching = [row for row in rows if falls_under(model, row)]
    return max(matching, key=len) if matching else None


#: `claude-<family>-<major>[-<minor>]` (a date suffix may follow; a minor has one or two digits).
_CLAUDE_VERSION = re.compile(r"^claude-([a-z]+)-(\d{1,2})(?:-(\d{1,2}))?(?=-|$)")


def claude_version(model: str) -> tuple[str, tuple[int, int]] | None:
    """The family and version of a versioned Claude id (claude-opus-4-7-20260101: opus, 4.7)."""
    match = _CLAUDE_VERSION.match(model)
    if match is None:
        return None
    family, major, minor = match.groups()
    return family, (int(major), int(minor or 0))


def family_rows(family: str, rows: Iterable[str]) -> dict[tuple[int, int], str]:
    """version → row, for the rows that name a version of the Claude `family`."""
    out: dict[tuple[int, int], str] = {}
    for row in rows:
        parsed = claude_version(row)
        if parsed is not None and parsed[0] == family:
            out[parsed[1]] = row
    return out
