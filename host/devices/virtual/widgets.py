"""Builders for the standard Android views an app screen is made of (rows, switches, fields).

Each builder lays its view out at a given position and returns a `Node` whose frame is final,
so an app describes a screen by stacking these and the geometry stays consistent everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from host.devices.virtual.layout import Action, Node, Rect
from host.devices.virtual.state import Page

PKG_SETTINGS = "com.android.settings"
STATUS_BAR_H = 96
NAV_BAR_H = 132
TOOLBAR_H = 176
PAD = 48
ROW_H = 176
ROW_H_TWO_LINE = 208

RowFactory = Callable[[int], Node]
"""Lays a row out with its top at the given y (the list decides where rows go)."""


@dataclass(frozen=True)
class Geometry:
    """The app window: full width, between the status bar and the navigation bar."""

    width: int
    height: int

    @property
    def top(self) -> int:
        return STATUS_BAR_H

    @property
    def bottom(self) -> int:
        return self.height - NAV_BAR_H


def text(
    frame: Rect,
    value: str,
    *,
    rid: str = "",
    size: int = 44,
    role: str = "text",
    align: str = "left",
    desc: str = "",
) -> Node:
    return Node(
        "android.widget.TextView",
        frame,
        text=value,
        resource_id=rid,
        content_desc=desc,
        font_size=size,
        role=role,
        align=align,
    )


def window(geo: Geometry, children: list[Node], *, compose: bool = False) -> Node:
    """The decor view chain every activity window has, as a real SDK 34 dump shows it:
    DecorView > LinearLayout > action_bar_root > content, then the status and navigation bar
    backgrounds the system bars are drawn over. A Compose app's content is one ComposeView
    whose nodes carry no resource ids."""
    full = (0, 0, geo.width, geo.height)
    inner = (0, geo.top, geo.width, geo.bottom)
    content = Node(
        "android.widget.FrameLayout", inner, resource_id="android:id/content", role="window"
    )
    if compose:
        content.add(
            Node("androidx.compose.ui.platform.ComposeView", inner).add(
                Node("android.view.View", inner).add(*children)
            )
        )
    else:
        content.add(*children)
    root = Node("android.widget.LinearLayout", inner, resource_id="android:id/action_bar_root")
    decor = Node("android.widget.FrameLayout", full, role="window").add(
        Node("android.widget.LinearLayout", (0, 0, geo.width, geo.bottom)).add(
            Node(
                "android.view.ViewStub", (0, 0, 0, 0), resource_id="android:id/action_mode_bar_stub"
            ),
            root.add(content),
        ),
        Node(
            "android.view.View",
            (0, geo.bottom, geo.width, geo.height),
            resource_id="android:id/navigationBarBackground",
        ),
        Node(
            "android.view.View",
            (0, 0, geo.width, geo.top),
            resource_id="android:id/statusBarBackground",
        ),
    )
    return decor


def toolbar(
    package: str,
    geo: Geometry,
    title: str,
    on_up: Action | None,
    actions: list[tuple[str, str, Action]] | None = None,
    up_label: str = "Navigate up",
) -> Node:
    """An action bar: optional "Navigate up" arrow, the page title, and text action buttons."""
    y1, y2 = geo.top, geo.top + TOOLBAR_H
    bar = Node(
        "android.view.ViewGroup",
        (0, y1, geo.width, y2),
        resource_id=f"{package}:id/action_bar",
        role="toolbar",
    )
    x = PAD
    if on_up is not None:
        bar.add(
            Node(
                "android.widget.ImageButton",
                (0, y1, 160, y2),
                content_desc=up_label,
                clickable=True,
                focusable=True,
                role="up_arrow",
                on_click=on_up,
            )
        )
        x = 176
    right = geo.width
    buttons: list[Node] = []
    for label, rid, action in reversed(actions or []):
        w = 64 + len(label) * 28
        buttons.insert(
            0,
            button(
                (right - w - 24, y1 + 36, right - 24, y2 - 36),
                label,
                f"{package}:id/{rid}",
                action,
                role="text_button",
                font_size=42,
            ),
        )
        right -= w + 24
    bar.add(text((x, y1, right - 16, y2), title, size=60, role="title"))
    bar.add(*buttons)
    return bar


def scroll_list(
    package: str,
    rid: str,
    rect: Rect,
    rows: list[RowFactory],
    scroll: int,
    key: str = "list",
) -> Node:
    """A RecyclerView: rows stacked from the top, shifted up by the scroll offset (clamped)."""
    height = rect[3] - rect[1]
    probe = 0
    for row in rows:
        n = row(0)
        probe += n.frame[3] - n.frame[1]
    max_scroll = max(0, probe - height)
    offset = min(max(scroll, 0), max_scroll)
    lst = Node(
        "androidx.recyclerview.widget.RecyclerView",
        rect,
        resource_id=f"{package}:id/{rid}",
        scrollable=max_scroll > 0,
        focusable=True,
        role="list",
        scroll_key=key,
        content_height=probe,
    )
    y = rect[1] - offset
    for row in rows:
        n = row(y)
        lst.add(n)
        y = n.frame[3]
    return lst


def two_line_row(
    width: int,
    title: str,
    summary: str = "",
    on_click: Action | None = None,
    *,
    icon: str = "",
    widget: Node | None = None,
    enabled: bool = True,
    package: str = PKG_SETTINGS,
) -> RowFactory:
    """A preference row: icon, title and summary on the left, an optional widget on the right."""

    def build(y: int) -> Node:
        h = ROW_H_TWO_LINE if summary else ROW_H
        row = Node(
            "android.widget.LinearLayout",
            (0, y, width, y + h),
            clickable=on_click is not None,
            focusable=on_click is not None,
            enabled=enabled,
            on_click=on_click,
            role="row",
        )
        x = PAD
        if icon:
            frame = (PAD, y + h // 2 - 52, PAD + 128, y + h // 2 + 52)
            row.add(
                Node(
                    "android.widget.LinearLayout", frame, resource_id=f"{package}:id/icon_frame"
                ).add(
                    Node(
                        "android.widget.ImageView",
                        (PAD, y + h // 2 - 36, PAD + 72, y + h // 2 + 36),
                        resource_id="android:id/icon",
                        role="icon",
                        glyph=icon,
                    )
                )
            )
            x = PAD + 72 + 56
        right = width - PAD
        if widget is not None:
            right = width - 220
        box = Node(
            "android.widget.RelativeLayout",
            (x, y + 24, right, y + h - 24),
            resource_id=f"{package}:id/text_frame",
        )
        if summary:
            mid = y + 24 + (h - 48) // 2 + 6
            box.add(text((x, y + 24, right, mid), title, rid="android:id/title", size=50))
            box.add(
                text(
                    (x, mid, right, y + h - 24),
                    summary,
                    rid="android:id/summary",
                    size=40,
                    role="secondary",
                )
            )
        else:
            box.add(text((x, y + 24, right, y + h - 24), title, rid="android:id/title", size=50))
            # An empty summary stays in the tree with no height, as SettingsLib leaves it.
            box.add(
                text(
                    (x, y + h - 24, right, y + h - 24),
                    "",
                    rid="android:id/summary",
                    size=40,
                    role="secondary",
                )
            )
        row.add(box)
        if widget is not None:
            wy = y + h // 2
            widget.frame = (width - 200, wy - 40, width - PAD, wy + 40)
            row.add(
                Node(
                    "android.widget.LinearLayout",
                    widget.frame,
                    resource_id="android:id/widget_frame",
                ).add(widget)
            )
        return row

    return build


def switch_widget(checked: bool, *, rid: str = "android:id/switch_widget") -> Node:
    """The Switch inside a preference row: checkable, but the row takes the click."""
    return Node(
        "android.widget.Switch",
        (0, 0, 0, 0),
        text="ON" if checked else "OFF",
        resource_id=rid,
        checkable=True,
        checked=checked,
        focusable=True,
        role="switch",
    )


def header_row(width: int, title: str) -> RowFactory:
    def build(y: int) -> Node:
        return text((PAD, y, width - PAD, y + 120), title, size=40, role="accent")

    return build


def radio_row(width: int, label: str, selected: bool, on_click: Action) -> RowFactory:
    def build(y: int) -> Node:
        row = Node(
            "android.widget.LinearLayout",
            (0, y, width, y + ROW_H),
            clickable=True,
            focusable=True,
            on_click=on_click,
            role="row",
        )
        row.add(
            Node(
                "android.widget.RadioButton",
                (PAD, y + 48, PAD + 80, y + ROW_H - 48),
                resource_id="android:id/checkbox",
                checkable=True,
                checked=selected,
                role="radio",
            ),
            text((PAD + 128, y, width - PAD, y + ROW_H), label, rid="android:id/title", size=48),
        )
        return row

    return build


def edit_text(
    frame: Rect,
    value: str,
    hint: str,
    rid: str,
    *,
    focused: bool,
    on_click: Action,
    on_set_text: Callable[[str], None] | None = None,
) -> Node:
    """An EditText. Like a real SDK 34 dump, an empty field reports its hint as its text, and
    the hint on its own (`hint`) whether the field is empty or not."""
    return Node(
        "android.widget.EditText",
        frame,
        text=value or hint,
        hint=hint,
        resource_id=rid,
        clickable=True,
        focusable=True,
        focused=focused,
        long_clickable=True,
        role="edit",
        font_size=48,
        on_click=on_click,
        on_set_text=on_set_text,
    )


def button(
    frame: Rect,
    label: str,
    rid: str,
    on_click: Action | None,
    *,
    role: str = "button",
    font_size: int = 46,
    align: str = "center",
) -> Node:
    """A labelled `android.widget.Button`; the system's bars and dialogs draw theirs in their
    own sizes and roles (`system_ui`). No `on_click`: a button that does nothing when tapped
    (a prompt given no answer for it)."""
    return Node(
        "android.widget.Button",
        frame,
        text=label,
        resource_id=rid,
        clickable=True,
        focusable=True,
        role=role,
        font_size=font_size,
        align=align,
        on_click=on_click,
    )


def fab(frame: Rect, desc: str, rid: str, on_click: Action) -> Node:
    """A floating action button: an icon only, so its name lives in content-desc."""
    return Node(
        "android.widget.ImageButton",
        frame,
        content_desc=desc,
        resource_id=rid,
        clickable=True,
        focusable=True,
        role="fab",
        on_click=on_click,
    )


def form_fields(
    page: Page, package: str, fields: list[tuple[str, str]], top: int, width: int
) -> tuple[list[Node], int]:
    """An editor's text fields (with the page's error line under them) from `top` down; returns
    the nodes and the y below them. Focus and typed text live on the page, as an editor keeps
    them across redraws."""
    nodes: list[Node] = []
    y = top
    for key, hint in fields:

        def focus(k: str = key) -> None:
            page.focus = k

        def set_text(value: str, k: str = key) -> None:
            page.fields[k] = value
            page.error = ""

        nodes.append(
            edit_text(
                (PAD, y, width - PAD, y + 160),
                page.fields.get(key, ""),
                hint,
                f"{package}:id/{key}",
                focused=page.focus == key,
                on_click=focus,
                on_set_text=set_text,
            )
        )
        y += 208
    if page.error:
        nodes.append(
            text(
                (PAD, y, width - PAD, y + 100), page.error, rid=f"{package}:id/error", role="error"
            )
        )
    return nodes, y
