"""The checker: did a step reach its expected outcome? A pure, deterministic reading of screens.

Every device action states what the screen should show afterwards (`expected_outcome`). After
the action runs, the host checks that statement against the next observation (and the one
before, which it also has) and gets a verdict — met, not met or unknown — with one line of
evidence: what was looked for and what was found. The cloud runs the same function on the
observation of the next Decide call when a host sent no verdict (it then has no screen from
before the action, so checks that compare the two say unknown).

What it reads, from the typed observation only: a switch named in the outcome is on or off; an
option is selected; a page named in the outcome is open; a text is shown or no longer listed; a
field shows the typed text; the keyboard or a dialog is gone; the home screen or an app is in
front; a list moved. Anything else is "unknown": the checker says met or not met only when the
screen says so, so a verdict never guesses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from amc.v1 import types_pb2
from planner import labels, secret_refs
from planner.history import verdict_line
from planner.scene import Scene

VerdictName = Literal["met", "not_met", "unknown"]
MAX_EVIDENCE_BYTES = 512
WORDS: dict[str, str] = {"met": "met", "not_met": "not met", "unknown": "unknown"}
_TO_PROTO: dict[VerdictName, types_pb2.Verdict.ValueType] = {
    "met": types_pb2.VERDICT_MET,
    "not_met": types_pb2.VERDICT_NOT_MET,
    "unknown": types_pb2.VERDICT_UNKNOWN,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}

_Q = r"['\"‘’“”]?"
_ON = ("on", "enabled", "checked", "active", "turned on", "switched on")
_OFF = ("off", "disabled", "unchecked", "inactive", "turned off", "switched off")
_SWITCH = re.compile(
    rf"^(?:the )?{_Q}(?P<name>.+?){_Q}(?: (?:switch|toggle|setting|option|tile|checkbox))?"
    rf" (?:is|are|shows|reads)(?: now)? (?P<state>{'|'.join(_ON + _OFF)})\b",
    re.I,
)
_SELECTED = re.compile(
    rf"^(?:the )?{_Q}(?P<name>.+?){_Q}(?: (?:option|choice|setting|entry))?"
    r" (?:is|are)(?: now)? (?:selected|chosen)",
    re.I,
)
_GONE = re.compile(
    rf"{_Q}(?P<name>[^'\"‘’“”]+?){_Q} (?:is|are) (?:no longer (?:listed|shown|visible|there|"
    r"present)|gone|removed|deleted)",
    re.I,
)
_PAGE = re.compile(
    rf"^(?:the )?{_Q}(?P<name>[^'\"‘’“”]+?){_Q} (?:settings )?(?:page|screen|tab|view|app|list)"
    r"(?: is| are)? (?:now )?(?:open|opens|opened|shown|displayed|visible|appears)",
    re.I,
)
_FIELD = re.compile(
    rf"{_Q}(?P<field>[^'\"‘’“”]+){_Q} field (?:shows|contains|reads|has) {_Q}(?P<value>.+?){_Q}$",
    re.I,
)
#: What a masked field shows instead of its text: Android's password dots, the host's mask.
MASK_CHARS = frozenset("•●*·∙")
_MASKED = re.compile(r"field is filled \(masked\)|masked|hidden characters", re.I)
_NO_LONGER = r"no longer (?:shown|visible|open|there|displayed)"
_KEYBOARD_GONE = re.compile(
    rf"keyboard (?:is )?(?:gone|hidden|closed|dismissed|{_NO_LONGER})", re.I
)
_DIALOG_GONE = re.compile(
    rf"(?:prompt|dialog|shade|popup|menu) (?:closes|is closed|is gone|is {_NO_LONGER})", re.I
)
#: What "… is gone" says of the screen's state, not of a text on it (read by their own rules).
_NOT_A_TEXT = re.compile(r"\b(?:keyboard|prompt|dialog|shade|popup|menu)\b", re.I)
_HOME = re.compile(r"\b(?:launcher|home screen)\b", re.I)
#: The home screen named as where the step leaves from, not where it goes.
_FROM_HOME = re.compile(
    r"\b(?:from|leav\w*|left|exit\w*|away from|no longer (?:on|at|in)|instead of)"
    r" (?:the |a )?(?:launcher|home screen)\b"
    r"|\b(?:launcher|home screen) (?:is |gets )?(?:replaced|left|closed|gone)",
    re.I,
)
_SCROLLED = re.compile(r"entries (?:below|above)|(?:list|page) (?:scrolls|moved|is scrolled)", re.I)
_QUOTED = re.compile(r"['\"‘“]([^'\"’”]{1,80})['\"’”]")
#: Words that name a page by where it stands ("the previous page is shown"), not by its title.
_RELATIVE = frozenset({"previous", "prior", "last", "preceding", "earlier", "former", "prev"})
_PAGE_STOP = frozenset({"the", "a", "an", "page", "screen", "settings", "is", "open", "opens"})
#: System windows that cover the app (a finger reaches the app only once they are gone).
BLOCKING = frozenset(
    {"permission_prompt", "app_not_responding", "app_crash", "system_dialog", "notification_shade"}
)


@dataclass(frozen=True, slots=True)
class _Action:
    """The few things of an action the rules read."""

    tool: str
    args: Mapping[str, Any]

    @property
    def package(self) -> str:
        return str(self.args.get("package_name") or "")

    @property
    def typed(self) -> str | None:
        """The typed text, unless sensitive or a secret's reference (the host typed the value
        in its place, which no screen shows): then it is never compared."""
        if self.tool != "input_text" or self.args.get("sensitive"):
            return None
        text = str(self.args.get("text") or "")
        return None if secret_refs.refers(text) else text


@dataclass(frozen=True, slots=True)
class Check:
    """A verdict and its evidence (one line: what was looked for, what was found)."""

    verdict: VerdictName
    evidence: str

    def line(self, expected: str) -> str:
        """How history and tool results say it: "expected 'X' — not met: <evidence>"."""
        return verdict_line(expected, self.verdict, self.evidence)


def verdict_to_proto(verdict: str | None) -> types_pb2.Verdict.ValueType:
    """ "not_met" → VERDICT_NOT_MET; None or anything unknown → UNSPECIFIED."""
    for name, value in _TO_PROTO.items():
        if name == verdict:
            return value
    return types_pb2.VERDICT_UNSPECIFIED


def verdict_from_proto(value: types_pb2.Verdict.ValueType) -> VerdictName | None:
    """VERDICT_MET → "met"; UNSPECIFIED → None (not judged)."""
    return _FROM_PROTO.get(value)


def disagree(checker: str | None, model: str | None) -> bool:
    """One said met and the other not met (unknown disagrees with nothing)."""
    return {checker, model} == {"met", "not_met"}


def cut_evidence(text: str) -> str:
    """`text` within MAX_EVIDENCE_BYTES, cut on a character boundary and marked with "…"."""
    raw = text.encode("utf-8")
    if len(raw) <= MAX_EVIDENCE_BYTES:
        return text
    return raw[: MAX_EVIDENCE_BYTES - 3].decode("utf-8", errors="ignore") + "…"


def _show(values: list[str], limit: int = 4) -> str:
    shown = ", ".join(repr(v[:40]) for v in values[:limit])
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


def _page_of(scene: Scene) -> str:
    return scene.page_title or scene.package or "an unnamed screen"


def verify(
    expected: str,
    tool_name: str,
    arguments: Mapping[str, Any],
    after: Scene,
    before: Scene | None = None,
) -> Check:
    """The verdict on an action's expected outcome, read from the screen `after` it (and the
    screen `before` it, when known). `arguments` are the executable arguments (a sensitive
    text may be masked: it is never compared). Pure: same inputs, same verdict."""
    action = _Action(tool_name, arguments)
    if tool_name in ("", "complete", "get_ui_tree"):
        return Check("unknown", "nothing to check: the action changes no screen")
    text = " ".join(expected.split()).rstrip(".")
    if not text:
        return Check("unknown", "no expected outcome was stated")
    for rule in (_launched, _switch, _selected, _gone, _keyboard, _dialog, _field, _page, _home):
        found = rule(text, action, after, before)
        if found is not None:
            return Check(found.verdict, cut_evidence(found.evidence))
    found = _scrolled(text, after, before) or _quoted(text, after)
    if found is not None:
        return Check(found.verdict, cut_evidence(found.evidence))
    if before is not None and _same_screen(before, after):
        return Check(
            "unknown",
            f"no rule reads this outcome; the screen did not change ({_page_of(after)!r})",
        )
    return Check("unknown", f"no rule reads this outcome; the screen shows {_page_of(after)!r}")


_ALREADY = re.compile(r"\b(is|are)(?: now)? already\b", re.I)
#: A state said in the past or perfect ("was already enabled", "has already been turned on"):
#: what a model says of a state it found set, read as the present the state rules check.
#: A bare "was" stays: "Wi-Fi was off, turned it on" says what the state was before.
_WAS = re.compile(r"\b(?:was already|has(?: already)? been)\b", re.I)
_WERE = re.compile(r"\b(?:were already|have(?: already)? been)\b", re.I)
#: What a model says of a state it found set before doing anything.
_FOUND_SET = re.compile(
    r"\balready\b|\bnothing (?:else )?(?:to|needed to) (?:do|change)\b|\bno change",
    re.I,
)
#: A goal that asks for a state (a switch on or off, an option chosen), not for a place.
_STATE_GOAL = re.compile(
    r"\b(?:(?:turn|switch|toggle)\b.*\b(?:on|off)|enable|disable|activate|deactivate"
    r"|select|choose|set)\b",
    re.I,
)


def _claim_sentences(statement: str) -> list[str]:
    """`statement`'s sentences as the state rules read them ("is already on", "was already
    on", "has been turned on" → "is on")."""
    return [
        _WERE.sub("are", _WAS.sub("is", _ALREADY.sub(r"\1", sentence.rstrip(".;!"))))
        for sentence in re.split(r"(?<=[.;!])\s+", " ".join(statement.split()))
    ]


def claims_a_checkable_state(statement: str) -> bool:
    """Whether `state_claim` reads a sentence of `statement` as a state on a screen that
    shows it ("'Dark theme' is already on", "Dark theme was already enabled"), not only
    whether it speaks of one ("Dark theme enabled successfully" does, in words no rule reads:
    unknown on any screen)."""
    return any(_SWITCH.match(text) or _SELECTED.match(text) for text in _claim_sentences(statement))


def found_already_set(statement: str) -> bool:
    """Whether `statement` says the run found what it was asked for already so ("already
    enabled", "nothing to do"): a run that then set nothing reached no state itself."""
    return _FOUND_SET.search(statement) is not None


def asks_for_a_state(goal: str) -> bool:
    """Whether `goal` asks for a state ("Turn on dark theme", "Select English"), not only for
    a place ("Open display settings")."""
    return _STATE_GOAL.search(goal) is not None


def state_claim(statement: str, scene: Scene) -> Check:
    """What `scene` says of a statement about a state it holds (a switch on or off, an option
    selected), read sentence by sentence: "not met" when one of them is not so, "met" when one
    is and none is not, else unknown.

    For the reason a run's closing `complete` gave ("'Dark theme' is on"), which a replay
    repeats as its own: the run may have found the state already there (a phone with dark
    theme on: the model opened Display, saw the switch on, and completed), and a flow learned
    from it has no step that sets it. Only state rules: a text quoted in a free-form reason
    ("opened 'Display'") need not be on the final screen."""
    verdicts: list[Check] = []
    # "is already on": what a model says when it found the state set before doing anything
    for text in _claim_sentences(statement):
        for rule in (_switch, _selected):
            found = rule(text, _Action("complete", {}), scene, None)
            if found is not None and found.verdict != "unknown":
                verdicts.append(Check(found.verdict, cut_evidence(found.evidence)))
                break
    unmet = next((c for c in verdicts if c.verdict == "not_met"), None)
    if unmet is not None:
        return unmet
    if verdicts:
        return verdicts[0]
    return Check("unknown", "no state the screen shows is named")


def _launched(text: str, action: _Action, after: Scene, before: Scene | None) -> Check | None:
    if action.tool != "launch_app":
        return None
    package = action.package
    if after.package == package:
        return Check("met", f"looked for {package} in front: it is ({_page_of(after)!r})")
    return Check("not_met", f"looked for {package} in front: {after.package or 'nothing'} is")


def _switch(text: str, action: _Action, after: Scene, before: Scene | None) -> Check | None:
    m = _SWITCH.match(text)
    if m is None:
        return None
    name = m.group("name").strip()
    want = m.group("state").lower() in _ON
    found = labels.checkables_named(after, name)
    state = "on" if want else "off"
    if not found:
        return None  # not a switch on this screen ("the display is on"): other rules read it
    now = found[0].checked
    if now == want:
        return Check("met", f"looked for the {name!r} switch {state}: it is {state}")
    return Check(
        "not_met", f"looked for the {name!r} switch {state}: it is {'on' if now else 'off'}"
    )


def _selected(text: str, action: _Action, after: Scene, before: Scene | None) -> Check | None:
    m = _SELECTED.match(text)
    if m is None:
        return None
    name = m.group("name").strip()
    options = [e for e in after.elements if e.checkable] or after.elements
    for e in options:
        if labels.name_of(after, e).lower() == name.lower() or e.text.lower() == name.lower():
            if e.checked or e.selected:
                return Check("met", f"looked for {name!r} selected: it is")
            chosen = [labels.name_of(after, o) for o in options if o.checked or o.selected]
            now = f"{_show(chosen)} is" if chosen else "nothing is"
            return Check("not_met", f"looked for {name!r} selected: {now}")
    return Check("unknown", f"looked for the option {name!r}: it is not on the screen")


def _gone(text: str, action: _Action, after: Scene, before: Scene | None) -> Check | None:
    m = _GONE.search(text)
    if m is None:
        return None
    name = m.group("name").strip()
    if _NOT_A_TEXT.search(name):
        return None  # "the keyboard is gone": no label says so, the keyboard's own rule does
    if labels.shows(after, name):
        return Check("not_met", f"looked for {name!r} to be gone: it is still shown")
    return Check("met", f"looked for {name!r} to be gone: it is not on the screen")


def hidden(shown: str) -> bool:
    """A field's text is only mask characters: the phone's password dots, or the host's mask
    over a secret it typed (`host/agent/redact.py`)."""
    kept = shown.strip()
    return bool(kept) and all(c in MASK_CHARS for c in kept)


def _field(text: str, action: _Action, after: Scene, before: Scene | None) -> Check | None:
    editable = [e for e in after.elements if "EditText" in e.class_name or e.password]
    m = _FIELD.search(text)
    secret = action.tool == "input_text" and action.typed is None
    if action.tool == "input_text" and (_MASKED.search(text) or (secret and m is not None)):
        # What a secret's field shows is a mask, never the value (nor the {{secret:NAME}} the
        # outcome may quote): all there is to read is whether a field holds hidden text.
        filled = [e for e in editable if e.text and (e.password or hidden(e.text))]
        if filled:
            return Check("met", "looked for the secret field to be filled: it holds hidden text")
        return Check("unknown", "looked for the secret field: no filled password field is shown")
    if m is None:
        if action.typed is None:
            return None
        value = action.typed
        field = "a field"
    else:
        value, field = m.group("value"), f"the {m.group('field')!r} field"
    if not value:
        return None
    if any(value.lower() in e.text.lower() for e in editable if e.text):
        return Check("met", f"looked for {field} showing {value!r}: it does")
    if labels.shows(after, value):
        return Check("met", f"looked for {field} showing {value!r}: the screen shows it")
    shown = [e.text for e in editable if e.text]
    now = f"the fields show {_show(shown)}" if shown else "no field shows text"
    return Check("not_met", f"looked for {field} showing {value!r}: {now}")


def _page_matches(name: str, scene: Scene) -> str | None:
    """The heading that names page `name`, if one does."""
    want = [w for w in labels.words(name) if w not in _PAGE_STOP]
    for heading in labels.headings(scene):
        have = set(labels.words(heading))
        if not have:
            continue
        if heading.lower() == name.lower() or (want and set(want) <= have):
            return heading
        if have <= set(labels.words(name)) and len(have) >= max(1, len(want) // 2):
            return heading
    return None


def _page(text: str, action: _Action, after: Scene, before: Scene | None) -> Check | None:
    m = _PAGE.match(text)
    if m is None:
        return None
    name = m.group("name").strip()
    if not labels.words(name):
        return None
    if set(labels.words(name)) <= _RELATIVE:
        return _went_back(name, after, before)
    if set(labels.words(name)) <= {"home", "launcher"}:
        return None  # "the home screen is shown": no page is titled so (`_home` reads it)
    heading = _page_matches(name, after)
    if heading is not None:
        return Check("met", f"looked for the {name!r} page: {heading!r} is open")
    blocking = [o for o in after.overlays if o in BLOCKING]
    covered = f" under a {blocking[0].replace('_', ' ')}" if blocking else ""
    return Check(
        "not_met", f"looked for the {name!r} page: the screen shows {_page_of(after)!r}{covered}"
    )


def _went_back(name: str, after: Scene, before: Scene | None) -> Check:
    """ "The previous page is shown" names no page: which one was before the screen the step
    began on is not on either screen, so only a screen that did not change says not met."""
    if before is None:
        return Check("unknown", f"looked for the {name} page: the screen before is not known here")
    if _same_screen(before, after):
        return Check("not_met", f"looked for the {name} page: still on {_page_of(after)!r}")
    return Check(
        "unknown",
        f"looked for the {name} page: {_page_of(before)!r} gave way to {_page_of(after)!r}, "
        "whether that one came before it is not on the screen",
    )


def _keyboard(text: str, action: _Action, after: Scene, before: Scene | None) -> Check | None:
    if not _KEYBOARD_GONE.search(text):
        return None
    if after.keyboard_shown or "keyboard" in after.overlays:
        return Check("not_met", "looked for the keyboard to be gone: it is still shown")
    return Check("met", "looked for the keyboard to be gone: it is")


def _dialog(text: str, action: _Action, after: Scene, before: Scene | None) -> Check | None:
    if not _DIALOG_GONE.search(text):
        return None
    blocking = [o for o in after.overlays if o in BLOCKING]
    if blocking:
        what = blocking[0].replace("_", " ")
        return Check("not_met", f"looked for the dialog to close: a {what} is still shown")
    return Check("met", f"looked for the dialog to close: nothing covers {_page_of(after)!r}")


def _home(text: str, action: _Action, after: Scene, before: Scene | None) -> Check | None:
    if not _HOME.search(text) or _FROM_HOME.search(text):
        return None  # "Settings opens from the home screen" says nothing of being home
    if labels.on_launcher(after):
        return Check("met", f"looked for the home screen: {after.package} is in front")
    return Check("not_met", f"looked for the home screen: the screen shows {_page_of(after)!r}")


def _same_screen(a: Scene, b: Scene) -> bool:
    return a.page == b.page and labels.screen_texts(a) == labels.screen_texts(b)


def _scrolled(text: str, after: Scene, before: Scene | None) -> Check | None:
    if not _SCROLLED.search(text):
        return None
    if before is None:
        return Check("unknown", "looked for the list to move: the screen before is not known here")
    if _same_screen(before, after):
        return Check("not_met", "looked for the list to move: the screen shows the same entries")
    return Check("met", "looked for the list to move: other entries are shown")


def _quoted(text: str, after: Scene) -> Check | None:
    names = [q.strip() for q in _QUOTED.findall(text) if q.strip()]
    if not names:
        return None
    shown = [n for n in names if labels.shows(after, n)]
    if shown and len(shown) == len(names):
        return Check("met", f"looked for {_show(names)}: the screen shows them")
    return None
