"""The on-screen keyboard (AOSP's LatinIME): its window while a field has focus, and its keys.

It sits at the bottom of the screen, above the navigation bar, and covers whatever the app has
there (the app is not resized), like an app that does not resize for the keyboard. Each key is
an accessibility node of its own, as LatinIME exposes them; tapping one types into the focused
field, so a tap meant for a button under the keyboard types a letter instead, as on a phone.
"""

from __future__ import annotations

from collections.abc import Callable

from host.devices.virtual.layout import Node
from host.devices.virtual.widgets import NAV_BAR_H, Geometry

PACKAGE = "com.android.inputmethod.latin"
#: Its input method id (`settings get secure default_input_method`): package/service.
IME = f"{PACKAGE}/.LatinIME"
KEY_CLASS = "com.android.inputmethod.keyboard.Key"
SUGGESTIONS_H = 120
ROW_H = 160
#: Letter rows by language (QWERTZ with umlauts for German).
ROWS = {
    "en": ["qwertyuiop", "asdfghjkl", "zxcvbnm"],
    "de": ["qwertzuiopü", "asdfghjklöä", "yxcvbnm"],
}
SPECIAL_LABELS = {"shift": "Shift", "del": "Delete", "symbols": "Symbols", "enter": "Enter"}


def height(geo: Geometry) -> int:
    return SUGGESTIONS_H + 4 * ROW_H


def frame(geo: Geometry, floating: bool = False) -> tuple[int, int, int, int]:
    """Docked above the navigation bar; floating (Gboard's and Samsung Keyboard's floating
    mode), four fifths of the width, centred, its top at a third of the screen."""
    if floating:
        w = geo.width * 4 // 5
        x1, y1 = (geo.width - w) // 2, geo.height // 3
        return (x1, y1, x1 + w, y1 + height(geo))
    bottom = geo.height - NAV_BAR_H
    return (0, bottom - height(geo), geo.width, bottom)


def build(
    geo: Geometry,
    language: str,
    press: Callable[[str], None],
    package: str = PACKAGE,
    floating: bool = False,
) -> Node:
    """The keyboard window's tree; `press` gets a character, or "del" / "enter". `package`
    names its resource ids (the package the phone presents its keyboard under)."""
    x1, y1, x2, y2 = frame(geo, floating)
    w = x2 - x1
    root = Node("android.widget.FrameLayout", (x1, y1, x2, y2), role="keyboard")
    strip = Node(
        "android.widget.LinearLayout",
        (x1, y1, x2, y1 + SUGGESTIONS_H),
        resource_id=f"{package}:id/suggestion_strip_view",
    )
    view = Node(
        "android.view.View",
        (x1, y1 + SUGGESTIONS_H, x2, y2),
        resource_id=f"{package}:id/keyboard_view",
    )

    def key(
        frame: tuple[int, int, int, int], label: str, desc: str, value: str, *, wide: bool = False
    ) -> Node:
        return Node(
            KEY_CLASS,
            frame,
            content_desc=desc,
            clickable=True,
            role="kb_key",
            glyph=label,
            font_size=52 if not wide else 40,
            on_click=lambda: press(value),
        )

    rows = ROWS.get(language, ROWS["en"])
    top = y1 + SUGGESTIONS_H
    for r, letters in enumerate(rows):
        kw = w // max(len(rows[0]), 10)
        offset = (w - kw * len(letters)) // 2
        if r == 2:
            view.add(
                key(
                    (x1, top, x1 + offset, top + ROW_H), "^", SPECIAL_LABELS["shift"], "", wide=True
                )
            )
        for i, ch in enumerate(letters):
            kx = x1 + offset + i * kw
            view.add(key((kx, top, kx + kw, top + ROW_H), ch, ch, ch))
        if r == 2:
            view.add(
                key(
                    (x2 - offset, top, x2, top + ROW_H),
                    "DEL",
                    SPECIAL_LABELS["del"],
                    "del",
                    wide=True,
                )
            )
        top += ROW_H
    bottom_row = [
        ("?123", SPECIAL_LABELS["symbols"], "", 0.15),
        (",", ",", ",", 0.1),
        (" ", "Space", " ", 0.5),
        (".", ".", ".", 0.1),
        ("GO", SPECIAL_LABELS["enter"], "enter", 0.15),
    ]
    kx = x1
    for label, desc, value, share in bottom_row:
        kw = int(w * share)
        view.add(key((kx, top, kx + kw, top + ROW_H), label, desc, value, wide=True))
        kx += kw
    return root.add(strip, view)
