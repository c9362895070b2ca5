"""The view tree as `uiautomator dump` writes it: one line, same attributes, same order."""

from __future__ import annotations

from xml.sax.saxutils import escape

from host.devices.virtual.layout import Node

XML_HEADER = "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"


def quoteattr(value: str) -> str:
    """Always double quotes, like the real dumper (the stdlib switches to single quotes)."""
    return '"' + escape(value, {'"': "&quot;", "\n": "&#10;"}) + '"'


def _b(value: bool) -> str:
    return "true" if value else "false"


def _node(node: Node, index: int, package: str, out: list[str]) -> None:
    x1, y1, x2, y2 = node.bounds
    out.append(
        f'<node index="{index}" text={quoteattr(node.text)}'
        f" resource-id={quoteattr(node.resource_id)}"
        f" class={quoteattr(node.cls)} package={quoteattr(package)}"
        f' content-desc={quoteattr(node.content_desc)} checkable="{_b(node.checkable)}"'
        f' checked="{_b(node.checked)}" clickable="{_b(node.clickable)}"'
        f' enabled="{_b(node.enabled)}" focusable="{_b(node.focusable)}"'
        f' focused="{_b(node.focused)}" scrollable="{_b(node.scrollable)}"'
        f' long-clickable="{_b(node.long_clickable)}" password="{_b(node.password)}"'
        f' selected="{_b(node.selected)}" bounds="[{x1},{y1}][{x2},{y2}]"'
    )
    if not node.children:
        out.append(" />")
        return
    out.append(">")
    for i, child in enumerate(node.children):
        _node(child, i, package, out)
    out.append("</node>")


def dump_xml(root: Node, package: str, rotation: int = 0) -> str:
    """Serialize a finalized tree. Every node carries the foreground window's package."""
    out = [XML_HEADER, f'<hierarchy rotation="{rotation}">']
    _node(root, 0, package, out)
    out.append("</hierarchy>")
    return "".join(out)
