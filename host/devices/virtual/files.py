"""A tiny in-memory filesystem: where `uiautomator dump` writes and what adb sync reads."""

from __future__ import annotations

import posixpath
import stat
import threading
import time
from dataclasses import dataclass

DIR_MODE = stat.S_IFDIR | 0o771
FILE_MODE = stat.S_IFREG | 0o644
ALIASES = {"/storage/emulated/0": "/sdcard", "/storage/self/primary": "/sdcard"}
INITIAL_DIRS = [
    "/",
    "/data",
    "/data/local",
    "/data/local/tmp",
    "/sdcard",
    "/sdcard/Download",
    "/sdcard/Pictures",
    "/storage",
    "/storage/emulated",
    "/system",
    "/system/bin",
]


@dataclass
class Stat:
    mode: int
    size: int
    mtime: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


def normalize(path: str) -> str:
    path = "/" + posixpath.normpath(path.strip()).lstrip("/")
    if path == "/.":
        path = "/"
    for alias, real in ALIASES.items():
        if path == alias or path.startswith(alias + "/"):
            path = real + path[len(alias) :]
    return path


class VirtualFs:
    """Files are bytes with a mode and mtime; directories are explicit (or made by writes)."""

    def __init__(self) -> None:
        now = int(time.time())
        self._dirs: dict[str, int] = {d: now for d in INITIAL_DIRS}
        self._files: dict[str, tuple[bytes, int, int]] = {}
        # Several adb connections (threads) may touch one phone's files at once.
        self._lock = threading.RLock()

    def _stat(self, path: str) -> Stat | None:
        path = normalize(path)
        if path in self._files:
            data, mode, mtime = self._files[path]
            return Stat(mode, len(data), mtime)
        if path in self._dirs:
            return Stat(DIR_MODE, 4096, self._dirs[path])
        return None

    def _read(self, path: str) -> bytes | None:
        entry = self._files.get(normalize(path))
        return entry[0] if entry else None

    def _write(
        self, path: str, data: bytes, mode: int = FILE_MODE, mtime: int | None = None
    ) -> bool:
        path = normalize(path)
        if path in self._dirs:
            return False
        parent = posixpath.dirname(path)
        while parent not in self._dirs:
            if parent in self._files:
                return False
            self._dirs[parent] = int(time.time())
            parent = posixpath.dirname(parent)
        if not stat.S_IFMT(mode):
            mode |= stat.S_IFREG
        self._files[path] = (data, mode, mtime if mtime is not None else int(time.time()))
        return True

    def _append(self, path: str, data: bytes) -> bool:
        return self._write(path, (self._read(path) or b"") + data)

    def _remove(self, path: str, *, recursive: bool = False) -> bool:
        path = normalize(path)
        if path in self._files:
            del self._files[path]
            return True
        if recursive and path in self._dirs and path != "/":
            for p in [p for p in self._files if p.startswith(path + "/")]:
                del self._files[p]
            for p in [p for p in self._dirs if p == path or p.startswith(path + "/")]:
                del self._dirs[p]
            return True
        return False

    def _mkdir(self, path: str) -> bool:
        path = normalize(path)
        if path in self._files:
            return False
        self._dirs.setdefault(path, int(time.time()))
        parent = posixpath.dirname(path)
        if parent != path:
            self._mkdir(parent)
        return True

    def _listdir(self, path: str) -> list[tuple[str, Stat]] | None:
        path = normalize(path)
        if path not in self._dirs:
            return None
        prefix = path.rstrip("/") + "/"
        out: list[tuple[str, Stat]] = []
        for p in sorted({*self._dirs, *self._files}):
            if p != path and p.startswith(prefix) and "/" not in p[len(prefix) :]:
                st = self._stat(p)
                if st is not None:
                    out.append((p[len(prefix) :], st))
        return out

    def stat(self, path: str) -> Stat | None:
        with self._lock:
            return self._stat(path)

    def read(self, path: str) -> bytes | None:
        with self._lock:
            return self._read(path)

    def write(
        self, path: str, data: bytes, mode: int = FILE_MODE, mtime: int | None = None
    ) -> bool:
        """Create or replace a file; parent directories are made, as adb push does."""
        with self._lock:
            return self._write(path, data, mode, mtime)

    def append(self, path: str, data: bytes) -> bool:
        with self._lock:
            return self._append(path, data)

    def remove(self, path: str, *, recursive: bool = False) -> bool:
        with self._lock:
            return self._remove(path, recursive=recursive)

    def mkdir(self, path: str) -> bool:
        with self._lock:
            return self._mkdir(path)

    def listdir(self, path: str) -> list[tuple[str, Stat]] | None:
        with self._lock:
            return self._listdir(path)
