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
from rich.console import (
    Console,
    ConsoleOptions,
    ConsoleRenderable,
    RenderableType,
    RenderHook,
    RenderResult,
)
from rich.segment import Segment


class OutputClosed(Exception):
    """Whatever read stdout stopped reading (`amc … | head -1`).

    Not a `BrokenPipeError`: click catches that (an OSError with EPIPE) and exits 1, as Rich
    does, and 1 is what `amc task watch ID` says when the task failed. `run_main` gives it
    its own code."""


#: Control characters other than newline and tab: shown as escapes, never sent to the
#: terminal (a screen's text could otherwise carry terminal commands into an audit).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_C1 = re.compile(r"[\x7f-\x9f]")


def _escaped(text: str) -> str:
    """`text` with its control characters written out (`\\x1b`)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class _Escaped:
    """Renders what it wraps with the control characters of its text written out; Rich's own
    styling (applied after, from the segments' styles) and control segments are kept."""

    def __init__(self, inner: RenderableType) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.inner, options):
            text, style, control = segment
            yield segment if control else Segment(_escaped(text), style)


class _EscapeControls(RenderHook):
    """Every `print` of a console: a goal, a host's progress summary (labels from an app's
    screen) or a cloud's message is data, never a terminal command. Rich drops only BEL, BS,
    VT, FF and CR: an ESC sequence in a goal recoloured, retitled or rewrote the terminal."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Escaped(r) for r in renderables]


class _Console(Console):
    """A Rich console whose closed pipe raises `OutputClosed` rather than exiting 1."""

    def on_broken_pipe(self) -> None:
        raise OutputClosed


#: Standard output: results.
out = _Console(markup=False, highlight=False, emoji=False, soft_wrap=True)
#: Standard error: warnings and notes that must not mix into a script's results.
err = Console(stderr=True, markup=False, highlight=False, emoji=False, soft_wrap=True)
for _console in (out, err):
    _console.push_render_hook(_EscapeControls())


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
    _write(_escaped(text) + "\n")


def print_json(value: BaseModel | dict[str, Any] | list[Any], *, indent: int | None = 2) -> None:
    """One JSON document (a model as the API shapes it) on stdout."""
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    # JSON escapes only \x00-\x1f; DEL and the C1 controls (\x9b is a terminal's CSI) only
    # occur inside strings, where `\u009b` means the same to a parser.
    _write(_C1.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n")


def print_json_line(value: BaseModel | dict[str, Any]) -> None:
    """One JSON object per line (a stream: `amc task watch --json`)."""
    print_json(value, indent=None)
