"""Private key files that others on the machine can read: said once, with the `chmod` that fixes it.

A key readable by its group or by everyone lets any account on the machine act as its
certificate's owner (a host, the cloud) or, for `ca.key`, mint certificates the whole fleet
trusts. `amc certs` writes keys owner-only (mode 600), but a copy, an archive, a config tool or
a volume mount loses that, and nothing said so.

Said, not refused (unlike ssh's "UNPROTECTED PRIVATE KEY FILE"): keys are often mounted where
the process cannot change their mode (a Kubernetes Secret's default 0644, a read-only bind
mount, a filesystem without Unix modes), and a fleet that worked before an upgrade must not stop
for it; the operator who reads the warning fixes it at its source.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path

log = logging.getLogger(__name__)

#: Permission bits that let someone else than the owner read the file.
_OTHERS_READ = stat.S_IRGRP | stat.S_IROTH

_said: set[Path] = set()
_said_lock = threading.Lock()


def readable_by_others(path: Path) -> str:
    """Why `path` is too open ("" when it is not, cannot be looked at, or on Windows, whose
    files carry no Unix modes): names the file, its mode and the command that fixes it."""
    if os.name == "nt":
        return ""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return ""
    if not mode & _OTHERS_READ:
        return ""
    who = " and ".join(
        name
        for bit, name in ((stat.S_IRGRP, "its group"), (stat.S_IROTH, "everyone"))
        if mode & bit
    )
    return (
        f"the private key {path} can be read by {who} (mode {mode:04o}): whoever reads it can "
        f"act as its certificate's owner; run `chmod 600 {path}`"
    )


def warn_if_readable(path: Path | None) -> str:
    """Log a warning once per file (per process) when `path` is readable by others; what was
    said ("" when nothing, or said before)."""
    if path is None:
        return ""
    said = readable_by_others(path)
    if not said:
        return ""
    with _said_lock:
        if path in _said:
            return ""
        _said.add(path)
    log.warning("%s", said)
    return said
