"""The artifact folder: screenshots named by task, attempt and step, never outside the folder."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from pathlib import Path

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: The mode of the folders the host makes for what it keeps (timeline, screenshots, outbox):
#: owner-only. Made with the umask's mode (0755 mostly), every account on the machine could
#: read the phones' screenshots and the prompts the host console shows only after a login.
PRIVATE_DIR = 0o700


class ArtifactPathError(ValueError):
    """A path would leave the artifact folder."""


def safe_component(value: str) -> str:
    """One path component made of safe characters only (no separators, no `..`)."""
    cleaned = _SAFE.sub("_", value).strip("._") or "_"
    return cleaned[:120]


class ArtifactStore:
    """Files under one root. Every path in and out is checked to stay inside it."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)

    def resolve(self, relative: str) -> Path:
        """An absolute path for a stored relative one; refuses anything that escapes the root
        or that no file system path can be (a NUL character, a name too long)."""
        if not relative or "\x00" in relative or Path(relative).is_absolute():
            raise ArtifactPathError(f"not a relative artifact path: {relative!r}")
        try:
            path = (self.root / relative).resolve()
        except (OSError, ValueError) as exc:
            raise ArtifactPathError(f"not an artifact path: {relative!r}") from exc
        if path != self.root and not path.is_relative_to(self.root):
            raise ArtifactPathError(f"{relative!r} escapes the artifact folder")
        return path

    def find(self, relative: str) -> Path | None:
        """The file a stored relative path names, or None when there is none (or the path is
        not one this folder can hold)."""
        try:
            path = self.resolve(relative)
            return path if path.is_file() else None
        except (ArtifactPathError, OSError):
            return None

    def task_dir_name(self, task_id: str, attempt: int) -> str:
        return f"{safe_component(task_id)}-a{int(attempt)}"

    def write(self, task_id: str, attempt: int, name: str, data: bytes) -> str:
        """Write one file for a task attempt; returns its path relative to the root.

        A write that fails (a full disk) takes its partial `.tmp` file with it: left behind it
        held the space a probe write needs to put the host back to work, and nothing removed
        it but the task's retention."""
        rel = f"{self.task_dir_name(task_id, attempt)}/{safe_component(name)}"
        path = self.resolve(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            tmp.write_bytes(data)
            tmp.replace(path)
        except BaseException:
            with contextlib.suppress(OSError):  # the write's own error is the one to raise
                tmp.unlink(missing_ok=True)
            raise
        return rel

    def read(self, relative: str) -> bytes:
        return self.resolve(relative).read_bytes()

    def delete_task(self, task_id: str, attempt: int, stop: threading.Event | None = None) -> None:
        path = self.resolve(self.task_dir_name(task_id, attempt))
        if path != self.root and path.is_dir():
            remove_tree(path, stop)

    def task_dirs(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())


def remove_tree(path: Path, stop: threading.Event | None = None) -> bool:
    """Delete a folder file by file, giving up once `stop` is set (False then): a folder of
    many thousand screenshots takes minutes, and a stopping host must not wait for it. What is
    left has no task row any more and goes with the next retention pass (`_drop_orphan_dirs`)."""
    if stop is None:
        shutil.rmtree(path, ignore_errors=True)
        return True
    for folder, dirs, files in os.walk(path, topdown=False):
        for name in files:
            if stop.is_set():
                return False
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        for name in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(folder, name))
    with contextlib.suppress(OSError):
        os.rmdir(path)
    return True
