"""The artifact store: step screenshots as objects in a directory or an S3-compatible bucket."""

from cloud.artifacts.base import (
    ArtifactStore,
    ArtifactStoreUnavailable,
    every_format,
    object_key,
)
from cloud.artifacts.directory import DirectoryStore
from cloud.artifacts.factory import open_artifact_store

__all__ = [
    "ArtifactStore",
    "ArtifactStoreUnavailable",
    "DirectoryStore",
    "every_format",
    "object_key",
    "open_artifact_store",
]
