"""Tactics: one turn's choice, tried in order (go home, leave, calculate, delete, switch,
fill a form, choose an option, done on the named page, navigate, explore).

Each tactic either returns a step or passes (None) to the next one; the goal, the screen and
the memory of earlier turns are all it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.prompts import ParsedPrompt
from planner.providers.offline.goal import (
    DESTRUCTIVE,
    FIELD_KINDS,
    HOME_GOAL,
    LEAVE_GOAL,
    OPS,
    SAVE_WORDS,
    SETTING_WORDS,
    arithmetic,
    arithmetic_result,
    parse_goal,
)
from planner.providers.offline.goal import words as words_of
from planner.providers.offline.memory import Memory
from planner.providers.offline.screen import El, Screen

MAX_STEPS = 40
MAX_SCROLLS_PER_PAGE = 4


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
            s += 3.0 if w in title else 1.5 if w in rest else 0.0
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

    def toggle(self) -> Step | None:
        if self.goal.want_on is None:
            return None
        switches = [e for e in self.screen.els if "checkable" in e.flags]
        scored = [
            (
                self.direct_score(self.screen.label(e))
                + (5.0 if self.mentions_target(f"{self.screen.row_label(e)} {e.desc}") else 0.0),
                e,
            )
            for e in switches
        ]
        scored = [(s, e) for s, e in scored if s > 0]
        if not scored:
            return None
        best = max(scored, key=lambda p: p[0])[1]
        name = self.screen.label(best).split(" — ")[0]
        state = "on" if self.goal.want_on else "off"
        if ("checked" in best.flags) == self.goal.want_on:
            return self.finish(True, f"'{name}' is {state}")
        # Prefer the row that holds the switch (the row takes the click on Android).
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
            if not words or not words <= wanted:
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

    def direct_score(self, text: str) -> float:
        words = set(words_of(text.split(" — ")[0]))
        return float(sum(1 for w in self.goal.keywords if w in words))

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
            if not words & {"delete", "remove", "trash"}:
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

    def form(self) -> Step | None:
        if not self.goal.all_values or self.goal.delete or self.goal.want_on is not None:
            return None
        fields = [e for e in self.screen.els if e.editable]
        typed = self.memory.typed()
        if fields:
            assigned = self.assign(fields)
            for el, value in assigned:
                if el.text == value:
                    continue
                hint = el.text or el.rid.rsplit("/", 1)[-1]
                secret = "password" in el.flags or value == self.goal.values.get("password")
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
        elif typed:
            # The most telling value typed (the longest) shown on a page without fields: saved.
            shown = max((v for v in typed if v and v != "•••"), key=len, default="")
            if shown and shown in self.screen.text_raw():
                visible = [v for v in typed if v and v != "•••" and v in self.screen.text_raw()]
                listed = ", ".join(f"'{v}'" for v in visible)
                return self.finish(True, f"saved: {listed} shown on '{self.screen.title}'")
        return None

    def assign(self, fields: list[El]) -> list[tuple[El, str]]:
        """Match each value to the field whose hint or id names its kind."""
        values = dict(self.goal.values)
        out: list[tuple[El, str]] = []
        used: set[str] = set()
        kinds_here: set[str] = set()
        for el in fields:
            words = set(words_of(el.text + " " + el.rid.rsplit("/", 1)[-1].replace("_", " ")))
            for kind_name, hints in FIELD_KINDS.items():
                if words & set(hints):
                    kinds_here.add(kind_name)
        if {"first", "last"} <= kinds_here:
            values.pop("name", None)
        else:
            values.pop("first", None)
            values.pop("last", None)
        generic = list(self.goal.generic_values)
        for el in fields:
            words = set(words_of(el.text + " " + el.rid.rsplit("/", 1)[-1].replace("_", " ")))
            kind = next(
                (k for k, hints in FIELD_KINDS.items() if words & set(hints) and k in values),
                None,
            )
            if kind is not None and kind not in used:
                used.add(kind)
                out.append((el, values[kind]))
            elif generic and kind is None and not any(words & set(h) for h in FIELD_KINDS.values()):
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
        if self.goal.want_on is not None or self.goal.all_values or not self.goal.keywords:
            return None
        wanted = [w for w in self.goal.keywords if w not in ("show", "view", "check", "find")]
        for heading in self.screen.headings:
            if wanted and all(w in set(words_of(heading)) for w in wanted):
                return self.finish(True, f"the '{heading}' page is open")
        return None

    def navigate(self) -> Step | None:
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
            label = self.screen.label(target)
            name = label.split(" — ")[0]
            if not self.goal.delete and set(words_of(target.own_label or name)) & DESTRUCTIVE:
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
                self.goal.want_on is not None
                or self.goal.wants_settings
                or set(self.goal.keywords) & SETTING_WORDS
            )
        ):
            for e in self.screen.els:
                target = self.screen.clickable_for(e)
                name = self.screen.label(target).split(" — ")[0]
                if (
                    "clickable" in target.flags
                    and "setting" in words_of(name)
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
        scrollable = next((e for e in self.screen.els if "scrollable" in e.flags), None)
        swipes, last_from = self.memory.trailing_swipes(self.screen.app)
        last_label = self.screen.bottom_label(scrollable) if scrollable is not None else ""
        at_end = swipes > 0 and last_label == last_from
        if scrollable is not None and swipes < MAX_SCROLLS_PER_PAGE and not at_end:
            left, top, right, bottom = scrollable.bounds
            x = (left + right) // 2
            start_y = top + (bottom - top) * 4 // 5
            end_y = top + (bottom - top) // 5
            return Step(
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
        if self.screen.on_launcher:
            return None
        why = "The list ends here and nothing" if at_end else "Nothing"
        return Step(
            f"{self.judge()} {why} on this page leads to the goal; go back.",
            "press_key",
            {
                "key": "back",
                "purpose": f"leave '{self.screen.title}', which does not lead to the goal",
                "expected_outcome": "the previous page is shown",
            },
        )
