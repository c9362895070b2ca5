"""Where on the screen a step's action happened, in screen pixels.

An action may name an element (`tap {element_id}`); the exported files need a point. It comes
from the screen the decision was made on (the element's bounds' center, which is where the host
taps), else from what the host reported it did (`{"point": [x, y]}` for a tap, `{"focused":
[x, y]}` for a field it tapped before typing), else it is unknown (None) and files say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from export.run import Step
from planner.describe import KEY_WORDS, swipe_direction
from planner.scene import Bounds

Kind = Literal[
    "tap", "long_press", "swipe", "type", "key", "launch", "stop", "read", "complete", "none"
]


@dataclass(frozen=True, slots=True)
class Gesture:
    """An action placed on the screen."""

    kind: Kind
    #: Tap point, swipe start, or the field tapped before typing; None when unknown.
    point: tuple[int, int] | None = None
    #: Swipe end.
    end: tuple[int, int] | None = None
    #: Bounds of the element the action names, when the screen is known.
    box: Bounds | None = None
    #: The text typed (already "•••" for a sensitive value), the key, the app, the reason.
    text: str = ""
    direction: str = ""


def _reported(step: Step, key: str) -> tuple[int, int] | None:
    try:
        data = json.loads(step.outcome.driver_output) if step.outcome.driver_output else {}
    except ValueError:
        return None
    value = data.get(key) if isinstance(data, dict) else None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (value[0], value[1])
    return None


def _element(step: Step, element_id: str) -> Bounds | None:
    element = step.screen.element(element_id) if step.screen and element_id else None
    return element.bounds if element is not None else None


def gesture(step: Step) -> Gesture:
    """The step's action on the screen."""
    action = step.action
    kind = action.WhichOneof("kind")
    if kind == "tap":
        t = action.tap
        verb: Kind = "long_press" if t.long_press else "tap"
        if t.WhichOneof("target") == "point":
            return Gesture(verb, point=(t.point.x, t.point.y))
        box = _element(step, t.element_id)
        point = box.center if box is not None else _reported(step, "point")
        return Gesture(verb, point=point, box=box)
    if kind == "swipe":
        s = action.swipe
        return Gesture(
            "swipe",
            point=(s.start.x, s.start.y),
            end=(s.end.x, s.end.y),
            direction=swipe_direction(s),
        )
    if kind == "input_text":
        it = action.input_text
        box = _element(step, it.element_id)
        point = box.center if box is not None else _reported(step, "focused")
        return Gesture("type", point=point, box=box, text=it.text)
    if kind == "press_key":
        return Gesture("key", text=KEY_WORDS.get(action.press_key.key, "key"))
    if kind == "launch_app":
        return Gesture("launch", text=action.launch_app.package_name)
    if kind == "terminate_app":
        return Gesture("stop", text=action.terminate_app.package_name)
    if kind == "get_ui_tree":
        return Gesture("read")
    if kind == "complete":
        return Gesture("complete", text=action.complete.reason)
    return Gesture("none")
