"""How both consoles and the command line read a whole number: ASCII digits, maybe a minus.

Their parameters were parsed by pydantic in lax mode (FastAPI's query, path and body fields,
Typer's options alike), which reads "1_0" as 10, "+3" and " 3" as 3 and "3.0" as 3: a typo
reached the cloud as a number nobody wrote (ten attempts, a page of ten). What is refused here
is refused before pydantic sees it (`webui.params`, `console.cli_help`), with `NOT_WHOLE`.
Kept free of imports: the command line loads it on every run.
"""

from __future__ import annotations

import re
import types
from typing import Any, Final, Union, get_args, get_origin

_WHOLE = re.compile(r"-?[0-9]+")
#: What a refused number is told.
NOT_WHOLE: Final = "must be a whole number written in the digits 0-9"


def written_whole(text: str) -> bool:
    """Whether `text` is a whole number as people write one: digits 0-9, a minus before them
    at most (a negative value then meets the parameter's own range and its message)."""
    return _WHOLE.fullmatch(text) is not None


def takes_int(annotation: Any) -> bool:
    """Whether a parameter's or field's annotation is int (alone, or with None)."""
    if annotation is int:
        return True
    if get_origin(annotation) in (Union, types.UnionType):
        return int in get_args(annotation)
    return False
