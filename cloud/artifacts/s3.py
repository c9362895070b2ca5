"""The artifact store on an S3-compatible bucket (AWS S3, MinIO, SeaweedFS, Ceph RGW …).

boto3 (the AWS SDK) in worker threads: its low-level clients are thread-safe, and a screenshot
is one small PUT or GET, so a thread per call costs less than an async SDK's extra stack.
Credentials: the explicit settings when given, else boto3's usual chain (AWS_* variables,
shared config, an instance role). Keys are prefixed with `prefix` so a bucket can be shared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from cloud.artifacts.base import ArtifactStoreUnavailable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_MISSING = {"NoSuchKey", "404", "NotFound"}
_DELETE_BATCH = 1000  # DeleteObjects takes at most 1,000 keys


class S3Store:
    """Objects in `bucket` under `prefix`."""

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url
        config = Config(
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"max_attempts": 2, "mode": "standard"},
            # Path-style addressing: what S3-compatible servers on a plain host:port answer.
            s3={"addressing_style": "path"} if endpoint_url else {},
        )
        kwargs: dict[str, Any] = {"config": config}
        if endpoint_url:
            kwargs["endpoint_url"] = endpoint_url
        if region:
            kwargs["region_name"] = region
        if access_key_id and secret_access_key:
            kwargs["aws_access_key_id"] = access_key_id
            kwargs["aws_secret_access_key"] = secret_access_key
        self.client: S3Client = boto3.session.Session().client("s3", **kwargs)

    def _key(self, key: str) -> str:
        return self.prefix + key

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        try:
            await asyncio.to_thread(
                self.client.put_object,
                Bucket=self.bucket,
                Key=self._key(key),
                Body=data,
                ContentType=content_type,
            )
        except (BotoCoreError, ClientError) as exc:
            raise ArtifactStoreUnavailable(f"bucket {self.bucket}: {exc}") from exc

    def _get(self, key: str) -> bytes | None:
        try:
            reply = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                return None
            raise
        return reply["Body"].read()

    async def get(self, key: str) -> bytes | None:
        try:
            return await asyncio.to_thread(self._get, key)
        except (BotoCoreError, ClientError) as exc:
            raise ArtifactStoreUnavailable(f"bucket {self.bucket}: {exc}") from exc

    def _delete(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = keys[start : start + _DELETE_BATCH]
            reply = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": self._key(k)} for k in batch], "Quiet": True},
            )
            failed = [e for e in reply.get("Errors", []) if e.get("Code") not in _MISSING]
            if failed:
                raise ArtifactStoreUnavailable(f"bucket {self.bucket}: could not delete {failed}")

    async def delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        try:
            await asyncio.to_thread(self._delete, list(keys))
        except (BotoCoreError, ClientError) as exc:
            raise ArtifactStoreUnavailable(f"bucket {self.bucket}: {exc}") from exc

    def describe(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3 bucket {self.bucket}{where}" + (
            f" (prefix {self.prefix})" if self.prefix else ""
        )
