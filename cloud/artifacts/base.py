"""What the cloud needs from an artifact store, and how it names a step screenshot in one.

The database keeps only the key and what the object is (`step_screenshots`); the bytes live
here, so a deployment can put them in a bucket with its own lifecycle and the database stays
small. Every store answers the same three calls; an unreachable store raises
`ArtifactStoreUnavailable` (the RPCs answer UNAVAILABLE), a missing object reads as None.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

_SAFE = re.compile(r"[A-Za-z0-9_-]{1,128}")
_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg"}


class ArtifactStoreUnavailable(RuntimeError):
    """The store could not be reached or refused the call; try again later."""


def object_key(task_id: str, attempt: int, step_index: int, phase: str, content_type: str) -> str:
    """`<task>/<attempt>/<step>-<phase>.<ext>`: one object per step and phase, so an upload
    again replaces it. Ids are the cloud's own (checked here all the same: a key never
    climbs out of its prefix)."""
    if not _SAFE.fullmatch(task_id) or phase not in ("before", "after"):
        raise ValueError(f"not a key for task {task_id!r}, phase {phase!r}")
    return f"{task_id}/{int(attempt)}/{int(step_index):05d}-{phase}.{_EXTENSIONS[content_type]}"


def every_format(key: str) -> list[str]:
    """The keys of `key`'s step and phase in every format: one row names only the latest, yet
    an earlier upload in another format may still be in the store (its delete failed, or the
    cloud stopped before it), so whatever deletes a step's screenshot deletes them all."""
    stem = key.rsplit(".", 1)[0]
    return [f"{stem}.{extension}" for extension in _EXTENSIONS.values()]


class ArtifactStore(Protocol):
    """Objects by key."""

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        """Store (or replace) one object."""
        ...

    async def get(self, key: str) -> bytes | None:
        """One object's bytes; None when there is no such object."""
        ...

    async def delete(self, keys: Sequence[str]) -> None:
        """Delete these objects (missing ones are fine)."""
        ...

    def describe(self) -> str:
        """Where objects go, for the start-up banner (no secrets)."""
        ...
