"""Certificate files that vanish while `amc host run` runs (deleted and copied in again, a
folder a tool replaces), and what the host says while its files keep it from connecting:
each problem once, a reminder at most every `REMIND_S`, and the connection that follows
(docs/deployment.md, "Certificates and rotation"; host.js alike:
tests/node/test_node_host_certificate_files.py).

Real parts: certificate files issued by the fleet CA (`cloud.pki`) in a temporary folder; the
runner's host against the in-test LeaseService of lease_fake.py (`_host_against_cloud`), or a
lease client dialing the host's own channels; the planner's channel opened from the files.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from pathlib import Path

import grpc
import pytest

from cloud import pki
from host import cloud_channel
from host.cloud_channel import CertificateMissing, ChannelOnce, LeaseDialer
from host.lease_client import LeaseClient, LeaseClientConfig
from host.metrics import REGISTRY
from host.not_connecting import REMIND_S, NotConnecting
from host.planner_client import CloudPlanError, CloudPlanner
from host.settings import HostSettings
from planner.scene import Scene
from tests.host.test_certificate_rotation import _host_against_cloud
from tests.host.test_host_certificates import _never_runs, _NoPhones
from tests.support.bad_certs import flawed_copy
from tests.support.waiting import until

HOST_ID = "h1"


def _reconnects() -> float:
    """The lease stream's attempts after a failure so far (`amc_host_lease_reconnects`)."""
    return REGISTRY.get_sample_value("amc_host_lease_reconnects_total") or 0.0


def _lines(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def _copied_in(path: Path, body: bytes) -> None:
    """`body` put back at `path` as docs/deployment.md says to: a temporary name, then `mv`."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_bytes(body)
    staged.chmod(0o600)
    os.replace(staged, path)


async def test_a_file_gone_after_the_host_connected_is_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The host's key is deleted while it runs, and its stream is lost: its next connection
    attempt found the file missing and the host stopped (CertificateMissing, exit 2), where
    files gone bad are checked again. It now says the file is missing, once, tries again with
    its backoff, and connects once the file is back, saying so."""
    caplog.set_level(logging.WARNING, logger="host.lease_client")
    async with _host_against_cloud(tmp_path) as rig:
        key = rig.cert.with_suffix(".key")
        body = key.read_bytes()
        key.unlink()
        tried = _reconnects()
        rig.cloud.cut()  # the stream is lost: the host reconnects, without its key
        await until(
            lambda: _reconnects() >= tried + 4 or rig.served.done(), 30, "attempts without it"
        )
        assert not rig.served.done(), rig.served.exception()
        _copied_in(key, body)
        await rig.cloud.wait_for(lambda: len(rig.cloud.hellos) == 2 or rig.served.done(), 30)
        await until(lambda: rig.app.lease.connected or rig.served.done(), 30, "the welcome")
        assert not rig.served.done(), rig.served.exception()
    said = _lines(caplog, "not connecting")
    assert len(said) == 1, said
    assert said[0].startswith(f"not connecting: {key} is missing; put it back"), said
    assert "Checking again in" in said[0]
    [back] = _lines(caplog, "connected to the cloud again")
    assert f"(they could not: {key} is missing)" in back


async def test_a_file_missing_at_the_first_attempt_still_stops_the_host(tmp_path: Path) -> None:
    """Before the host made a connection from its files, a missing one is a setting to fix:
    the lease client raises it (`amc host run`: exit 2), as before."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    settings = HostSettings(
        cloud_address="127.0.0.1:1", certs_dir=tmp_path / "pki", host_id=HOST_ID,
        data_dir=tmp_path / "h",
    )  # fmt: skip
    (tmp_path / "pki" / pki.host_files(HOST_ID)[1]).unlink()
    client = LeaseClient(
        LeaseDialer(settings), _NoPhones(), _never_runs, LeaseClientConfig(reconnect_max_s=0.1)
    )
    with pytest.raises(CertificateMissing, match=r"client key .* does not exist"):
        await asyncio.wait_for(client.run(asyncio.Event()), 30)


async def test_a_problem_with_the_files_is_said_once_not_at_every_attempt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Files the cloud would refuse (here: the certificate expired after the host read them)
    were said at every connection attempt (every `AMC_HOST_RECONNECT_MAX_S`): the same line
    filled the log for as long as they stayed bad. Said once now."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    bad = tmp_path / "expired"
    cert = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", "expired", bad)
    settings = HostSettings(
        cloud_address="127.0.0.1:1", certs_dir=bad, host_id=HOST_ID, data_dir=tmp_path / "h"
    )
    client = LeaseClient(
        LeaseDialer(settings),
        _NoPhones(),
        _never_runs,
        LeaseClientConfig(reconnect_initial_s=0.01, reconnect_max_s=0.05),
        rng=random.Random(7),
    )
    caplog.set_level(logging.ERROR, logger="host.lease_client")
    stop = asyncio.Event()
    tried = _reconnects()
    running = asyncio.create_task(client.run(stop))
    try:
        await until(lambda: _reconnects() >= tried + 5 or running.done(), 30, "five attempts")
    finally:
        stop.set()
        await running
    said = _lines(caplog, "not connecting")
    assert len(said) == 1, said
    assert said[0].startswith(f"not connecting: host certificate {cert} expired"), said


def test_a_problem_still_there_is_said_again_as_a_reminder() -> None:
    """Said once, a problem is said again only `REMIND_S` after it was last said ("still not
    connecting"); another problem is said at once; an attempt that got past the files makes
    the same problem, found again, a new one; the welcome says which one was fixed."""
    now = [0.0]
    notice = NotConnecting(clock=lambda: now[0])
    expired = "host certificate c.pem expired 2026-01-01 00:00 UTC"
    early = "host certificate c.pem is not valid before 2027-01-01 00:00 UTC"
    said = []
    for step in range(0, 1300, 30):  # an attempt every 30 s for 21 minutes
        now[0] = float(step)
        said.append((step, notice.said(expired)))
    assert [(t, s) for t, s in said if s] == [
        (0, "not connecting"),
        (600, "still not connecting"),
        (1200, "still not connecting"),
    ]
    clocked = f"{early} (this machine's clock says 2026-12-07 10:1%d UTC)"
    assert notice.said(clocked % 0) == "not connecting"  # another problem
    now[0] += 60
    assert notice.said(clocked % 1) == ""  # the same one: only its clock moved
    notice.passed()
    assert notice.said(clocked % 2) == "not connecting"
    assert notice.connected() == clocked % 2
    assert notice.connected() == ""
    assert REMIND_S == 600.0


async def test_the_planner_waits_for_a_file_missing_when_its_channel_is_made(
    tmp_path: Path,
) -> None:
    """A step's Decide whose channel is made while a certificate file is missing (its first
    opening failed; the files are copied in again): CertificateMissing failed the task for
    good, where an OSError (the files hang) is the cloud unreachable for now. So is a missing
    file: the agent loop waits and asks again."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    key = tmp_path / "pki" / pki.host_files(HOST_ID)[1]
    settings = HostSettings(
        cloud_address="127.0.0.1:1", certs_dir=tmp_path / "pki", host_id=HOST_ID,
        data_dir=tmp_path / "h",
    )  # fmt: skip
    key.unlink()
    once = ChannelOnce(settings)
    planner = CloudPlanner(once.get, task_id="t1", attempt=1, lease_id="l1")
    scene = Scene([], "com.android.settings", "Settings", 1080, 2400)
    try:
        with pytest.raises(CloudPlanError) as err:
            await planner.decide("Turn on dark theme", scene, [])
    finally:
        await once.close()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert f"client key {key} does not exist" in str(err.value)
    assert cloud_channel.latest(settings) is None
