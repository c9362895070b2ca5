"""Parse a uiautomator hierarchy dump into a `planner.scene.Scene`.

Only informative or actionable nodes become elements (text, a description, or something a
finger can do), so a prompt lists dozens of elements rather than hundreds of layout wrappers.
Element ids are `e1, e2, …` in document order of the kept nodes: the same dump always yields
the same ids, and they are short, which matters when every step re-sends the scene.

Real dumps come in several shapes (see `dump_text` and `windows`): one `<hierarchy>` with one
root per window, or `<displays><display><window><hierarchy>` from `uiautomator dump --windows`.
Only the default display's windows are read (the one the drivers tap): `--windows` lists the
others under their own `<display>`, uiautomator2 marks their roots `display-id`.
What lies under a modal window (a permission prompt, an "isn't responding" dialog, the shade,
the lock screen) or under the keyboard is out of a finger's reach and is left out; what covers
the app is named in `Scene.overlays`. Texts are capped and the scene's total size is bounded,
so one chat history or web page cannot blow up every prompt.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from host.devices.base import DeviceError
from host.perception.dump_text import clean_dump, repair_dump
from host.perception.windows import (
    CHROME,
    MODAL,
    Kind,
    Window,
    WindowFacts,
    classify,
    stacking,
)
from planner.scene import Bounds, Element, Scene, derive_page_title

_BOUNDS_RE = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")
_TOOLBAR_ID_HINTS = ("action_bar", "toolbar", "app_bar")
_TOOLBAR_CLASSES = ("Toolbar", "ActionBar")
_EDITABLE_HINTS = ("EditText", "AutoCompleteTextView")
_ROOTS = ("hierarchy", "displays")
#: A keyboard ending at most this share of the height above the screen's bottom (room for a
#: navigation bar) is docked; one ending higher floats.
_DOCKED_GAP = 0.15
_WRAPPERS = ("display", "displays", "hierarchy")

#: One element's text (and description) at most this long in the scene; the rest is counted.
TEXT_CAP = 300
#: At most this many elements in a scene, and this many characters of text in all of them.
MAX_ELEMENTS = 200
MAX_SCENE_TEXT = 16_000
KEYBOARD_LABEL = "On-screen keyboard"


class HierarchyError(DeviceError):
    """The dump is empty, truncated or not XML (the screen was still settling, or worse)."""


class ScreenTurned(HierarchyError):
    """The dump is laid out for the other orientation than the screen size it came with: the
    phone turned between the two reads (an app that asks for landscape turns it as it
    starts). `xml` is the dump, to be read again with the size read anew."""

    def __init__(self, message: str, xml: str) -> None:
        super().__init__(message)
        self.xml = xml


def _turned(own: tuple[int, int], size: tuple[int, int]) -> bool:
    """Whether a dump whose windows span `own` belongs to the other orientation than `size`:
    it reaches past `size` along one side and fits it turned (a window a few pixels past the
    screen, a display cutout, does not fit it turned)."""
    (ow, oh), (w, h) = own, size
    return (w < ow <= h and oh <= w) or (h < oh <= w and ow <= h)


@dataclass(frozen=True, slots=True)
class RawNode:
    """One `<node>` of the dump, flattened with its depth in its window and its toolbar
    ancestry."""

    attrs: dict[str, str]
    bounds: Bounds
    depth: int
    in_toolbar: bool
    window: int = 0


def parse_bounds(value: str) -> Bounds | None:
    m = _BOUNDS_RE.fullmatch(value.strip()) if value else None
    if not m:
        return None
    left, top, right, bottom = (int(g) for g in m.groups())
    return Bounds(left, top, right, bottom)


def _flag(attrs: dict[str, str], name: str) -> bool:
    return attrs.get(name, "false").lower() == "true"


def _window_attrs(el: ET.Element, index: int) -> Window:
    a = el.attrib
    layer = a.get("layer", "")
    return Window(
        index=index,
        package="",
        bounds=parse_bounds(a.get("bounds", "")) or Bounds(0, 0, 0, 0),
        type=a.get("type", ""),
        layer=int(layer) if layer.lstrip("-").isdigit() else None,
        title=a.get("title", ""),
        focused=a.get("active") == "true" or a.get("focused") == "true",
        rootless=el.find("hierarchy") is None,
    )


def _check_trees(windows: list[Window], kinds: dict[int, Kind]) -> None:
    """Raise `HierarchyError` when the window that matters has no tree: a `<window>` without
    a `<hierarchy>` had a null root (the `--windows` form of "null root node returned by
    UiTestAutomationBridge": it is changing), so the dump is retried instead of showing the
    planner an empty screen built from the system bars alone.

    That is the focused or active window, or an app's window while no modal window with a
    tree (an "isn't responding" or crash dialog, a permission prompt) is up. A hung app's
    window stays rootless for as long as it hangs while its "isn't responding" dialog has a
    tree: raising then would keep the agent from ever tapping Wait or Close app."""
    modal_shown = any(kinds[w.index] in MODAL and not w.rootless for w in windows)
    for w in windows:
        if w.rootless and (w.focused or (w.type == "TYPE_APPLICATION" and not modal_shown)):
            raise HierarchyError(
                f"window {w.title!r} ({w.type or 'unknown type'}) has no tree yet (null root)"
            )


def _parse_root(xml_text: str) -> ET.Element:
    text = clean_dump(xml_text)
    if not text.strip():
        raise HierarchyError("empty hierarchy dump")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise HierarchyError(f"malformed hierarchy dump: {exc}") from exc
    except RecursionError as exc:
        raise HierarchyError("malformed hierarchy dump: nested too deeply") from exc
    if root.tag not in _ROOTS:
        raise HierarchyError(f"not a uiautomator dump (root element <{root.tag}>)")
    return root


def parse_windows(xml_text: str) -> tuple[str, list[RawNode], list[Window]]:
    """All nodes in document order with the windows they belong to, and the rotation.

    Raises `HierarchyError` for an empty, malformed or node-less dump.
    """
    root = _parse_root(xml_text)
    rotation = root.attrib.get("rotation", "")
    nodes: list[RawNode] = []
    windows: list[Window] = []
    # A `<window>` element opens a window; in a plain `<hierarchy>` each top-level node does.
    # Iterative depth-first walk in document order: a dump nested thousands of levels deep
    # (a broken or hostile dumper) must not hit Python's recursion limit.
    stack: list[tuple[Iterator[ET.Element], int, bool, int | None]] = [(iter(root), 0, False, None)]
    while stack:
        children, depth, in_toolbar, window = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            continue
        if child.tag == "window":
            windows.append(_window_attrs(child, len(windows)))
            stack.append((iter(child), 0, False, len(windows) - 1))
            continue
        if child.tag == "display" and child.attrib.get("id", "0") != "0":
            # A cast, presentation or foldable cover display: not where the driver taps.
            continue
        if child.tag in _WRAPPERS:
            rotation = rotation or child.attrib.get("rotation", "")
            stack.append((iter(child), depth, in_toolbar, window))
            continue
        if child.tag != "node":
            continue
        if window is None and child.attrib.get("display-id", "0") != "0":
            # uiautomator2's agent (SDK 30+) dumps every display's windows side by side, each
            # node saying its display, clipped to the default display's size: a cast or
            # cover screen's window would lie over the phone's own screen.
            continue
        if window is None:
            # A top-level node of a plain hierarchy: a window of its own.
            windows.append(Window(index=len(windows), package="", bounds=Bounds(0, 0, 0, 0)))
            window = len(windows) - 1
            owner: int | None = None
        else:
            owner = window
        attrs = dict(child.attrib)
        bounds = parse_bounds(attrs.get("bounds", ""))
        if depth == 0 and (bounds is not None or windows[window].package == ""):
            w = windows[window]
            windows[window] = Window(
                index=w.index,
                package=w.package or attrs.get("package", ""),
                bounds=w.bounds if w.bounds.width > 0 else (bounds or w.bounds),
                type=w.type,
                layer=w.layer,
                title=w.title,
                focused=w.focused,
                rootless=w.rootless,
            )
        cls = attrs.get("class", "")
        rid = attrs.get("resource-id", "").rsplit("/", 1)[-1]
        toolbar = (
            in_toolbar
            or any(cls.endswith(t) for t in _TOOLBAR_CLASSES)
            or any(rid.endswith(t) for t in _TOOLBAR_ID_HINTS)
        )
        if bounds is not None:
            nodes.append(RawNode(attrs, bounds, depth, toolbar, window))
        stack.append((iter(child), depth + 1, toolbar, owner if owner is not None else window))
    if not nodes:
        raise HierarchyError("hierarchy dump has no nodes (screen not ready)")
    return rotation or "0", nodes, windows


def parse_nodes(xml_text: str) -> tuple[str, list[RawNode]]:
    """All nodes in document order, with the hierarchy's rotation. Raises `HierarchyError`."""
    rotation, nodes, _ = parse_windows(xml_text)
    return rotation, nodes


def _clip(b: Bounds, width: int, height: int) -> Bounds:
    return Bounds(
        max(0, min(b.left, width)),
        max(0, min(b.top, height)),
        max(0, min(b.right, width)),
        max(0, min(b.bottom, height)),
    )


def _is_kept(node: RawNode) -> bool:
    a = node.attrs
    if a.get("visible-to-user", "true").lower() == "false":
        return False
    if node.bounds.width <= 0 or node.bounds.height <= 0:
        return False
    informative = bool(a.get("text", "").strip() or a.get("content-desc", "").strip())
    actionable = any(
        _flag(a, f) for f in ("clickable", "long-clickable", "checkable", "scrollable")
    )
    editable = any(h in a.get("class", "") for h in _EDITABLE_HINTS)
    return informative or actionable or editable


def foreground_package(nodes: list[RawNode]) -> str:
    """The package owning most of the screen; the system UI only when nothing else shows."""
    area: dict[str, int] = {}
    for n in nodes:
        if n.depth == 0:
            pkg = n.attrs.get("package", "")
            area[pkg] = area.get(pkg, 0) + n.bounds.width * n.bounds.height
    if not area:
        return ""
    candidates = {p: a for p, a in area.items() if p and p != "com.android.systemui"} or area
    return max(candidates, key=lambda p: candidates[p])


def cap_text(value: str, cap: int = TEXT_CAP) -> str:
    """`value` cut to `cap` characters with a marker saying how much was left out."""
    value = value.strip()
    if len(value) <= cap:
        return value
    return f"{value[:cap]}… [{len(value) - cap} more characters]"


def _screen_from(windows: list[Window], nodes: list[RawNode]) -> tuple[int, int]:
    """The screen's size from the windows' own bounds (the app's root spans the screen), never
    from every node: nodes laid out off screen (pages of a pager, a list's recycled rows) would
    stretch the "screen" and keep them all."""
    roots = [w.bounds for w in windows if w.bounds.width > 0 and w.bounds.height > 0]
    if not roots:
        roots = [n.bounds for n in nodes if n.depth == 0] or [n.bounds for n in nodes]
    return max(b.right for b in roots), max(b.bottom for b in roots)


def _covered(b: Bounds, cover: Bounds) -> Bounds | None:
    """What of `b` is left in view beside a window `cover` over it (a keyboard, a system
    bar): the largest of its parts above, below, left and right of the cover, where a tap on
    it lands on it; None when the cover hides all of it."""
    if b.right <= cover.left or b.left >= cover.right or b.bottom <= cover.top:
        return b
    if b.top >= cover.bottom:
        return b
    parts = (
        Bounds(b.left, b.top, b.right, min(b.bottom, cover.top)),
        Bounds(b.left, max(b.top, cover.bottom), b.right, b.bottom),
        Bounds(b.left, b.top, min(b.right, cover.left), b.bottom),
        Bounds(max(b.left, cover.right), b.top, b.right, b.bottom),
    )
    best = max(parts, key=lambda p: max(0, p.width) * max(0, p.height))
    return best if best.width > 0 and best.height > 0 else None


def _budget(candidates: list[tuple[RawNode, Bounds]]) -> tuple[list[tuple[RawNode, Bounds]], int]:
    """Keep the scene bounded: actionable elements first, then texts in document order."""

    def size(n: RawNode) -> int:
        a = n.attrs
        return min(len(a.get("text", "")), TEXT_CAP) + min(len(a.get("content-desc", "")), TEXT_CAP)

    def actionable(n: RawNode) -> bool:
        a = n.attrs
        return any(
            _flag(a, f) for f in ("clickable", "long-clickable", "checkable", "scrollable")
        ) or any(h in a.get("class", "") for h in _EDITABLE_HINTS)

    total = sum(size(n) for n, _ in candidates)
    if len(candidates) <= MAX_ELEMENTS and total <= MAX_SCENE_TEXT:
        return candidates, 0
    order = sorted(range(len(candidates)), key=lambda i: (not actionable(candidates[i][0]), i))
    kept: set[int] = set()
    used = 0
    for i in order:
        cost = size(candidates[i][0])
        if len(kept) >= MAX_ELEMENTS or (used + cost > MAX_SCENE_TEXT and kept):
            continue
        kept.add(i)
        used += cost
    return [c for i, c in enumerate(candidates) if i in kept], len(candidates) - len(kept)


def parse_scene(
    xml_text: str,
    screen_size: tuple[int, int] | None = None,
    package: str | None = None,
    ime_package: str = "",
) -> Scene:
    """Dump → Scene. `screen_size` and `package` (from the driver) win over the dump's own.

    `ime_package` (the driver's `keyboard_package`) names the keyboard's windows where the
    dump has no window types; "" leaves it to the package hints. It is ignored when it is the
    foreground app itself (the keyboard's settings screen): taking that app for a keyboard
    would hide all of it."""
    xml_text, repaired = repair_dump(xml_text)
    rotation, nodes, windows = parse_windows(xml_text)
    if ime_package and ime_package == package:
        ime_package = ""
    own = _screen_from(windows, nodes)
    if screen_size is not None and _turned(own, screen_size):
        raise ScreenTurned(
            f"the dump spans {own[0]}x{own[1]} (rotation {rotation}) on a screen read as "
            f"{screen_size[0]}x{screen_size[1]}: the phone turned while it was read",
            xml_text,
        )
    width, height = screen_size if screen_size is not None else own
    facts: dict[int, tuple[list[str], list[str]]] = {w.index: ([], []) for w in windows}
    for n in nodes:
        ids, texts = facts[n.window]
        if n.attrs.get("resource-id"):
            ids.append(n.attrs["resource-id"])
        if n.attrs.get("text"):
            texts.append(n.attrs["text"])
    kinds: dict[int, Kind] = {
        w.index: classify(
            w,
            WindowFacts(tuple(facts[w.index][0]), tuple(facts[w.index][1])),
            (width, height),
            ime_package,
            package or "",
        )
        for w in windows
    }
    _check_trees(windows, kinds)
    stack = sorted(windows, key=lambda w: stacking(w, kinds[w.index]))  # nearest the user last
    # Windows under the topmost modal one are out of reach; a keyboard covers what is below it.
    reachable = list(stack)
    for i in range(len(stack) - 1, -1, -1):
        if kinds[stack[i].index] in MODAL:
            reachable = stack[i:]
            break
    reachable, app_dialog = _past_app_dialog(reachable, kinds)
    keyboards = [w for w in reachable if kinds[w.index] == "keyboard"]
    keyboard_top = {w.index: w for w in keyboards}
    level = {w.index: i for i, w in enumerate(stack)}
    # What covers the windows under it: a keyboard and the system bars, which an edge-to-edge
    # app draws under. A docked keyboard covers whatever lies below it too (it reaches down to
    # the navigation bar); a floating one (ending well above the bottom) only itself: the app
    # below and beside it is in plain view and in reach.
    covers = [
        (
            kb.index,
            _clip(
                Bounds(
                    kb.bounds.left,
                    kb.bounds.top,
                    kb.bounds.right,
                    height if kb.bounds.bottom >= height * (1 - _DOCKED_GAP) else kb.bounds.bottom,
                ),
                width,
                height,
            ),
        )
        for kb in keyboards
    ] + [(w.index, _clip(w.bounds, width, height)) for w in stack if kinds[w.index] in CHROME]
    shown = {w.index for w in reachable if kinds[w.index] not in CHROME}
    overlays: list[str] = []
    for w in reversed(reachable):
        kind = kinds[w.index]
        if kind in MODAL or kind == "keyboard":
            overlays.append(kind)
    overlays = list(dict.fromkeys(overlays))
    modal = next((w for w in reversed(reachable) if kinds[w.index] in MODAL), None)

    candidates: list[tuple[RawNode, Bounds]] = []
    keyboard_done: set[int] = set()
    for node in nodes:
        if node.window not in shown:
            continue
        if node.window in keyboard_top:
            if node.window not in keyboard_done:
                keyboard_done.add(node.window)
                w = keyboard_top[node.window]
                b = _clip(w.bounds if w.bounds.width > 0 else node.bounds, width, height)
                attrs = {
                    "content-desc": KEYBOARD_LABEL,
                    "class": node.attrs.get("class", ""),
                    "package": w.package,
                }
                candidates.append((RawNode(attrs, b, 0, False, node.window), b))
            continue
        if not _is_kept(node):
            continue
        bounds: Bounds | None = _clip(node.bounds, width, height)
        for index, cover in covers:
            if bounds is not None and level[index] > level[node.window]:
                bounds = _covered(bounds, cover)
        if bounds is None or bounds.width <= 0 or bounds.height <= 0:
            continue
        candidates.append((node, bounds))
    kept, omitted = _budget(candidates)

    elements: list[Element] = []
    toolbar_ids: set[str] = set()
    for node, bounds in kept:
        a = node.attrs
        eid = f"e{len(elements) + 1}"
        if node.in_toolbar:
            toolbar_ids.add(eid)
        text = cap_text(a.get("text", ""))
        hint = cap_text(a.get("hint", ""))
        if hint and text == hint and any(h in a.get("class", "") for h in _EDITABLE_HINTS):
            text = ""  # an empty field reports its hint as its text (Android 8+)
        elements.append(
            Element(
                element_id=eid,
                bounds=bounds,
                text=text,
                content_desc=cap_text(a.get("content-desc", "")),
                resource_id=a.get("resource-id", ""),
                class_name=a.get("class", ""),
                package=a.get("package", ""),
                clickable=_flag(a, "clickable"),
                long_clickable=_flag(a, "long-clickable"),
                checkable=_flag(a, "checkable"),
                checked=_flag(a, "checked"),
                enabled=a.get("enabled", "true").lower() == "true",
                focusable=_flag(a, "focusable"),
                focused=_flag(a, "focused"),
                scrollable=_flag(a, "scrollable"),
                selected=_flag(a, "selected"),
                password=_flag(a, "password"),
                hint=hint,
            )
        )
    if modal is not None:
        fg = modal.package or package or ""
    else:
        fg = package or _app_package(windows, kinds, nodes)
    titled = [e for e in elements if modal is None or e.package == modal.package]
    return Scene(
        elements=elements,
        package=fg,
        page_title=derive_page_title(
            titled, height, toolbar_ids, dialog=modal is not None or app_dialog
        ),
        screen_width=width,
        screen_height=height,
        rotation=int(rotation) if rotation in ("0", "1", "2", "3") else 0,
        keyboard_shown="keyboard" in overlays,
        overlays=overlays,
        omitted=omitted,
        tree_repaired=repaired,
    )


def _past_app_dialog(stack: list[Window], kinds: dict[int, Kind]) -> tuple[list[Window], bool]:
    """`stack` (nearest the user last) without the app windows under the focused one, and
    whether any were left out.

    An app's own dialog or popup menu is a window of its package over the activity, and it
    takes the focus. A Dialog does not set FLAG_NOT_TOUCH_MODAL, so it takes every touch (one
    outside it cancels it): the activity under it is out of reach, as the plain `uiautomator
    dump` (Android 10 and earlier: the focused window alone) shows it. So does another app's
    activity (TYPE_APPLICATION) over it: Android 13+'s share sheet (`com.android.intentresolver`,
    translucent, the screen's size), an "Open with" chooser, a dialog-themed activity. A
    popup that does not take the focus (an autocomplete list) leaves the focused activity in
    reach; dumps that do not say which window has the focus (uiautomator2's) keep every
    window. Only a window the focused one lies within is under it: side-by-side panes of one
    app (activity embedding on a foldable or tablet, Settings' two panes) and split-screen
    apps are both in reach."""
    top = next((w for w in reversed(stack) if w.focused and kinds[w.index] == "app"), None)
    if top is None or top.bounds.width <= 0 or top.bounds.height <= 0:
        return stack, False
    level = stack.index(top)

    def under(w: Window) -> bool:
        b, t = w.bounds, top.bounds
        return (
            kinds[w.index] == "app"
            and (w.package == top.package or top.type == "TYPE_APPLICATION")
            and b.left <= t.left
            and b.top <= t.top
            and b.right >= t.right
            and b.bottom >= t.bottom
        )

    kept = [w for i, w in enumerate(stack) if i >= level or not under(w)]
    return kept, len(kept) < len(stack)


def _app_package(windows: list[Window], kinds: dict[int, Kind], nodes: list[RawNode]) -> str:
    apps = [w for w in windows if kinds[w.index] == "app" and w.package]
    if apps:
        return max(apps, key=lambda w: w.bounds.width * w.bounds.height).package
    return foreground_package(nodes)


def ui_tree_nodes(scene: Scene) -> list[dict[str, Any]]:
    """The structured node list `get_ui_tree` returns: every element, tree and OCR, in order."""
    out: list[dict[str, Any]] = []
    for e in scene.elements:
        node = e.to_prompt()
        node["source"] = e.source
        node["center"] = list(e.bounds.center)
        out.append(node)
    return out
