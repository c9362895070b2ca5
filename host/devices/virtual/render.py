"""Draw a finalized view tree to pixels with Pillow, using the frames the XML dump reports.

Text is drawn large, dark on light (light on dark in dark theme) with Pillow's bundled TrueType
font, so OCR reads the screenshot the way it reads a real phone's.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Protocol, TypedDict

import font_roboto
from PIL import Image, ImageDraw, ImageFont

from host.devices.virtual.layout import Node, Rect

RGB = tuple[int, int, int]
WALLPAPER: RGB = (32, 64, 112)
ON_WALLPAPER: RGB = (255, 255, 255)


@dataclass(frozen=True)
class Palette:
    background: RGB
    surface: RGB
    text: RGB
    secondary: RGB
    accent: RGB
    on_accent: RGB
    outline: RGB
    key: RGB
    error: RGB


LIGHT = Palette(
    background=(255, 255, 255),
    surface=(240, 244, 250),
    text=(28, 27, 31),
    secondary=(73, 69, 79),
    accent=(11, 87, 208),
    on_accent=(255, 255, 255),
    outline=(121, 116, 126),
    key=(225, 230, 240),
    error=(179, 38, 30),
)
DARK = Palette(
    background=(18, 18, 20),
    surface=(36, 38, 44),
    text=(232, 230, 236),
    secondary=(200, 196, 208),
    accent=(168, 199, 250),
    on_accent=(0, 40, 100),
    outline=(147, 143, 153),
    key=(52, 56, 64),
    error=(242, 184, 181),
)


@lru_cache(maxsize=32)
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Roboto, Android's font, at a pixel size: it has German and typographic characters
    (’, –, …) that Pillow's bundled font draws as boxes."""
    return ImageFont.truetype(font_roboto.Roboto, size)


def _fit(text: str, size: int, width: int) -> str:
    f = font(size)
    if f.getlength(text) <= width:
        return text
    while text and f.getlength(text + "…") > width:
        text = text[:-1]
    return text + "…"


class Painter:
    """Draws one screen; `ox, oy` translate frames when drawing into a clipped list image."""

    def __init__(self, palette: Palette, text_scale: float = 1.0) -> None:
        self.p = palette
        self.scale = text_scale

    def text(
        self,
        d: ImageDraw.ImageDraw,
        box: Rect,
        value: str,
        size: int,
        color: RGB,
        align: str = "left",
    ) -> None:
        if not value:
            return
        size = round(size * self.scale)
        x1, y1, x2, y2 = box
        value = _fit(value, size, max(1, x2 - x1))
        f = font(size)
        w = f.getlength(value)
        if align == "center":
            x = x1 + (x2 - x1 - w) / 2
        elif align == "right":
            x = x2 - w
        else:
            x = x1
        d.text((x, (y1 + y2) / 2), value, font=f, fill=color, anchor="lm")

    def node(self, img: Image.Image, n: Node, ox: int, oy: int) -> None:
        d = ImageDraw.Draw(img)
        x1, y1, x2, y2 = n.frame
        box = (x1 - ox, y1 - oy, x2 - ox, y2 - oy)
        self.decorate(d, n, box)
        if n.scrollable or n.role == "list":
            sub = Image.new("RGB", (x2 - x1, y2 - y1), self.p.background)
            for child in n.children:
                self.node(sub, child, x1, y1)
            img.paste(sub, (box[0], box[1]))
            return
        for child in n.children:
            self.node(img, child, ox, oy)

    @staticmethod
    def nav_glyph(d: ImageDraw.ImageDraw, shape: str, cx: int, cy: int, color: RGB) -> None:
        if shape == "back":
            d.polygon(
                [(cx + 22, cy - 28), (cx + 22, cy + 28), (cx - 26, cy)], outline=color, width=5
            )
        elif shape == "home":
            d.ellipse((cx - 30, cy - 30, cx + 30, cy + 30), outline=color, width=5)
        else:
            d.rectangle((cx - 26, cy - 26, cx + 26, cy + 26), outline=color, width=5)

    def decorate(self, d: ImageDraw.ImageDraw, n: Node, box: Rect) -> None:
        p = self.p
        x1, y1, x2, y2 = box
        cx, cy = (x1 + x2) // 2, (y1 + y2) // 2
        role = n.role
        if role == "launcher":
            d.rectangle(box, fill=WALLPAPER)
        elif role == "toolbar":
            d.rectangle(box, fill=p.background)
        elif role in ("title", "text"):
            self.text(d, box, n.text, n.font_size, p.text, n.align)
        elif role == "secondary":
            self.text(d, box, n.text, n.font_size, p.secondary, n.align)
        elif role == "accent":
            self.text(d, box, n.text, n.font_size, p.accent, n.align)
        elif role == "error":
            self.text(d, box, n.text, n.font_size, p.error, n.align)
        elif role == "on_wallpaper":
            self.text(d, box, n.text, n.font_size, ON_WALLPAPER, n.align)
        elif role == "icon":
            d.ellipse(box, fill=p.accent)
            self.text(d, box, n.glyph, 40, p.on_accent, "center")
        elif role == "app_icon":
            r = 84
            top = y1 + 30
            d.rounded_rectangle(
                (cx - r, top, cx + r, top + 2 * r), radius=48, fill=n.color or p.accent
            )
            self.text(d, (cx - r, top, cx + r, top + 2 * r), n.glyph, 88, (255, 255, 255), "center")
            self.text(
                d,
                (x1 + 4, top + 2 * r + 10, x2 - 4, y2),
                n.text,
                n.font_size,
                ON_WALLPAPER,
                "center",
            )
        elif role == "switch":
            h = y2 - y1
            track = (x2 - 2 * h + 20, y1 + 8, x2, y2 - 8)
            if n.checked:
                d.rounded_rectangle(track, radius=h, fill=p.accent)
                d.ellipse((track[2] - h + 12, y1 + 14, track[2] - 12, y2 - 14), fill=p.on_accent)
            else:
                d.rounded_rectangle(track, radius=h, fill=p.surface, outline=p.outline, width=4)
                d.ellipse((track[0] + 16, y1 + 22, track[0] + h - 16, y2 - 22), fill=p.outline)
        elif role == "radio":
            r = min(x2 - x1, y2 - y1) // 2 - 4
            color = p.accent if n.checked else p.outline
            d.ellipse((cx - r, cy - r, cx + r, cy + r), outline=color, width=6)
            if n.checked:
                d.ellipse((cx - r + 16, cy - r + 16, cx + r - 16, cy + r - 16), fill=color)
        elif role == "edit":
            color = p.accent if n.focused else p.outline
            d.rounded_rectangle(box, radius=16, outline=color, width=6 if n.focused else 3)
            inner = (x1 + 36, y1, x2 - 36, y2)
            empty = bool(n.hint) and n.text == n.hint
            if empty:
                self.text(d, inner, n.hint, n.font_size, p.secondary, n.align)
            else:
                self.text(d, inner, n.text, n.font_size, p.text, n.align)
            if n.focused and n.align == "left":
                width = 0 if empty else int(font(n.font_size).getlength(n.text)) + 4
                cursor_x = min(x1 + 36 + width, x2 - 30)
                d.line((cursor_x, cy - 36, cursor_x, cy + 36), fill=p.accent, width=4)
        elif role == "button":
            d.rounded_rectangle(box, radius=(y2 - y1) // 2, fill=p.accent)
            self.text(d, box, n.text, n.font_size, p.on_accent, "center")
        elif role == "text_button":
            self.text(d, box, n.text, n.font_size, p.accent, "center")
        elif role == "key":
            fill = p.accent if n.text == "=" else p.key
            color = p.on_accent if n.text == "=" else p.text
            d.rounded_rectangle(box, radius=40, fill=fill)
            self.text(d, box, n.text, n.font_size, color, "center")
        elif role == "fab":
            d.rounded_rectangle(box, radius=48, fill=p.accent)
            d.line((cx - 36, cy, cx + 36, cy), fill=p.on_accent, width=8)
            d.line((cx, cy - 36, cx, cy + 36), fill=p.on_accent, width=8)
        elif role == "up_arrow":
            d.line((cx - 30, cy, cx + 30, cy), fill=p.text, width=7)
            d.line((cx - 30, cy, cx - 4, cy - 26), fill=p.text, width=7)
            d.line((cx - 30, cy, cx - 4, cy + 26), fill=p.text, width=7)
        elif role == "delete":
            d.line((cx - 24, cy - 24, cx + 24, cy + 24), fill=p.secondary, width=6)
            d.line((cx - 24, cy + 24, cx + 24, cy - 24), fill=p.secondary, width=6)
        elif role == "tab":
            if n.selected:
                d.rounded_rectangle((x1 + 20, y1 + 30, x2 - 20, y2 - 30), radius=50, fill=p.key)
            self.text(d, box, n.text, n.font_size, p.text, "center")
        elif role == "status_bar":
            d.rectangle(box, fill=p.background)
        elif role == "status_icon":
            self.text(d, box, n.glyph, 36, p.text, "center")
        elif role == "navigation_bar":
            d.rectangle(box, fill=p.surface)
        elif role == "nav_button":
            self.nav_glyph(d, n.glyph, cx, cy, p.text)
        elif role in ("shade", "dialog_scrim"):
            d.rectangle(box, fill=p.surface)
        elif role == "keyguard":
            d.rectangle(box, fill=WALLPAPER)
        elif role == "dialog":
            d.rounded_rectangle(box, radius=56, fill=p.surface)
        elif role == "pill":
            d.rounded_rectangle(box, radius=(y2 - y1) // 2, fill=p.key)
            self.text(d, box, n.text, n.font_size, p.text, "center")
        elif role == "tile":
            d.rounded_rectangle(box, radius=48, fill=p.accent if n.checked else p.key)
        elif role == "tile_icon":
            color = p.on_accent if n.checked else p.text
            self.text(d, box, n.glyph, 44, color, "center")
        elif role == "card":
            d.rounded_rectangle(box, radius=32, fill=p.surface)
        elif role == "keyboard":
            d.rectangle(box, fill=p.key)
        elif role == "kb_key":
            d.rounded_rectangle((x1 + 6, y1 + 10, x2 - 6, y2 - 10), radius=16, fill=p.background)
            self.text(d, box, n.glyph, n.font_size, p.text, "center")
        elif role == "picker":
            d.line(
                (x1 + 20, y1 + (y2 - y1) // 3, x2 - 20, y1 + (y2 - y1) // 3),
                fill=p.outline,
                width=3,
            )
            d.line(
                (x1 + 20, y1 + 2 * (y2 - y1) // 3, x2 - 20, y1 + 2 * (y2 - y1) // 3),
                fill=p.outline,
                width=3,
            )
        elif role == "picker_neighbour":
            self.text(d, box, n.text, n.font_size, p.secondary, "center")
        elif role == "search_bar":
            d.rounded_rectangle(box, radius=(y2 - y1) // 2, fill=(240, 244, 250))
            self.text(d, (x1 + 60, y1, x2, y2), "G", 56, (66, 133, 244))
        elif role == "icon_button":
            d.ellipse((cx - 30, cy - 30, cx + 22, cy + 22), outline=p.text, width=6)
            d.line((cx + 14, cy + 14, cx + 36, cy + 36), fill=p.text, width=6)


class PaintedWindow(Protocol):
    """What the renderer needs of a window (`phone.Surface` is one)."""

    @property
    def kind(self) -> str: ...
    @property
    def root(self) -> Node: ...
    @property
    def modal(self) -> bool: ...
    @property
    def secure(self) -> bool: ...


class ScreenLook(TypedDict):
    """`render_screen`'s arguments besides the windows."""

    width: int
    height: int
    dark: bool
    text_scale: float
    toast: str | None
    awake: bool


def render_screen(
    windows: Sequence[PaintedWindow],
    width: int,
    height: int,
    *,
    dark: bool,
    text_scale: float = 1.0,
    toast: str | None = None,
    awake: bool = True,
) -> Image.Image:
    """The whole screen: each window bottom first (a dim layer under a dialog), then a toast.

    `text_scale` is the user's font size setting: text grows inside the same layout (long
    labels get ellipsized), which is roughly what a real phone shows before it re-flows. A
    phone whose screen is off shows black."""
    palette = DARK if dark else LIGHT
    if not awake:
        return Image.new("RGB", (width, height), (0, 0, 0))
    img = Image.new("RGB", (width, height), palette.background)
    for w in windows:
        if w.modal and w.kind in ("dialog", "anr"):
            dim = Image.new("RGB", (width, height), (0, 0, 0))
            img = Image.blend(img, dim, 0.45)
        if w.secure:
            # What SurfaceFlinger puts in a capture in place of a FLAG_SECURE layer.
            x1, y1, x2, y2 = w.root.bounds
            ImageDraw.Draw(img).rectangle((x1, y1, x2 - 1, y2 - 1), fill=(0, 0, 0))
            continue
        scale = text_scale if w.kind == "app" else 1.0
        Painter(palette, scale).node(img, w.root, 0, 0)
    if toast:
        d = ImageDraw.Draw(img)
        painter = Painter(palette)
        f = font(40)
        tw = int(f.getlength(toast)) + 96
        x1 = (width - tw) // 2
        y1 = height - 420
        d.rounded_rectangle((x1, y1, x1 + tw, y1 + 110), radius=55, fill=(60, 60, 64))
        painter.text(d, (x1, y1, x1 + tw, y1 + 110), toast, 40, (255, 255, 255), "center")
    return img


def png_bytes(img: Image.Image) -> bytes:
    """Encode fast: screenshots are taken every step, and size matters less than latency."""
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


#: Every field of a view but its children and its behaviour (`on_click`, ...): what drawing it
#: may read. More than the painter uses (ids, say): a key too fine costs a cache miss, never a
#: wrong picture.
_DRAWN_FIELDS = tuple(
    f.name for f in fields(Node) if f.name != "children" and not f.name.startswith("on_")
)


def _node_key(n: Node) -> tuple[object, ...]:
    return (*(getattr(n, name) for name in _DRAWN_FIELDS), tuple(map(_node_key, n.children)))


def windows_key(windows: Sequence[PaintedWindow]) -> Hashable:
    """What `render_screen` draws of `windows`, as a dictionary key: with the same other
    arguments, equal keys give the same pixels (the painter reads nothing else of them)."""
    return tuple((w.kind, w.modal, w.secure, _node_key(w.root)) for w in windows)


class _PngCache:
    """The PNGs of the screens drawn last, by `screen_key`: an agent looks at the same screen
    again and again (before and after a step that changed nothing, the same page in the next
    task, on every phone of a fleet), and drawing and encoding it was most of the virtual
    phone's CPU time per look. Shared by the phones of a process; thread-safe."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._pngs: OrderedDict[Hashable, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            png = self._pngs.get(key)
            if png is not None:
                self._pngs.move_to_end(key)
            return png

    def put(self, key: Hashable, png: bytes) -> None:
        with self._lock:
            self._pngs[key] = png
            self._pngs.move_to_end(key)
            while len(self._pngs) > self._size:
                self._pngs.popitem(last=False)


_recent = _PngCache(32)


def screen_png(
    windows: Sequence[PaintedWindow],
    width: int,
    height: int,
    *,
    dark: bool,
    text_scale: float = 1.0,
    toast: str | None = None,
    awake: bool = True,
    size: tuple[int, int] | None = None,
) -> bytes:
    """`png_bytes(render_screen(...))`, resized to `size` when given (a `screencap` at another
    size than the screen's), drawn and encoded only the first time the same screen is asked
    for (`_PngCache`)."""
    key = (windows_key(windows), width, height, dark, text_scale, toast, awake, size)
    png = _recent.get(key)
    if png is None:
        img = render_screen(
            windows, width, height, dark=dark, text_scale=text_scale, toast=toast, awake=awake
        )
        if size is not None and size != img.size:
            img = img.resize(size)
        png = png_bytes(img)
        _recent.put(key, png)
    return png
