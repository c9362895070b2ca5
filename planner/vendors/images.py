"""A screenshot made to fit a provider's image limit, at the screen's own pixel size.

Anthropic refuses an image whose base64 is over 5 MB (400 "image exceeds 5 MB maximum: …
bytes > 5242880 bytes"), while the Decide contract lets a host send 8 MB: the PNG of a large
phone screen (1440×3120) runs past it, and every step of a task with `send_screenshot` got that
400. OpenAI takes up to 20 MB per image (its vision guide), more than Decide allows, but the
direct transport has no such cap, so its limit is applied the same way.

An image over the limit is sent as a JPEG of the same pixel size, at the first of a few falling
qualities that fits: the model reads coordinates off the image, and they must stay the screen's
(no second coordinate system). One that fits at no quality, or that cannot be read, is left
out of that step and the prompt says so (`left_out`): the element list still describes the
screen. So is one with more pixels a side than the provider takes (Anthropic: 8,000, where amc
takes 8,192): scaled down, the model's coordinates would no longer be the screen's.
"""

from __future__ import annotations

import io
import logging

from PIL import Image

from planner.conversation.turns import ProjectionStats
from planner.image_read import IMAGE_ERRORS, UnreadableImage, open_image

#: Anthropic Messages: the most base64 one image may take.
ANTHROPIC_MAX_BASE64 = 5 * 1024 * 1024
#: Anthropic Messages: the most pixels an image may have a side ("If you submit an image larger
#: than 8000x8000 px, it will be rejected", the vision page), below amc's own cap
#: (`planner.image_read.MAX_SIDE`, 8,192).
ANTHROPIC_MAX_SIDE = 8000
#: OpenAI: 20 MB per image, taken as its base64 (what travels) to be safe.
OPENAI_MAX_BASE64 = 20 * 1024 * 1024
#: JPEG qualities tried in turn; below the last, text on a screen gets hard to read.
JPEG_QUALITIES = (90, 80, 70, 55, 40)

log = logging.getLogger(__name__)


def base64_size(raw: int) -> int:
    """The length of the base64 of `raw` bytes (padded)."""
    return 4 * ((raw + 2) // 3)


def fitted(data: bytes, max_base64: int) -> bytes | None:
    """`data` itself when its base64 fits in `max_base64`, else the same image as a JPEG of the
    same size that fits, else None (it does not fit, or it is no image Pillow reads)."""
    if base64_size(len(data)) <= max_base64:
        return data
    try:
        with Image.open(io.BytesIO(data)) as image:
            pixels = image.convert("RGB")
    except IMAGE_ERRORS:
        log.warning("screenshot of %d bytes is over the image limit and unreadable", len(data))
        return None
    for quality in JPEG_QUALITIES:
        out = io.BytesIO()
        pixels.save(out, "JPEG", quality=quality)
        if base64_size(out.tell()) <= max_base64:
            log.info(
                "screenshot of %d bytes sent as a %d-byte JPEG (quality %d) to fit the image limit",
                len(data),
                out.tell(),
                quality,
            )
            return out.getvalue()
    log.warning("screenshot of %d bytes is over the image limit even as a JPEG", len(data))
    return None


def left_out(data: bytes, max_base64: int, provider: str) -> str:
    """What the prompt says in place of a screenshot `fitted` could not make fit."""
    return (
        f"[No screenshot this step: the screen's image ({len(data):,} bytes) is over "
        f"{provider}'s limit of {max_base64:,} bytes of base64 even as a JPEG, or could not be "
        "read. Judge the screen from its elements below.]"
    )


def fitted_or_noted(
    data: bytes,
    max_base64: int,
    provider: str,
    stats: ProjectionStats,
    max_side: int | None = None,
) -> bytes | str:
    """The image to send (`fitted`), or the note to send in its place, which `stats` keeps:
    the decision's recorded prompt must say what the model was told instead of the image. An
    image with a side over `max_side` pixels is left out too, and so is one that does not
    decode: Decide checks only a screenshot's first bytes, and the providers decode what they
    get and refuse the whole request ("Could not process image")."""
    size: tuple[int, int] | None = None
    try:
        with open_image(data) as image:
            size = image.size
    except UnreadableImage as err:
        log.warning("screenshot of %d bytes cannot be read: %s", len(data), err)
        note = (
            f"[No screenshot this step: the screen's image could not be read ({err}). Judge "
            "the screen from its elements below.]"
        )
    if size is not None and max_side is not None and max(size) > max_side:
        log.warning("screenshot of %dx%d pixels is over %s's image limit", *size, provider)
        note = (
            f"[No screenshot this step: the screen's image ({size[0]}x{size[1]} pixels) is over "
            f"{provider}'s limit of {max_side:,} pixels a side. Judge the screen from its "
            "elements below.]"
        )
    elif size is not None:
        fit = fitted(data, max_base64)
        if fit is not None:
            return fit
        note = left_out(data, max_base64, provider)
    stats.screenshot_notes.append(note)
    return note
