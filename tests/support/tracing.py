"""An in-memory span exporter for the tests that look at traces.

OpenTelemetry lets a process install its tracer provider once, so the first test that asks
installs an SDK provider with a `SimpleSpanProcessor` over one `InMemorySpanExporter` and every
later test of the process reuses it (clearing it first). Spans are exported as they end; a test
reads `exporter.get_finished_spans()`.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER: InMemorySpanExporter | None = None


def memory_exporter() -> InMemorySpanExporter:
    """The process's in-memory exporter, installed on first use, emptied."""
    global _EXPORTER
    if _EXPORTER is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider(resource=Resource.create({SERVICE_NAME: "amc-tests"}))
            trace.set_tracer_provider(provider)
        _EXPORTER = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    _EXPORTER.clear()
    return _EXPORTER
