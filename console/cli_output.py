"""What `amc` prints: text exactly as it was written, and JSON for scripts.

Model and user text (a rationale, a goal, a prompt, a progress summary) can hold anything
Rich would otherwise read as markup ("[e12]" vanished, "[/b]" crashed), emoji codes
(":smile:") or something to highlight, so both consoles here have all three off: styles come
only from `rich.text.Text` spans this package builds, and lines are never re-wrapped (a long id
or prompt line stays one line for copy and paste). `--json` output goes straight to stdout as
the operators' API shapes it (`console.gateway.models`), so a script sees what the JSON API
returns.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from pydantic import BaseModel
from rich.console import Console


class OutputClosed(Exception):
    """Whatever read stdout stopped reading (`amc … | head -1`).

    Not a `BrokenPipeError`: click catches that (an OSError with EPIPE) and exits 1, as Rich
    does, and 1 is what `amc task watch ID` says when the task failed. `run_main` gives it
    its own code."""


class _Console(Console):
    """A Rich console whose closed pipe raises `OutputClosed` rather than exiting 1."""

    def on_broken_pipe(self) -> None:
        raise OutputClosed


#: Standard output: results.
out = _Console(markup=False, highlight=False, emoji=False, soft_wrap=True)
#: Standard error: warnings and notes that must not mix into a script's results.
err = Console(stderr=True, markup=False, highlight=False, emoji=False, soft_wrap=True)


#: Control characters other than newline and tab: shown as escapes, never sent to the
#: terminal (a screen's text could otherwise carry terminal commands into an audit).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _write(text: str) -> None:
    """Write and flush stdout; a closed pipe is `OutputClosed`."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosed from None


def print_text(text: str) -> None:
    """Text exactly as written (model text, prompts): tabs and line breaks kept, nothing
    re-wrapped or expanded; only control characters are shown as escapes (`\\x1b`)."""
    _write(_CONTROL.sub(lambda m: repr(m.group())[1:-1], text) + "\n")


def print_json(value: BaseModel | dict[str, Any] | list[Any], *, indent: int | None = 2) -> None:
    """One JSON document (a model as the API shapes it) on stdout."""
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    _write(json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


def print_json_line(value: BaseModel | dict[str, Any]) -> None:
    """One JSON object per line (a stream: `amc task watch --json`)."""
    print_json(value, indent=None)
