"""The context file `amc up` leaves for the commands run beside it.

`amc up` writes where its cloud listens, its certificates, its operator and its consoles to
`$AMC_CONTEXT_FILE` (default `$XDG_STATE_HOME/amc/context.json`, i.e.
`~/.local/state/amc/context.json`) and removes it when it stops, so a bare `amc task list` in
another terminal talks to the running stack. Explicit options and environment variables
(--cloud, --pki-dir, --operator; AMC_CLOUD, AMC_PKI_DIR, AMC_OPERATOR) always win, and a file
left behind by a stack that is gone (its process no longer runs) is ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

ENV = "AMC_CONTEXT_FILE"


def path() -> Path:
    """Where the context file is (it may not exist)."""
    explicit = os.environ.get(ENV)
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "amc" / "context.json"


@dataclass(frozen=True, slots=True)
class Context:
    """A running embedded stack, as `amc up` described it."""

    cloud: str
    pki_dir: str
    operator: str
    console_url: str
    host_data_dir: str
    pid: int


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write(context: Context) -> Path:
    """Record a running stack (readable by this user only)."""
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(context), indent=2) + "\n")
    temporary.chmod(0o600)
    temporary.replace(target)
    return target


def read() -> Context | None:
    """The running stack's context, None when there is none (or it is stale or unreadable)."""
    try:
        data = json.loads(path().read_text())
        found = Context(**data)
    except (OSError, ValueError, TypeError):
        return None
    return found if _alive(found.pid) else None


def remove(pid: int) -> None:
    """Forget the context this process (`pid`) wrote; another stack's is left alone."""
    target = path()
    try:
        data = json.loads(target.read_text())
    except (OSError, ValueError):
        return
    if data.get("pid") == pid:
        target.unlink(missing_ok=True)
