"""Tactics: one turn's choice, tried in order (answer an interruption, go home, leave,
calculate, delete, switch, fill a form, choose an option, done on the named page, navigate,
explore).

Each tactic either returns a step or passes (None) to the next one; the goal, the screen and
the memory of earlier turns are all it reads. Two rules hold throughout: a switch, checkbox or
tile is only ever touched by `toggle`, and only when the goal names it (so nothing is flipped
on the way, "as if opening a row"); and success is judged from what the screen shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner import secret_refs
from planner.prompts import ParsedPrompt
from planner.providers.offline.goal import OPS, arithmetic, arithmetic_result, parse_goal, variants
from planner.providers.offline.goal import words as words_of
from planner.providers.offline.memory import Memory, action_of
from planner.providers.offline.screen import El, Screen
from planner.providers.offline.vocabulary import (
    ALLOW,
    CREATIVE,
    DENY,
    DESTRUCTIVE,
    DISMISS,
    FIELD_FALLBACK,
    FIELD_KINDS,
    GRANT_WORDS,
    HOME_GOAL,
    LEAVE_GOAL,
    SAVE_WORDS,
    SETTING_WORDS,
    SETTINGS_APP_NAMES,
    WAIT,
)
from planner.verify import hidden

MAX_STEPS = 40
#: Swipes one way on one list before the agent turns round (down first, then back up).
MAX_SCROLLS_PER_PAGE = 6


@dataclass(slots=True)
class Step:
    """One turn's choice before it becomes a tool call."""

    rationale: str
    tool: str
    args: dict[str, Any]


class Agent:
    """One turn on one goal (or one part of a compound goal)."""

    def __init__(self, parsed: ParsedPrompt) -> None:
        self.goal = parse_goal(parsed.goal)
        self.screen = Screen(parsed.scene)
        self.memory = Memory(parsed.history)

    def judge(self) -> str:
        return self.memory.judge(self.screen)

    def score(self, text: str) -> float:
        """Goal words in `text`: the first line (a title) weighs most, related words least."""
        parts = text.split(" — ")
        title, rest = set(words_of(parts[0])), set(words_of(" ".join(parts[1:])))
        s = 0.0
        for w in self.goal.keywords:
            s += 3.0 if variants(w) & title else 1.5 if variants(w) & rest else 0.0
        for w in self.goal.related:
            s += 1.0 if w in title else 0.5 if w in rest else 0.0
        if self.mentions_target(text):
            s += 4.0
        return s

    def mentions_target(self, text: str) -> bool:
        low = text.lower()
        return any(t.lower() in low for t in self.goal.targets)

    # -- deciding -------------------------------------------------------------------------
    def decide_part(self) -> Step:
        if len(self.memory) >= MAX_STEPS:
            return self.finish(False, f"gave up after {len(self.memory)} steps")
        steps = (
            self.interruption,
            self.go_home,
            self.leave,
            self.calculate,
            self.delete,
            self.toggle,
            self.form,
            self.choose,
            self.reached_page,
            self.hide_keyboard,
            self.navigate,
            self.explore,
        )
        unmet = self.memory.unmet_last(self.screen.page)
        for attempt in steps:
            step = attempt()
            if step is None:
                continue
            if unmet is not None and self.same_move(step, unmet):
                # The checker found this very move's outcome not met a moment ago: doing it
                # again unchanged would not help. Let the next tactic choose something else.
                continue
            if unmet is not None:
                why = "failed" if unmet.get("success") is False else "outcome was not met"
                step.rationale += f" (The previous step {why}; not repeating it.)"
            return step
        return self.finish(False, "nothing on screen relates to the goal and there is no way back")

    def same_move(self, step: Step, record: dict[str, Any]) -> bool:
        """Whether `step` repeats the history `record`: same tool, same target (by its label,
        element ids change), same key, or same purpose."""
        done = action_of(record)
        if step.tool != done.get("tool") or step.tool == "complete":
            return False
        if step.tool in ("tap", "input_text") and step.args.get("element_id"):
            el = next((e for e in self.screen.els if e.id == step.args["element_id"]), None)
            name = self.screen.label(el).split(" — ")[0] if el is not None else ""
            if done.get("target"):
                return name == str(done["target"]).split(" — ")[0]
        if step.tool == "press_key":
            return step.args.get("key") == done.get("key")
        return step.args.get("purpose") == done.get("purpose")

    # -- the phone's own interruptions ----------------------------------------------------
    def button(self, phrases: tuple[str, ...], avoid: tuple[str, ...] = ()) -> El | None:
        """A clickable whose label is one of `phrases` (or holds one), never one that holds
        an `avoid` phrase ("Allow" is not "Don't allow")."""

        def norm(text: str) -> str:
            return text.lower().replace("’", "'").strip()

        buttons = [e for e in self.screen.els if "clickable" in e.flags and e.own_label]
        for exact in (True, False):
            for phrase in phrases:
                for e in buttons:
                    label = norm(e.own_label)
                    if any(norm(a) in label for a in avoid):
                        continue
                    if (label == norm(phrase)) if exact else (norm(phrase) in label):
                        return e
        return None

    def interruption(self) -> Step | None:
        """What the phone put in the way: a permission prompt (declined unless the goal asks
        to allow something), "isn't responding" (wait), another system dialog (dismissed), the
        shade (closed, unless a tile the goal names is the way), a lock screen (stop)."""
        overlays = [o for o in self.screen.overlays if o != "keyboard"]
        if not overlays:
            return None
        top = overlays[0]
        if top == "permission_prompt":
            asked = self.screen.title or "a permission"
            grant = bool(set(self.goal.keywords) & GRANT_WORDS)
            choice = self.button(ALLOW, avoid=DENY) if grant else self.button(DENY)
            if choice is None:
                return self.press_back(f"answer '{asked}'", "the prompt closes")
            why = (
                "the goal asks to allow it"
                if grant
                else "the goal does not need it, so decline: the phone keeps its settings"
            )
            return self.tap(
                choice,
                f"answer the permission prompt '{asked}' with '{choice.own_label}' ({why})",
                "the prompt closes and the app is shown",
            )
        if top == "app_not_responding":
            wait = self.button(WAIT)
            if wait is None:
                return self.press_back(f"dismiss '{self.screen.title}'", "the dialog closes")
            return self.tap(
                wait,
                f"wait on '{self.screen.title}' (closing the app could lose its state)",
                "the dialog closes",
            )
        if top in ("app_crash", "system_dialog"):
            dismiss = self.button(DISMISS)
            if dismiss is None:
                return self.press_back(f"dismiss '{self.screen.title}'", "the dialog closes")
            return self.tap(dismiss, f"dismiss '{self.screen.title}'", "the dialog closes")
        if top == "notification_shade":
            if self.named_switch() is not None:
                return None  # a quick settings tile the goal names: `toggle` uses it
            return self.press_back("close the notification shade", "the app is shown again")
        if top == "lock_screen":
            return self.finish(False, "the phone shows its lock screen")
        return None

    def hide_keyboard(self) -> Step | None:
        """The keyboard covers the bottom of the screen; with nothing left to type, hide it
        (Back hides a keyboard before it leaves a page) to see what is under it."""
        if "keyboard" not in self.screen.overlays:
            return None
        return self.press_back(
            "hide the keyboard, which covers the bottom of the screen",
            "the keyboard is gone and the whole page is visible",
        )

    def press_back(self, intent: str, expected: str) -> Step:
        return Step(
            f"{self.judge()} Next: {intent}.",
            "press_key",
            {"key": "back", "purpose": intent, "expected_outcome": expected},
        )

    def go_home(self) -> Step | None:
        if not HOME_GOAL.search(self.goal.text):
            return None
        if self.screen.on_launcher:
            return self.finish(True, "the home screen is shown")
        return Step(
            f"{self.judge()} Next: go to the home screen.",
            "press_key",
            {"key": "home", "purpose": "go to the home screen", "expected_outcome": "the launcher"},
        )

    def leave(self) -> Step | None:
        """ "Leave the X": back out while the screen is still X, then done."""
        if not LEAVE_GOAL.search(self.goal.text):
            return None
        here = " ".join([*self.screen.headings, self.screen.app]).lower()
        words = [w for w in self.goal.keywords if w not in ("leave", "exit", "close", "quit")]
        if words and any(w in set(words_of(here)) for w in words) and not self.screen.on_launcher:
            return Step(
                f"{self.judge()} Still on '{self.screen.title}'; go back to leave it.",
                "press_key",
                {
                    "key": "back",
                    "purpose": f"leave '{self.screen.title}'",
                    "expected_outcome": "it closes",
                },
            )
        return self.finish(True, f"left it; now on '{self.screen.title or self.screen.app}'")

    def calculate(self) -> Step | None:
        """Arithmetic goals on a calculator: press the keys one by one, then read the result."""
        problem = arithmetic(self.goal.text)
        if problem is None:
            return None
        a, op, b = problem
        keys = [*a, op, *b, "="]
        pressed = self.memory.keys_pressed()
        buttons = [e for e in self.screen.els if "clickable" in e.flags]
        if pressed >= len(keys):
            result = arithmetic_result(a, op, b)
            shown = any(e.text.strip() == result for e in self.screen.els)
            if shown:
                return self.finish(True, f"{a} {op} {b} = {result} is shown")
            return self.finish(False, f"pressed {' '.join(keys)} but {result} is not shown")
        key = keys[pressed]
        button = self.key_button(buttons, key)
        if button is None:
            return None  # not in a calculator yet: navigate there
        return Step(
            f"{self.judge()} Next: press '{key}' (key {pressed + 1} of {len(keys)}: {a} {op} {b}).",
            "tap",
            {
                "element_id": button.id,
                "purpose": f"press '{key}' ({pressed + 1}/{len(keys)})",
                "expected_outcome": f"the display shows the input so far with '{key}'",
            },
        )

    @staticmethod
    def key_button(buttons: list[El], key: str) -> El | None:
        if key in OPS:
            symbols, names = OPS[key]
            for e in buttons:
                if e.text.strip() in symbols or set(words_of(e.desc)) & set(names):
                    return e
            return None
        if key == "=":
            return next(
                (e for e in buttons if e.text.strip() == "=" or "equal" in words_of(e.desc)), None
            )
        return next((e for e in buttons if e.text.strip() == key), None)

    def finish(self, success: bool, reason: str) -> Step:
        verdict = "reached" if success else "not reachable"
        return Step(
            f"{self.judge()} The goal is {verdict}: {reason}.",
            "complete",
            {"success": success, "reason": reason},
        )

    def tap(self, el: El, intent: str, expected: str) -> Step:
        target = self.screen.clickable_for(el)
        return Step(
            f"{self.judge()} Next: {intent}.",
            "tap",
            {"element_id": target.id, "purpose": intent, "expected_outcome": expected},
        )

    # -- switches and options ---------------------------------------------------------------
    def named_switch(self) -> El | None:
        """The switch (or tile, or checkbox) the goal names, best named first; None when the
        goal names none on this screen. Radio buttons are options: see `choose`."""
        best: tuple[float, El] | None = None
        for el in self.screen.els:
            if "checkable" not in el.flags or "disabled" in el.flags or "Radio" in el.cls:
                continue
            name = self.screen.switch_name(el)
            row = f"{self.screen.row_label(el)} {el.desc}"
            targeted = bool(self.goal.targets) and self.mentions_target(row)
            if not (targeted or self.goal.names(name)):
                continue
            weight = self.goal.weight(name) + (5.0 if targeted else 0.0)
            if best is None or weight > best[0]:
                best = (weight, el)
        return best[1] if best else None

    def toggle(self) -> Step | None:
        """A goal that wants a switch on or off: done when the switch it names shows that
        state, else tap it (its row, which takes the click). A switch the goal does not name
        is never touched."""
        want = self.goal.switch_wish
        if want is None:
            return None
        best = self.named_switch()
        if best is None:
            return None
        name = self.screen.switch_name(best)
        state = "on" if want else "off"
        if ("checked" in best.flags) == want:
            return self.finish(True, f"'{name}' is {state}")
        el = self.screen.row_holder(best)
        return Step(
            f"{self.judge()} Next: switch '{name}' {state}.",
            "tap",
            {
                "element_id": el.id,
                "purpose": f"turn '{name}' {state}",
                "expected_outcome": f"the '{name}' switch is {state}",
            },
        )

    def choose(self) -> Step | None:
        """A goal that names an option ("screen timeout 5 minutes"): select it; done once checked.

        Options are checkable elements other than on/off switches (radio buttons, check marks),
        named by their own text or the text on their row; the whole name must be in the goal.
        """
        if self.goal.want_on is not None or not self.goal.keywords:
            return None
        wanted = set(self.goal.keywords)
        for el in self.screen.els:
            if "checkable" not in el.flags or "Switch" in el.cls or el.text in ("ON", "OFF"):
                continue
            name = el.text or self.screen.row_label(el).split(" — ")[0]
            words = set(words_of(name))
            if not words or not all(variants(w) & wanted for w in words):
                continue
            if "checked" in el.flags or "selected" in el.flags:
                return self.finish(True, f"'{name}' is selected")
            target = self.screen.row_holder(el)
            return Step(
                f"{self.judge()} Next: select '{name}'.",
                "tap",
                {
                    "element_id": target.id,
                    "purpose": f"select '{name}'",
                    "expected_outcome": f"'{name}' is selected",
                },
            )
        return None

    # -- removing ---------------------------------------------------------------------------
    def delete(self) -> Step | None:
        """Delete goals: tap a delete control for the target, or finish once it is gone."""
        if not self.goal.delete:
            return None
        deleted_before = self.memory.deleted_before()
        visible = self.mentions_target(self.screen.text_raw())
        if deleted_before and self.goal.targets and not visible:
            return self.finish(True, f"'{self.goal.targets[0]}' is no longer shown")
        page_is_target = any(self.mentions_target(h) for h in self.screen.headings)
        for el in self.screen.els:
            if "clickable" not in el.flags:
                continue
            words = set(words_of(el.own_label))
            if not words & {"delete", "remove", "trash", "löschen", "entfernen"}:
                continue
            if not self.goal.targets or self.mentions_target(el.own_label) or page_is_target:
                what = self.goal.targets[0] if self.goal.targets else self.screen.title
                return Step(
                    f"{self.judge()} Next: delete '{what}'.",
                    "tap",
                    {
                        "element_id": el.id,
                        "purpose": f"delete '{what}'",
                        "expected_outcome": f"'{what}' is no longer listed",
                    },
                )
        return None

    # -- forms ----------------------------------------------------------------------------
    @staticmethod
    def holds_secret(shown: str) -> bool:
        """A field showing only mask characters ("•••", "****"): it holds a secret already.
        The phone masks a password field, and the host masks any field showing a secret it
        typed, so such a field never shows the value typed; typing it again changes nothing."""
        return hidden(shown)

    @staticmethod
    def same_value(shown: str, value: str) -> bool:
        """A field shows the value: the same text, or the same number ("06" is 6)."""
        shown, value = shown.strip(), value.strip()
        if shown == value:
            return True
        return shown.isdigit() and value.isdigit() and int(shown) == int(value)

    def field_label(self, el: El) -> str:
        """How to name a field to a reader: its hint, else what holds it (a picker's "hour"),
        else its text (older dumps show an empty field's hint there), else its id."""
        if el.hint:
            return el.hint
        holder = self.screen.container_of(el)
        if holder is not None and holder.rid and not holder.text:
            return holder.rid.rsplit("/", 1)[-1].replace("_", " ")
        return el.text or el.rid.rsplit("/", 1)[-1]

    def field_words(self, el: El) -> set[str]:
        """What says what a field is for: its hint, its id, and the id of what holds it (a
        time picker's column is `android:id/hour`)."""
        parts = [el.field_name, el.rid.rsplit("/", 1)[-1].replace("_", " ")]
        holder = self.screen.container_of(el)
        if holder is not None and holder.rid:
            parts.append(holder.rid.rsplit("/", 1)[-1].replace("_", " "))
        return set(words_of(" ".join(parts)))

    def form(self) -> Step | None:
        if not self.goal.all_values or self.goal.delete or self.goal.want_on is not None:
            return None
        fields = [e for e in self.screen.els if e.editable]
        typed = self.memory.typed()
        if fields:
            assigned = self.assign(fields)
            for el, value in assigned:
                shown = el.text if el.hint or el.text != el.field_name else ""
                if self.same_value(shown or el.text, value):
                    continue
                hint = self.field_label(el)
                if secret_refs.refers(value):
                    if self.holds_secret(el.text):
                        continue
                    return Step(
                        f"{self.judge()} Next: type the secret {value} in the '{hint}' field.",
                        "input_text",
                        {
                            "text": value,
                            "element_id": el.id,
                            "purpose": f"fill in '{hint}' with the secret {value}",
                            "expected_outcome": f"the '{hint}' field holds the secret (masked)",
                        },
                    )
                secret = "password" in el.flags or value == self.goal.values.get("password")
                if secret and self.holds_secret(el.text):
                    continue
                if secret:
                    return Step(
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
                return Step(
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
                        f"save with '{self.screen.label(save)}'",
                        "the entry is saved and shown",
                    )
                if "keyboard" in self.screen.overlays:
                    return self.press_back(
                        "hide the keyboard: the save button is under it",
                        "the keyboard is gone and the save button is visible",
                    )
        elif typed:
            # The most telling value typed (the longest) shown on a page without fields: saved.
            shown_text = self.screen.text_raw()
            readable = [v for v in typed if v and v != "•••" and not secret_refs.refers(v)]
            shown = max(readable, key=len, default="")
            if shown and shown in shown_text:
                visible = [v for v in readable if v in shown_text]
                listed = ", ".join(f"'{v}'" for v in visible)
                return self.finish(True, f"saved: {listed} shown on '{self.screen.title}'")
        return None

    def assign(self, fields: list[El]) -> list[tuple[El, str]]:
        """Match each value to the field whose hint or id names its kind (a value with no
        field of its own kind goes to a related one: an alarm's label into its name field)."""
        values = dict(self.goal.values)
        if "hour" in values and any("ampm" in self.field_words(f) for f in fields):
            hour = int(values["hour"])
            values["hour"], values["ampm"] = str(hour % 12 or 12), "AM" if hour < 12 else "PM"
        kinds: list[str | None] = []
        for el in fields:
            words = self.field_words(el)
            kinds.append(next((k for k, hints in FIELD_KINDS.items() if words & set(hints)), None))
        here = {k for k in kinds if k}
        if {"first", "last"} <= here:
            values.pop("name", None)
        else:
            values.pop("first", None)
            values.pop("last", None)
        for kind in list(values):
            if kind not in here:
                spare = next(
                    (f for f in FIELD_FALLBACK.get(kind, ()) if f in here and f not in values), None
                )
                if spare is not None:
                    values[spare] = values.pop(kind)
        out: list[tuple[El, str]] = []
        used: set[str] = set()
        generic = list(self.goal.generic_values)
        for el, field_kind in zip(fields, kinds, strict=True):
            if field_kind is not None and field_kind in values and field_kind not in used:
                used.add(field_kind)
                out.append((el, values[field_kind]))
            elif generic and field_kind is None:
                out.append((el, generic.pop(0)))
        return out

    def save_button(self) -> El | None:
        for word in SAVE_WORDS:
            for e in self.screen.els:
                if "clickable" in e.flags and not e.editable and word in words_of(e.own_label):
                    return e
        return None

    def reached_page(self) -> Step | None:
        """A goal that only names a place ("open battery settings") is done when it is open."""
        if self.goal.switch_wish is not None or self.goal.all_values or not self.goal.keywords:
            return None
        wanted = [w for w in self.goal.keywords if w not in ("show", "view", "check", "find")]
        for heading in self.screen.headings:
            if wanted and all(variants(w) & set(words_of(heading)) for w in wanted):
                return self.finish(True, f"the '{heading}' page is open")
        return None

    # -- moving around ----------------------------------------------------------------------
    def navigate(self) -> Step | None:
        """Tap what the goal's words point at (an app, a settings entry, a list row). Never a
        switch or a row holding one (`toggle` decides those), never a control that destroys
        when the goal does not, nor one that creates when the goal removes."""
        tried = self.memory.tried_here(self.screen.page)
        dead = self.memory.dead_ends()
        best: tuple[float, El] | None = None
        seen: set[str] = set()
        for el in self.screen.els:
            if el.editable or "disabled" in el.flags:
                continue
            target = self.screen.clickable_for(el)
            if "clickable" not in target.flags or target.id in seen:
                continue
            seen.add(target.id)
            if self.screen.toggles(target):
                continue
            label = self.screen.label(target)
            name = label.split(" — ")[0]
            verbs = set(words_of(target.own_label or name))
            if not self.goal.delete and verbs & DESTRUCTIVE:
                continue
            if self.goal.delete and verbs & CREATIVE:
                continue
            if not label or name in tried or name.lower() in dead:
                continue
            if name.lower() in (h.lower() for h in self.screen.headings):
                continue
            s = self.score(label)
            if s > 0 and (best is None or s > best[0]):
                best = (s, target)
        if (
            best is None
            and self.screen.on_launcher
            and (
                self.goal.switch_wish is not None
                or self.goal.wants_settings
                or set(self.goal.keywords) & SETTING_WORDS
            )
        ):
            for e in self.screen.els:
                target = self.screen.clickable_for(e)
                name = self.screen.label(target).split(" — ")[0]
                if (
                    "clickable" in target.flags
                    and set(words_of(name)) & SETTINGS_APP_NAMES
                    and name not in tried
                ):
                    best = (0.1, target)
                    break
        if best is None:
            return None
        el = best[1]
        name = self.screen.label(el).split(" — ")[0]
        return self.tap(el, f"open '{name}'", f"the '{name}' page is open")

    def explore(self) -> Step | None:
        """Nothing matches: scroll the list down to its end, then back up to its top (a list
        may have been left scrolled down), then leave the page."""
        scrollable = next((e for e in self.screen.els if "scrollable" in e.flags), None)
        swipes = self.memory.trailing_swipes(self.screen.app)
        if scrollable is not None:
            bottom = self.screen.bottom_label(scrollable)
            top = self.screen.top_label(scrollable)
            downs = [label for d, label in swipes if d == "down"]
            ups = [label for d, label in swipes if d == "up"]
            at_bottom = bool(downs) and (swipes[-1][0] == "up" or downs[-1] == bottom)
            at_top = bool(ups) and swipes[-1][0] == "up" and ups[-1] == top
            if not at_bottom and len(downs) < MAX_SCROLLS_PER_PAGE:
                return self.swipe(scrollable, "down", bottom)
            if not at_top and len(ups) < MAX_SCROLLS_PER_PAGE:
                return self.swipe(scrollable, "up", top)
        if self.screen.on_launcher:
            return None
        why = "The list has been seen end to end and nothing" if swipes else "Nothing"
        return Step(
            f"{self.judge()} {why} on this page leads to the goal; go back.",
            "press_key",
            {
                "key": "back",
                "purpose": f"leave '{self.screen.title}', which does not lead to the goal",
                "expected_outcome": "the previous page is shown",
            },
        )

    def swipe(self, lst: El, direction: str, edge: str) -> Step:
        left, top, right, bottom = lst.bounds
        x = (left + right) // 2
        low, high = top + (bottom - top) * 4 // 5, top + (bottom - top) // 5
        start_y, end_y = (low, high) if direction == "down" else (high, low)
        past = f" past '{edge}'" if edge else ""
        return Step(
            f"{self.judge()} Nothing here matches the goal; scroll {direction} for more.",
            "swipe",
            {
                "start_x": x,
                "start_y": start_y,
                "end_x": x,
                "end_y": end_y,
                "purpose": f"scroll {direction}{past} to look for the goal's target",
                "expected_outcome": f"entries {'below' if direction == 'down' else 'above'} "
                "the current ones are visible",
            },
        )
