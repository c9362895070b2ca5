"""Spans leave the process scrubbed, as log lines do (`telemetry.redaction`).

A span records the exception that ended it (its message and traceback, the event
`exception`), its status description and its attributes; the SDK exports them as they were,
so a library's text quoting a configured secret reached the trace backend though every log
line is scrubbed. Every exporter `tracing.configure` installs is wrapped in `ScrubbedExporter`,
which sends a copy of each span with its text scrubbed. Imported only once tracing is on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status

from telemetry.redaction import scrub


def _value(value: Any) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, tuple | list):
        return type(value)(_value(v) for v in value)
    return value


def _attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if attributes is None else {k: _value(v) for k, v in attributes.items()}


def scrubbed(span: ReadableSpan) -> ReadableSpan:
    """A copy of `span` with its attributes, its events' attributes and its status
    description scrubbed."""
    status = span.status
    if status.description:
        status = Status(status.status_code, scrub(status.description))
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=_attributes(span.attributes),
        events=[Event(e.name, _attributes(e.attributes), e.timestamp) for e in span.events],
        links=span.links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class ScrubbedExporter(SpanExporter):
    """`inner`, sent scrubbed copies of the spans."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result: SpanExportResult = self._inner.export([scrubbed(s) for s in spans])
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))
