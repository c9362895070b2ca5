"""OpenTelemetry traces: set up from the standard `OTEL_*` variables, off unless asked for.

One trace per step of a task attempt, across processes: the host's step span (with perceive,
plan, act and record below it), the Decide RPC on the host (client span) and in the cloud
(server span, the context carried in the call's gRPC metadata by
opentelemetry-instrumentation-grpc's grpc.aio interceptors), the provider call, the decision-log
write. Code here and in the packages uses the OpenTelemetry *API* only; until `configure` installs
an SDK tracer provider every span is a no-op that costs almost nothing, records nothing and sends
nothing.

`configure` installs one when the environment asks for it:
- `OTEL_SDK_DISABLED=true`: never;
- `OTEL_TRACES_EXPORTER` (comma-separated): `otlp` (OTLP over gRPC to
  `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`, default
  `http://localhost:4317`, with the exporter's other `OTEL_EXPORTER_OTLP_*` variables), `console`
  (spans as JSON on stdout, for a quick look), `none`;
- unset, `otlp` when an OTLP endpoint variable is set, else nothing;
- `OTEL_SERVICE_NAME` (default `amc-cloud`, `amc-host` or `amc`), `OTEL_RESOURCE_ATTRIBUTES`,
  `OTEL_TRACES_SAMPLER[_ARG]` and `OTEL_BSP_*` are read by the SDK as usual.
Spans are exported in batches by a background thread; a collector that is down costs dropped
spans and a log line, never a failed step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor

TRACER_NAME = "amc"

#: Long-lived streams are not traced: a span that lasts as long as a host's connection (or a
#: watcher's page) says nothing about a step.
UNTRACED = frozenset(
    {
        "/amc.v1.LeaseService/Lease",
        "/amc.v1.ProgressService/WatchProgress",
        "/amc.v1.FleetService/WatchHosts",
    }
)

_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_HTTP_PROTOCOLS = ("http/protobuf", "http/json")


class TracingConfigError(ValueError):
    """The OTEL_* variables ask for something this build cannot do (one line, for start-up)."""


def tracer() -> trace.Tracer:
    """amc's tracer (a no-op one until an SDK provider is installed)."""
    return trace.get_tracer(TRACER_NAME)


@contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[trace.Span]:
    """A span around a block, current inside it (`None` attribute values are left out)."""
    attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
    with tracer().start_as_current_span(name, attributes=attrs) as current:
        yield current


def set_attributes(target: trace.Span, attributes: Mapping[str, Any]) -> None:
    """Set the attributes whose value is not None."""
    if target.is_recording():
        target.set_attributes({k: v for k, v in attributes.items() if v is not None})


def _traced(details: Any) -> bool:
    method = details.method
    if isinstance(method, bytes):  # grpc hands the client side bytes (grpc/grpc#31092)
        method = method.decode()
    return str(method).startswith("/amc.v1.") and method not in UNTRACED


def server_interceptor() -> grpc.aio.ServerInterceptor:
    """The cloud's server interceptor: a server span per unary amc RPC, continuing the caller's
    trace from the call's metadata (W3C trace context)."""
    interceptor: grpc.aio.ServerInterceptor = aio_server_interceptor(filter_=_traced)  # type: ignore[no-untyped-call]  # the library is untyped
    return interceptor


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """A host's channel interceptors: a client span per unary amc call, its context put in the
    call's metadata. Only the unary-unary one: the Lease stream is not traced, and an
    interceptor of a kind changes the call objects of every call of that kind."""
    interceptors: list[grpc.aio.ClientInterceptor] = aio_client_interceptors(filter_=_traced)  # type: ignore[no-untyped-call]  # the library is untyped
    return interceptors[:1]


def _exporter_names() -> list[str]:
    raw = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        return ["otlp"] if any(os.environ.get(v) for v in _OTLP_ENDPOINTS) else []
    return [n.strip().lower() for n in raw.split(",") if n.strip() and n.strip() != "none"]


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp":
        protocol = os.environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
        )
        if protocol in _HTTP_PROTOCOLS:
            raise TracingConfigError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: this build exports OTLP over gRPC "
                "only; set it to grpc (the collector's port 4317) or unset it"
            )
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    raise TracingConfigError(
        f"OTEL_TRACES_EXPORTER: {name!r} is not an exporter this build has; use otlp, console "
        "or none"
    )


def configure(default_service: str) -> str:
    """Install an SDK tracer provider if the `OTEL_*` variables ask for one; return what the
    start-up banner says about tracing. Raises `TracingConfigError` for a request this build
    cannot serve. A process that already has an SDK provider (a second part of the embedded
    stack, a test) keeps it."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "off (OTEL_SDK_DISABLED)"
    names = _exporter_names()
    if not names:
        return "off (set OTEL_EXPORTER_OTLP_ENDPOINT to export traces over OTLP)"
    exporters = [_exporter(name) for name in names]
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return f"on ({', '.join(names)}; already set up in this process)"
    service = os.environ.get("OTEL_SERVICE_NAME") or default_service
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    from telemetry.scrubbed_spans import ScrubbedExporter

    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(ScrubbedExporter(exporter)))
    trace.set_tracer_provider(provider)
    where = ""
    if "otlp" in names:
        endpoint = next((os.environ[v] for v in _OTLP_ENDPOINTS if os.environ.get(v)), None)
        where = f" to {endpoint or 'http://localhost:4317'}"
    return f"on: {', '.join(names)}{where} as service {service!r}"


def describe() -> str:
    """Whether this process exports traces (for a start-up banner)."""
    from opentelemetry.sdk.trace import TracerProvider

    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        service = provider.resource.attributes.get("service.name", "")
        return f"on: exported as service {service!r} (OTEL_* variables)"
    return "off (set OTEL_EXPORTER_OTLP_ENDPOINT to export traces over OTLP)"
