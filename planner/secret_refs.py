"""Secret parameters by name: the `{{secret:NAME}}` reference a goal and a typed text carry.

A task may carry secrets (a Wi-Fi password, a PIN) that must reach the phone but nothing else:
not the task row, not a prompt, not the decision log, not a timeline. So the goal names them
(`{{secret:wifi_password}}`), the model writes the same reference into `input_text`, and only
the host holding the lease puts the value in its place at the moment it types. This module is
the one definition of the syntax, for the cloud (validating a submission), the planner (telling
the model, the offline heuristic) and the host (typing).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: A secret's name: a lower-case letter, then up to 63 of a-z, 0-9 and _.
NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: A reference to a secret in a goal or a typed text.
REFERENCE = re.compile(r"\{\{\s*secret:(" + NAME.pattern + r")\s*\}\}")
MAX_SECRETS = 16
MAX_VALUE = 4096
#: What a sensitive text is stored and shown as (Android's password dots).
MASK = "•••"


class MissingSecret(KeyError):
    """A text refers to a secret the task does not carry."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return (
            f"the text refers to the secret {self.name!r}, which this task does not carry "
            "(nothing was typed)"
        )


def reference(name: str) -> str:
    """How a goal or a typed text refers to secret `name`."""
    return "{{secret:" + name + "}}"


def names_in(text: str) -> list[str]:
    """The names `text` refers to, in order of first appearance, each once."""
    return list(dict.fromkeys(m.group(1) for m in REFERENCE.finditer(text)))


def refers(text: str) -> bool:
    """True when `text` holds at least one secret reference."""
    return REFERENCE.search(text) is not None


def stored(text: object) -> str:
    """What a sensitive typed text is kept as wherever it is stored or shown (decision log,
    timeline, exports, prompts): the mask, unless the text is exactly one reference (spaces
    around allowed). A reference is no secret (the goal carries it, and only the host puts the
    value in its place), and kept it lets a flow learned from the run type it again; a text
    with anything else beside a reference may be a secret in part, so it is masked whole."""
    if isinstance(text, str) and REFERENCE.fullmatch(text.strip()):
        return text
    return MASK


def substitute(text: str, values: Mapping[str, str]) -> str:
    """`text` with every reference replaced by its value; `MissingSecret` for an unknown name
    (then nothing is typed: half a password is worse than none)."""
    for name in names_in(text):
        if name not in values:
            raise MissingSecret(name)
    return REFERENCE.sub(lambda m: values[m.group(1)], text)


def problem(goal: str, secrets: Mapping[str, str]) -> str | None:
    """Why a submission's secrets cannot be taken (INVALID_ARGUMENT text naming the field), or
    None. Values are never quoted back."""
    if len(secrets) > MAX_SECRETS:
        return f"secrets: at most {MAX_SECRETS}"
    for name, value in secrets.items():
        if not NAME.fullmatch(name):
            return (
                f"secrets: the name {name[:70]!r} is not 1 to 64 of a-z, 0-9 and _ starting "
                "with a letter"
            )
        if not value:
            return f"secrets[{name}]: the value is empty"
        if len(value) > MAX_VALUE:
            return f"secrets[{name}]: the value is longer than {MAX_VALUE} characters"
        if "\x00" in value:
            return f"secrets[{name}]: the value holds a NUL character"
    named = names_in(goal)
    unknown = [n for n in named if n not in secrets]
    if unknown:
        return (
            f"goal: refers to {reference(unknown[0])} but secrets has no {unknown[0]!r} "
            "(pass it in secrets)"
        )
    unused = sorted(set(secrets) - set(named))
    if unused:
        return (
            f"secrets[{unused[0]}]: the goal does not refer to it; write "
            f"{reference(unused[0])} where the goal needs it"
        )
    return None
