"""Goal parsing: what a goal in plain words asks for (words, on/off, values, arithmetic).

Everything here reads only the goal text; nothing looks at a screen. A little general Android
vocabulary (dark theme lives under display, Wi-Fi under network) is the kind any model knows;
nothing here knows a particular task suite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from planner import secret_refs
from planner.providers.offline.vocabulary import (
    FIELD_KINDS,
    GENERIC,
    OFF,
    ON,
    RELATED,
    SOFT_ON,
    STOP,
    SYNONYMS,
    VERBS,
)

SPLIT = re.compile(
    r"\s*(?:,\s*(?:and\s+)?then|,\s*and|\band then|\bthen|\band also|\band|;)\s+", re.I
)
# "the phone" in a goal is the device itself, never an app or a setting named Phone.
_THE_DEVICE = re.compile(r"\b(?:the|my|this|your)\s+(?:phone|device|handy|telefon)\b", re.I)
# Calculator words: operator name -> (symbols a key may show, words its description may use)
OPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "*": (("×", "*", "x", "X"), ("multiply", "times")),
    "/": (("÷", "/"), ("divide", "division")),
    "+": (("+",), ("plus", "add")),
    "-": (("−", "-", "–"), ("minus", "subtract")),
}
ARITH = (
    (
        re.compile(r"(\d+(?:\.\d+)?)\s*(?:times|multiplied by|x|\*|×)\s*(\d+(?:\.\d+)?)", re.I),
        "*",
        False,
    ),
    (re.compile(r"divide\s+(\d+(?:\.\d+)?)\s+by\s+(\d+(?:\.\d+)?)", re.I), "/", False),
    (re.compile(r"(\d+(?:\.\d+)?)\s*(?:divided by|/|÷)\s*(\d+(?:\.\d+)?)", re.I), "/", False),
    (re.compile(r"multiply\s+(\d+(?:\.\d+)?)\s+(?:by|and)\s+(\d+(?:\.\d+)?)", re.I), "*", False),
    (re.compile(r"(\d+(?:\.\d+)?)\s*(?:plus|\+)\s*(\d+(?:\.\d+)?)", re.I), "+", False),
    (re.compile(r"add\s+(\d+(?:\.\d+)?)\s+(?:and|to)\s+(\d+(?:\.\d+)?)", re.I), "+", False),
    (re.compile(r"(\d+(?:\.\d+)?)\s*(?:minus|-)\s*(\d+(?:\.\d+)?)", re.I), "-", False),
    (re.compile(r"subtract\s+(\d+(?:\.\d+)?)\s+from\s+(\d+(?:\.\d+)?)", re.I), "-", True),
)


def split_goal(goal: str) -> list[str]:
    """ "Do X and do Y" / "X, then Y" into parts, only where each part starts with a verb."""
    pieces = [p.strip(" .") for p in SPLIT.split(goal) if p and p.strip(" .")]
    if len(pieces) < 2:
        return [goal]
    parts = [pieces[0]]
    for piece in pieces[1:]:
        if piece.split(" ", 1)[0].lower() in VERBS:
            parts.append(piece)
        else:
            parts[-1] = f"{parts[-1]} and {piece}"
    return parts


def arithmetic(goal: str) -> tuple[str, str, str] | None:
    for pattern, op, swap in ARITH:
        m = pattern.search(goal)
        if m:
            a, b = m.group(1), m.group(2)
            return (b, op, a) if swap else (a, op, b)
    return None


def arithmetic_result(a: str, op: str, b: str) -> str:
    x, y = float(a), float(b)
    value = {"*": x * y, "/": x / y if y else float("nan"), "+": x + y, "-": x - y}[op]
    return str(int(value)) if value == int(value) else f"{value:g}"


def norm(word: str) -> str:
    """Lower case, no hyphens, a plural's "s" dropped: "Wi-Fi" and "wifi", "alarms" and
    "alarm" are one word."""
    word = word.lower().replace("-", "")
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us")):
        return word[:-1]
    return word


def words(text: str) -> list[str]:
    """The words of a text in any script (umlauts, accents, CJK), normalised."""
    return [norm(w) for w in re.findall(r"[^\W_]+(?:-[^\W_]+)*", text or "")]


def variants(word: str) -> frozenset[str]:
    """A word and the words that mean the same (`SYNONYMS`)."""
    return frozenset({word}) | SYNONYMS.get(word, frozenset())


def on_off(goal: str) -> tuple[bool | None, bool | None]:
    """(explicit, soft) on/off wish of a goal. Explicit: "turn X off", "switch on X",
    "disable X"; the earliest wording wins. Soft: "I want X", "show X", "put the phone in X
    mode", which mean "on" for a switch the goal names and nothing else."""
    off, on = OFF.search(goal), ON.search(goal)
    explicit: bool | None = None
    if off and (not on or off.start() <= on.start()):
        explicit = False
    elif on:
        explicit = True
    soft = True if SOFT_ON.search(goal) else None
    return explicit, soft


@dataclass(slots=True)
class Goal:
    """A goal read once per turn: its content words, the state it asks for and its values."""

    text: str
    keywords: list[str]
    related: list[str]
    want_on: bool | None
    values: dict[str, str]
    generic_values: list[str] = field(default_factory=list)
    wants_settings: bool = False
    delete: bool = False
    #: "I want X", "show X": on, for a switch the goal names (never a reason to fill forms).
    soft_on: bool | None = None

    @property
    def switch_wish(self) -> bool | None:
        """The state the goal wants a switch it names in."""
        return self.want_on if self.want_on is not None else self.soft_on

    def names(self, label: str) -> bool:
        """Whether the goal names the thing called `label`: each of its telling words (all
        but `GENERIC` ones, which need not all be there) is in the goal, itself or as a
        synonym. "Battery Saver" is not named by "show the battery percentage"."""
        wanted = set(self.keywords)
        tokens = [w for w in words(label) if w not in STOP]
        telling = [w for w in tokens if w not in GENERIC]
        if not telling:
            return False
        return all(variants(w) & wanted for w in telling)

    def weight(self, label: str) -> float:
        """How strongly the goal's words point at `label` (telling words 1, generic 0.3)."""
        wanted = set(self.keywords)
        return sum(
            (0.3 if w in GENERIC else 1.0)
            for w in dict.fromkeys(words(label))
            if variants(w) & wanted
        )

    @property
    def targets(self) -> list[str]:
        """Strings that identify the object the goal is about (a name, a time, a quoted text)."""
        out = [self.values[k] for k in ("name", "label", "phone", "email") if k in self.values]
        if "hour" in self.values:
            h, m = int(self.values["hour"]), self.values["minute"]
            h12 = h % 12 or 12
            suffix = "AM" if h < 12 else "PM"
            out += [f"{h:02d}:{m}", f"{h}:{m}", f"{h12}:{m} {suffix}"]
        return out + self.generic_values

    @property
    def all_values(self) -> list[str]:
        return [*self.values.values(), *self.generic_values]


def secret_values(goal: str) -> dict[str, str]:
    """The goal's secret parameters as values to type: each `{{secret:NAME}}` reference under
    the field kind its name says ("wifi_password" a password, "phone_number" a phone), a
    password when it says none. The value is the reference itself: the host types the secret."""
    out: dict[str, str] = {}
    for name in secret_refs.names_in(goal):
        parts = set(name.split("_"))
        kind = next((k for k, hints in FIELD_KINDS.items() if parts & set(hints)), "password")
        out.setdefault(kind, secret_refs.reference(name))
    return out


def parse_goal(goal: str) -> Goal:
    """Read a goal: on/off wording, values to enter (names, numbers, times, labels, secrets)
    and the remaining content words, with the places they usually live (`related`). A secret
    parameter's reference is a value (`secret_values`), never words to look for."""
    text = goal
    secrets = secret_values(goal)
    goal = secret_refs.REFERENCE.sub(" ", goal)
    lower = goal.lower()
    want_on, soft_on = on_off(goal)
    values: dict[str, str] = {}
    quoted = [
        q for pair in re.findall(r"\"([^\"]+)\"|“([^”]+)”|'([^']+)'", goal) for q in pair if q
    ]
    value_text = " ".join(quoted)
    named = re.search(
        r"\b(?:named|called|name)\s+(\"[^\"]+\"|'[^']+'|[A-Z][\w'.-]*(?:\s+[A-Z][\w'.-]*)*)", goal
    )
    if named:
        values["name"] = named.group(1).strip("\"'")
        value_text += " " + values["name"]
    if "name" not in values and (re.search(r"\b(delete|remove|erase|contact)", lower)):
        # A person or item named without "named": a run of capitalized words after the first.
        proper = re.search(r"(?<=\s)([A-Z][\w'.-]+(?:\s+[A-Z][\w'.-]+)+)", goal)
        if proper:
            values["name"] = proper.group(1)
            value_text += " " + values["name"]
    phone = re.search(r"(\+?\d[\d ().-]{3,}\d)", goal)
    if phone and not re.fullmatch(r"\d{1,2}:\d{2}", phone.group(1)):
        values["phone"] = phone.group(1).strip()
        value_text += " " + values["phone"]
    email = re.search(r"[\w.+-]+@[\w-]+\.[\w.]+", goal)
    if email:
        values["email"] = email.group(0)
        value_text += " " + values["email"]
    clock = next(
        (
            m
            for m in re.finditer(
                r"\b(\d{1,2})(?::(\d{2}))?\s*(am|pm|a\.m\.|p\.m\.)?(?=\W|$)", lower
            )
            if m.group(2) or m.group(3)
        ),
        None,
    )
    if clock:
        hour, minute = int(clock.group(1)), int(clock.group(2) or 0)
        suffix = (clock.group(3) or "").replace(".", "")
        if suffix == "pm" and hour < 12:
            hour += 12
        if suffix == "am" and hour == 12:
            hour = 0
        values["hour"], values["minute"] = str(hour), f"{minute:02d}"
        value_text += " " + clock.group(0)
    label = re.search(r"\blabel(?:led|ed)?\s+(\"[^\"]+\"|'[^']+'|\w+)", goal, re.I)
    if label:
        values["label"] = label.group(1).strip("\"'")
        value_text += " " + values["label"]
    title = re.search(r"\b(?:titled|entitled|title)\s+(\"[^\"]+\"|“[^”]+”|'[^']+'|\w+)", goal, re.I)
    if title:
        values["title"] = title.group(1).strip("\"'“”")
        value_text += " " + values["title"]
    body = re.search(
        r"\b(?:says?|saying|reads?|reading|with the text|containing)\s+"
        r"(\"[^\"]+\"|“[^”]+”|'[^']+')",
        goal,
        re.I,
    )
    if body:
        values["body"] = body.group(1).strip("\"'“”")
        value_text += " " + values["body"]
    secret = re.search(
        r"\b(?:password|passcode|pin|code)\s+(?:is\s+)?(\"[^\"]+\"|'[^']+'|\S+)", goal, re.I
    )
    if secret and "password" not in secrets:
        values["password"] = secret.group(1).strip("\"'")
        value_text += " " + values["password"]
    values.update(secrets)
    generic = [q for q in quoted if q not in values.values()]
    if "name" in values and " " in values["name"]:
        first, last = values["name"].split(" ", 1)
        values["first"], values["last"] = first, last
    value_words = set(words(value_text))
    if "phone" in values:
        value_words |= {"phone", "number", "mobile"}
    if "email" in values:
        value_words |= {"email", "mail", "address"}
    content = _THE_DEVICE.sub(" ", goal)
    keywords = [w for w in words(content) if w not in STOP and w not in value_words]
    related: list[str] = []
    for w in keywords:
        related += [r for r in RELATED.get(w, ()) if r not in keywords and r not in related]
    wants_settings = bool(re.search(r"\b(settings?|einstellungen)\b", lower))
    delete = bool(re.search(r"\b(delete|remove|erase|lösche|entferne)\b", lower))
    return Goal(text, keywords, related, want_on, values, generic, wants_settings, delete, soft_on)
