"""The artifact store a cloud's settings ask for."""

from __future__ import annotations

from cloud.artifacts.base import ArtifactStore
from cloud.artifacts.directory import DirectoryStore
from cloud.settings import CloudSettings, SettingError


def open_artifact_store(settings: CloudSettings) -> ArtifactStore:
    """`AMC_CLOUD_ARTIFACT_STORE`: "directory" (default; `AMC_CLOUD_ARTIFACT_DIR`) or "s3"
    (`AMC_CLOUD_ARTIFACT_S3_*`; the SDK is loaded only then)."""
    if settings.artifact_store == "directory":
        return DirectoryStore(settings.resolved_artifact_dir)
    if not settings.artifact_s3_bucket:
        raise SettingError(
            "AMC_CLOUD_ARTIFACT_S3_BUCKET",
            "the S3 artifact store needs a bucket",
            "set it to an existing bucket (and AMC_CLOUD_ARTIFACT_S3_ENDPOINT_URL for a server "
            "other than AWS), or AMC_CLOUD_ARTIFACT_STORE=directory",
        )
    from cloud.artifacts.s3 import S3Store

    secret = settings.artifact_s3_secret_access_key.get_secret_value()
    return S3Store(
        settings.artifact_s3_bucket,
        prefix=settings.artifact_s3_prefix,
        endpoint_url=settings.artifact_s3_endpoint_url or None,
        region=settings.artifact_s3_region or None,
        access_key_id=settings.artifact_s3_access_key_id or None,
        secret_access_key=secret or None,
    )
