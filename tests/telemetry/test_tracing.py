"""Tracing is off unless the standard OTEL_* variables ask for it: then nothing is exported,
no connection is attempted and no error is logged; asked for, spans are exported as asked.

Each case runs in a fresh interpreter (a process installs its tracer provider once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, logging, socket, sys
connects = []
def audit(event, args):
    if event == "socket.connect":
        connects.append(str(args))
sys.addaudithook(audit)
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
from opentelemetry import trace
from telemetry import tracing
said = tracing.configure("amc-test")
with tracing.span("step", {"amc.task_id": "t1"}):
    with tracing.span("plan"):
        pass
provider = trace.get_tracer_provider()
if hasattr(provider, "shutdown"):
    provider.shutdown()
exporters = sorted(m for m in sys.modules if m.startswith("opentelemetry.exporter"))
print(json.dumps({"said": said, "connects": connects, "provider": type(provider).__name__,
                  "exporters": exporters}))
"""


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_unconfigured_tracing_exports_nothing_connects_nowhere_and_logs_no_error() -> None:
    done = _run({})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["said"].startswith("off")
    assert result["connects"] == []
    # No exporter is even loaded (gRPC's own sockets would not show in the audit hook).
    assert result["exporters"] == []
    assert result["provider"] == "ProxyTracerProvider"
    assert "ERROR" not in done.stderr and "Traceback" not in done.stderr


def test_sdk_disabled_wins_over_an_endpoint() -> None:
    done = _run({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["said"] == "off (OTEL_SDK_DISABLED)" and result["connects"] == []


def test_the_console_exporter_prints_the_spans_with_the_service_name() -> None:
    done = _run({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "amc-cloud-eu"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["said"] == "on: console as service 'amc-cloud-eu'"
    assert '"name": "plan"' in done.stdout and '"amc.task_id": "t1"' in done.stdout
    assert '"service.name": "amc-cloud-eu"' in done.stdout


def test_an_otlp_endpoint_turns_the_otlp_exporter_on() -> None:
    done = _run(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_BSP_EXPORT_TIMEOUT": "1"}
    )
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["said"] == "on: otlp to http://127.0.0.1:9 as service 'amc-test'"


def test_otlp_over_http_is_refused_with_the_variable_to_change() -> None:
    done = _run(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        }
    )
    assert done.returncode != 0
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in done.stderr
    assert "TracingConfigError" in done.stderr


SECRET_SCRIPT = """
from opentelemetry import trace
from cloud.settings import CloudSettings
from telemetry import tracing
tracing.configure("amc-test")
CloudSettings(database_url="postgresql+psycopg://amc:pg7Hq2Wn5Zr8Tx@db/amc")
try:
    with tracing.span("step") as span:
        span.set_attribute("amc.note", "password=pg7Hq2Wn5Zr8Tx")
        raise RuntimeError("libpq said: password=pg7Hq2Wn5Zr8Tx")
except RuntimeError:
    pass
trace.get_tracer_provider().shutdown()
"""


def test_an_exported_span_never_carries_a_configured_secret() -> None:
    """A span records the exception that ended it (its message and traceback, as the event
    `exception`), its status description and its attributes, and the exporter sent them as
    they were: a library's text quoting the database password reached the trace backend
    though every log line is scrubbed. Spans are scrubbed as they are exported."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", SECRET_SCRIPT],
        cwd=ROOT,
        env={**clean, "OTEL_TRACES_EXPORTER": "console"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"name": "step"' in done.stdout and "libpq said" in done.stdout
    assert "pg7Hq2Wn5Zr8Tx" not in done.stdout, done.stdout
