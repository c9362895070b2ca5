"""`amc host run` as an integrator meets it: a real process that says what it runs where — its
phones and how it reaches them, where it plans, its certificates, its timeline, its metrics
(served, and scraped here over HTTP), tracing and logs — and stops on SIGTERM. No cloud is up:
the banner comes before the host connects, and the host keeps reconnecting meanwhile."""

from __future__ import annotations

import re
import signal
import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509

from cloud.cert_validity import when
from tests.support.mtls import server_credentials
from tests.support.processes import AMC, _clean_env, free_port, make_pki


def test_amc_host_run_says_what_it_runs_and_serves_its_metrics(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", ["lab-1"])
    env = {
        **_clean_env(),
        "AMC_HOST_DEVICE_SOURCE": "virtual",
        "AMC_HOST_DATA_DIR": str(tmp_path / "data"),
        "AMC_HOST_CLOUD_ADDRESS": f"127.0.0.1:{free_port()}",
        "AMC_HOST_CERTS_DIR": str(pki),
        "AMC_HOST_HOST_ID": "lab-1",
        "AMC_HOST_METRICS_ADDRESS": "127.0.0.1:0",
        "AMC_PLANNER_PROVIDER": "offline",
        "AMC_HOST_PLANNER_TRANSPORT": "direct",  # the banner's planner line is the direct one's
    }
    process = subprocess.Popen(
        [AMC, "host", "run"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:  # blocks until the banner is printed (or the process ends)
            lines.append(line.rstrip("\n"))
            if line.lstrip().startswith("logs:"):
                break
        banner = "\n".join(lines)
        url = re.search(r"metrics:\s+(http://127\.0\.0\.1:\d+/metrics)", banner)
        assert url, banner
        scraped = httpx.get(url.group(1), timeout=10).raise_for_status().text
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == 0
    assert banner.startswith(f"amc host lab-1 for cloud {env['AMC_HOST_CLOUD_ADDRESS']}")
    assert "phones:       emulator-5554 via 1 virtual phone(s)" in banner
    assert "planner:      direct transport: offline (model amc-offline-heuristic-1" in banner
    until = when(
        x509.load_pem_x509_certificate((pki / "host-lab-1.pem").read_bytes()).not_valid_after_utc
    )
    assert (
        f"certificates: CA {pki / 'ca.pem'}, certificate {pki / 'host-lab-1.pem'} "
        f"(valid until {until}), key"
    ) in banner
    assert f"timeline:     {tmp_path / 'data' / 'task_progress.sqlite3'}" in banner
    assert "tracing:      off" in banner
    assert 'amc_host_phones{state="idle"} 1.0' in scraped
    assert "amc_host_lease_reconnects_total" in scraped


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("AMC_HOST_CLOUD_ADDRESS", "", "empty"),
        ("AMC_HOST_CLOUD_ADDRESS", "127.0.0.1:99999", "port 99999 is out of range"),
        ("AMC_HOST_ADB_PORT", "70000", "less than or equal to 65535"),
    ],
)
def test_an_address_that_cannot_work_is_refused_at_start_naming_it(
    tmp_path: Path, setting: str, value: str, says: str
) -> None:
    """`AMC_HOST_CLOUD_ADDRESS=${CLOUD}` with CLOUD unset: the host started, printed "for cloud "
    and retried a channel to '' forever, gRPC's own resolver errors filling its log ("the
    target uri is not valid: dns:///"), where a setting that cannot work is one line, exit 2.
    So did a port no socket can have (the cloud's, or the adb server's)."""
    pki = make_pki(tmp_path / "pki", ["lab-1"])
    env = {
        **_clean_env(),
        "AMC_HOST_DATA_DIR": str(tmp_path / "data"),
        "AMC_HOST_CLOUD_ADDRESS": f"127.0.0.1:{free_port()}",
        "AMC_HOST_CERTS_DIR": str(pki),
        "AMC_HOST_HOST_ID": "lab-1",
        "AMC_HOST_METRICS_ADDRESS": "127.0.0.1:0",
        setting: value,
    }
    done = subprocess.run([AMC, "host", "run"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"amc host run: {setting}: "), lines[0]
    assert says in lines[0]


def test_a_cloud_address_where_no_lease_service_answers_stops_the_host_naming_it(
    tmp_path: Path,
) -> None:
    """A gRPC server that is not an amc cloud answers the Lease stream UNIMPLEMENTED. Before,
    the host logged "lease stream lost: UNIMPLEMENTED" and reconnected with backoff for ever;
    now it stops at once with one line naming the address and the answer, in the Node host's
    words (tests/node/test_node_host_not_a_cloud.py), exit 4 (a cloud not reached)."""
    pki = make_pki(tmp_path / "pki", ["lab-1"])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))  # no service at all
    address = f"127.0.0.1:{server.add_secure_port('127.0.0.1:0', server_credentials(pki))}"
    server.start()
    env = {
        **_clean_env(),
        "AMC_HOST_DEVICE_SOURCE": "virtual",
        "AMC_HOST_DATA_DIR": str(tmp_path / "data"),
        "AMC_HOST_CLOUD_ADDRESS": address,
        "AMC_HOST_CERTS_DIR": str(pki),
        "AMC_HOST_HOST_ID": "lab-1",
        "AMC_HOST_METRICS_ADDRESS": "127.0.0.1:0",
        "AMC_PLANNER_PROVIDER": "offline",
    }
    try:
        done = subprocess.run(
            [AMC, "host", "run"], env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        server.stop(None)
    assert done.returncode == 4, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"amc host run: {address} is not an amc cloud: it answered the Lease stream UNIMPLEMENTED ("
    ), done.stderr
    assert last.endswith("); check AMC_HOST_CLOUD_ADDRESS"), done.stderr
    # UNIMPLEMENTED is never retried. A first try a loaded machine failed otherwise (twice in
    # dry runs: "INTERNAL: Internal error from Core" from this thread-pool server) is retried
    # like any lost stream, which is right, and then meets UNIMPLEMENTED.
    assert "lease stream lost: UNIMPLEMENTED" not in done.stderr, done.stderr
