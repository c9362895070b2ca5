"""The one layout model: a tree of view nodes that both the PNG renderer and the XML dumper read.

Keeping a single tree (with pixel frames computed once) is what guarantees that the bounds in a
hierarchy dump land exactly on the pixels drawn in the screenshot, as on a real phone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

Rect = tuple[int, int, int, int]
Action = Callable[[], None]


def intersect(a: Rect, b: Rect) -> Rect | None:
    """The overlap of two rectangles, or None when they do not overlap."""
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    if x2 <= x1 or y2 <= y1:
        return None
    return (x1, y1, x2, y2)


def contains(r: Rect, x: int, y: int) -> bool:
    return r[0] <= x < r[2] and r[1] <= y < r[3]


@dataclass
class Node:
    """One Android view: what uiautomator reports about it plus how to draw it.

    `frame` is where the view is laid out (it may reach outside a scrolled list); `bounds` is
    the part that is visible, which is what uiautomator reports and what a tap can hit.
    """

    cls: str
    frame: Rect
    text: str = ""
    resource_id: str = ""
    content_desc: str = ""
    checkable: bool = False
    checked: bool = False
    clickable: bool = False
    enabled: bool = True
    focusable: bool = False
    focused: bool = False
    scrollable: bool = False
    long_clickable: bool = False
    password: bool = False
    selected: bool = False
    #: The accessibility hint (an EditText's hint): dumped as `hint` on SDK 34.
    hint: str = ""
    children: list[Node] = field(default_factory=list)
    # Drawing hints, never dumped.
    role: str = "plain"
    font_size: int = 44
    #: The letter or symbol an icon shows.
    glyph: str = ""
    align: str = "left"
    color: tuple[int, int, int] | None = None
    # Behaviour, never dumped.
    on_click: Action | None = None
    on_long_click: Action | None = None
    on_set_text: Callable[[str], None] | None = None
    #: A view that handles a drag itself (a number picker spins); gets the drag's upward pixels.
    on_scroll: Callable[[int], None] | None = None
    scroll_key: str = ""
    content_height: int = 0
    bounds: Rect = (0, 0, 0, 0)
    #: Order among its siblings when drawn (uiautomator's `drawing-order`), set by `finalize`.
    drawing_order: int = 0

    def add(self, *nodes: Node) -> Node:
        self.children.extend(nodes)
        return self

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()


def finalize(root: Node) -> Node:
    """Clip every node to its scrolling ancestors and drop the ones scrolled out of sight.

    A zero-size view inside the visible area stays (real dumps are full of them: empty text
    views, collapsed containers) with zero-size bounds; nothing can tap it.
    """

    def visit(node: Node, clip: Rect) -> bool:
        x1, y1, x2, y2 = node.frame
        if x2 <= x1 or y2 <= y1:
            if not (clip[0] <= x1 <= clip[2] and clip[1] <= y1 <= clip[3]):
                return False
            node.bounds = (x1, y1, x1, y1)
        else:
            visible = intersect(node.frame, clip)
            if visible is None:
                return False
            node.bounds = visible
        inner = node.bounds if node.scrollable else clip
        node.children = [c for c in node.children if visit(c, inner)]
        for order, child in enumerate(node.children, start=1):
            child.drawing_order = order
        return True

    visit(root, root.frame)
    return root


def hit_test(root: Node, x: int, y: int, *, long_press: bool = False) -> Node | None:
    """The topmost clickable (or long-clickable) node under a point, as Android dispatches it."""
    found: Node | None = None

    def visit(node: Node) -> None:
        nonlocal found
        if not contains(node.bounds, x, y):
            return
        wanted = node.long_clickable if long_press else node.clickable
        if wanted and node.enabled:
            found = node
        for child in node.children:
            visit(child)

    visit(root)
    return found


def scroller_at(root: Node, x: int, y: int) -> Node | None:
    """The innermost scrollable container under a point (where a swipe starting there lands)."""
    found: Node | None = None
    for node in root.walk():
        if node.scrollable and contains(node.bounds, x, y):
            found = node
    return found


def naf(node: Node) -> bool:
    """uiautomator's "Not Accessibility Friendly" mark: a clickable, enabled view with no text
    and no description anywhere inside it (lists and grids are exempt), as AOSP's dumper
    decides it."""
    if node.cls.endswith(("GridView", "GridLayout", "ListView", "TableLayout")):
        return False
    if not (node.clickable and node.enabled and not node.text and not node.content_desc):
        return False

    def labelled(n: Node) -> bool:
        return any(c.text or c.content_desc or labelled(c) for c in n.children)

    return not labelled(node)
