"""A step's screenshot with its action drawn on it: the tap point, the swipe arrow, the typed text
(a sensitive value only ever as "•••"), the key or app. The report and the video both show these
images, so the drawing lives here once.

A step without a screenshot (a cloud export that was not merged with a host's), or whose
screenshot cannot be read, gets a plain frame of the screen's aspect, with the elements'
outlines when the screen is known, and the action drawn the same way: where it happened stays
visible. Everything is decoded and drawn at the width shown (`WIDTH`), so what an export takes
is bounded by that width whatever size a screenshot or an observation claims.
"""

from __future__ import annotations

import contextlib
import io
import math
import textwrap
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import replace
from functools import lru_cache
from typing import Literal

import font_roboto
from PIL import Image, ImageDraw, ImageFont

from export.gesture import Gesture, gesture
from export.run import Step
from planner.image_read import IMAGE_ERRORS, UnreadableImage, open_image
from planner.scene import Bounds

#: Frame size when neither a screenshot nor the screen's size is known (a common phone).
DEFAULT_SCREEN = (1080, 2400)
#: Width of the screenshots and frames the report and the video show (pixels): a compromise
#: between a readable screen and a file that mails well. They are decoded and drawn at it.
WIDTH = 360
ACCENT = (230, 40, 90)
HALO = (255, 255, 255)
INK = (25, 25, 30)
PAPER = (238, 238, 242)

Which = Literal["before", "after"]


@lru_cache(maxsize=16)
def font(size: int) -> ImageFont.FreeTypeFont:
    """Roboto (the virtual phone's font too): it has the typographic characters and "•"."""
    return ImageFont.truetype(font_roboto.Roboto, size)


def wrap(text: str, size: int, width: int, max_lines: int = 3) -> list[str]:
    """`text` in lines that fit `width` pixels at `size`, at most `max_lines` (the last ends
    "…")."""
    f = font(size)
    per_line = max(8, int(width / max(1.0, f.getlength("n"))))
    lines = textwrap.wrap(" ".join(text.split()), per_line) or [""]
    if len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], lines[max_lines - 1][: per_line - 1] + "…"]
    return lines


def _screen_size(step: Step) -> tuple[int, int]:
    if step.screen is not None and step.screen.screen_width > 0:
        return (step.screen.screen_width, step.screen.screen_height)
    return DEFAULT_SCREEN


#: Screenshots already decoded by the export being written (`decoded_once`), by PNG and width.
_decoded: ContextVar[dict[tuple[bytes, int], tuple[Image.Image, float]] | None] = ContextVar(
    "export_decoded", default=None
)


@contextlib.contextmanager
def decoded_once() -> Iterator[None]:
    """Within the block, each screenshot is decoded and shrunk once: an export shows a step's
    screenshot in the report, the GIF and the MP4, and each decoded and shrank it again (the
    LANCZOS shrink of a 1080 × 2400 PNG was half of a bundle's CPU). What the block decoded is
    let go at its end, so nothing outlives the export."""
    token = _decoded.set({})
    try:
        yield
    finally:
        _decoded.reset(token)


def screenshot(png: bytes, width: int) -> tuple[Image.Image, float]:
    """The screenshot (RGB) at most `width` wide and the scale from its pixels to the result's.
    Decoded at the size shown (`open_image`): a screenshot claiming 12000 × 12000 pixels took
    hundreds of MB to decode whole and draw on before it was shrunk. `UnreadableImage` for one
    that cannot be read (damaged, or over the cap: one stored before the cloud refused those).
    The image is the caller's to draw on (a copy, inside `decoded_once`)."""
    cache = _decoded.get()
    if cache is None:
        return _screenshot(png, width)
    key = (png, width)
    if key not in cache:
        cache[key] = _screenshot(png, width)
    image, scale = cache[key]
    return image.copy(), scale


def _screenshot(png: bytes, width: int) -> tuple[Image.Image, float]:
    try:
        with Image.open(io.BytesIO(png)) as header:
            full_width = header.width
    except IMAGE_ERRORS as exc:
        raise UnreadableImage(f"{type(exc).__name__}: {exc}") from exc
    image = open_image(png, width)
    return image.convert("RGB"), image.width / max(1, full_width)


def _frame(step: Step, which: Which, width: int) -> tuple[Image.Image, float]:
    """`base_image` and the scale from screen pixels to its pixels."""
    png = step.before_png if which == "before" else step.after_png
    note = "no screenshot in this export"
    if png:
        try:
            return screenshot(png, width)
        except UnreadableImage:
            note = "the screenshot could not be read"
    screen = _screen_size(step)
    scale = min(1.0, width / max(1, screen[0]))
    # Built at the width shown, whatever size the observation claims (16384 × 16384 is
    # within the contract: a frame that size took 800 MB).
    size = (max(1, round(screen[0] * scale)), max(1, round(screen[1] * scale)))
    image = Image.new("RGB", size, PAPER)
    draw = ImageDraw.Draw(image)
    unit = max(1, size[0] // 360)
    if step.screen is not None and which == "before":
        for e in step.screen.elements:
            b = e.bounds
            box = tuple(round(v * scale) for v in (b.left, b.top, b.right, b.bottom))
            if box[2] >= box[0] and box[3] >= box[1]:
                draw.rectangle(box, outline=(170, 170, 180), width=unit)
    f = font(18 * unit)
    draw.text((size[0] // 2, size[1] // 2), note, fill=(120, 120, 130), font=f, anchor="mm")
    return image, scale


def base_image(step: Step, which: Which = "before", width: int = WIDTH) -> Image.Image:
    """The step's screenshot (RGB) at most `width` wide, or a plain frame of the screen's aspect
    when it has none or it cannot be read (saying which)."""
    return _frame(step, which, width)[0]


def _circle(draw: ImageDraw.ImageDraw, point: tuple[int, int], r: int, width: int) -> None:
    x, y = point
    draw.ellipse((x - r, y - r, x + r, y + r), outline=HALO, width=width + 2 * max(1, width // 3))
    draw.ellipse((x - r, y - r, x + r, y + r), outline=ACCENT, width=width)
    dot = max(2, r // 4)
    draw.ellipse((x - dot, y - dot, x + dot, y + dot), fill=ACCENT)


def _arrow(
    draw: ImageDraw.ImageDraw, start: tuple[int, int], end: tuple[int, int], width: int
) -> None:
    for colour, w in ((HALO, width + 2 * max(1, width // 3)), (ACCENT, width)):
        draw.line((start, end), fill=colour, width=w)
    angle = math.atan2(end[1] - start[1], end[0] - start[0])
    head = width * 5
    left = (
        end[0] - head * math.cos(angle - math.pi / 7),
        end[1] - head * math.sin(angle - math.pi / 7),
    )
    right = (
        end[0] - head * math.cos(angle + math.pi / 7),
        end[1] - head * math.sin(angle + math.pi / 7),
    )
    draw.polygon((end, left, right), fill=ACCENT, outline=HALO)
    _circle(draw, start, width * 3, max(2, width // 2))


def _label(draw: ImageDraw.ImageDraw, image: Image.Image, text: str, y: int, unit: int) -> None:
    """A readable tag (white on the accent colour) centred at height `y`, kept on the image."""
    f = font(22 * unit)
    lines = wrap(text, 22 * unit, image.width - 40 * unit, max_lines=2)
    line_h = int(28 * unit)
    height = line_h * len(lines) + 12 * unit
    top = min(max(0, y - height // 2), image.height - height)
    draw.rectangle((0, top, image.width, top + height), fill=ACCENT)
    for i, line in enumerate(lines):
        draw.text(
            (image.width // 2, top + 6 * unit + line_h * i + line_h // 2),
            line,
            fill=HALO,
            font=f,
            anchor="mm",
        )


def draw_gesture(image: Image.Image, g: Gesture, scale: float = 1.0) -> Image.Image:
    """`image` with `g` drawn on it (in place; returned for chaining); `scale` takes the
    gesture's screen pixels to the image's."""
    g = _scaled(g, scale) if scale != 1.0 else g
    draw = ImageDraw.Draw(image)
    unit = max(1, image.width // 360)
    width = 3 * unit
    if g.box is not None:
        b = g.box
        draw.rectangle((b.left, b.top, b.right, b.bottom), outline=ACCENT, width=max(1, unit))
    if g.kind in ("tap", "long_press") and g.point is not None:
        _circle(draw, g.point, 14 * unit, width)
        if g.kind == "long_press":
            _circle(draw, g.point, 22 * unit, max(1, width // 2))
    elif g.kind == "swipe" and g.point is not None and g.end is not None:
        _arrow(draw, g.point, g.end, width)
    elif g.kind == "type":
        if g.point is not None:
            _circle(draw, g.point, 10 * unit, width)
        y = (g.point[1] + 40 * unit) if g.point is not None else image.height // 2
        _label(draw, image, f"type “{g.text}”", y, unit)
    elif g.kind == "key":
        _label(draw, image, f"press {g.text}", image.height - 60 * unit, unit)
    elif g.kind == "launch":
        _label(draw, image, f"launch {g.text}", image.height // 2, unit)
    elif g.kind == "stop":
        _label(draw, image, f"stop {g.text}", image.height // 2, unit)
    return image


def _scaled(g: Gesture, scale: float) -> Gesture:
    def at(p: tuple[int, int] | None) -> tuple[int, int] | None:
        return None if p is None else (round(p[0] * scale), round(p[1] * scale))

    box = g.box
    if box is not None:
        box = Bounds(*(round(v * scale) for v in (box.left, box.top, box.right, box.bottom)))
    return replace(g, point=at(g.point), end=at(g.end), box=box)


def annotated(step: Step, width: int = WIDTH) -> Image.Image:
    """The before screenshot (or frame), at most `width` wide, with the step's action drawn on
    it."""
    image, scale = _frame(step, "before", width)
    return draw_gesture(image, gesture(step), scale)


def fit_width(image: Image.Image, width: int) -> Image.Image:
    """`image` scaled to `width` pixels wide (never enlarged), aspect kept."""
    if image.width <= width:
        return image
    height = max(1, round(image.height * width / image.width))
    return image.resize((width, height), Image.Resampling.LANCZOS)


def encode(image: Image.Image, fmt: Literal["PNG", "JPEG"] = "JPEG") -> bytes:
    buf = io.BytesIO()
    if fmt == "JPEG":
        image.convert("RGB").save(buf, format="JPEG", quality=82, optimize=True)
    else:
        image.save(buf, format="PNG", optimize=True)
    return buf.getvalue()
