"""The system prompt and the user prompt, and the parser that reads a user prompt back.

The user prompt is plain text with three fenced JSON sections (goal, scene, history). Fences keep
it readable for a model and exact for a machine: the offline provider recovers goal, scene and
history from the prompt text alone, so it behaves the same in-process and behind the cloud's
Decide service, which only ever receives prompts.

History is compact by construction: one `WorldEvent.compact()` record per step, never a past
scene, never thinking, sensitive input masked, and only the last `history_window` records (older
steps are counted, not repeated), so prompt size stays flat however long a task runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.history import WorldEvent
from planner.scene import Scene
from planner.secret_refs import stored

SYSTEM_PROMPT = """\
You control an Android phone to reach the user's goal, one action per turn.

Each turn you get the goal, the current screen as a list of elements (id, text, desc, resource \
id, class, bounds [left, top, right, bottom] in pixels, state flags) and a compact record of the \
steps so far (page, action with its purpose and expected outcome, your rationale, whether the \
action ran).

Every turn:
1. First write one or two sentences: did the previous step reach its expected outcome (judge it \
from the current screen), and what is this step's intent.
2. Then call exactly one tool. Device actions need a short `purpose`, a concrete \
`expected_outcome` (what the screen should show afterwards: name the page, the switch state, the \
text shown, so it can be checked) and `previous_step`: your verdict on the previous step (met, \
not_met or unknown; unknown on the first step) with one line of evidence. Each step in the \
history carries the checker's `verdict` on its expected outcome; do not repeat a step whose \
outcome was not met without changing something. Prefer tapping by element id; use x/y only for \
targets the list lacks. Mark passwords and codes as `sensitive`. Type a secret the goal names as \
{{secret:NAME}} by writing that reference itself as the text; a field that shows only dots or \
••• afterwards holds the secret (do not type it again).
3. Call `complete` with success true only when the current screen shows the goal reached; call \
it with success false, and say why, when the goal cannot be reached.
"""

HISTORY_WINDOW = 20
_SECTION = re.compile(r"^```json (goal|scene|history)\n(.*?)\n```$", re.M | re.S)


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _scene_block(scene: Scene | dict[str, Any]) -> str:
    """The scene as JSON with one element per line: compact, yet a diff-able, readable prompt."""
    data = scene.to_prompt() if isinstance(scene, Scene) else scene
    parts = [f"{_dump(k)}:{_dump(v)}" for k, v in data.items() if k != "elements"]
    elements = ",\n".join(_dump(e) for e in data.get("elements", []))
    parts.append(f'"elements":[\n{elements}\n]' if elements else '"elements":[]')
    return "{" + ",".join(parts) + "}"


def compact_history(history: Sequence[WorldEvent | dict[str, Any]]) -> list[dict[str, Any]]:
    """Compact records; a dict is taken as an already-compact record and only masked."""
    out: list[dict[str, Any]] = []
    for event in history:
        record = event.compact() if isinstance(event, WorldEvent) else dict(event)
        action = record.get("action")
        if isinstance(action, dict) and action.get("sensitive") and "text" in action:
            record["action"] = {**action, "text": stored(action["text"])}
        out.append(record)
    return out


def build_user_prompt(
    goal: str,
    scene: Scene | dict[str, Any],
    history: Sequence[WorldEvent | dict[str, Any]] = (),
    *,
    history_window: int = HISTORY_WINDOW,
    note: str | None = None,
) -> str:
    """Goal, current scene and compact history as fenced JSON sections; `note` (a replay that
    handed over, see planner/flows/replay.py) goes between the history and the instruction."""
    records = compact_history(history)
    omitted = max(0, len(records) - history_window)
    shown = records[omitted:]
    for offset, record in enumerate(shown, start=omitted + 1):
        record["step"] = offset
    omitted_note = f" {omitted} earlier steps omitted." if omitted else ""
    history_lines = ",\n".join(_dump(r) for r in shown)
    history_json = f"[\n{history_lines}\n]" if shown else "[]"
    return (
        "Goal:\n"
        f"```json goal\n{_dump(goal)}\n```\n\n"
        "Current screen:\n"
        f"```json scene\n{_scene_block(scene)}\n```\n\n"
        f"Steps so far (oldest first; {len(records)} in total.{omitted_note}):\n"
        f"```json history\n{history_json}\n```\n\n"
        + (f"{note}\n\n" if note else "")
        + "Judge the previous step in one or two sentences, state this step's intent, then call "
        "exactly one tool."
    )


@dataclass(frozen=True, slots=True)
class ParsedPrompt:
    """What `parse_user_prompt` recovers: the goal, the scene dict and the compact records."""

    goal: str
    scene: dict[str, Any]
    history: list[dict[str, Any]]


def parse_user_prompt(text: str) -> ParsedPrompt:
    """Read goal, scene and history back from a prompt made by `build_user_prompt`.

    Raises ValueError naming the missing or malformed section, so a caller that sends a prompt of
    its own making learns why the offline provider cannot use it.
    """
    sections: dict[str, Any] = {}
    for match in _SECTION.finditer(text):
        name, body = match.group(1), match.group(2)
        if name in sections:
            continue
        try:
            sections[name] = json.loads(body)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"user prompt: the {name} section is not valid JSON ({err.msg})"
            ) from None
    missing = [n for n in ("goal", "scene") if n not in sections]
    if missing:
        raise ValueError(f"user prompt: missing the ```json {missing[0]} section")
    goal, scene, history = sections["goal"], sections["scene"], sections.get("history", [])
    if not isinstance(goal, str) or not isinstance(scene, dict) or not isinstance(history, list):
        raise ValueError("user prompt: goal must be a string, scene an object, history a list")
    return ParsedPrompt(goal=goal, scene=scene, history=[h for h in history if isinstance(h, dict)])
