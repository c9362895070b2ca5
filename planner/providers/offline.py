"""A deterministic planner that needs no network: a general heuristic agent, not a script.

It reads goal, scene and compact history back from the user prompt text (`parse_user_prompt`), so
it behaves the same in-process and behind the cloud's Decide service. Each turn it:

* judges the previous step (did the page change as its expected outcome said?);
* completes when the goal's target state is on screen (the switch the goal names is on/off as
  asked, the page the goal names is open, the values it asked to enter are shown after saving);
* fills form fields with values taken from the goal text (quoted strings, "named X", "phone
  555…", times "7:30"), matching each field's hint or id to the kind of value, then saves;
* otherwise taps the element whose label (its text, description, or the texts inside its row,
  such as a settings entry's summary) best matches the goal's words, opening the matching app
  from a launcher; it never re-taps what it already tried on that page and does not go back into
  pages it backed out of;
* scrolls when nothing matches, and backs out of dead ends.

It knows a little general Android vocabulary (dark theme lives under display, Wi-Fi under network,
an alarm in a clock app) the way any model does; it knows nothing about a particular task suite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from planner.conversation.items import AssistantText, ToolCall, UserObservation
from planner.decision import Usage
from planner.prompts import ParsedPrompt, parse_user_prompt
from planner.vendors.base import Turn, TurnRequest

MODEL = "amc-offline-heuristic-1"
MAX_STEPS = 40
MAX_SCROLLS_PER_PAGE = 4

_STOP = frozenset(
    " ".join(
        (
            "a an the to on off in of for and or with my me please turn switch set setting",
            "enable disable activate deactivate make sure that is it be go open app its this",
            "into from at as by can you up named called number new value labeled labelled",
            "label page",
        )
    ).split(" ")
)
_ON_WORDS = re.compile(r"\b(turn on|switch on|enable|activate|start using)\b")
_OFF_WORDS = re.compile(r"\b(turn off|switch off|disable|deactivate|stop using)\b")
# General vocabulary: where things usually live on Android (a hint, weaker than a direct match).
_RELATED: dict[str, tuple[str, ...]] = {
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
_SETTING_WORDS = (
    frozenset(_RELATED)
    | frozenset(w for targets in _RELATED.values() for w in targets)
    | {"mode", "toggle", "battery", "setting", "preference", "about", "storage", "accessibility"}
    | {"notification", "privacy", "security", "wallpaper", "system", "timeout", "screen"}
) - {"clock", "contacts", "people"}
_DESTRUCTIVE = frozenset({"delete", "remove", "trash", "erase", "reset", "clear", "uninstall"})
_HOME_GOAL = re.compile(r"\b(home screen|go home|return home|back home|launcher)\b", re.I)
_LEAVE_GOAL = re.compile(r"^\s*(leave|exit|close|quit)\b", re.I)
_VERBS = frozenset(
    " ".join(
        (
            "turn switch enable disable set open go return create add delete remove leave exit",
            "close use stop start make change put select show",
        )
    ).split(" ")
)
_SPLIT = re.compile(
    r"\s*(?:,\s*(?:and\s+)?then|,\s*and|\band then|\bthen|\band also|\band|;)\s+", re.I
)
# Calculator words: operator name -> (symbols a key may show, words its description may use)
_OPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "*": (("×", "*", "x", "X"), ("multiply", "times")),
    "/": (("÷", "/"), ("divide", "division")),
    "+": (("+",), ("plus", "add")),
    "-": (("−", "-", "–"), ("minus", "subtract")),
}
_ARITH = (
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
    pieces = [p.strip(" .") for p in _SPLIT.split(goal) if p and p.strip(" .")]
    if len(pieces) < 2:
        return [goal]
    parts = [pieces[0]]
    for piece in pieces[1:]:
        if piece.split(" ", 1)[0].lower() in _VERBS:
            parts.append(piece)
        else:
            parts[-1] = f"{parts[-1]} and {piece}"
    return parts


def _arithmetic(goal: str) -> tuple[str, str, str] | None:
    for pattern, op, swap in _ARITH:
        m = pattern.search(goal)
        if m:
            a, b = m.group(1), m.group(2)
            return (b, op, a) if swap else (a, op, b)
    return None


def _result(a: str, op: str, b: str) -> str:
    x, y = float(a), float(b)
    value = {"*": x * y, "/": x / y if y else float("nan"), "+": x + y, "-": x - y}[op]
    return str(int(value)) if value == int(value) else f"{value:g}"


_SAVE_WORDS = ("save", "done", "ok", "create", "add", "set", "apply", "confirm")
_FIELD_KINDS: dict[str, tuple[str, ...]] = {
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


def _norm(word: str) -> str:
    word = word.lower().replace("-", "")
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _words(text: str) -> list[str]:
    return [_norm(w) for w in re.findall(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*", text or "")]


@dataclass(frozen=True, slots=True)
class _El:
    id: str
    text: str
    desc: str
    rid: str
    cls: str
    bounds: tuple[int, int, int, int]
    flags: frozenset[str]

    @property
    def own_label(self) -> str:
        return self.text or self.desc

    @property
    def editable(self) -> bool:
        return "EditText" in self.cls or "AutoComplete" in self.cls

    @property
    def center(self) -> tuple[int, int]:
        b = self.bounds
        return ((b[0] + b[2]) // 2, (b[1] + b[3]) // 2)

    def contains(self, other: _El) -> bool:
        a, b = self.bounds, other.bounds
        return a != b and a[0] <= b[0] and a[1] <= b[1] and a[2] >= b[2] and a[3] >= b[3]


def _elements(scene: dict[str, Any]) -> list[_El]:
    out: list[_El] = []
    for raw in scene.get("elements", []):
        bounds = raw.get("bounds") or [0, 0, 0, 0]
        out.append(
            _El(
                id=str(raw.get("id", "")),
                text=str(raw.get("text", "")),
                desc=str(raw.get("desc", "")),
                rid=str(raw.get("rid", "")),
                cls=str(raw.get("cls", "")),
                bounds=(int(bounds[0]), int(bounds[1]), int(bounds[2]), int(bounds[3])),
                flags=frozenset(raw.get("flags", [])),
            )
        )
    return out


@dataclass(slots=True)
class _Goal:
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


def _parse_goal(goal: str) -> _Goal:
    lower = goal.lower()
    want_on: bool | None = None
    if _OFF_WORDS.search(lower):
        want_on = False
    elif _ON_WORDS.search(lower):
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
    value_words = set(_words(value_text))
    if "phone" in values:
        value_words |= {"phone", "number", "mobile"}
    if "email" in values:
        value_words |= {"email", "mail", "address"}
    keywords = [w for w in _words(goal) if w not in _STOP and w not in value_words]
    related: list[str] = []
    for w in keywords:
        related += [r for r in _RELATED.get(w, ()) if r not in keywords and r not in related]
    wants_settings = bool(re.search(r"\bsettings?\b", lower))
    delete = bool(re.search(r"\b(delete|remove|erase)\b", lower))
    return _Goal(goal, keywords, related, want_on, values, generic, wants_settings, delete)


@dataclass(slots=True)
class _Step:
    """One turn's choice before it becomes a tool call."""

    rationale: str
    tool: str
    args: dict[str, Any]


class OfflineProvider:
    """Deterministic heuristic agent behind the model adapter protocol."""

    @property
    def name(self) -> str:
        return "offline"

    @property
    def model(self) -> str:
        return MODEL

    @property
    def retry_form(self) -> Literal["forced"]:
        return "forced"

    async def aclose(self) -> None:
        return None

    async def complete(self, request: TurnRequest) -> Turn:
        prompt = next((m.text for m in request.items if isinstance(m, UserObservation)), "")
        try:
            parsed = parse_user_prompt(prompt)
            step = _decide(parsed)
        except ValueError as err:
            step = _Step(
                f"I cannot read this prompt ({err}).",
                "complete",
                {"success": False, "reason": f"offline planner: {err}"},
            )
        words = len(prompt.split())
        call_id = f"offline_{len(prompt)}"
        return Turn(
            turn_id=call_id,
            items=[
                AssistantText("offline", call_id, step.rationale),
                ToolCall("offline", call_id, call_id, step.tool, step.args),
            ],
            usage=Usage(input_tokens=words, output_tokens=len(step.rationale.split()) + 20),
            model=MODEL,
            stop_reason="tool_use",
            raw_calls={call_id: step.args},
        )


_PART_DONE = re.compile(r"Part (\d+)/(\d+) done")


def _decide(parsed: ParsedPrompt) -> _Step:
    """Split a compound goal into parts and work on the first part not yet done.

    Which parts are done is read from the agent's own earlier rationales ("Part 1/2 done: ..."),
    which the compact history carries; each part sees only the history since it started.
    """
    parts = split_goal(parsed.goal)
    if len(parts) == 1:
        return _Agent(parsed).decide_part()
    n = len(parts)
    if len(parsed.history) >= MAX_STEPS:
        return _Agent(parsed).finish(False, f"gave up after {len(parsed.history)} steps")
    k, start = 0, 0
    for i, record in enumerate(parsed.history):
        for m in _PART_DONE.finditer(str(record.get("rationale") or "")):
            if int(m.group(1)) > k:
                k, start = int(m.group(1)), i
    history = parsed.history[start:] if k else parsed.history
    notes: list[str] = []
    while True:
        step = _Agent(ParsedPrompt(parts[k], parsed.scene, history)).decide_part()
        done = step.tool == "complete" and step.args["success"]
        if done and k + 1 < n:
            notes.append(f"Part {k + 1}/{n} done: {step.args['reason']}.")
            k, history = k + 1, []
            continue
        if step.tool == "complete":
            reason = str(step.args["reason"])
            step.args = {
                "success": bool(step.args["success"]),
                "reason": f"all {n} parts done ({reason})"
                if done
                else f"part {k + 1}/{n} '{parts[k]}': {reason}",
            }
        step.rationale = " ".join([*notes, f"Part {k + 1}/{n} ('{parts[k]}'): {step.rationale}"])
        return step


class _Agent:
    def __init__(self, parsed: ParsedPrompt) -> None:
        self.goal = _parse_goal(parsed.goal)
        self.scene = parsed.scene
        self.history = parsed.history
        self.els = _elements(parsed.scene)
        self.title = str(parsed.scene.get("page", ""))
        self.app = str(parsed.scene.get("app", ""))
        self.page = f"{self.app}: {self.title}" if self.title else self.app
        screen = parsed.scene.get("screen") or [1080, 2400]
        self.width, self.height = int(screen[0]), int(screen[1])
        # The page's name as shown: the scene's title and the plain texts in the top bar.
        top = int(self.height * 0.12)
        self.headings = [self.title] + [
            e.text for e in self.els if e.text and e.bounds[3] <= top and "clickable" not in e.flags
        ]

    # -- reading the screen ---------------------------------------------------------------
    def label(self, el: _El) -> str:
        """What a finger on `el` means: its own text, or the texts inside it (a list row)."""
        if el.own_label and not el.editable and el.text not in ("ON", "OFF"):
            return el.own_label
        inner = [o.own_label for o in self.els if el.contains(o) and o.own_label]
        inner = [t for t in inner if t not in ("ON", "OFF")]
        if inner:
            return " — ".join(inner)
        if "checkable" in el.flags:
            return self.row_label(el)
        return el.own_label

    def row_label(self, el: _El) -> str:
        """Texts on the same row (a switch's label sits to its left)."""
        top, bottom = el.bounds[1], el.bounds[3]
        mid = (top + bottom) // 2
        texts = [
            o
            for o in self.els
            if o is not el
            and o.own_label
            and o.text not in ("ON", "OFF")
            and not o.contains(el)
            and o.bounds[1] - 60 <= mid <= o.bounds[3] + 60
        ]
        texts.sort(key=lambda o: o.bounds[1])
        return " — ".join(o.own_label for o in texts)

    def clickable_for(self, el: _El) -> _El:
        """The element that takes a tap meant for `el`: itself, or the row that contains it."""
        if "clickable" in el.flags or "checkable" in el.flags or el.editable:
            return el
        holders = [o for o in self.els if "clickable" in o.flags and o.contains(el)]
        if holders:
            return min(
                holders, key=lambda o: (o.bounds[2] - o.bounds[0]) * (o.bounds[3] - o.bounds[1])
            )
        return el

    def score(self, text: str) -> float:
        """Goal words in `text`: the first line (a title) weighs most, related words least."""
        parts = text.split(" — ")
        title, rest = set(_words(parts[0])), set(_words(" ".join(parts[1:])))
        s = 0.0
        for w in self.goal.keywords:
            s += 3.0 if w in title else 1.5 if w in rest else 0.0
        for w in self.goal.related:
            s += 1.0 if w in title else 0.5 if w in rest else 0.0
        if self.mentions_target(text):
            s += 4.0
        return s

    def mentions_target(self, text: str) -> bool:
        low = text.lower()
        return any(t.lower() in low for t in self.goal.targets)

    @property
    def on_launcher(self) -> bool:
        return "launcher" in self.app or self.title.lower() in ("home", "home screen")

    # -- reading the history --------------------------------------------------------------
    def tried_here(self) -> set[str]:
        """Names already tapped on this page (element ids are per screen; names survive).

        The name is the history's `target` when the host recorded it, else the quoted name in
        the action's purpose ("open 'Display'").
        """
        out: set[str] = set()
        for h in self.history:
            action = h.get("action") or {}
            if h.get("page") != self.page or action.get("tool") != "tap":
                continue
            if action.get("target"):
                out.add(str(action["target"]).split(" — ")[0])
            out.update(re.findall(r"'([^']+)'", str(action.get("purpose") or "")))
        return out

    def dead_ends(self) -> set[str]:
        """Titles of pages we backed out of."""
        out: set[str] = set()
        for h in self.history:
            action = h.get("action") or {}
            if action.get("tool") == "press_key" and action.get("key") == "back":
                page = str(h.get("page") or "")
                out.add(page.split(": ", 1)[-1].lower())
        return out

    def trailing_swipes(self) -> tuple[int, str]:
        """Swipes in a row in this app (page titles may change as a list scrolls), and the
        bottom label the last swipe started from ("" when none)."""
        n, last_from = 0, ""
        for h in reversed(self.history):
            action = h.get("action") or {}
            app = str(h.get("page") or "").split(": ", 1)[0]
            if app != self.app or action.get("tool") != "swipe":
                break
            if n == 0:
                found = re.findall(r"'([^']+)'", str(action.get("purpose") or ""))
                last_from = found[0] if found else ""
            n += 1
        return n, last_from

    def bottom_label(self, container: _El) -> str:
        inside = [
            e for e in self.els if container.contains(e) and e.text and e.text not in ("ON", "OFF")
        ]
        return max(inside, key=lambda e: e.bounds[3]).text if inside else ""

    def typed(self) -> list[str]:
        return [
            str((h.get("action") or {}).get("text"))
            for h in self.history
            if (h.get("action") or {}).get("tool") == "input_text"
        ]

    def judge(self) -> str:
        if not self.history:
            return f"First step on '{self.title or self.app}'."
        last = self.history[-1]
        action = last.get("action") or {}
        expected = str(action.get("expected_outcome") or "")
        ran = last.get("success")
        if ran is False:
            return f"The previous {action.get('tool')} failed to run; the screen is '{self.title}'."
        quoted = re.findall(r"'([^']+)'", expected)
        switch = re.fullmatch(r"the '(.+)' switch is (on|off)", expected)
        state = self.switch_state(switch.group(1)) if switch else None
        if switch and state is not None:
            want = switch.group(2) == "on"
            now = "on" if state else "off"
            verdict = (
                "reached its expected outcome"
                if state == want
                else f"did not reach its expected outcome (the switch is {now})"
            )
        elif quoted and any(q.lower() in h.lower() for q in quoted for h in self.headings):
            verdict = "reached its expected outcome"
        elif quoted and any(q.lower() in self._screen_text() for q in quoted):
            verdict = "looks done: what it expected is on screen"
        elif last.get("page") != self.page:
            verdict = "changed the page"
        else:
            verdict = "left the page as it was"
        return f"The previous step ({action.get('tool')}) {verdict}; now on '{self.title}'."

    def switch_state(self, name: str) -> bool | None:
        """Checked state of the switch whose row is named `name`, None when not on screen."""
        for el in self.els:
            if "checkable" in el.flags and self.label(el).split(" — ")[0] == name:
                return "checked" in el.flags
        return None

    def _screen_text(self) -> str:
        return " ".join(e.own_label for e in self.els).lower()

    # -- deciding -------------------------------------------------------------------------
    def decide_part(self) -> _Step:
        if len(self.history) >= MAX_STEPS:
            return self.finish(False, f"gave up after {len(self.history)} steps")
        steps = (
            self.go_home,
            self.leave,
            self.calculate,
            self.delete,
            self.toggle,
            self.form,
            self.choose,
            self.reached_page,
            self.navigate,
            self.explore,
        )
        for attempt in steps:
            step = attempt()
            if step is not None:
                return step
        return self.finish(False, "nothing on screen relates to the goal and there is no way back")

    def go_home(self) -> _Step | None:
        if not _HOME_GOAL.search(self.goal.text):
            return None
        if self.on_launcher:
            return self.finish(True, "the home screen is shown")
        return _Step(
            f"{self.judge()} Next: go to the home screen.",
            "press_key",
            {"key": "home", "purpose": "go to the home screen", "expected_outcome": "the launcher"},
        )

    def leave(self) -> _Step | None:
        """ "Leave the X": back out while the screen is still X, then done."""
        if not _LEAVE_GOAL.search(self.goal.text):
            return None
        here = " ".join([*self.headings, self.app]).lower()
        words = [w for w in self.goal.keywords if w not in ("leave", "exit", "close", "quit")]
        if words and any(w in set(_words(here)) for w in words) and not self.on_launcher:
            return _Step(
                f"{self.judge()} Still on '{self.title}'; go back to leave it.",
                "press_key",
                {
                    "key": "back",
                    "purpose": f"leave '{self.title}'",
                    "expected_outcome": "it closes",
                },
            )
        return self.finish(True, f"left it; now on '{self.title or self.app}'")

    def calculate(self) -> _Step | None:
        """Arithmetic goals on a calculator: press the keys one by one, then read the result."""
        problem = _arithmetic(self.goal.text)
        if problem is None:
            return None
        a, op, b = problem
        keys = [*a, op, *b, "="]
        pressed = 0
        for h in self.history:
            m = re.match(
                r"press '.+' \((\d+)/\d+\)", str((h.get("action") or {}).get("purpose") or "")
            )
            if m and h.get("success") is not False:
                pressed = int(m.group(1))
        buttons = [e for e in self.els if "clickable" in e.flags]
        if pressed >= len(keys):
            result = _result(a, op, b)
            shown = any(e.text.strip() == result for e in self.els)
            if shown:
                return self.finish(True, f"{a} {op} {b} = {result} is shown")
            return self.finish(False, f"pressed {' '.join(keys)} but {result} is not shown")
        key = keys[pressed]
        button = self.key_button(buttons, key)
        if button is None:
            return None  # not in a calculator yet: navigate there
        return _Step(
            f"{self.judge()} Next: press '{key}' (key {pressed + 1} of {len(keys)}: {a} {op} {b}).",
            "tap",
            {
                "element_id": button.id,
                "purpose": f"press '{key}' ({pressed + 1}/{len(keys)})",
                "expected_outcome": f"the display shows the input so far with '{key}'",
            },
        )

    @staticmethod
    def key_button(buttons: list[_El], key: str) -> _El | None:
        if key in _OPS:
            symbols, names = _OPS[key]
            for e in buttons:
                if e.text.strip() in symbols or set(_words(e.desc)) & set(names):
                    return e
            return None
        if key == "=":
            return next(
                (e for e in buttons if e.text.strip() == "=" or "equal" in _words(e.desc)), None
            )
        return next((e for e in buttons if e.text.strip() == key), None)

    def finish(self, success: bool, reason: str) -> _Step:
        verdict = "reached" if success else "not reachable"
        return _Step(
            f"{self.judge()} The goal is {verdict}: {reason}.",
            "complete",
            {"success": success, "reason": reason},
        )

    def tap(self, el: _El, intent: str, expected: str) -> _Step:
        target = self.clickable_for(el)
        return _Step(
            f"{self.judge()} Next: {intent}.",
            "tap",
            {"element_id": target.id, "purpose": intent, "expected_outcome": expected},
        )

    def toggle(self) -> _Step | None:
        if self.goal.want_on is None:
            return None
        switches = [e for e in self.els if "checkable" in e.flags]
        scored = [
            (
                self.direct_score(self.label(e))
                + (5.0 if self.mentions_target(f"{self.row_label(e)} {e.desc}") else 0.0),
                e,
            )
            for e in switches
        ]
        scored = [(s, e) for s, e in scored if s > 0]
        if not scored:
            return None
        best = max(scored, key=lambda p: p[0])[1]
        name = self.label(best).split(" — ")[0]
        state = "on" if self.goal.want_on else "off"
        if ("checked" in best.flags) == self.goal.want_on:
            return self.finish(True, f"'{name}' is {state}")
        # Prefer the row that holds the switch (the row takes the click on Android).
        holders = [o for o in self.els if "clickable" in o.flags and o.contains(best)]
        el = min(holders, key=lambda o: o.bounds[3] - o.bounds[1]) if holders else best
        return _Step(
            f"{self.judge()} Next: switch '{name}' {state}.",
            "tap",
            {
                "element_id": el.id,
                "purpose": f"turn '{name}' {state}",
                "expected_outcome": f"the '{name}' switch is {state}",
            },
        )

    def choose(self) -> _Step | None:
        """A goal that names an option ("screen timeout 5 minutes"): select it; done once checked.

        Options are checkable elements other than on/off switches (radio buttons, check marks),
        named by their own text or the text on their row; the whole name must be in the goal.
        """
        if self.goal.want_on is not None or not self.goal.keywords:
            return None
        wanted = set(self.goal.keywords)
        for el in self.els:
            if "checkable" not in el.flags or "Switch" in el.cls or el.text in ("ON", "OFF"):
                continue
            name = el.text or self.row_label(el).split(" — ")[0]
            words = set(_words(name))
            if not words or not words <= wanted:
                continue
            if "checked" in el.flags or "selected" in el.flags:
                return self.finish(True, f"'{name}' is selected")
            holders = [o for o in self.els if "clickable" in o.flags and o.contains(el)]
            target = min(holders, key=lambda o: o.bounds[3] - o.bounds[1]) if holders else el
            return _Step(
                f"{self.judge()} Next: select '{name}'.",
                "tap",
                {
                    "element_id": target.id,
                    "purpose": f"select '{name}'",
                    "expected_outcome": f"'{name}' is selected",
                },
            )
        return None

    def direct_score(self, text: str) -> float:
        words = set(_words(text.split(" — ")[0]))
        return float(sum(1 for w in self.goal.keywords if w in words))

    def delete(self) -> _Step | None:
        """Delete goals: tap a delete control for the target, or finish once it is gone."""
        if not self.goal.delete:
            return None
        deleted_before = any(
            (h.get("action") or {}).get("tool") == "tap"
            and str((h.get("action") or {}).get("purpose") or "").startswith("delete")
            and h.get("success") is not False
            for h in self.history
        )
        visible = self.mentions_target(self._screen_text_raw())
        if deleted_before and self.goal.targets and not visible:
            return self.finish(True, f"'{self.goal.targets[0]}' is no longer shown")
        page_is_target = any(self.mentions_target(h) for h in self.headings)
        for el in self.els:
            if "clickable" not in el.flags:
                continue
            words = set(_words(el.own_label))
            if not words & {"delete", "remove", "trash"}:
                continue
            if not self.goal.targets or self.mentions_target(el.own_label) or page_is_target:
                what = self.goal.targets[0] if self.goal.targets else self.title
                return _Step(
                    f"{self.judge()} Next: delete '{what}'.",
                    "tap",
                    {
                        "element_id": el.id,
                        "purpose": f"delete '{what}'",
                        "expected_outcome": f"'{what}' is no longer listed",
                    },
                )
        return None

    def form(self) -> _Step | None:
        if not self.goal.all_values or self.goal.delete or self.goal.want_on is not None:
            return None
        fields = [e for e in self.els if e.editable]
        typed = self.typed()
        if fields:
            assigned = self.assign(fields)
            for el, value in assigned:
                if el.text == value:
                    continue
                hint = el.text or el.rid.rsplit("/", 1)[-1]
                secret = "password" in el.flags or value == self.goal.values.get("password")
                if secret:
                    return _Step(
                        f"{self.judge()} Next: enter the secret in the '{hint}' field.",
                        "input_text",
                        {
                            "text": value,
                            "sensitive": True,
                            "element_id": el.id,
                            "purpose": f"fill in '{hint}'",
                            "expected_outcome": f"the '{hint}' field is filled (masked)",
                        },
                    )
                return _Step(
                    f"{self.judge()} Next: enter '{value}' in the '{hint}' field.",
                    "input_text",
                    {
                        "text": value,
                        "element_id": el.id,
                        "purpose": f"fill in '{hint}'",
                        "expected_outcome": f"the '{hint}' field shows '{value}'",
                    },
                )
            if assigned:
                save = self.save_button()
                if save is not None:
                    return self.tap(
                        save,
                        f"save with '{self.label(save)}'",
                        "the entry is saved and shown",
                    )
        elif typed:
            # The most telling value typed (the longest) shown on a page without fields: saved.
            shown = max((v for v in typed if v and v != "•••"), key=len, default="")
            if shown and shown in self._screen_text_raw():
                visible = [v for v in typed if v and v != "•••" and v in self._screen_text_raw()]
                listed = ", ".join(f"'{v}'" for v in visible)
                return self.finish(True, f"saved: {listed} shown on '{self.title}'")
        return None

    def _screen_text_raw(self) -> str:
        return " ".join(e.own_label for e in self.els)

    def assign(self, fields: list[_El]) -> list[tuple[_El, str]]:
        """Match each value to the field whose hint or id names its kind."""
        values = dict(self.goal.values)
        out: list[tuple[_El, str]] = []
        used: set[str] = set()
        kinds_here: set[str] = set()
        for el in fields:
            words = set(_words(el.text + " " + el.rid.rsplit("/", 1)[-1].replace("_", " ")))
            for kind_name, hints in _FIELD_KINDS.items():
                if words & set(hints):
                    kinds_here.add(kind_name)
        if {"first", "last"} <= kinds_here:
            values.pop("name", None)
        else:
            values.pop("first", None)
            values.pop("last", None)
        generic = list(self.goal.generic_values)
        for el in fields:
            words = set(_words(el.text + " " + el.rid.rsplit("/", 1)[-1].replace("_", " ")))
            kind = next(
                (k for k, hints in _FIELD_KINDS.items() if words & set(hints) and k in values),
                None,
            )
            if kind is not None and kind not in used:
                used.add(kind)
                out.append((el, values[kind]))
            elif (
                generic and kind is None and not any(words & set(h) for h in _FIELD_KINDS.values())
            ):
                out.append((el, generic.pop(0)))
        return out

    def save_button(self) -> _El | None:
        for word in _SAVE_WORDS:
            for e in self.els:
                if "clickable" in e.flags and not e.editable and word in _words(e.own_label):
                    return e
        return None

    def reached_page(self) -> _Step | None:
        """A goal that only names a place ("open battery settings") is done when it is open."""
        if self.goal.want_on is not None or self.goal.all_values or not self.goal.keywords:
            return None
        wanted = [w for w in self.goal.keywords if w not in ("show", "view", "check", "find")]
        for heading in self.headings:
            if wanted and all(w in set(_words(heading)) for w in wanted):
                return self.finish(True, f"the '{heading}' page is open")
        return None

    def navigate(self) -> _Step | None:
        tried = self.tried_here()
        dead = self.dead_ends()
        best: tuple[float, _El] | None = None
        seen: set[str] = set()
        for el in self.els:
            if el.editable or "disabled" in el.flags:
                continue
            target = self.clickable_for(el)
            if "clickable" not in target.flags or target.id in seen:
                continue
            seen.add(target.id)
            label = self.label(target)
            name = label.split(" — ")[0]
            if not self.goal.delete and set(_words(target.own_label or name)) & _DESTRUCTIVE:
                continue
            if not label or name in tried or name.lower() in dead:
                continue
            if name.lower() in (h.lower() for h in self.headings):
                continue
            s = self.score(label)
            if s > 0 and (best is None or s > best[0]):
                best = (s, target)
        if (
            best is None
            and self.on_launcher
            and (
                self.goal.want_on is not None
                or self.goal.wants_settings
                or set(self.goal.keywords) & _SETTING_WORDS
            )
        ):
            for e in self.els:
                target = self.clickable_for(e)
                name = self.label(target).split(" — ")[0]
                if "clickable" in target.flags and "setting" in _words(name) and name not in tried:
                    best = (0.1, target)
                    break
        if best is None:
            return None
        el = best[1]
        name = self.label(el).split(" — ")[0]
        return self.tap(el, f"open '{name}'", f"the '{name}' page is open")

    def explore(self) -> _Step | None:
        scrollable = next((e for e in self.els if "scrollable" in e.flags), None)
        swipes, last_from = self.trailing_swipes()
        last_label = self.bottom_label(scrollable) if scrollable is not None else ""
        at_end = swipes > 0 and last_label == last_from
        if scrollable is not None and swipes < MAX_SCROLLS_PER_PAGE and not at_end:
            left, top, right, bottom = scrollable.bounds
            x = (left + right) // 2
            start_y = top + (bottom - top) * 4 // 5
            end_y = top + (bottom - top) // 5
            return _Step(
                f"{self.judge()} Nothing here matches the goal; scroll for more.",
                "swipe",
                {
                    "start_x": x,
                    "start_y": start_y,
                    "end_x": x,
                    "end_y": end_y,
                    "purpose": f"scroll down past '{last_label}' to look for the goal's target"
                    if last_label
                    else "scroll down to look for the goal's target",
                    "expected_outcome": "entries below the current ones are visible",
                },
            )
        if self.on_launcher:
            return None
        why = "The list ends here and nothing" if at_end else "Nothing"
        return _Step(
            f"{self.judge()} {why} on this page leads to the goal; go back.",
            "press_key",
            {
                "key": "back",
                "purpose": f"leave '{self.title}', which does not lead to the goal",
                "expected_outcome": "the previous page is shown",
            },
        )
