"""The default artifact store: one file per object under a directory (written atomically)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from cloud.artifacts.base import ArtifactStoreUnavailable


class DirectoryStore:
    """Objects as files under `root`; a key never resolves outside it."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root) or path == self.root:
            raise ValueError(f"artifact key {key!r} leaves the store")
        return path

    def _put(self, key: str, data: bytes) -> None:
        path = self.path(key)
        # Owner-only when made here: the phones' screenshots are the cloud account's alone
        # (made with the umask's mode, 0755 mostly, any account on the machine read them).
        # A folder that exists keeps its mode.
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        try:
            await asyncio.to_thread(self._put, key, data)
        except OSError as exc:
            raise ArtifactStoreUnavailable(f"artifact directory {self.root}: {exc}") from exc

    async def get(self, key: str) -> bytes | None:
        path = self.path(key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ArtifactStoreUnavailable(f"artifact directory {self.root}: {exc}") from exc

    def _delete(self, keys: Sequence[str]) -> None:
        parents: set[Path] = set()
        for key in keys:
            path = self.path(key)
            path.unlink(missing_ok=True)
            parents.update(p for p in path.parents if p.is_relative_to(self.root))
        # Empty task and attempt folders go too (deepest first).
        for folder in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            if folder != self.root:
                with contextlib.suppress(OSError):  # not empty: other objects live there
                    folder.rmdir()

    async def delete(self, keys: Sequence[str]) -> None:
        try:
            await asyncio.to_thread(self._delete, keys)
        except OSError as exc:
            raise ArtifactStoreUnavailable(f"artifact directory {self.root}: {exc}") from exc

    def describe(self) -> str:
        return f"directory {self.root}"
