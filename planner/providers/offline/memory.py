"""Memory: what the compact history says about earlier turns (taps tried, pages left, swipes).

The offline agent keeps no state between turns; everything it remembers it reads back from the
history records the prompt carries (`WorldEvent.compact()`), so it behaves the same in-process
and behind the cloud's Decide service.
"""

from __future__ import annotations

import re
from typing import Any

from planner.providers.offline.screen import Screen

_QUOTED = re.compile(r"'([^']+)'")
_PRESSED = re.compile(r"press '.+' \((\d+)/\d+\)")
PART_DONE = re.compile(r"Part (\d+)/(\d+) done")


def action_of(record: dict[str, Any]) -> dict[str, Any]:
    action = record.get("action") or {}
    return action if isinstance(action, dict) else {}


class Memory:
    """The history records of this goal (or of this part of a compound goal)."""

    def __init__(self, history: list[dict[str, Any]]) -> None:
        self.history = history

    def __len__(self) -> int:
        return len(self.history)

    def tried_here(self, page: str) -> set[str]:
        """Names already tapped on this page (element ids are per screen; names survive).

        The name is the history's `target` when the host recorded it, else the quoted name in
        the action's purpose ("open 'Display'").
        """
        out: set[str] = set()
        for h in self.history:
            action = action_of(h)
            if h.get("page") != page or action.get("tool") != "tap":
                continue
            if action.get("target"):
                out.add(str(action["target"]).split(" — ")[0])
            out.update(_QUOTED.findall(str(action.get("purpose") or "")))
        return out

    def dead_ends(self) -> set[str]:
        """Titles of pages we backed out of."""
        out: set[str] = set()
        for h in self.history:
            action = action_of(h)
            if action.get("tool") == "press_key" and action.get("key") == "back":
                page = str(h.get("page") or "")
                out.add(page.split(": ", 1)[-1].lower())
        return out

    def trailing_swipes(self, app: str) -> list[tuple[str, str]]:
        """The swipes in a row that end the history, in this app (page titles may change as a
        list scrolls), oldest first: (direction, the edge label it started from), read back
        from their purposes ("scroll down past 'About phone'")."""
        out: list[tuple[str, str]] = []
        for h in reversed(self.history):
            action = action_of(h)
            page_app = str(h.get("page") or "").split(": ", 1)[0]
            if page_app != app or action.get("tool") != "swipe":
                break
            purpose = str(action.get("purpose") or "")
            found = _QUOTED.findall(purpose)
            direction = "up" if purpose.startswith("scroll up") else "down"
            out.append((direction, found[0] if found else ""))
        return out[::-1]

    def typed(self) -> list[str]:
        return [
            str(action_of(h).get("text"))
            for h in self.history
            if action_of(h).get("tool") == "input_text"
        ]

    def keys_pressed(self) -> int:
        """How many calculator keys the earlier turns pressed (from their purposes)."""
        pressed = 0
        for h in self.history:
            m = _PRESSED.match(str(action_of(h).get("purpose") or ""))
            if m and h.get("success") is not False:
                pressed = int(m.group(1))
        return pressed

    def deleted_before(self) -> bool:
        return any(
            action_of(h).get("tool") == "tap"
            and str(action_of(h).get("purpose") or "").startswith("delete")
            and h.get("success") is not False
            for h in self.history
        )

    def unmet_last(self, page: str) -> dict[str, Any] | None:
        """The last step, when it was made on `page` and failed to run (an error: a phone that
        cannot type the text, say) or the checker found its expected outcome not met (its
        history record says "— not met:"), else None."""
        if not self.history:
            return None
        last = self.history[-1]
        if last.get("page") != page:
            return None
        if last.get("success") is False or " — not met:" in str(last.get("verdict") or ""):
            return last
        return None

    def judgement(self, screen: Screen) -> dict[str, str]:
        """The `previous_step` argument: this agent's own verdict on the previous step (from
        what the screen shows now, as `judge` reads it) and its one line."""
        line = self.judge(screen)
        if not self.history:
            return {"verdict": "unknown", "note": "first step: nothing to judge"}
        if "failed to run" in line or "did not reach" in line:
            verdict = "not_met"
        elif "reached its expected outcome" in line or "looks done" in line:
            verdict = "met"
        else:
            verdict = "unknown"
        return {"verdict": verdict, "note": line}

    def judge(self, screen: Screen) -> str:
        """One sentence on the previous step: did the screen reach its expected outcome?"""
        if not self.history:
            return f"First step on '{screen.title or screen.app}'."
        last = self.history[-1]
        action = action_of(last)
        expected = str(action.get("expected_outcome") or "")
        ran = last.get("success")
        if ran is False:
            return (
                f"The previous {action.get('tool')} failed to run; the screen is '{screen.title}'."
            )
        quoted = _QUOTED.findall(expected)
        switch = re.fullmatch(r"the '(.+)' switch is (on|off)", expected)
        state = screen.switch_state(switch.group(1)) if switch else None
        if switch and state is not None:
            want = switch.group(2) == "on"
            now = "on" if state else "off"
            verdict = (
                "reached its expected outcome"
                if state == want
                else f"did not reach its expected outcome (the switch is {now})"
            )
        elif quoted and any(q.lower() in h.lower() for q in quoted for h in screen.headings):
            verdict = "reached its expected outcome"
        elif quoted and any(q.lower() in screen.text_lower() for q in quoted):
            verdict = "looks done: what it expected is on screen"
        elif last.get("page") != screen.page:
            verdict = "changed the page"
        else:
            verdict = "left the page as it was"
        return f"The previous step ({action.get('tool')}) {verdict}; now on '{screen.title}'."


def parts_done(history: list[dict[str, Any]]) -> tuple[int, int]:
    """How many parts of a compound goal earlier rationales reported done ("Part 1/2 done"),
    and the index of the record where the next part started."""
    k, start = 0, 0
    for i, record in enumerate(history):
        for m in PART_DONE.finditer(str(record.get("rationale") or "")):
            if int(m.group(1)) > k:
                k, start = int(m.group(1)), i
    return k, start
