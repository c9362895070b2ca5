"""When the host says it is not connecting because of its certificate files, and when not.

The lease stream checks its certificate files before each connection attempt (every
`AMC_HOST_RECONNECT_MAX_S`, 30 s by default, while they are files the cloud would refuse): a
line at every attempt filled the log with the same words for as long as the files stayed bad,
burying whatever else the host said. Each problem (its file and why) is said once, then at most
every `REMIND_S` as a reminder ("still not connecting: …"), and the connection that follows
is said too, so the log shows when the files were fixed. So are files that are there but
cannot be read, or whose disk hangs (`CertificatesUnreadable`, `CertificatesHung`). host.js
says the same the same way (examples/node-host/host.js, `notConnecting`). The outbox, which
opens its channel from the same files, tells one problem from another with `problem_key`.
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable

from cloud.cert_validity import CertificateInvalid
from host.cloud_channel import CertificateMissing

#: A problem still there this long after it was last said is said again, as a reminder.
REMIND_S = 600.0

#: The part of a problem that changes with every attempt ("not valid before …"'s own clock):
#: left out when problems are compared, or one problem counted as a new one each minute.
_CLOCK = re.compile(r" \(this machine's clock says [^)]*\)")


def problem_key(exc: BaseException) -> tuple[str, str]:
    """A problem with the certificate files as compared to tell a new one from the same one
    found again: its kind and its file, not its words (`CertificateInvalid.kind`). The words
    of "not valid before …" hold this machine's clock: compared whole, the outbox said the
    same problem again each minute. A problem with no kind told is its words, clock left out."""
    if isinstance(exc, CertificateInvalid) and exc.kind:
        return exc.kind, str(exc.path)
    if isinstance(exc, CertificateMissing):
        return "missing", str(exc.path)
    if isinstance(exc, OSError) and exc.filename is not None:
        code = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        return code, str(exc.filename)
    return type(exc).__name__, _CLOCK.sub("", str(exc))


class NotConnecting:
    """What to say of each connection attempt the certificate files stopped (`said`), of one
    that got past them (`passed`), and of the welcome that follows (`connected`)."""

    def __init__(
        self, remind_s: float = REMIND_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._remind_s = remind_s
        self._clock = clock
        #: The problem of the last attempt (None: it got past the files), as compared.
        self._problem: str | None = None
        self._said_at = 0.0
        #: The problem last said, until a welcome says the host connected again.
        self.unresolved = ""
        #: Its kind (`said`): how the line of the welcome words it (`back`).
        self._kind = ""

    def said(self, problem: str, kind: str = "") -> str:
        """The words to start the line with for an attempt `problem` stopped: "not
        connecting" when it is not the last attempt's problem, "still not connecting" when
        that was last said `REMIND_S` ago or more, else "" (nothing to say). `kind` is
        "hung" or "unreadable" for files whose reading hung or failed, "" for files there
        that the cloud would refuse (or that are missing)."""
        key = _CLOCK.sub("", problem)
        now = self._clock()
        if key != self._problem:
            self._problem, self._said_at, self.unresolved = key, now, problem
            self._kind = kind
            return "not connecting"
        if now - self._said_at >= self._remind_s:
            self._said_at = now
            return "still not connecting"
        return ""

    def passed(self) -> None:
        """An attempt got past the files (whether the cloud answered or not): the same problem
        found again later is a new one, said at once."""
        self._problem = None

    def connected(self) -> str:
        """The cloud welcomed the host: the problem said since the last welcome ("" for none),
        for the line saying it connected again."""
        self._problem = None
        said, self.unresolved = self.unresolved, ""
        return said

    def back(self, again: bool) -> str:
        """The line for the welcome (`connected`), "" when no problem was said since the last:
        "again" only after an earlier connection (a disk that hung at the host's first start
        was said as a connection regained), and in the words of the problem's kind (files
        whose reading hung were said to be files the cloud would now take)."""
        kind, was = self._kind, self.connected()
        if not was:
            return ""
        head = "connected to the cloud again" if again else "connected to the cloud"
        if kind == "hung":
            return f"{head}: the certificate files could be read (reading them hung: {was})"
        if kind == "unreadable":
            return f"{head}: the certificate files could be read (reading them failed: {was})"
        return f"{head}: the certificate files can be used (they could not: {was})"
