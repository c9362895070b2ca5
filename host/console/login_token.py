"""The one-time login token: printed when the console starts, exchanged once for a session.

Whoever can read the host's log (its terminal, its journal) may use the console; nobody else
can, and there is no password to configure or leak. A token works once: after a successful
login a fresh one is made and logged, so a token seen later (shell history, a screenshot, a
browser's address bar) is already useless.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading

log = logging.getLogger(__name__)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class OneTimeToken:
    """The current token (to print) and its hash (compared in constant time); `redeem` uses it."""

    def __init__(self, token: str | None = None) -> None:
        self._lock = threading.Lock()
        self._hash = b""
        self.current = ""
        self.rotate(token)

    def rotate(self, token: str | None = None) -> str:
        """Replace the token (the old one stops working); returns the new one."""
        new = token or secrets.token_urlsafe(24)
        with self._lock:
            self._hash = _digest(new)
            self.current = new
        return new

    def redeem(self, candidate: str) -> bool:
        """True once for the current token (constant-time compare); then a new token is made."""
        if not candidate:
            return False
        with self._lock:
            ok = hmac.compare_digest(_digest(candidate.strip()), self._hash)
            if ok:
                # Consumed: make the next one now, under the same lock, so it cannot be reused.
                self.current = secrets.token_urlsafe(24)
                self._hash = _digest(self.current)
                fresh = self.current
        if ok:
            log.info("host console: login token used; the next login needs token %s", fresh)
        return ok
