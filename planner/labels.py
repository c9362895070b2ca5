"""What the elements of a scene are called, as a person reading the screen would name them.

An element id names an element on one screen only; a label ("the 'Dark theme' switch", "the
'Display' row") names it on any screen that shows it. The checker (`planner/verify.py`) and the
semantic targets of learned flows (`planner/targets.py`) both read labels, so they are read one
way: an element's own text, description or hint; else the texts inside it (a list row); else
the texts on its row (a switch sits right of its label).
"""

from __future__ import annotations

import re

from planner.scene import Bounds, Element, Scene

#: Texts a switch shows about itself, never its name.
SWITCH_TEXTS = frozenset({"ON", "OFF"})
_WORD = re.compile(r"[\w%]+", re.UNICODE)
#: How far (pixels) a text may sit above or below a row's middle and still be on that row.
ROW_SLACK = 60


def words(text: str) -> list[str]:
    """Lower-case words of `text` (letters, digits, %)."""
    return [w.lower() for w in _WORD.findall(text)]


def contains(outer: Bounds, inner: Bounds) -> bool:
    """`outer` holds `inner` and is not the same box."""
    return outer != inner and (
        outer.left <= inner.left
        and outer.top <= inner.top
        and outer.right >= inner.right
        and outer.bottom >= inner.bottom
    )


def own_label(element: Element) -> str:
    """The element's own name: text, else description, else hint; a switch's ON/OFF is none."""
    if element.text and element.text not in SWITCH_TEXTS:
        return element.text
    return element.content_desc or element.hint


def inner_label(scene: Scene, element: Element) -> str:
    """The labels of what `element` holds, joined with " — " (a row's title and summary)."""
    inside = [
        own_label(o)
        for o in scene.elements
        if o is not element and contains(element.bounds, o.bounds) and own_label(o)
    ]
    return " — ".join(inside)


def row_label(scene: Scene, element: Element) -> str:
    """The labels on the same row as `element`, top first (a switch's name sits to its left)."""
    mid = (element.bounds.top + element.bounds.bottom) // 2
    beside = [
        o
        for o in scene.elements
        if o is not element
        and own_label(o)
        and not contains(o.bounds, element.bounds)
        and not contains(element.bounds, o.bounds)
        and o.bounds.top - ROW_SLACK <= mid <= o.bounds.bottom + ROW_SLACK
        and not o.clickable
    ]
    beside.sort(key=lambda o: (o.bounds.top, o.bounds.left))
    return " — ".join(own_label(o) for o in beside)


def label(scene: Scene, element: Element) -> str:
    """What a person calls `element`: its own label, else what it holds, else its row's."""
    return own_label(element) or inner_label(scene, element) or row_label(scene, element)


def name_of(scene: Scene, element: Element) -> str:
    """The first part of `label` (a row's title without its summary)."""
    return label(scene, element).split(" — ")[0]


def checkables_named(scene: Scene, name: str) -> list[Element]:
    """Switches, checkboxes and radio buttons whose name (own, held or row label) is `name`
    (case-insensitive, or all its words in the name)."""
    want = words(name)
    out: list[Element] = []
    for e in scene.elements:
        if not e.checkable:
            continue
        for candidate in (own_label(e), inner_label(scene, e), row_label(scene, e)):
            first = candidate.split(" — ")[0]
            if first and (
                first.lower() == name.lower() or (want and set(want) <= set(words(first)))
            ):
                out.append(e)
                break
    return out


def holding_checkable(scene: Scene, element: Element) -> Element | None:
    """The switch a tap on `element` flips: itself, or the one its row holds."""
    if element.checkable:
        return element
    inside = [o for o in scene.elements if o.checkable and contains(element.bounds, o.bounds)]
    return inside[0] if len(inside) == 1 else None


def headings(scene: Scene) -> list[str]:
    """The page's names as shown: its title and the plain texts of the top bar."""
    top = int(scene.screen_height * 0.12) if scene.screen_height else 0
    found = [scene.page_title] if scene.page_title else []
    found += [
        e.text
        for e in scene.elements
        if e.text and e.bounds.bottom <= top and not e.clickable and e.text not in found
    ]
    return found


def screen_texts(scene: Scene) -> list[str]:
    """Every label on the screen (texts, descriptions, hints), in document order."""
    return [t for e in scene.elements for t in (e.text, e.content_desc, e.hint) if t]


def shows(scene: Scene, text: str) -> bool:
    """Whether `text` appears on the screen (case-insensitive, inside any label)."""
    low = text.lower().strip()
    return bool(low) and any(low in t.lower() for t in screen_texts(scene))


def on_launcher(scene: Scene) -> bool:
    """The home screen: a launcher package (or a page called home)."""
    return "launcher" in scene.package or scene.page_title.lower() in ("home", "home screen")
