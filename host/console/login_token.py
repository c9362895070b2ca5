"""One-time login tokens: printed when the console starts, and on demand (`amc host token`).

Whoever can read the host's log (its terminal, its journal) or write its data folder may use
the console; nobody else can, and there is no password to configure or leak. A token works
once: after a successful login a fresh one is made and printed (through `on_rotate`), so a
token seen later (shell history, a screenshot, a browser's address bar) is already useless,
and the log always shows one that works.

`amc host token` runs in another process: it `issue`s a token by creating a file named by the
token's SHA-256 in the console's token folder (`<host data dir>/console-tokens`, 0700). The
console accepts such a token once, within `ISSUED_TTL_S`, by deleting that file: an unlink
succeeds for exactly one caller, so even two consoles sharing the folder cannot both accept
it. Only hashes are on disk, never a token.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

#: The token folder inside a host's data folder.
TOKEN_DIR_NAME = "console-tokens"
#: Where a serving console writes its base URL, for `amc host token` to print a login link.
URL_FILE = "console-url"
#: How long a token made by `amc host token` stays usable.
ISSUED_TTL_S = 600.0


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_dir(data_dir: Path) -> Path:
    """A host's token folder."""
    return data_dir / TOKEN_DIR_NAME


def issue(directory: Path, *, now: float | None = None) -> str:
    """A fresh one-time token for the console whose token folder is `directory` (created
    0700 when missing); expired ones left behind are removed on the way."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    moment = time.time() if now is None else now
    for stale in directory.glob("[0-9a-f]" * 64):
        with contextlib.suppress(OSError):
            if moment - stale.stat().st_mtime > ISSUED_TTL_S:
                stale.unlink()
    token = secrets.token_urlsafe(24)
    fd = os.open(directory / _digest(token).hex(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    return token


def served_url(directory: Path) -> str | None:
    """The base URL the console serving from this token folder wrote, if one is serving."""
    try:
        return (directory / URL_FILE).read_text().strip() or None
    except OSError:
        return None


class OneTimeToken:
    """The current token (to print) and its hash (compared in constant time); `redeem` uses it,
    and tokens issued into `issued_dir` by another process."""

    def __init__(
        self,
        token: str | None = None,
        *,
        issued_dir: Path | None = None,
        on_rotate: Callable[[str], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._hash = b""
        self.current = ""
        self.issued_dir = issued_dir
        #: Told the next token after every successful login (the console prints it).
        self.on_rotate = on_rotate
        self.rotate(token)

    def rotate(self, token: str | None = None) -> str:
        """Replace the token (the old one stops working); returns the new one."""
        new = token or secrets.token_urlsafe(24)
        with self._lock:
            self._hash = _digest(new)
            self.current = new
        return new

    def redeem(self, candidate: str) -> bool:
        """True once for the current token (constant-time compare), then a new token is made;
        or once for a token issued into `issued_dir` that has not expired."""
        candidate = candidate.strip()
        if not candidate:
            return False
        with self._lock:
            ok = hmac.compare_digest(_digest(candidate), self._hash)
            if ok:
                # Consumed: make the next one now, under the same lock, so it cannot be reused.
                self.current = secrets.token_urlsafe(24)
                self._hash = _digest(self.current)
        if not ok:
            ok = self._redeem_issued(candidate)
        if ok:
            log.info("host console: a login token was used")
            if self.on_rotate is not None:
                self.on_rotate(self.current)
        return ok

    def _redeem_issued(self, candidate: str) -> bool:
        if self.issued_dir is None:
            return False
        path = self.issued_dir / _digest(candidate).hex()
        try:
            issued_at = path.stat().st_mtime
            path.unlink()  # exactly one caller succeeds
        except OSError:
            return False
        return time.time() - issued_at <= ISSUED_TTL_S
