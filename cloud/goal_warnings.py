"""Warnings at submit: a goal that looks like it holds a credential.

A goal is stored in the task row, shown on every page, sent in every prompt and kept in the
decision log. A password written into it is therefore everywhere; a secret parameter
(`SubmitTaskRequest.secrets`, referred to as `{{secret:NAME}}`) is nowhere but on the phone.
The task is still queued (the check is a heuristic and the operator may know better), but the
answer says so (`SubmitTaskResponse.warnings`), and the console and the CLI show it. The
warning names what it found, never the value.
"""

from __future__ import annotations

import re

from planner import secret_refs

#: A credential's name followed by what looks like its value ("password is hunter2",
#: "PIN: 2580", "api key = abc123…"): quoted, or a word holding a digit or a symbol.
_NAMED = re.compile(
    r"\b(?P<what>passwor[dt]|passcode|passphrase|pass\s?word|pwd|pin(?:\s?code)?|"
    r"api[\s_-]?key|access[\s_-]?key|secret(?:[\s_-]?key)?|token|credentials?|kennwort)\b"
    r"(?:\s+(?:is|of|to|as|=|:|ist|lautet))?\s*[:=]?\s*"
    r"(?P<value>\"[^\"]{3,}\"|'[^']{3,}'|“[^”]{3,}”|[^\s,;]+)",
    re.IGNORECASE,
)
#: Key formats that are credentials on their own, whatever surrounds them.
_FORMATS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an API key (sk-…)", re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")),
    ("a GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}")),
    ("an AWS access key id", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),
    ("a Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}")),
    ("a JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
)
_ADVICE = (
    "it is stored with the task and sent in every prompt; pass it as a secret parameter "
    "instead (secrets, referred to as {{secret:NAME}} in the goal; `amc task submit --secret`)"
)


def _looks_like_value(value: str) -> bool:
    """A quoted string, or a word of 4+ characters holding a digit or a symbol (not a plain
    word such as "lock" or "screen", which would follow "PIN" in an ordinary goal)."""
    if value[:1] in "\"'“":
        return True
    stripped = value.strip(".!?)")
    return len(stripped) >= 4 and any(not c.isalpha() for c in stripped)


def credential_warnings(goal: str) -> list[str]:
    """Plain-language warnings for a goal that seems to hold a credential (empty: none)."""
    text = secret_refs.REFERENCE.sub(" ", goal)
    found: list[str] = []
    for m in _NAMED.finditer(text):
        if _looks_like_value(m.group("value")):
            what = m.group("what").lower()
            found.append(f"a {'PIN' if what.startswith('pin') else what} written out")
            break
    found += [what for what, pattern in _FORMATS if pattern.search(text)]
    if not found:
        return []
    return [f"the goal looks like it holds a credential ({', '.join(found)}): {_ADVICE}"]
