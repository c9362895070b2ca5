"""The phone's `/system/bin/sh`: runs parsed command lines against a virtual phone.

Output is kept as ordered (fd, bytes) chunks so the adb server can send it raw (`shell:`,
stdout and stderr interleaved as a terminal shows them) or framed per stream (`shell,v2:`).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from host.devices.virtual.shell_parser import Command, ShellSyntaxError, expand, parse

if TYPE_CHECKING:
    from host.devices.virtual.phone import VirtualPhone

SH = "/system/bin/sh"
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


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


Tool = Callable[["Shell", list[str], bytes], Output]
TOOLS: dict[str, Tool] = {}


def tool(*names: str) -> Callable[[Tool], Tool]:
    """Register a command implementation under one or more names."""

    def register(fn: Tool) -> Tool:
        for name in names:
            TOOLS[name] = fn
        return fn

    return register


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class Shell:
    """One `sh -c` invocation's environment: the phone and shell variables such as `$?`."""

    def __init__(self, phone: VirtualPhone, cancel: threading.Event | None = None) -> None:
        self.phone = phone
        self.cancel = cancel or threading.Event()
        self.env: dict[str, str] = {}
        self.variables: dict[str, str] = {
            "?": "0",
            "$": "4242",
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
                for i, cmd in enumerate(pipeline.commands):
                    result = self._command(cmd, data)
                    if i < len(pipeline.commands) - 1:
                        data = result.stdout
                        total.chunks.extend((f, d) for f, d in result.chunks if f == 2)
                total.chunks.extend(result.chunks)
                self.variables["?"] = str(result.code)
        except _Exit as done:
            self.variables["?"] = str(done.code)
        total.code = int(self.variables["?"])
        return total

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
        fn = TOOLS.get(posixpath.basename(name) if name.startswith("/system/") else name)
        if fn is None:
            result = Output().err(f"{SH}: {name}: not found\n", 127)
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


# --- core utilities -----------------------------------------------------------------------


@tool("echo")
def _echo(sh: Shell, args: list[str], stdin: bytes) -> Output:
    newline = True
    if args and args[0] == "-n":
        newline, args = False, args[1:]
    return Output().out(" ".join(args) + ("\n" if newline else ""))


@tool("true")
def _true(sh: Shell, args: list[str], stdin: bytes) -> Output:
    return Output()


@tool("false")
def _false(sh: Shell, args: list[str], stdin: bytes) -> Output:
    return Output(code=1)


@tool("sleep")
def _sleep(sh: Shell, args: list[str], stdin: bytes) -> Output:
    try:
        seconds = float(args[0]) if args else 0.0
    except ValueError:
        return Output().err(f"sleep: invalid number '{args[0]}'\n", 1)
    sh.wait(seconds)
    return Output()


@tool("cat")
def _cat(sh: Shell, args: list[str], stdin: bytes) -> Output:
    files = [a for a in args if not a.startswith("-") or a == "-"]
    if not files:
        return Output().out(stdin)
    result = Output()
    for path in files:
        data = stdin if path == "-" else sh.phone.files.read(path)
        if data is None:
            st = sh.phone.files.stat(path)
            why = "Is a directory" if st and st.is_dir else "No such file or directory"
            result.err(f"cat: {path}: {why}\n", 1)
        else:
            result.out(data)
    return result


@tool("rm")
def _rm(sh: Shell, args: list[str], stdin: bytes) -> Output:
    flags = "".join(a[1:] for a in args if a.startswith("-"))
    force, recursive = "f" in flags, "r" in flags or "R" in flags
    result = Output()
    for path in (a for a in args if not a.startswith("-")):
        if sh.phone.files.remove(path, recursive=recursive):
            continue
        st = sh.phone.files.stat(path)
        if st is not None and st.is_dir:
            result.err(f"rm: {path}: is a directory\n", 1)
        elif not force:
            result.err(f"rm: {path}: No such file or directory\n", 1)
    return result


@tool("mkdir")
def _mkdir(sh: Shell, args: list[str], stdin: bytes) -> Output:
    result = Output()
    for path in (a for a in args if not a.startswith("-")):
        if not sh.phone.files.mkdir(path):
            result.err(f"mkdir: '{path}': File exists\n", 1)
    return result


@tool("touch")
def _touch(sh: Shell, args: list[str], stdin: bytes) -> Output:
    for path in (a for a in args if not a.startswith("-")):
        if sh.phone.files.stat(path) is None:
            sh.phone.files.write(path, b"")
    return Output()


@tool("chmod", "chown", "sync")
def _noop(sh: Shell, args: list[str], stdin: bytes) -> Output:
    return Output()


@tool("ls")
def _ls(sh: Shell, args: list[str], stdin: bytes) -> Output:
    paths = [a for a in args if not a.startswith("-")] or ["/"]
    result = Output()
    for path in paths:
        entries = sh.phone.files.listdir(path)
        if entries is None:
            if sh.phone.files.stat(path) is not None:
                result.out(path + "\n")
            else:
                result.err(f"ls: {path}: No such file or directory\n", 1)
            continue
        result.out("".join(name + "\n" for name, _ in entries))
    return result


@tool("toybox")
def _toybox(sh: Shell, args: list[str], stdin: bytes) -> Output:
    """`toybox CMD …` runs the built-in CMD, as on every Android since 6."""
    if not args or args[0] not in TOOLS or args[0] == "toybox":
        return Output().err(f"toybox: Unknown command {args[0] if args else ''}\n", 1)
    return TOOLS[args[0]](sh, args[1:], stdin)


@tool("md5sum")
def _md5sum(sh: Shell, args: list[str], stdin: bytes) -> Output:
    result = Output()
    for path in args:
        data = sh.phone.files.read(path)
        if data is None:
            result.err(f"md5sum: {path}: No such file or directory\n", 1)
        else:
            result.out(f"{hashlib.md5(data).hexdigest()}  {path}\n")
    return result


@tool("grep")
def _grep(sh: Shell, args: list[str], stdin: bytes) -> Output:
    flags = "".join(a[1:] for a in args if a.startswith("-") and len(a) > 1)
    rest = [a for a in args if not (a.startswith("-") and len(a) > 1)]
    if not rest:
        return Output().err("usage: grep [-EFivc] PATTERN [FILE...]\n", 2)
    pattern, files = rest[0], rest[1:]
    data = b"".join(sh.phone.files.read(f) or b"" for f in files) if files else stdin
    try:
        regex = re.compile(
            pattern if "F" not in flags else re.escape(pattern), re.I if "i" in flags else 0
        )
    except re.error:
        regex = re.compile(re.escape(pattern), re.I if "i" in flags else 0)
    lines = data.decode(errors="replace").splitlines(keepends=True)
    hits = [ln for ln in lines if bool(regex.search(ln)) != ("v" in flags)]
    if "c" in flags:
        return Output(code=0 if hits else 1).out(f"{len(hits)}\n")
    return Output(code=0 if hits else 1).out("".join(hits))


@tool("sh")
def _sh(sh: Shell, args: list[str], stdin: bytes) -> Output:
    if len(args) >= 2 and args[0] == "-c":
        return Shell(sh.phone).run(args[1])
    return Output().err(f"{SH}: interactive shells are not supported here\n", 2)


@tool("whoami")
def _whoami(sh: Shell, args: list[str], stdin: bytes) -> Output:
    return Output().out("shell\n")


@tool("id")
def _id(sh: Shell, args: list[str], stdin: bytes) -> Output:
    return Output().out("uid=2000(shell) gid=2000(shell) groups=2000(shell) context=u:r:shell:s0\n")


@tool("pwd")
def _pwd(sh: Shell, args: list[str], stdin: bytes) -> Output:
    return Output().out("/\n")


# The Android tools register themselves into TOOLS on import.
from host.devices.virtual import android_tools, u2_agent  # noqa: E402, F401
