"""The shell's own utilities (toybox on a real phone): echo, cat, ls, rm, grep, sh -c…"""

from __future__ import annotations

import hashlib
import re

from host.devices.virtual.commands import SH, Output, Registry, Session

registry = Registry()


@registry.tool("echo")
def _echo(sh: Session, args: list[str], stdin: bytes) -> Output:
    newline = True
    if args and args[0] == "-n":
        newline, args = False, args[1:]
    return Output().out(" ".join(args) + ("\n" if newline else ""))


@registry.tool("true")
def _true(sh: Session, args: list[str], stdin: bytes) -> Output:
    return Output()


@registry.tool("false")
def _false(sh: Session, args: list[str], stdin: bytes) -> Output:
    return Output(code=1)


@registry.tool("sleep")
def _sleep(sh: Session, args: list[str], stdin: bytes) -> Output:
    try:
        seconds = float(args[0]) if args else 0.0
    except ValueError:
        return Output().err(f"sleep: invalid number '{args[0]}'\n", 1)
    sh.wait(seconds)
    return Output()


@registry.tool("cat")
def _cat(sh: Session, args: list[str], stdin: bytes) -> Output:
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


@registry.tool("rm")
def _rm(sh: Session, args: list[str], stdin: bytes) -> Output:
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


@registry.tool("mkdir")
def _mkdir(sh: Session, args: list[str], stdin: bytes) -> Output:
    result = Output()
    for path in (a for a in args if not a.startswith("-")):
        if not sh.phone.files.mkdir(path):
            result.err(f"mkdir: '{path}': File exists\n", 1)
    return result


@registry.tool("touch")
def _touch(sh: Session, args: list[str], stdin: bytes) -> Output:
    for path in (a for a in args if not a.startswith("-")):
        if sh.phone.files.stat(path) is None:
            sh.phone.files.write(path, b"")
    return Output()


@registry.tool("chmod", "chown", "sync")
def _noop(sh: Session, args: list[str], stdin: bytes) -> Output:
    return Output()


@registry.tool("ls")
def _ls(sh: Session, args: list[str], stdin: bytes) -> Output:
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


@registry.tool("toybox")
def _toybox(sh: Session, args: list[str], stdin: bytes) -> Output:
    """`toybox CMD …` runs the built-in CMD, as on every Android since 6."""
    fn = sh.command(args[0]) if args and args[0] != "toybox" else None
    if fn is None:
        return Output().err(f"toybox: Unknown command {args[0] if args else ''}\n", 1)
    return fn(sh, args[1:], stdin)


@registry.tool("md5sum")
def _md5sum(sh: Session, args: list[str], stdin: bytes) -> Output:
    result = Output()
    for path in args:
        data = sh.phone.files.read(path)
        if data is None:
            result.err(f"md5sum: {path}: No such file or directory\n", 1)
        else:
            result.out(f"{hashlib.md5(data).hexdigest()}  {path}\n")
    return result


@registry.tool("grep")
def _grep(sh: Session, args: list[str], stdin: bytes) -> Output:
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


@registry.tool("sh")
def _sh(sh: Session, args: list[str], stdin: bytes) -> Output:
    if len(args) >= 2 and args[0] == "-c":
        return sh.subshell(args[1])
    return Output().err(f"{SH}: interactive shells are not supported here\n", 2)


@registry.tool("df")
def _df(sh: Session, args: list[str], stdin: bytes) -> Output:
    """toybox `df` in 1K blocks; every path lives on /data here."""
    left = sh.phone.storage_left
    total = 52_428_800
    free = total if left is None else left // 1024
    used = total - free
    return Output().out(
        "Filesystem      1K-blocks     Used Available Use% Mounted on\n"
        f"/dev/block/dm-5 {total:>9} {used:>8} {free:>9} {used * 100 // total:>3}% /data\n"
    )


@registry.tool("whoami")
def _whoami(sh: Session, args: list[str], stdin: bytes) -> Output:
    return Output().out("shell\n")


@registry.tool("id")
def _id(sh: Session, args: list[str], stdin: bytes) -> Output:
    return Output().out("uid=2000(shell) gid=2000(shell) groups=2000(shell) context=u:r:shell:s0\n")


@registry.tool("pwd")
def _pwd(sh: Session, args: list[str], stdin: bytes) -> Output:
    return Output().out("/\n")
