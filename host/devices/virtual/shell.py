"""The phone's `/system/bin/sh`: runs parsed command lines against a virtual phone.

Output is kept as ordered (fd, bytes) chunks so the adb server can send it raw (`shell:`,
stdout and stderr interleaved as a terminal shows them) or framed per stream (`shell,v2:`).
"""

from __future__ import annotations

import posixpath
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from host.devices.virtual import android_tools, coreutils, system_tools, u2_agent
from host.devices.virtual.commands import SH, Output, Tool
from host.devices.virtual.phone import SIGNAL_EXITS
from host.devices.virtual.shell_parser import Command, ShellSyntaxError, expand, parse

if TYPE_CHECKING:
    from host.devices.virtual.phone import VirtualPhone

TOOLS: dict[str, Tool] = {
    **coreutils.registry.tools,
    **android_tools.registry.tools,
    **system_tools.registry.tools,
    **u2_agent.registry.tools,
}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
#: The binder service each `cmd`-based tool asks system_server for (Android 10+ ships them as
#: scripts around `cmd SERVICE`); `cmd` and `dumpsys` name it in their first argument.
_CMD_SERVICES = {"wm": "window", "input": "input", "am": "activity", "pm": "package"}
_CMD_SERVICES |= {"settings": "settings"}


def _without_system_server(name: str, args: list[str]) -> Output:
    """What a tool that needs system_server prints while it is not running (a phone still
    booting, system_server restarting after a crash): its binder service is not there."""
    if name == "monkey":
        return Output().err(
            "** Error: Unable to connect to activity manager; is the system running?\n", 255
        )
    service = _CMD_SERVICES.get(name) or (args[0] if args else "")
    if name == "dumpsys":
        return Output().err(f"Can't find service: {service}\n", 20)
    return Output().err(f"cmd: Can't find service: {service}\n", 20)


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class Shell:
    """One `sh -c` invocation's environment: the phone and shell variables such as `$?`."""

    def __init__(
        self,
        phone: VirtualPhone,
        cancel: threading.Event | None = None,
        live: Callable[[int, bytes], None] | None = None,
    ) -> None:
        self.phone = phone
        self.cancel = cancel or threading.Event()
        self.env: dict[str, str] = {}
        self._live_sink = live
        self.live: Callable[[int, bytes], None] | None = None
        self.exec_pid: int | None = None
        self._late: threading.Thread | None = None  # output sent late (`_exec`)
        self.variables: dict[str, str] = {
            "?": "0",
            "$": str(phone.processes.new_pid()),
            "#": "0",
            "HOME": "/",
            "PATH": "/product/bin:/apex/com.android.runtime/bin:/system/bin:/system/xbin",
            "EXTERNAL_STORAGE": "/sdcard",
            "ANDROID_DATA": "/data",
            "USER": "shell",
        }

    def wait(self, seconds: float) -> bool:
        """Block up to `seconds`; True as soon as the caller hangs up or the phone is unplugged."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self.phone.online or self.cancel.wait(min(left, 0.05)):
                return True
        return not self.phone.online or self.cancel.is_set()

    def subshell(self, line: str) -> Output:
        """`sh -c LINE`: a fresh shell on the same phone (its own variables)."""
        return Shell(self.phone).run(line)

    def command(self, name: str) -> Tool | None:
        name = posixpath.basename(name) if name.startswith("/system/") else name
        if self.phone.system_server_down and name in (*_CMD_SERVICES, "cmd", "dumpsys", "monkey"):
            return lambda sh, args, stdin: _without_system_server(name, args)
        return None if name in self.phone.missing_commands else TOOLS.get(name)

    def run(self, line: str) -> Output:
        """Run a whole command line, like `adb shell '<line>'`."""
        total = Output()
        try:
            pipelines = parse(line)
        except ShellSyntaxError as exc:
            return total.err(f"{SH}: {exc}\n", 2)
        try:
            for pipeline in pipelines:
                last = int(self.variables["?"])
                if pipeline.connector == "&&" and last != 0:
                    continue
                if pipeline.connector == "||" and last == 0:
                    continue
                data = b""
                result = Output()
                alone = len(pipelines) == 1 and len(pipeline.commands) == 1
                for i, cmd in enumerate(pipeline.commands):
                    self.live = self._live_sink if alone and not cmd.redirects else None
                    if len(pipeline.commands) == 1 and cmd.argv[:1] == ["exec"] and cmd.argv[1:]:
                        cmd = self._exec(cmd, total)
                    result = self._command(cmd, data)
                    if i < len(pipeline.commands) - 1:
                        data = result.stdout
                        total.chunks.extend((f, d) for f, d in result.chunks if f == 2)
                total.chunks.extend(result.chunks)
                self.variables["?"] = str(result.code)
                if self.exec_pid is not None:
                    break  # the program replaced the shell: nothing after it runs
        except _Exit as done:
            self.variables["?"] = str(done.code)
        total.code = int(self.variables["?"])
        if self._late is not None:
            self._late.join()
        return total

    def _exec(self, cmd: Command, total: Output) -> Command:
        """`exec PROGRAM …`: the program replaces the shell, under its pid (`$$`), and what
        the shell printed before it has reached the client (a shell writes as it goes), so a
        caller can read `echo $$; exec …` before the program ends."""
        self.exec_pid = int(self.variables["$"])
        if self._live_sink is not None:
            head, sink = list(total.chunks), self._live_sink
            total.chunks.clear()
            delay = self.phone.take_exec_head_delay()
            if delay is None:
                self._send(sink, head)
            else:
                # Late (`delay_exec_heads`): the program starts now, its head reaches the
                # client later, and before anything the program prints (`run` waits for it).
                self._late = threading.Thread(
                    target=self._send, args=(sink, head, delay), daemon=True
                )
                self._late.start()
        return Command(cmd.argv[1:], cmd.redirects)

    def _send(
        self, sink: Callable[[int, bytes], None], chunks: list[tuple[int, bytes]], delay: float = 0
    ) -> None:
        """Send `chunks` to the client after `delay` s; none to a client that hung up."""
        if delay and self.wait(delay):
            return
        for fd, data in chunks:
            sink(fd, data)

    def _command(self, cmd: Command, stdin: bytes) -> Output:
        argv = [expand(a, self.variables) for a in cmd.argv]
        fs = self.phone.files
        for r in cmd.redirects:
            if r.op == "<":
                data = fs.read(expand(r.target, self.variables))
                if data is None:
                    return Output().err(f"{SH}: {r.target}: No such file or directory\n", 1)
                stdin = data
        self.env = {}
        while argv and _ASSIGNMENT.match(argv[0]):
            key, _, value = argv.pop(0).partition("=")
            self.env[key] = value
        if not argv:
            self.variables.update(self.env)
            return Output()
        name = argv[0]
        if name == "exit":
            raise _Exit(int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 0)
        fn = self.command(name)
        deaths = self.phone.command_deaths.get(name)
        if fn is None:
            result = Output().err(f"{SH}: {name}: not found\n", 127)
        elif deaths:
            word = deaths.pop(0)
            result = Output().err(f"{word}\n", SIGNAL_EXITS[word])
        else:
            result = fn(self, argv[1:], stdin)
        return self._redirect(cmd, result)

    def _redirect(self, cmd: Command, result: Output) -> Output:
        fs = self.phone.files
        chunks = result.chunks
        for r in cmd.redirects:
            target = expand(r.target, self.variables)
            if r.op == ">&":
                dest = int(target) if target.isdigit() else 1
                chunks = [(dest if f == r.fd else f, d) for f, d in chunks]
            elif r.op in (">", ">>"):
                data = b"".join(d for f, d in chunks if f == r.fd)
                chunks = [(f, d) for f, d in chunks if f != r.fd]
                if target in ("/dev/null", "/dev/tty"):
                    if target == "/dev/tty":
                        chunks.append((1, data))
                    continue
                ok = fs.append(target, data) if r.op == ">>" else fs.write(target, data)
                if not ok:
                    return Output(
                        chunks=[(2, f"{SH}: can't create {target}: Is a directory\n".encode())],
                        code=1,
                    )
        return Output(chunks=chunks, code=result.code)
