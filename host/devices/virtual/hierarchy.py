"""The windows on screen as uiautomator writes them, attribute for attribute.

Three shapes, each what a real SDK 34 phone produces:

* `dump_active`: `uiautomator dump` — the focused window's tree only (the app, or the dialog,
  shade or lock screen that has focus; never the keyboard or the bars).
* `dump_windows`: `uiautomator dump --windows` — `<displays><display><window …><hierarchy>`
  for every window, topmost first, with its title, bounds, type and layer.
* `dump_roots`: uiautomator2's agent (androidx `dumpWindowHierarchy`) — every window's root
  side by side under one `<hierarchy>`, the focused one first, with `visible-to-user` and
  (SDK 30+) `display-id`: from SDK 30 it lists the windows of every display.

Node attributes follow AOSP's AccessibilityNodeInfoDumper in order, with the SDK 34 additions
(`drawing-order`, `hint`) and `NAF="true"` on clickable views that nothing labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol
from xml.sax.saxutils import escape

from host.devices.virtual.layout import Node, naf

XML_HEADER = "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"


def quoteattr(value: str) -> str:
    """Always double quotes, like the real dumper (the stdlib switches to single quotes)."""
    return '"' + escape(value, {'"': "&quot;", "\n": "&#10;"}) + '"'


def _b(value: bool) -> str:
    return "true" if value else "false"


def _node(
    node: Node,
    index: int,
    package: str,
    out: list[str],
    *,
    visible: bool,
    depth: int = 0,
    max_depth: int | None = None,
    display_id: int | None = None,
) -> None:
    x1, y1, x2, y2 = node.bounds
    out.append("<node")
    if naf(node):
        out.append(' NAF="true"')
    out.append(
        f' index="{index}" text={quoteattr(node.text)}'
        f" resource-id={quoteattr(node.resource_id)}"
        f" class={quoteattr(node.cls)} package={quoteattr(package)}"
        f' content-desc={quoteattr(node.content_desc)} checkable="{_b(node.checkable)}"'
        f' checked="{_b(node.checked)}" clickable="{_b(node.clickable)}"'
        f' enabled="{_b(node.enabled)}" focusable="{_b(node.focusable)}"'
        f' focused="{_b(node.focused)}" scrollable="{_b(node.scrollable)}"'
        f' long-clickable="{_b(node.long_clickable)}" password="{_b(node.password)}"'
        f' selected="{_b(node.selected)}"'
    )
    if visible:
        out.append(' visible-to-user="true"')
    out.append(
        f' bounds="[{x1},{y1}][{x2},{y2}]" drawing-order="{node.drawing_order}"'
        f" hint={quoteattr(node.hint)}"
    )
    if display_id is not None:
        out.append(f' display-id="{display_id}"')
    # uiautomator2's agent leaves out every node deeper than its `max_depth` argument.
    if not node.children or (max_depth is not None and depth + 1 >= max_depth):
        out.append(" />")
        return
    out.append(">")
    for i, child in enumerate(node.children):
        _node(
            child,
            i,
            package,
            out,
            visible=visible,
            depth=depth + 1,
            max_depth=max_depth,
            display_id=display_id,
        )
    out.append("</node>")


def dump_xml(root: Node, package: str, rotation: int = 0) -> str:
    """One finalized tree as a `uiautomator dump` file; every node carries `package`."""
    out = [XML_HEADER, f'<hierarchy rotation="{rotation}">']
    _node(root, 0, package, out, visible=False)
    out.append("</hierarchy>")
    return "".join(out)


class DumpedWindow(Protocol):
    """What a dump needs of a window (`phone.Surface` is one)."""

    @property
    def package(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def layer(self) -> int: ...
    @property
    def root(self) -> Node: ...
    @property
    def window_id(self) -> int: ...
    @property
    def focused(self) -> bool: ...


def dump_active(windows: Sequence[DumpedWindow], rotation: int = 0) -> str:
    focused = next(w for w in windows if w.focused)
    return dump_xml(focused.root, focused.package, rotation)


def dump_windows(
    windows: Sequence[DumpedWindow],
    rotation: int = 0,
    *,
    rootless_focus: bool = False,
    hung: frozenset[str] = frozenset(),
    second_display: bool = False,
) -> str:
    """Bottom-first `windows` as `<displays>`, topmost first (the order accessibility lists
    them in). `rootless_focus`: the focused window's root is null (it is changing), so its
    `<window>` comes without a `<hierarchy>`, as AOSP's dumpWindowRec writes it. `hung`:
    packages whose app does not answer (an "isn't responding" dialog is up); their
    `TYPE_APPLICATION` windows come without a `<hierarchy>` too (getRoot times out).
    `second_display`: a cast or presentation display (id 2) shows a window of its own, which
    `--windows` lists under its own `<display>`."""
    out = [XML_HEADER, '<displays><display id="0">']
    for index, w in enumerate(reversed(windows)):
        x1, y1, x2, y2 = w.root.bounds
        out.append(
            f"<window index={quoteattr(str(index))} title={quoteattr(w.title)}"
            f' bounds="[{x1},{y1}][{x2},{y2}]" active="{_b(w.focused)}"'
            f' focused="{_b(w.focused)}" accessibility-focused="false" id="{w.window_id}"'
            f' layer="{w.layer}" type="{w.type}">'
        )
        rootless = (rootless_focus and w.focused) or (
            w.type == "TYPE_APPLICATION" and w.package in hung
        )
        if not rootless:
            out.append(f'<hierarchy rotation="{rotation}">')
            _node(w.root, 0, w.package, out, visible=False)
            out.append("</hierarchy>")
        out.append("</window>")
    out.append("</display>")
    if second_display:
        out.append(
            '<display id="2"><window index="0" title="Presentation" bounds="[0,0][1920,1080]"'
            ' active="false" focused="false" accessibility-focused="false" id="300"'
            ' layer="1" type="TYPE_APPLICATION"><hierarchy rotation="0">'
        )
        _node(
            _presentation((0, 0, 1920, 1080)),
            0,
            "com.example.presentation",
            out,
            visible=False,
        )
        out.append("</hierarchy></window></display>")
    out.append("</displays>")
    return "".join(out)


def _presentation(bounds: tuple[int, int, int, int]) -> Node:
    """The window a cast or presentation display (id 2) shows."""
    return Node(
        "android.widget.Button",
        bounds,
        text="Presentation screen",
        clickable=True,
        bounds=bounds,
    )


def dump_roots(
    windows: Sequence[DumpedWindow],
    rotation: int = 0,
    max_depth: int | None = None,
    *,
    sdk: int = 34,
    second_display: tuple[int, int] | None = None,
) -> str:
    """Every window's root under one `<hierarchy>`: the focused one, then top to bottom;
    nodes `max_depth` levels or more below a root left out (uiautomator2's limit).

    From `sdk` 30 every node says its `display-id`, and the roots are those of every
    display's windows (`getWindowsOnAllDisplays`). `second_display`: the default display's
    size while a cast or presentation display (id 2) is attached; its window's root comes
    last, its bounds clipped to that size as the agent clips every node's."""
    ordered = sorted(reversed(windows), key=lambda w: not w.focused)
    shown = sdk >= 30
    out = [XML_HEADER, f'<hierarchy rotation="{rotation}">']
    for w in ordered:
        _node(
            w.root,
            0,
            w.package,
            out,
            visible=True,
            max_depth=max_depth,
            display_id=0 if shown else None,
        )
    if second_display is not None and shown:
        width, height = second_display
        clipped = (0, 0, min(1920, width), min(1080, height))
        _node(
            _presentation(clipped),
            0,
            "com.example.presentation",
            out,
            visible=True,
            max_depth=max_depth,
            display_id=2,
        )
    out.append("</hierarchy>")
    return "".join(out)
