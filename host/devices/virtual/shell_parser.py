"""Parse a `/system/bin/sh -c` command line: quoting, `;` `&&` `||` `|`, redirects, `$?`.

Real drivers send shell strings (adbutils quotes every argument with `shlex.quote` and appends
`; echo X4EXIT:$?`), so the virtual phone needs a small but faithful POSIX-style parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VAR_START = "\x00"
VAR_END = "\x01"


class ShellSyntaxError(ValueError):
    pass


@dataclass
class Redirect:
    fd: int
    op: str  # ">", ">>", "<", ">&"
    target: str


@dataclass
class Command:
    argv: list[str] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)


@dataclass
class Pipeline:
    commands: list[Command]
    connector: str  # how this pipeline joins the previous one: ";", "&&" or "||"


@dataclass
class _Tok:
    kind: str  # "word" or "op"
    value: str
    quoted: bool = False


_OPS = ["&&", "||", ">>", ">&", ";", "|", "&", ">", "<", "\n"]


def _var(name: str) -> str:
    return f"{VAR_START}{name}{VAR_END}"


def tokenize(line: str) -> list[_Tok]:
    toks: list[_Tok] = []
    buf: list[str] = []
    in_word = False
    quoted = False
    i = 0
    n = len(line)

    def flush() -> None:
        nonlocal in_word, quoted
        if in_word:
            toks.append(_Tok("word", "".join(buf), quoted))
        buf.clear()
        in_word = False
        quoted = False

    def dollar(j: int) -> int:
        """Read `$…` at line[j] == "$" into buf; returns the index after it."""
        nxt = line[j + 1] if j + 1 < n else ""
        if nxt in "?$#":
            buf.append(_var(nxt))
            return j + 2
        if nxt == "{":
            end = line.find("}", j)
            if end < 0:
                raise ShellSyntaxError("bad substitution")
            buf.append(_var(line[j + 2 : end]))
            return end + 1
        k = j + 1
        while k < n and (line[k].isalnum() or line[k] == "_"):
            k += 1
        if k == j + 1:
            buf.append("$")
            return j + 1
        buf.append(_var(line[j + 1 : k]))
        return k

    while i < n:
        c = line[i]
        if c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise ShellSyntaxError("unterminated quoted string")
            buf.append(line[i + 1 : end])
            in_word = quoted = True
            i = end + 1
        elif c == '"':
            in_word = quoted = True
            i += 1
            while True:
                if i >= n:
                    raise ShellSyntaxError("unterminated quoted string")
                c = line[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < n and line[i + 1] in '"\\$`\n':
                    buf.append(line[i + 1])
                    i += 2
                elif c == "$":
                    i = dollar(i)
                else:
                    buf.append(c)
                    i += 1
        elif c == "\\":
            if i + 1 < n:
                if line[i + 1] != "\n":
                    buf.append(line[i + 1])
                    in_word = True
                i += 2
            else:
                i += 1
        elif c == "$":
            in_word = True
            i = dollar(i)
        elif c in " \t":
            flush()
            i += 1
        elif c == "#" and not in_word:
            end = line.find("\n", i)
            i = n if end < 0 else end
        else:
            op = next((o for o in _OPS if line.startswith(o, i)), None)
            if op is None:
                buf.append(c)
                in_word = True
                i += 1
                continue
            if op in (">", ">>", "<", ">&") and in_word and not quoted and "".join(buf).isdigit():
                fd = "".join(buf)
                buf.clear()
                in_word = False
                toks.append(_Tok("op", fd + op))
            else:
                flush()
                toks.append(_Tok("op", op))
            i += len(op)
    flush()
    return toks


def parse(line: str) -> list[Pipeline]:
    """Split a command line into pipelines joined by `;`, `&&`, `||` (`&` runs in sequence)."""
    pipelines: list[Pipeline] = []
    commands: list[Command] = []
    cmd = Command()
    connector = ";"
    toks = tokenize(line)
    i = 0

    def end_command() -> None:
        nonlocal cmd
        if cmd.argv or cmd.redirects:
            commands.append(cmd)
        elif commands:
            raise ShellSyntaxError("syntax error: unexpected '|'")
        cmd = Command()

    def end_pipeline(next_connector: str, op: str) -> None:
        nonlocal commands, connector
        end_command()
        if commands:
            pipelines.append(Pipeline(commands, connector))
        elif op in ("&&", "||", "|"):
            raise ShellSyntaxError(f"syntax error: unexpected '{op}'")
        commands = []
        connector = next_connector

    while i < len(toks):
        tok = toks[i]
        if tok.kind == "word":
            cmd.argv.append(tok.value)
        elif tok.value == "|":
            if not cmd.argv:
                raise ShellSyntaxError("syntax error: unexpected '|'")
            end_command()
        elif tok.value in (";", "&", "\n"):
            end_pipeline(";", tok.value)
        elif tok.value in ("&&", "||"):
            if not cmd.argv and not commands:
                raise ShellSyntaxError(f"syntax error: unexpected '{tok.value}'")
            end_pipeline(tok.value, tok.value)
        else:
            fd_text = tok.value.rstrip("<>&")
            op = tok.value[len(fd_text) :]
            fd = int(fd_text) if fd_text else (0 if op == "<" else 1)
            if i + 1 >= len(toks) or toks[i + 1].kind != "word":
                raise ShellSyntaxError("syntax error: missing redirect target")
            cmd.redirects.append(Redirect(fd, op, toks[i + 1].value))
            i += 1
        i += 1
    end_pipeline(";", "")
    return pipelines


def expand(word: str, variables: dict[str, str]) -> str:
    """Substitute `$?`, `$NAME` markers left by the tokenizer, at the moment a command runs."""
    if VAR_START not in word:
        return word
    out: list[str] = []
    i = 0
    while i < len(word):
        if word[i] == VAR_START:
            end = word.index(VAR_END, i)
            out.append(variables.get(word[i + 1 : end], ""))
            i = end + 1
        else:
            out.append(word[i])
            i += 1
    return "".join(out)
