"""The `/metrics` endpoint of one process: prometheus-client's own HTTP server on its own thread.

Each process (a cloud replica, a host) serves its own registry on its own address, so
Prometheus scrapes every replica and every host separately and nothing is shared between
processes. The server is prometheus-client's WSGI server: it answers `/metrics` (and gzip when
asked) in a daemon thread, so a scrape never waits for the event loop and the event loop never
waits for a scrape. Port 0 picks a free port (tests); `address` says which.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

#: What turns the endpoint off.
OFF = frozenset({"", "off", "none", "0"})


class MetricsAddressError(ValueError):
    """The metrics address is not host:port, or cannot be listened on."""


def split_address(address: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets) → (host, port)."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise MetricsAddressError(f"{address!r} is not host:port (e.g. 127.0.0.1:9471)")
    if int(port) > 65535:  # socket's OverflowError was an "unexpected" error that stopped it
        raise MetricsAddressError(f"{address!r}: port {port} is out of range (0 to 65535)")
    return host.strip("[]"), int(port)


@dataclass(slots=True)
class MetricsServer:
    """A running `/metrics` endpoint."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        host = str(host)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def stop(self) -> None:
        """Stop serving and wait for the thread (idempotent)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(address: str, registry: CollectorRegistry) -> MetricsServer | None:
    """Serve `registry` at `http://address/metrics`; None when `address` turns it off. Raises
    `MetricsAddressError` for an address it cannot listen on."""
    if address.strip().lower() in OFF:
        return None
    host, port = split_address(address)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise MetricsAddressError(f"cannot listen on {address} ({exc.strerror or exc})") from exc
    return MetricsServer(server, thread)
