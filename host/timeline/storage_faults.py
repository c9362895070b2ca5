"""Whether a failure was this host's own disk refusing a write, not anything the task did.

A data folder that filled up (or went read-only, or failed, or was made unwritable to the
host: its permissions changed under it) ends whatever attempt touched it: a
screenshot that cannot be saved, a timeline row that cannot be written. That is the host's
condition, like an unplugged phone: the attempt ends retryable, so the cloud queues the task
again (for this host once it has room, or another), instead of failing it for good. Before, a
full disk failed every task the host was given, each on its first attempt.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path

#: OSError numbers that mean the disk, not the data: full, over quota, read-only, failing.
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG}
#: Numbers that mean the same of a file the host writes (one the error names): a data folder
#: whose mode, owner or attributes were changed under the running host refuses every write as a
#: full one does, and an operator mends it as one frees space (docs/reliability.md). Without a
#: file named (a signal to another process, say), or naming one outside the data folders (a
#: program that is not executable, a cache folder elsewhere), they are not the disk: counted,
#: the attempt ended retryable, the host paused, its probe worked at once, and the task
#: bounced between hosts instead of failing with its real error.
_DENIED_ERRNOS = {errno.EACCES, errno.EPERM}
#: SQLite result names that mean the same (extended names start with their primary's).
_DISK_SQLITE = ("SQLITE_FULL", "SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN")


def storage_fault(exc: BaseException, folders: Iterable[Path] | None = None) -> str | None:
    """What the disk said (e.g. "No space left on device"), when `exc` or one it was raised
    from is a write this host's disk refused; None for anything else. `folders`: the host's
    data folders, when `exc` may come from anything (an attempt's end): a refused permission
    counts only for a file inside one; None when the caller touched only its own files there
    (a store's write)."""
    inside = None if folders is None else [_real(f) for f in folders]
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and (
            current.errno in _DISK_ERRNOS
            or (current.errno in _DENIED_ERRNOS and _ours(current.filename, inside))
        ):
            return current.strerror or os.strerror(current.errno)
        name = getattr(current, "sqlite_errorname", None)
        disk_name = isinstance(name, str) and name.startswith(_DISK_SQLITE)
        if isinstance(current, sqlite3.Error) and disk_name:
            return str(current) or str(name)
        current = current.__cause__ or current.__context__
    return None


def _real(path: Path) -> Path:
    """`path` absolute, its links resolved where it exists (the artifacts' folder is kept
    resolved, the others as configured)."""
    return Path(os.path.realpath(path))


def _ours(filename: object, inside: list[Path] | None) -> bool:
    """Whether an error's file is one of the host's (`inside`: its data folders; None: any)."""
    if filename is None:
        return False
    if inside is None:
        return True
    if not isinstance(filename, str | bytes | os.PathLike):
        return False
    named = _real(Path(os.fsdecode(filename)))
    return any(named == f or named.is_relative_to(f) for f in inside)


def refused_path(exc: BaseException) -> Path | None:
    """The file a refused write named, when `exc` or one it was raised from says (an open that
    failed does; a write that found the disk full, and SQLite, do not)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.filename is not None:
            return Path(os.fsdecode(current.filename))
        current = current.__cause__ or current.__context__
    return None


def storage_summary(host_id: str, reason: str) -> str:
    """An attempt's end summary for a disk fault: whose disk and what to do."""
    return (
        f"host {host_id} cannot write its data folder ({reason}); the task is retried: "
        "free space or fix the folder (AMC_HOST_DATA_DIR)"
    )
