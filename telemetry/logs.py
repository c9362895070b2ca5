"""Structured logs: what a line is about (task, attempt, host, step) travels in a context variable.

Every line a task produces — the host's agent loop, its lease renewals, the cloud's Decide for
that task — should say which task, attempt, host and step it belongs to, without each call site
passing them. A `ContextVar` does that for asyncio tasks (each copies its creator's context) and
for worker threads started with `asyncio.to_thread` (which runs the function in a copy of the
caller's context). `bound(...)` adds fields for a block, `bind(...)` for the rest of the
current task; `ContextFilter`, on the handler, copies them (and the current trace and span id)
onto each record, so any logger — ours or a library's — carries them.

Two formats, chosen by `AMC_LOG_FORMAT`: `text` (the default, for people: the usual line with
`[task=… attempt=… host=… step=…]` at its end) and `json` (one object per line for log
pipelines, via python-json-logger: time, level, logger, message, the fields above, exception).
Nothing here logs a value it was not given, and every line (its traceback too) is scrubbed of
the configured API keys and credential header values (`telemetry.redaction`) as it is written:
an exception's text is the provider's or a library's, not ours to vet at each call site.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import IO, Any, Literal

from opentelemetry import trace
from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pythonjsonlogger.json import JsonFormatter

from telemetry.redaction import scrub

#: The fields bound to log lines, in the order the text format shows them.
FIELDS = ("task_id", "attempt", "host_id", "step")
_SHORT = {"task_id": "task", "attempt": "attempt", "host_id": "host", "step": "step"}

_CONTEXT: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "amc_log_context", default=MappingProxyType({})
)

LogFormat = Literal["text", "json"]


class LogSettings(BaseSettings):
    """How every amc process writes its log (env prefix `AMC_LOG_`)."""

    model_config = SettingsConfigDict(env_prefix="AMC_LOG_", extra="ignore")

    #: `text` for people (default), `json` for log pipelines (one object per line).
    format: LogFormat = "text"
    #: The root level: DEBUG, INFO, WARNING, ERROR.
    level: str = "INFO"

    @field_validator("level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        """Checked here, so a typo is a setting error naming AMC_LOG_LEVEL, not the logging
        module's "Unknown level" raised once the process is half started."""
        if value.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("not a log level; use DEBUG, INFO, WARNING or ERROR")
        return value.upper()


def current() -> Mapping[str, object]:
    """The fields bound in the current context."""
    return _CONTEXT.get()


def bind(**fields: object) -> contextvars.Token[Mapping[str, object]]:
    """Bind fields for the rest of the current context (an asyncio task, or until `unbind`).
    Fields set to None are removed."""
    merged = {**_CONTEXT.get(), **fields}
    return _CONTEXT.set({k: v for k, v in merged.items() if v is not None})


def unbind(token: contextvars.Token[Mapping[str, object]]) -> None:
    """Restore the fields as they were before the `bind` that returned `token`."""
    _CONTEXT.reset(token)


@contextlib.contextmanager
def bound(**fields: object) -> Iterator[None]:
    """Bind fields for a block."""
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


class ContextFilter(logging.Filter):
    """Copies the bound fields, and the current trace and span id, onto each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _CONTEXT.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            record.trace_id = format(span.trace_id, "032x")
            record.span_id = format(span.span_id, "016x")
        return True


class TextFormatter(logging.Formatter):
    """The usual line, then the bound fields: `… [task=ab12 attempt=1 host=h1 step=3]`;
    scrubbed (`telemetry.redaction`)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = scrub(super().format(record))
        fields = [f"{_SHORT[k]}={getattr(record, k)}" for k in FIELDS if hasattr(record, k)]
        if not fields:
            return line
        first, newline, rest = line.partition("\n")  # keep a traceback below the context
        return f"{first} [{' '.join(fields)}]{newline}{rest}"


class _ScrubbedJson(JsonFormatter):
    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


def json_formatter() -> logging.Formatter:
    """One JSON object per line: time, level, logger, message, bound fields, exception;
    scrubbed (`telemetry.redaction`: what it replaces leaves the line valid JSON)."""
    return _ScrubbedJson(
        "{asctime}{levelname}{name}{message}",
        style="{",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        exc_info_as_array=False,
    )


def handler(fmt: LogFormat, stream: IO[str] | None = None) -> logging.Handler:
    """A stream handler with the context filter and the chosen format."""
    out = logging.StreamHandler(stream or sys.stderr)
    out.addFilter(ContextFilter())
    out.setFormatter(json_formatter() if fmt == "json" else TextFormatter())
    out._amc_handler = True  # type: ignore[attr-defined]  # marks the handler we own
    return out


def configure(settings: LogSettings | None = None, stream: IO[str] | None = None) -> LogFormat:
    """Make the root logger write in the configured format (replacing the handler this function
    installed before, leaving others alone). Returns the format in use."""
    settings = settings or LogSettings()
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_amc_handler", False)]:
        root.removeHandler(old)
    root.addHandler(handler(settings.format, stream))
    root.setLevel(settings.level.upper())
    return settings.format


def describe(fmt: str) -> str:
    """The start-up line's words for the log format."""
    if fmt == "json":
        return "JSON lines on stderr (AMC_LOG_FORMAT=json)"
    return "text on stderr (AMC_LOG_FORMAT=json for one JSON object per line)"


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The bound fields a record carries (for tests and tools)."""
    return {k: getattr(record, k) for k in FIELDS if hasattr(record, k)}
