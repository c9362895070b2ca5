"""What a shell command is on the virtual phone: its output, its signature, and a registry.

Command modules (`coreutils`, `android_tools`, `u2_agent`) each fill a `Registry` of their own;
`shell.Shell` merges them. A command sees the shell running it only through `Session`, so no
command module imports the shell.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from host.devices.virtual.phone import VirtualPhone

SH = "/system/bin/sh"


@dataclass
class Output:
    """What one command wrote, in order, and how it exited."""

    chunks: list[tuple[int, bytes]] = field(default_factory=list)
    code: int = 0

    def out(self, data: bytes | str) -> Output:
        if isinstance(data, str):
            data = data.encode()
        if data:
            self.chunks.append((1, data))
        return self

    def err(self, data: bytes | str, code: int | None = None) -> Output:
        if isinstance(data, str):
            data = data.encode()
        if data:
            self.chunks.append((2, data))
        if code is not None:
            self.code = code
        return self

    def stream(self, fd: int) -> bytes:
        return b"".join(d for f, d in self.chunks if f == fd)

    @property
    def stdout(self) -> bytes:
        return self.stream(1)

    @property
    def stderr(self) -> bytes:
        return self.stream(2)

    @property
    def combined(self) -> bytes:
        return b"".join(d for _, d in self.chunks)


class Session(Protocol):
    """The shell invocation a command runs in: the phone, the command's environment
    assignments (`CLASSPATH=… app_process …`), and the ways to wait, nest and look up."""

    phone: VirtualPhone
    env: dict[str, str]
    cancel: threading.Event
    #: Where a command that keeps running (`logcat` following the log) sends output as it comes,
    #: or None when its output is collected (in a pipe or a redirect it cannot be live).
    live: Callable[[int, bytes], None] | None
    #: The shell's own pid when the command replaced it (`exec PROGRAM`: a program spawned
    #: then runs under it, as `exec` keeps the pid); None for a command the shell forked.
    exec_pid: int | None

    def wait(self, seconds: float) -> bool:
        """Block up to `seconds`; True as soon as the caller hangs up or the phone is unplugged."""
        ...

    def subshell(self, line: str) -> Output:
        """Run a command line in a fresh shell on the same phone (`sh -c LINE`)."""
        ...

    def command(self, name: str) -> Tool | None:
        """The command registered under `name`, as this shell resolves it."""
        ...


Tool = Callable[[Session, list[str], bytes], Output]


class Registry:
    """Commands by name; `@registry.tool("a", "b")` registers one under several names."""

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}

    def tool(self, *names: str) -> Callable[[Tool], Tool]:
        def register(fn: Tool) -> Tool:
            for name in names:
                self.tools[name] = fn
            return fn

        return register
