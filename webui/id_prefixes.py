"""Task ids as people type them: the whole id, or a unique prefix of it (as a terminal, a log
line or a narrow table shows them), the same rules in the cloud console, its CLI and a host's
console. Each looks the candidates up in its own place (the cloud's `ListTasks.task_id_prefix`,
the host's timeline); what counts as a prefix and what is said about none or several is here.
"""

from __future__ import annotations

import re

#: Hexadecimal digits of a whole task id.
ID_LENGTH = 32
#: The fewest characters taken as a prefix: any, when they name one task only.
MIN_PREFIX = 1
#: Candidates named in an "ambiguous" answer.
SHOWN = 5

_PREFIX = re.compile(rf"^[0-9a-fA-F]{{{MIN_PREFIX},{ID_LENGTH}}}$")


class IdPrefixError(Exception):
    """A typed id that names no single task: `str()` says why, `hint` what to do."""

    def __init__(self, message: str, hint: str, candidates: list[str] | None = None) -> None:
        super().__init__(message)
        self.hint = hint
        self.candidates = candidates or []


def as_prefix(text: str) -> str | None:
    """`text` (trimmed) as the lower-case prefix a lookup takes, None when it is not one."""
    given = text.strip()
    return given.lower() if _PREFIX.match(given) else None


def not_an_id(text: str) -> IdPrefixError:
    """The refusal of a text that cannot start a task id."""
    return IdPrefixError(
        f"{text!r} is not a task id",
        f"task ids are {ID_LENGTH} hexadecimal digits; a unique prefix of one works too",
    )


def pick(prefix: str, found: list[str], where: str = "") -> str:
    """The one task id `prefix` names among `found` (the ids starting with it, at least
    SHOWN + 1 of them when there are that many): an id equal to it wins; else there must be
    exactly one. `where` ("on this host") ends the messages."""
    if prefix in found:
        return prefix
    if len(found) == 1:
        return found[0]
    place = f" {where}" if where else ""
    if not found:
        raise IdPrefixError(f"no task id starts with {prefix}{place}", "check the id")
    more = ", …" if len(found) > SHOWN else ""
    raise IdPrefixError(
        f"task id prefix {prefix} is ambiguous{place}: {', '.join(found[:SHOWN])}{more}",
        "give more characters of the id",
        found[:SHOWN],
    )
