"""The phone's log (what `logcat` reads and `log` writes), kept in memory.

Entries carry the fields logcat prints; `format_entry` renders them in logcat's formats
(`threadtime`, the default since Android 7, `time` and `brief`). Followers (`logcat` without
`-d`) wait on `wait_for` for entries newer than the ones they printed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

LEVELS = "VDIWEF"
MAX_ENTRIES = 5000


@dataclass(frozen=True)
class LogEntry:
    seq: int
    time: str  # "11-29 12:30:01.123"
    pid: int
    tid: int
    level: str  # one of LEVELS
    tag: str
    message: str


def format_entry(e: LogEntry, fmt: str = "threadtime") -> str:
    if fmt == "time":
        return f"{e.time} {e.level}/{e.tag}({e.pid:5d}): {e.message}\n"
    if fmt == "brief":
        return f"{e.level}/{e.tag}({e.pid:5d}): {e.message}\n"
    if fmt == "tag":
        return f"{e.level}/{e.tag}: {e.message}\n"
    return f"{e.time} {e.pid:5d} {e.tid:5d} {e.level} {e.tag}: {e.message}\n"


class LogBuffer:
    """The main log buffer; thread-safe, bounded (old entries fall off, as on a phone)."""

    def __init__(self) -> None:
        self._entries: list[LogEntry] = []
        self._seq = 0
        self._clock_ms = 0
        self._cond = threading.Condition()

    def write(self, level: str, tag: str, message: str, pid: int = 1100, tid: int = 0) -> LogEntry:
        level = level.upper()[:1] if level else "I"
        if level not in LEVELS:
            level = "I"
        with self._cond:
            self._seq += 1
            self._clock_ms += 37
            ms = self._clock_ms
            stamp = f"11-29 12:{30 + ms // 60000 % 30:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"
            entry = LogEntry(self._seq, stamp, pid, tid or pid, level, tag, message)
            self._entries.append(entry)
            del self._entries[:-MAX_ENTRIES]
            self._cond.notify_all()
            return entry

    def entries(self, after: int = 0) -> list[LogEntry]:
        with self._cond:
            return [e for e in self._entries if e.seq > after]

    def clear(self) -> None:
        with self._cond:
            self._entries.clear()

    @property
    def last_seq(self) -> int:
        with self._cond:
            return self._seq

    def wait_for(self, after: int, timeout: float) -> list[LogEntry]:
        """Entries newer than `after`, waiting up to `timeout` seconds for the first one."""
        with self._cond:
            self._cond.wait_for(lambda: self._seq > after, timeout)
            return [e for e in self._entries if e.seq > after]
