"""Goal parsing: what a goal in plain words asks for (words, on/off, values, arithmetic).

Everything here reads only the goal text; nothing looks at a screen. A little general Android
vocabulary (dark theme lives under display, Wi-Fi under network) is the kind any model knows;
nothing here knows a particular task suite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

STOP = frozenset(
    " ".join(
        (
            "a an the to on off in of for and or with my me please turn switch set setting",
            "enable disable activate deactivate make sure that is it be go open app its this",
            "into from at as by can you up named called number new value labeled labelled",
            "label page",
        )
    ).split(" ")
)
ON_WORDS = re.compile(r"\b(turn on|switch on|enable|activate|start using)\b")
OFF_WORDS = re.compile(r"\b(turn off|switch off|disable|deactivate|stop using)\b")
# General vocabulary: where things usually live on Android (a hint, weaker than a direct match).
RELATED: dict[str, tuple[str, ...]] = {
    "dark": ("display", "theme"),
    "theme": ("display",),
    "brightness": ("display",),
    "font": ("display",),
    "timeout": ("display",),
    "rotate": ("display",),
    "autorotate": ("display",),
    "rotation": ("display",),
    "wifi": ("network", "internet"),
    "airplane": ("network", "internet"),
    "hotspot": ("network", "internet"),
    "data": ("network", "internet"),
    "bluetooth": ("connected", "device"),
    "nfc": ("connected", "device"),
    "volume": ("sound",),
    "ringtone": ("sound",),
    "vibrate": ("sound", "vibration"),
    "vibration": ("sound",),
    "disturb": ("sound",),
    "saver": ("battery",),
    "percentage": ("battery",),
    "alarm": ("clock",),
    "timer": ("clock",),
    "stopwatch": ("clock",),
    "contact": ("contacts", "people"),
    "location": ("location",),
    "gps": ("location",),
    "language": ("system",),
    "date": ("system",),
    "time": ("system",),
}
SETTING_WORDS = (
    frozenset(RELATED)
    | frozenset(w for targets in RELATED.values() for w in targets)
    | {"mode", "toggle", "battery", "setting", "preference", "about", "storage", "accessibility"}
    | {"notification", "privacy", "security", "wallpaper", "system", "timeout", "screen"}
) - {"clock", "contacts", "people"}
DESTRUCTIVE = frozenset({"delete", "remove", "trash", "erase", "reset", "clear", "uninstall"})
HOME_GOAL = re.compile(r"\b(home screen|go home|return home|back home|launcher)\b", re.I)
LEAVE_GOAL = re.compile(r"^\s*(leave|exit|close|quit)\b", re.I)
VERBS = frozenset(
    " ".join(
        (
            "turn switch enable disable set open go return create add delete remove leave exit",
            "close use stop start make change put select show",
        )
    ).split(" ")
)
SPLIT = re.compile(
    r"\s*(?:,\s*(?:and\s+)?then|,\s*and|\band then|\bthen|\band also|\band|;)\s+", re.I
)
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


SAVE_WORDS = ("save", "done", "ok", "create", "add", "set", "apply", "confirm")
FIELD_KINDS: dict[str, tuple[str, ...]] = {
    "first": ("first",),
    "last": ("last", "surname", "family"),
    "name": ("name",),
    "phone": ("phone", "number", "mobile", "tel"),
    "email": ("email", "mail"),
    "hour": ("hour",),
    "minute": ("minute",),
    "label": ("label", "title", "note", "description"),
    "password": ("password", "pin", "passcode", "code"),
}


def norm(word: str) -> str:
    word = word.lower().replace("-", "")
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def words(text: str) -> list[str]:
    return [norm(w) for w in re.findall(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*", text or "")]


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


def parse_goal(goal: str) -> Goal:
    """Read a goal: on/off wording, values to enter (names, numbers, times, labels, secrets)
    and the remaining content words, with the places they usually live (`related`)."""
    lower = goal.lower()
    want_on: bool | None = None
    if OFF_WORDS.search(lower):
        want_on = False
    elif ON_WORDS.search(lower):
        want_on = True
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
    secret = re.search(
        r"\b(?:password|passcode|pin|code)\s+(?:is\s+)?(\"[^\"]+\"|'[^']+'|\S+)", goal, re.I
    )
    if secret:
        values["password"] = secret.group(1).strip("\"'")
        value_text += " " + values["password"]
    generic = [q for q in quoted if q not in values.values()]
    if "name" in values and " " in values["name"]:
        first, last = values["name"].split(" ", 1)
        values["first"], values["last"] = first, last
    value_words = set(words(value_text))
    if "phone" in values:
        value_words |= {"phone", "number", "mobile"}
    if "email" in values:
        value_words |= {"email", "mail", "address"}
    keywords = [w for w in words(goal) if w not in STOP and w not in value_words]
    related: list[str] = []
    for w in keywords:
        related += [r for r in RELATED.get(w, ()) if r not in keywords and r not in related]
    wants_settings = bool(re.search(r"\bsettings?\b", lower))
    delete = bool(re.search(r"\b(delete|remove|erase)\b", lower))
    return Goal(goal, keywords, related, want_on, values, generic, wants_settings, delete)
