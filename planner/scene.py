"""The planner's view of one screen: elements with stable ids, the foreground app, a page title.

Perception (in `host/perception/`) builds a Scene from a uiautomator dump plus OCR; the planner
renders it into the prompt. It lives here, not in the host, because the planner is its consumer
and must not import host code.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class Bounds:
    """A screen rectangle in physical pixels, `[left,top][right,bottom]` as uiautomator has it."""

    left: int
    top: int
    right: int
    bottom: int

    @property
    def center(self) -> tuple[int, int]:
        return ((self.left + self.right) // 2, (self.top + self.bottom) // 2)

    @property
    def width(self) -> int:
        return self.right - self.left

    @property
    def height(self) -> int:
        return self.bottom - self.top

    def to_list(self) -> list[int]:
        return [self.left, self.top, self.right, self.bottom]


@dataclass(frozen=True, slots=True)
class Element:
    """One actionable or informative thing on screen.

    `element_id` is what the planner's `tap` names; it is derived deterministically from the
    dump so the same screen yields the same ids step after step.
    """

    element_id: str
    bounds: Bounds
    text: str = ""
    content_desc: str = ""
    resource_id: str = ""
    class_name: str = ""
    package: str = ""
    clickable: bool = False
    long_clickable: bool = False
    checkable: bool = False
    checked: bool = False
    enabled: bool = True
    focusable: bool = False
    focused: bool = False
    scrollable: bool = False
    selected: bool = False
    password: bool = False
    source: Literal["tree", "ocr"] = "tree"
    #: A field's hint ("Name", "Search") when the dump reports it; with no `text` the field is
    #: empty and only shows this hint.
    hint: str = ""

    def to_prompt(self) -> dict[str, Any]:
        """Compact form for the prompt: only what is set, so an element costs a few tokens."""
        out: dict[str, Any] = {"id": self.element_id}
        if self.text:
            out["text"] = self.text
        if self.hint:
            out["hint"] = self.hint
        if self.content_desc:
            out["desc"] = self.content_desc
        if self.resource_id:
            out["rid"] = self.resource_id
        if self.class_name:
            out["cls"] = self.class_name.rsplit(".", 1)[-1]
        out["bounds"] = self.bounds.to_list()
        flags = [
            name
            for name, on in (
                ("clickable", self.clickable),
                ("long_clickable", self.long_clickable),
                ("checkable", self.checkable),
                ("checked", self.checked),
                ("disabled", not self.enabled),
                ("focused", self.focused),
                ("scrollable", self.scrollable),
                ("selected", self.selected),
                ("password", self.password),
                ("ocr", self.source == "ocr"),
            )
            if on
        ]
        if flags:
            out["flags"] = flags
        return out


@dataclass(frozen=True, slots=True)
class OcrObservation:
    """One raw OCR word or line. Kept for the timeline; never serialized into a prompt."""

    text: str
    bounds: Bounds
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "bounds": self.bounds.to_list(), "confidence": self.confidence}


@dataclass(slots=True)
class Scene:
    """Everything the planner may know about the current screen.

    `rotation` is uiautomator's quarter turns (0..3); `activity` and `keyboard_shown` are what the
    host knows of the foreground activity and the on-screen keyboard ("" / False when unknown).
    """

    elements: list[Element]
    package: str
    page_title: str
    screen_width: int
    screen_height: int
    ocr: list[OcrObservation] = field(default_factory=list)
    rotation: int = 0
    activity: str = ""
    keyboard_shown: bool = False
    #: What covers the app, topmost first, as perception recognised it: "keyboard",
    #: "permission_prompt", "app_not_responding", "app_crash", "system_dialog",
    #: "notification_shade", "lock_screen". Empty when the app has the screen to itself.
    overlays: list[str] = field(default_factory=list)
    #: Elements left out to keep the scene (and so the prompt) bounded: the least telling
    #: texts go first, actionable elements last.
    omitted: int = 0
    #: Why there is no UI tree of this screen ("" when there is): the phone answered, but its
    #: dumps kept failing (a secure window, a screen never idle), so the elements are only
    #: what OCR read off the screenshot, and the model is told so.
    tree_missing: str = ""
    #: What had to be repaired in the phone's dump to read it ("" when nothing): a dumper
    #: that left `&` or `<` unescaped in its texts. The tree is whole; said so that the step's
    #: record shows this phone's dumper writes broken XML.
    tree_repaired: str = ""
    #: Why the screenshot shows nothing of the app though the tree does ("" when it shows
    #: the screen): a FLAG_SECURE window (a banking app, a password screen) is black in
    #: every capture. Said so the model relies on the elements instead of a black image.
    screenshot_blank: str = ""

    def element(self, element_id: str) -> Element | None:
        return next((e for e in self.elements if e.element_id == element_id), None)

    @property
    def page(self) -> str:
        """Short name of the page for compact history ("com.android.settings: Display")."""
        return f"{self.package}: {self.page_title}" if self.page_title else self.package

    def to_prompt(self) -> dict[str, Any]:
        """The scene as the model sees it. Raw OCR observations are deliberately left out;
        rotation, activity, keyboard, `overlays`, `omitted`, a missing UI tree and a blank
        screenshot appear only when they say something, so an ordinary screen costs nothing
        more."""
        out: dict[str, Any] = {
            "app": self.package,
            "page": self.page_title,
            "screen": [self.screen_width, self.screen_height],
        }
        if self.activity:
            out["activity"] = self.activity
        if self.rotation:
            out["rotation"] = 90 * self.rotation
        if self.keyboard_shown:
            out["keyboard"] = "shown"
        if self.overlays:
            out["overlays"] = list(self.overlays)
        if self.omitted:
            out["omitted"] = self.omitted
        if self.tree_missing:
            out["ui_tree"] = (
                f"missing ({self.tree_missing}): the elements are only text read off the "
                "screenshot, if any; tap by x/y where the screen shows the target"
            )
        elif self.tree_repaired:
            out["ui_tree"] = f"repaired ({self.tree_repaired})"
        if self.screenshot_blank:
            out["screenshot"] = (
                f"blank ({self.screenshot_blank}): the image shows nothing of the app; rely on "
                "the elements, which come from the UI tree"
            )
        out["elements"] = [e.to_prompt() for e in self.elements]
        return out


_TITLE_ID_HINTS = ("action_bar_title", "toolbar_title", "title_bar", "large_title", "page_title")


def derive_page_title(
    elements: list[Element], height: int, toolbar_ids: Collection[str] = (), dialog: bool = False
) -> str:
    """A short page name: a toolbar's title, an id that says "title", or the top-most heading
    (for a dialog, its first short text wherever it sits).

    Perception passes the ids of elements inside a toolbar (it sees the tree); the cloud, which
    gets a flat element list from a host that read no title, passes none.
    """
    texts = [e for e in elements if e.text.strip() and e.source == "tree"]
    for e in texts:
        if e.element_id in toolbar_ids and not e.clickable:
            return e.text.strip()
    for e in texts:
        rid = e.resource_id.rsplit("/", 1)[-1].lower()
        if any(rid.endswith(h) for h in _TITLE_ID_HINTS) and e.bounds.top < height // 3:
            return e.text.strip()
    top = [
        e
        for e in texts
        if e.bounds.top < height // 5 and not e.clickable and not e.checkable and len(e.text) <= 60
    ]
    if not top and dialog:
        top = [e for e in texts if not e.clickable and not e.checkable and len(e.text) <= 80]
    if top:
        return min(top, key=lambda e: (e.bounds.top, e.bounds.left)).text.strip()
    return ""
