"""Semantic targets: name an element so it can be found again on another screen.

An element id ("e12") means something on one screen only, and coordinates shift with every
layout. A learned flow therefore keeps, for each action that names an element, what a person
would use to find it again (`amc.v1.ElementTarget`): its resource id, text, description, hint,
class, its position among the elements that share its id and class, the label of its row when
it has none of its own, and — only to break ties — where it was. `describe` makes one from the
screen a decision was made on (`plan_step` does it for every decision); `resolve` finds the
element it names on the current screen, or says why none fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from amc.v1 import types_pb2
from planner import labels
from planner.observation import clip
from planner.scene import Element, Scene

MAX_TARGET_TEXT_BYTES = 256


def element_id_of(action: types_pb2.Action) -> str:
    """The element an action names ("" for none)."""
    kind = action.WhichOneof("kind")
    if kind == "tap" and action.tap.WhichOneof("target") == "element_id":
        return action.tap.element_id
    if kind == "input_text":
        return action.input_text.element_id
    return ""


def _alike(scene: Scene, element: Element) -> list[Element]:
    return [
        e
        for e in scene.elements
        if e.resource_id == element.resource_id and e.class_name == element.class_name
    ]


def scrolled_on(scene: Scene, x: int, y: int) -> Element | None:
    """The smallest scrollable element under the point (x, y): what a swipe from there moves."""
    under = [
        e
        for e in scene.elements
        if e.scrollable
        and e.bounds.left <= x < e.bounds.right
        and e.bounds.top <= y < e.bounds.bottom
    ]
    return min(under, key=lambda e: e.bounds.width * e.bounds.height) if under else None


def tapped_on(scene: Scene, x: int, y: int) -> Element | None:
    """The element a tap at the point (x, y) lands on: the smallest clickable one holding it,
    else the smallest of any."""
    under = [
        e
        for e in scene.elements
        if e.bounds.left <= x < e.bounds.right and e.bounds.top <= y < e.bounds.bottom
    ]
    pressed = [e for e in under if e.clickable] or under
    return min(pressed, key=lambda e: e.bounds.width * e.bounds.height) if pressed else None


def describe(scene: Scene, action: types_pb2.Action) -> types_pb2.ElementTarget | None:
    """The semantic target of the element `action` names on `scene` (for a swipe: the list it
    moves; for a tap by point: the element under it, so a replay on a screen of another size
    or rotation finds it again instead of tapping the same coordinates); None when it names
    none.

    A text field's own text is left out (it is what gets typed, and may be a secret); so is
    anything of a password field but its hint and ids.
    """
    if action.WhichOneof("kind") == "swipe":
        element = scrolled_on(scene, action.swipe.start.x, action.swipe.start.y)
    elif action.WhichOneof("kind") == "tap" and action.tap.WhichOneof("target") == "point":
        element = tapped_on(scene, action.tap.point.x, action.tap.point.y)
    else:
        element_id = element_id_of(action)
        element = scene.element(element_id) if element_id else None
    if element is None:
        return None
    field = action.WhichOneof("kind") == "input_text" or element.password
    alike = _alike(scene, element)
    switch = labels.holding_checkable(scene, element)
    own = labels.own_label(element)
    target = types_pb2.ElementTarget(
        resource_id=clip(element.resource_id, MAX_TARGET_TEXT_BYTES),
        text=""
        if field or element.text in labels.SWITCH_TEXTS
        else clip(element.text, MAX_TARGET_TEXT_BYTES),
        content_description=clip(element.content_desc, MAX_TARGET_TEXT_BYTES),
        class_name=clip(element.class_name, MAX_TARGET_TEXT_BYTES),
        hint=clip(element.hint, MAX_TARGET_TEXT_BYTES),
        index_among_alike=next(i for i, e in enumerate(alike) if e is element),
        alike_count=len(alike),
        bounds=types_pb2.Rect(
            left=element.bounds.left,
            top=element.bounds.top,
            right=element.bounds.right,
            bottom=element.bounds.bottom,
        ),
        checkable=switch is not None,
        checked=switch.checked if switch is not None else False,
    )
    if not own and not field and not element.scrollable:  # a list's contents move: not a name
        row = labels.inner_label(scene, element) or labels.row_label(scene, element)
        target.row_label = clip(row.split(" — ")[0], MAX_TARGET_TEXT_BYTES)
    return target


def semantics(target: types_pb2.ElementTarget) -> str:
    """The target as words, for people and for retrieval ("tap 'Display' (row, …)")."""
    parts = [
        repr(t)
        for t in (target.text, target.content_description, target.row_label, target.hint)
        if t
    ]
    if target.resource_id:
        parts.append(target.resource_id.rsplit("/", 1)[-1].replace("_", " "))
    if target.class_name:
        parts.append(target.class_name.rsplit(".", 1)[-1])
    return " ".join(parts) or "an unnamed element"


@dataclass(frozen=True, slots=True)
class Resolved:
    """The element a target names on the current screen, or why none does."""

    element: Element | None
    why: str


def _named(target: types_pb2.ElementTarget) -> bool:
    return bool(target.text or target.content_description or target.hint or target.row_label)


def _words(text: str) -> str:
    """A label as a replay compares it: an app that changed a label's case or spacing ("Dark
    theme" → "Dark Theme") still names the same element; another wording or language does not."""
    return " ".join(text.split()).casefold()


def _fits(scene: Scene, target: types_pb2.ElementTarget, e: Element) -> bool:
    if target.resource_id and e.resource_id != target.resource_id:
        return False
    if target.class_name and e.class_name != target.class_name:
        return False
    if target.text and _words(e.text) != _words(target.text):
        return False
    if target.content_description and _words(e.content_desc) != _words(target.content_description):
        return False
    if target.hint and e.hint and _words(e.hint) != _words(target.hint):
        return False
    if target.row_label:
        row = (labels.inner_label(scene, e) or labels.row_label(scene, e)).split(" — ")[0]
        if _words(row) != _words(target.row_label):
            return False
    return True


def resolve(scene: Scene, target: types_pb2.ElementTarget) -> Resolved:
    """The element of `scene` that `target` names.

    Every field the target has must match; among several that do, the one at the same position
    among its alike elements, else the nearest to where it was. A target with nothing but a
    class and an id (no text, description, hint or row label) must also be at the same
    position among the same number of alike elements, or it is not resolved: a bare position
    on a changed screen would be a guess.
    """
    fits = [e for e in scene.elements if _fits(scene, target, e)]
    what = semantics(target)
    if not fits:
        return Resolved(None, f"no element {what} on this screen")
    if not _named(target):
        alike = [
            e
            for e in scene.elements
            if e.resource_id == target.resource_id and e.class_name == target.class_name
        ]
        if len(alike) != target.alike_count or target.index_among_alike >= len(alike):
            return Resolved(
                None,
                f"{what} is known by its position only, and the screen has {len(alike)} such "
                f"elements instead of {target.alike_count}",
            )
        return Resolved(alike[target.index_among_alike], f"{what} by its position")
    if len(fits) == 1:
        return Resolved(fits[0], f"{what} found")
    alike = [e for e in fits if _alike(scene, e) and len(_alike(scene, e)) == target.alike_count]
    same_place = [e for e in alike if _alike(scene, e).index(e) == target.index_among_alike]
    if len(same_place) == 1:
        return Resolved(same_place[0], f"{what} found at the same position among alike")
    b = target.bounds
    cx, cy = (b.left + b.right) // 2, (b.top + b.bottom) // 2
    nearest = min(fits, key=lambda e: abs(e.bounds.center[0] - cx) + abs(e.bounds.center[1] - cy))
    return Resolved(nearest, f"{what} found ({len(fits)} matched; the nearest to where it was)")
