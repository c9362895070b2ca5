"""The host's planner channel (`PlannerService.Decide`, the cloud transport) names the host
certificate the cloud refused, against a real cloud on loopback: that channel is opened once, at
start, and outlives the certificate it was opened with; its next handshake after the expiry
fails, and gRPC says only "Socket closed"."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from cloud.cert_validity import when
from host.agent.loop import TaskSpec
from host.planner_client import CloudPlanError
from host.runner import build_host, cloud_planner
from host.settings import HostSettings
from planner.scene import Scene
from tests.host.test_host_certificates import HOST_ID, real_cloud
from tests.support.bad_certs import expired, flawed_copy
from tests.support.waiting import until


async def test_the_planner_names_a_host_certificate_that_expired_after_its_channel_opened(
    tmp_path: Path,
) -> None:
    """A host on the cloud transport, built (its planner channel opened) while its certificate
    is valid; once it expired, an attempt's Decide fails naming the file and the date, as the
    lease client and the outbox do. Without `failure` on the planner's calls (the runner's
    `cloud_planner`), it said "cloud planner: UNAVAILABLE: … Socket closed"."""
    async with real_cloud(tmp_path) as cloud:
        short = tmp_path / "pki_short"
        cert = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", "expires_in_seconds", short)
        end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
        settings = HostSettings(
            cloud_address=cloud.address,
            certs_dir=short,
            host_id=HOST_ID,
            data_dir=tmp_path / "h",
            planner_transport="cloud",
            ocr_enabled=False,
        )
        app = build_host(settings)
        try:
            await until(lambda: expired(end), 30, "the host certificate expired")
            spec = TaskSpec("t1", 1, "Turn on dark theme", "emulator-5554", lease_id="l1")
            scene = Scene([], "com.android.settings", "Settings", 1080, 2400)
            with pytest.raises(CloudPlanError) as err:
                await cloud_planner(app, spec).decide(spec.goal, scene, [])
        finally:
            assert app.planner_channel is not None
            await app.planner_channel.close(grace=None)
            app.close()
    assert str(err.value) == (
        f"cloud planner: host certificate {cert} expired {when(end)} (the cloud refuses it)"
    )
