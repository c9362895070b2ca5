"""The phone's process table: what `ps`, `pidof` and `kill` see.

System processes are always there; an app has a process while it has a task (it was started
and not force-stopped); programs started from a shell (`app_process` for uiautomator2's agent)
have one while their shell runs, and `kill` ends them by ending that shell's command.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

SYSTEM: list[tuple[int, str, str]] = [
    (1, "root", "init"),
    (312, "logd", "logd"),
    (598, "root", "zygote64"),
    (1100, "system", "system_server"),
    (1480, "u0_a140", "com.android.systemui"),
    (1702, "u0_a150", "com.android.inputmethod.latin"),
    (1811, "radio", "com.android.phone"),
]


@dataclass
class Spawned:
    """A program a shell started, running until its shell's command ends."""

    pid: int
    user: str
    name: str
    stop: threading.Event = field(default_factory=threading.Event)


class ProcessTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._app_pids: dict[str, int] = {}
        self._spawned: dict[int, Spawned] = {}
        self._next = 4100

    def app_pid(self, package: str) -> int:
        """A running app's pid (the same while it keeps running)."""
        with self._lock:
            if package not in self._app_pids:
                self._next += 7
                self._app_pids[package] = self._next
            return self._app_pids[package]

    def app_stopped(self, package: str) -> None:
        with self._lock:
            self._app_pids.pop(package, None)

    def new_pid(self) -> int:
        """A pid no process has had yet (a shell's `$$`)."""
        with self._lock:
            self._next += 3
            return self._next

    def spawn(self, name: str, user: str, stop: threading.Event, pid: int | None = None) -> Spawned:
        """A program started from a shell; `pid`: the shell's own, for one it `exec`ed."""
        with self._lock:
            if pid is None:
                self._next += 3
                pid = self._next
            proc = Spawned(pid, user, name, stop)
            self._spawned[proc.pid] = proc
            return proc

    def exited(self, proc: Spawned) -> None:
        with self._lock:
            self._spawned.pop(proc.pid, None)

    def spawned(self) -> list[Spawned]:
        with self._lock:
            return list(self._spawned.values())

    def rows(self, running_apps: list[str], launcher: str) -> list[tuple[int, int, str, str]]:
        """(pid, ppid, user, name) of every process, system first."""
        rows = [(pid, 0 if pid == 1 else 1, user, name) for pid, user, name in SYSTEM]
        uid = 160
        for package in dict.fromkeys([launcher, *running_apps]):
            uid += 1
            rows.append((self.app_pid(package), 598, f"u0_a{uid}", package))
        rows += [(p.pid, 4000, p.user, p.name) for p in self.spawned()]
        return rows
