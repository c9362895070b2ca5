"""What a step's action looks like drawn on its before screenshot: the tap point, the swipe
arrow, the field and the typed text (sensitive text stays "•••", a lone {{secret:NAME}}
reference as it is: the decision log never holds a secret). The page draws it as an SVG
over the image in the screenshot's own pixels, so the image itself is served untouched.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from console.gateway.models import DecisionOut, ScreenOut
from planner.describe import typed_text


class Overlay(BaseModel):
    """Marks in the screenshot's pixels; `label` says the same in words (for screen readers)."""

    width: int
    height: int
    point: tuple[int, int] | None = None
    box: tuple[int, int, int, int] | None = None
    arrow: tuple[int, int, int, int] | None = None
    text: str | None = None
    label: str

    @property
    def scale(self) -> float:
        """Stroke and font sizes follow the screen's size (a phone is ~1080 px wide)."""
        return max(self.width, 1) / 1080


def _xy(point: Any) -> tuple[int, int]:
    point = point if isinstance(point, dict) else {}
    return int(point.get("x", 0)), int(point.get("y", 0))


def _center(box: list[int]) -> tuple[int, int]:
    return (box[0] + box[2]) // 2, (box[1] + box[3]) // 2


def overlay(decision: DecisionOut, screen: ScreenOut) -> Overlay | None:
    """The marks of `decision`'s action on its before screenshot; None for actions that touch
    no place on the screen (keys, apps, complete) and for after screenshots."""
    if screen.phase != "before":
        return None
    size = {"width": screen.width, "height": screen.height}
    action = decision.action
    target = screen.target
    if "tap" in action:
        tap = action["tap"]
        verb = "long press" if tap.get("long_press") else "tap"
        if "point" in tap:
            point = _xy(tap["point"])
        elif target is not None:
            point = _center(target)
        else:
            return None
        box = (target[0], target[1], target[2], target[3]) if target else None
        return Overlay(**size, point=point, box=box, label=f"{verb} at {point[0]}, {point[1]}")
    if "swipe" in action:
        (x1, y1), (x2, y2) = _xy(action["swipe"].get("start")), _xy(action["swipe"].get("end"))
        return Overlay(**size, arrow=(x1, y1, x2, y2), label=f"swipe from {x1}, {y1} to {x2}, {y2}")
    if "input_text" in action:
        text = str(action["input_text"].get("text", ""))
        box = (target[0], target[1], target[2], target[3]) if target else None
        sensitive = bool(action["input_text"].get("sensitive"))
        label = f"type {typed_text(text, sensitive=sensitive)}"
        return Overlay(**size, box=box, text=text, label=label)
    return None
