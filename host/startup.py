"""What `amc host run` tells the person who starts it, once the host is assembled.

Who it is, where its cloud is and where its certificates come from, which phones it drives and
how, where planning happens (the cloud, or a model it calls itself, with the model's price),
where its timeline is kept, and where its metrics, traces and logs go. No secret is printed:
certificate and key paths, never their contents; the provider, never its key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloud.cert_validity import when
from host.devices.adb_errors import start_server_hint
from host.devices.registry import refused_serial
from telemetry import logs, tracing
from telemetry.metrics_http import MetricsServer

if TYPE_CHECKING:
    from host.runner import HostApp


def _planner(app: HostApp) -> str:
    s = app.settings
    if s.planner_transport == "cloud":
        return "cloud transport: the cloud plans each step (PlannerService.Decide)"
    if app.direct_planner is not None:
        return "direct transport: a planner given by the caller"
    ps = app.planner_settings
    if ps is None:
        return "direct transport"
    line = (
        f"direct transport: {ps.resolved_provider} (model {ps.resolved_model}, {ps.mode} mode; "
        "AMC_PLANNER_* settings)"
    )
    from planner.prices import PriceTable

    return f"{line}; {PriceTable.load(ps.prices_file).describe(ps.resolved_model)}"


def _valid_until(app: HostApp) -> str:
    """When the certificate stops working: the one date a person must act before. As the
    start read it (`HostApp.certificate`): read here, on the event loop, a certs folder on a
    disk that hangs stalled the host at its banner."""
    validity = app.certificate
    return f" (valid until {when(validity.not_after)})" if validity is not None else ""


def describe(
    app: HostApp, *, metrics: MetricsServer | None = None, metrics_note: str = ""
) -> list[str]:
    """The banner's lines."""
    s = app.settings
    devices = app.registry.devices()
    phones = [d.serial for d in devices if not refused_serial(d.serial)]
    # A phone the cloud would refuse is left out of the hello: listed among the phones, it
    # looked like one that could get work.
    refused = [
        f"  refused:      {d.serial} (left out: {why}; it gets no work)"
        for d in devices
        if (why := refused_serial(d.serial))
    ]
    if s.device_source == "virtual":
        source = f"{s.virtual_phones} virtual phone(s) behind adb {s.adb_host}:{s.adb_port}"
    else:
        source = f"adb server {s.adb_host}:{s.adb_port} ({s.driver})"
        if not app.registry.server_answers:
            hint = start_server_hint(s.adb_host, s.adb_port)
            source += f", which does not answer: start it with {hint}"
    certs = (
        f"CA {s.ca_cert}, certificate {s.client_cert}{_valid_until(app)}, key {s.client_key}"
        if s.client_cert
        else "none configured (AMC_HOST_CERTS_DIR + AMC_HOST_HOST_ID)"
    )
    if metrics is not None:
        metric_line = f"{metrics.url} (AMC_HOST_METRICS_ADDRESS)"
    else:
        metric_line = metrics_note or "not served"
    return [
        f"amc host {s.host_id or '(id from its certificate)'} for cloud {s.cloud_address}",
        f"  phones:       {', '.join(phones) or 'none attached yet'} via {source}",
        *refused,
        f"  planner:      {_planner(app)}",
        f"  certificates: {certs}",
        f"  timeline:     {s.resolved_db_path} (screenshots in {s.resolved_artifact_dir})",
        f"  metrics:      {metric_line}",
        f"  tracing:      {tracing.describe()}",
        f"  logs:         {logs.describe(logs.LogSettings().format)}",
    ]
