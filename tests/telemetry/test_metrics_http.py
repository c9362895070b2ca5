"""The `/metrics` endpoint's address: what it refuses is a `MetricsAddressError`, which the cloud
and the host turn into "metrics not served" in their banner and keep running."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from telemetry import metrics_http


@pytest.mark.parametrize("address", ["127.0.0.1:65536", "127.0.0.1:99999", "[::1]:70000"])
def test_a_port_out_of_range_is_an_address_error(address: str) -> None:
    """socket's OverflowError ("bind(): port must be 0-65535.") went through as an "unexpected"
    error: `amc host run` stopped with exit 70, `amc cloud serve` with gRPC's traceback."""
    with pytest.raises(metrics_http.MetricsAddressError, match="out of range"):
        metrics_http.serve(address, CollectorRegistry())
