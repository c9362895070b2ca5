"""Goal parameters: text a run typed that came from its goal becomes a slot ({p1}, {p2}, …).

"Create a contact named Ada Lovelace with phone 555 0100" typed "Ada Lovelace" and "555 0100":
the flow keeps the goal template "Create a contact named {p1} with phone {p2}" and types {p1}
and {p2}. A new goal is bound to a template by matching it, so "Create a contact named Alan
Turing with phone 555 0111" gives p1 = "Alan Turing", p2 = "555 0111"; a goal that does not
match supplies no values, and a flow that needs one is not used. A sensitive value is never
stored: its step names a parameter no template slot can fill (`SECRET_PREFIX`), so such a flow
is kept for the record but replayed only once the task supplies that value some other way. A
sensitive text that is one secret reference (`{{secret:pin}}`) is no value: the step keeps it
as it is, the goal template keeps it too, and a replay's host types the new task's value.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping

SLOT = re.compile(r"\{(p\d+)\}")
SECRET_PREFIX = "secret"
_SPACE = re.compile(r"\s+")
#: Punctuation a value may end against without it being part of the value. Not "!" or "?":
#: they end typed text ("Type Good morning!") more often than they separate a value.
_STOPS = r"[,;:.]*"
_POLITE = r"(?:[\s,;:.!?]*(?<!\w)(?:please|thanks|thank\s+you)(?!\w))+"
#: What may close a goal, said or not: punctuation and a "please" or "thanks" ("Call 555 0111,
#: please" asks to call "555 0111", as "Call 555 0111" does).
_CLOSING = rf"(?:{_POLITE})?[\s,;:.!?]*"
#: What may close a goal after its last value: as `_CLOSING`, but a bare "!" or "?" stays the
#: value's ("Type Good morning!" types it), unless the template closed with one after its slot
#: (learned from "Call 555 0100!", whose value did not take it).
_TAIL = rf"(?:{_POLITE}[\s,;:.!?]*|[\s,;:.]*)"


def _boundary(value: str) -> str:
    """`value` as a regex matching it as whole words: not inside a longer word or number, nor
    a part of a dotted name (a typed "Android" is no slot in the page "com.android.contacts:
    …", whose package a replay must find as it is, whatever name the next goal gives)."""
    return rf"(?<!\w)(?<!\w\.){re.escape(value)}(?!\w)(?!\.\w)"


def template_goal(goal: str, typed: Iterable[str]) -> tuple[str, dict[str, str]]:
    """The goal with each typed value it contains replaced by a slot, and value -> slot name.

    Values are taken longest first (so "555 0100" is not cut by "5"). A value becomes a slot
    only where the goal says it once, as whole words: said twice ("Set the alarm on and turn
    on vibration" typing "on"), nothing tells which place the run typed, and making both one
    slot would bind a similar goal only when both places agree ("alarm off … turn on" would not
    bind at all). Such a value, or one not in the goal, stays literal text of its step.
    """
    template = goal
    found: dict[str, str] = {}
    for value in sorted({v.strip() for v in typed if v and v.strip()}, key=len, reverse=True):
        pattern = re.compile(_boundary(value), re.I)
        if len(pattern.findall(template)) != 1:
            continue
        temp = f"q{len(found)}"
        found[temp] = value
        template = pattern.sub("{" + temp + "}", template)
    # Number the slots in the order they appear in the goal.
    order = list(dict.fromkeys(re.findall(r"\{(q\d+)\}", template)))
    names = {temp: f"p{i}" for i, temp in enumerate(order, start=1)}
    template = re.sub(r"\{(q\d+)\}", lambda m: "{" + names[m.group(1)] + "}", template)
    return template, {found[temp]: name for temp, name in names.items()}


def bind(template: str, goal: str) -> dict[str, str] | None:
    """The slot values `goal` gives `template`, or None when it does not match it.

    Matching ignores case and runs of spaces; each slot takes at least one letter or digit,
    and a slot used twice must take the same value both times. A value ends where the
    template's text resumes, not counting punctuation against it ("named Alan Turing, with
    phone"), and at the goal's closing punctuation or "please": the last slot took the rest of
    the goal, so "Call 555 0111, please" bound to "Call {p1}" dialled "555 0111, please".
    """
    m = _pattern(template).fullmatch(_SPACE.sub(" ", goal.strip()))
    if m is None:
        return None
    values = {k: v.strip() for k, v in m.groupdict().items()}
    # "Call ." gives no number to dial
    return values if all(re.search(r"\w", v) for v in values.values()) else None


@functools.lru_cache(maxsize=8192)
def _pattern(template: str) -> re.Pattern[str]:
    """The compiled form of a template, kept: retrieval binds a goal to every active flow's
    template (up to 2,000), more than `re`'s own cache holds, and compiling each one again
    was most of a retrieval's CPU."""
    spaced = _SPACE.sub(" ", template.strip())
    body = without_closing(spaced)
    parts = SLOT.split(body)
    pattern = ""
    seen: set[str] = set()
    for i, part in enumerate(parts):
        if i % 2 == 0:
            if i and part.startswith(" "):
                pattern += _STOPS
            pattern += r"\s+".join(re.escape(w) for w in part.split(" "))
        elif part in seen:
            pattern += f"(?P={part})"
        else:
            seen.add(part)
            pattern += f"(?P<{part}>.+?)"
    closed = re.search(r"[!?]", spaced[len(body) :]) is not None
    return re.compile(pattern + (_CLOSING if closed else _TAIL), re.I)


def without_closing(goal: str) -> str:
    """`goal` without the punctuation and please/thanks it closes with: they ask for nothing,
    so "Turn on dark theme, thank you." is the flow for "Turn on dark theme"."""
    return re.sub(_CLOSING + r"\Z", "", goal.strip(), flags=re.I)


def slotted(goal: str, values: Mapping[str, str]) -> str:
    """`goal` with its bound values written as their slots (what the lexical scorer compares)."""
    out = goal
    for name, value in sorted(values.items(), key=lambda kv: len(kv[1]), reverse=True):
        out = re.sub(_boundary(value), "{" + name + "}", out, flags=re.I)
    return out


def missing(needed: Iterable[str], values: Mapping[str, str]) -> list[str]:
    """The parameters a flow's steps type that `values` does not supply, in order."""
    return [n for n in dict.fromkeys(needed) if n and n not in values]
