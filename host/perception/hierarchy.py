"""Parse a uiautomator hierarchy dump into a `planner.scene.Scene`.

Only informative or actionable nodes become elements (text, a description, or something a
finger can do), so a prompt lists dozens of elements rather than hundreds of layout wrappers.
Element ids are `e1, e2, …` in document order of the kept nodes: the same dump always yields
the same ids, and they are short, which matters when every step re-sends the scene.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from host.devices.base import DeviceError
from planner.scene import Bounds, Element, Scene, derive_page_title

_BOUNDS_RE = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")
_SYSTEM_UI = "com.android.systemui"
_TOOLBAR_ID_HINTS = ("action_bar", "toolbar", "app_bar")
_TOOLBAR_CLASSES = ("Toolbar", "ActionBar")
_EDITABLE_HINTS = ("EditText", "AutoCompleteTextView")


class HierarchyError(DeviceError):
    """The dump is empty, truncated or not XML (the screen was still settling, or worse)."""


@dataclass(frozen=True, slots=True)
class RawNode:
    """One `<node>` of the dump, flattened with its depth and its toolbar ancestry."""

    attrs: dict[str, str]
    bounds: Bounds
    depth: int
    in_toolbar: bool


def parse_bounds(value: str) -> Bounds | None:
    m = _BOUNDS_RE.fullmatch(value.strip()) if value else None
    if not m:
        return None
    left, top, right, bottom = (int(g) for g in m.groups())
    return Bounds(left, top, right, bottom)


def _flag(attrs: dict[str, str], name: str) -> bool:
    return attrs.get(name, "false").lower() == "true"


def parse_nodes(xml_text: str) -> tuple[str, list[RawNode]]:
    """All nodes in document order, with the hierarchy's rotation. Raises `HierarchyError`."""
    text = (xml_text or "").strip()
    if not text:
        raise HierarchyError("empty hierarchy dump")
    # Some tools prepend a status line ("UI hierchary dumped to: …") before the XML.
    start = text.find("<")
    if start > 0:
        text = text[start:]
    try:
        root = ET.fromstring(text.encode("utf-8"))
    except ET.ParseError as exc:
        raise HierarchyError(f"malformed hierarchy dump: {exc}") from exc
    except RecursionError as exc:
        raise HierarchyError("malformed hierarchy dump: nested too deeply") from exc
    if root.tag != "hierarchy":
        raise HierarchyError(f"not a uiautomator dump (root element <{root.tag}>)")
    nodes: list[RawNode] = []

    # Iterative depth-first walk in document order: a dump nested thousands of levels deep
    # (a broken or hostile dumper) must not hit Python's recursion limit.
    stack: list[tuple[Iterator[ET.Element], int, bool]] = [(iter(root), 0, False)]
    while stack:
        children, depth, in_toolbar = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            continue
        if child.tag != "node":
            continue
        attrs = dict(child.attrib)
        bounds = parse_bounds(attrs.get("bounds", ""))
        cls = attrs.get("class", "")
        rid = attrs.get("resource-id", "").rsplit("/", 1)[-1]
        toolbar = (
            in_toolbar
            or any(cls.endswith(t) for t in _TOOLBAR_CLASSES)
            or any(rid.endswith(t) for t in _TOOLBAR_ID_HINTS)
        )
        if bounds is not None:
            nodes.append(RawNode(attrs, bounds, depth, toolbar))
        stack.append((iter(child), depth + 1, toolbar))
    if not nodes:
        raise HierarchyError("hierarchy dump has no nodes (screen not ready)")
    return root.attrib.get("rotation", "0"), nodes


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
    candidates = {p: a for p, a in area.items() if p and p != _SYSTEM_UI} or area
    return max(candidates, key=lambda p: candidates[p])


def parse_scene(
    xml_text: str,
    screen_size: tuple[int, int] | None = None,
    package: str | None = None,
) -> Scene:
    """Dump → Scene. `screen_size` and `package` (from the driver) win over the dump's own."""
    rotation, nodes = parse_nodes(xml_text)
    if screen_size is None:
        width = max(n.bounds.right for n in nodes)
        height = max(n.bounds.bottom for n in nodes)
    else:
        width, height = screen_size
    fg = package or foreground_package(nodes)
    has_other = any(n.attrs.get("package", "") not in ("", _SYSTEM_UI) for n in nodes)
    elements: list[Element] = []
    toolbar_ids: set[str] = set()
    for node in nodes:
        if not _is_kept(node):
            continue
        a = node.attrs
        if has_other and a.get("package") == _SYSTEM_UI:
            continue
        bounds = _clip(node.bounds, width, height)
        if bounds.width <= 0 or bounds.height <= 0:
            continue
        eid = f"e{len(elements) + 1}"
        if node.in_toolbar:
            toolbar_ids.add(eid)
        elements.append(
            Element(
                element_id=eid,
                bounds=bounds,
                text=a.get("text", "").strip(),
                content_desc=a.get("content-desc", "").strip(),
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
            )
        )
    return Scene(
        elements=elements,
        package=fg,
        page_title=derive_page_title(elements, height, toolbar_ids),
        screen_width=width,
        screen_height=height,
        rotation=int(rotation) if rotation in ("0", "1", "2", "3") else 0,
    )


def ui_tree_nodes(scene: Scene) -> list[dict[str, Any]]:
    """The structured node list `get_ui_tree` returns: every element, tree and OCR, in order."""
    out: list[dict[str, Any]] = []
    for e in scene.elements:
        node = e.to_prompt()
        node["source"] = e.source
        node["center"] = list(e.bounds.center)
        out.append(node)
    return out
