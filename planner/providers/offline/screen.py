"""Screen reading: the scene's elements and what each one means to a finger.

The scene is the dict the prompt carries (`parse_user_prompt`); nothing here knows the goal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SWITCH_TEXTS = ("ON", "OFF")


@dataclass(frozen=True, slots=True)
class El:
    """One element of the scene, with the flags as a set."""

    id: str
    text: str
    desc: str
    rid: str
    cls: str
    bounds: tuple[int, int, int, int]
    flags: frozenset[str]
    #: A field's hint, when the dump reports it apart from the text (SDK 26+).
    hint: str = ""

    @property
    def own_label(self) -> str:
        return self.text or self.desc or self.hint

    @property
    def field_name(self) -> str:
        """What a field is for: its hint, else (older dumps show an empty field's hint as its
        text) its text."""
        return self.hint or self.text

    @property
    def editable(self) -> bool:
        return "EditText" in self.cls or "AutoComplete" in self.cls

    @property
    def center(self) -> tuple[int, int]:
        b = self.bounds
        return ((b[0] + b[2]) // 2, (b[1] + b[3]) // 2)

    def contains(self, other: El) -> bool:
        a, b = self.bounds, other.bounds
        return a != b and a[0] <= b[0] and a[1] <= b[1] and a[2] >= b[2] and a[3] >= b[3]


def elements(scene: dict[str, Any]) -> list[El]:
    out: list[El] = []
    for raw in scene.get("elements", []):
        bounds = raw.get("bounds") or [0, 0, 0, 0]
        out.append(
            El(
                id=str(raw.get("id", "")),
                text=str(raw.get("text", "")),
                desc=str(raw.get("desc", "")),
                rid=str(raw.get("rid", "")),
                cls=str(raw.get("cls", "")),
                bounds=(int(bounds[0]), int(bounds[1]), int(bounds[2]), int(bounds[3])),
                flags=frozenset(raw.get("flags", [])),
                hint=str(raw.get("hint", "")),
            )
        )
    return out


class Screen:
    """The current screen: its elements, app, page title and headings, and how to read rows."""

    def __init__(self, scene: dict[str, Any]) -> None:
        self.els = elements(scene)
        self.title = str(scene.get("page", ""))
        self.app = str(scene.get("app", ""))
        self.page = f"{self.app}: {self.title}" if self.title else self.app
        #: What covers the app, topmost first ("permission_prompt", "keyboard"…).
        self.overlays = [str(o) for o in scene.get("overlays", [])]
        size = scene.get("screen") or [1080, 2400]
        self.width, self.height = int(size[0]), int(size[1])
        # The page's name as shown: the scene's title and the plain texts in the top bar.
        top = int(self.height * 0.12)
        self.headings = [self.title] + [
            e.text for e in self.els if e.text and e.bounds[3] <= top and "clickable" not in e.flags
        ]

    def label(self, el: El) -> str:
        """What a finger on `el` means: its own text, or the texts inside it (a list row)."""
        if el.own_label and not el.editable and el.text not in SWITCH_TEXTS:
            return el.own_label
        inner = [o.own_label for o in self.els if el.contains(o) and o.own_label]
        inner = [t for t in inner if t not in SWITCH_TEXTS]
        if inner:
            return " — ".join(inner)
        if "checkable" in el.flags:
            return self.row_label(el)
        return el.own_label

    def row_label(self, el: El) -> str:
        """Texts on the same row (a switch's label sits to its left)."""
        top, bottom = el.bounds[1], el.bounds[3]
        mid = (top + bottom) // 2
        texts = [
            o
            for o in self.els
            if o is not el
            and o.own_label
            and o.text not in SWITCH_TEXTS
            and not o.contains(el)
            and o.bounds[1] - 60 <= mid <= o.bounds[3] + 60
        ]
        texts.sort(key=lambda o: o.bounds[1])
        return " — ".join(o.own_label for o in texts)

    def clickable_for(self, el: El) -> El:
        """The element that takes a tap meant for `el`: itself, or the row that contains it."""
        if "clickable" in el.flags or "checkable" in el.flags or el.editable:
            return el
        holders = [o for o in self.els if "clickable" in o.flags and o.contains(el)]
        if holders:
            return min(
                holders, key=lambda o: (o.bounds[2] - o.bounds[0]) * (o.bounds[3] - o.bounds[1])
            )
        return el

    def toggles(self, el: El) -> bool:
        """Whether a tap on `el` flips something: it is a switch, checkbox or tile, or a row
        that holds one (the row takes the click on Android)."""
        if "checkable" in el.flags:
            return True
        return any("checkable" in o.flags and el.contains(o) for o in self.els)

    def switch_name(self, el: El) -> str:
        """The name of a switch: its own label (a tile's), or its row's first text."""
        if el.own_label and el.text not in SWITCH_TEXTS:
            return el.own_label
        return self.row_label(el).split(" — ")[0]

    def container_of(self, el: El) -> El | None:
        """The smallest element strictly around `el` (a field's picker, a row)."""
        around = [o for o in self.els if o.contains(el)]
        if not around:
            return None
        return min(around, key=lambda o: (o.bounds[2] - o.bounds[0]) * (o.bounds[3] - o.bounds[1]))

    def top_label(self, container: El) -> str:
        inside = [
            e for e in self.els if container.contains(e) and e.text and e.text not in SWITCH_TEXTS
        ]
        return min(inside, key=lambda e: e.bounds[1]).text if inside else ""

    def row_holder(self, el: El) -> El:
        """The smallest clickable row holding `el` (the row takes the click on Android)."""
        holders = [o for o in self.els if "clickable" in o.flags and o.contains(el)]
        return min(holders, key=lambda o: o.bounds[3] - o.bounds[1]) if holders else el

    @property
    def on_launcher(self) -> bool:
        return "launcher" in self.app or self.title.lower() in ("home", "home screen")

    def bottom_label(self, container: El) -> str:
        inside = [
            e for e in self.els if container.contains(e) and e.text and e.text not in SWITCH_TEXTS
        ]
        return max(inside, key=lambda e: e.bounds[3]).text if inside else ""

    def switch_state(self, name: str) -> bool | None:
        """Checked state of the switch whose row is named `name`, None when not on screen."""
        for el in self.els:
            if "checkable" in el.flags and self.label(el).split(" — ")[0] == name:
                return "checked" in el.flags
        return None

    def text_raw(self) -> str:
        return " ".join(e.own_label for e in self.els)

    def text_lower(self) -> str:
        return self.text_raw().lower()
