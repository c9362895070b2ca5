"""Screenshots of the size real phones take, for tests of what goes to a provider."""

from __future__ import annotations

import base64
import io
import random

from PIL import Image


def phone_png(width: int, height: int, noisy_rows: int, *, seed: int = 7) -> bytes:
    """A PNG of a `width`×`height` screen: a plain background with a band of `noisy_rows` of
    photo-like noise (what makes a real screenshot's PNG large; noise does not compress)."""
    screen = Image.new("RGB", (width, height), (240, 240, 240))
    rows = min(noisy_rows, height)
    noise = random.Random(seed).randbytes(width * rows * 3)
    screen.paste(Image.frombytes("RGB", (width, rows), noise), (0, (height - rows) // 2))
    out = io.BytesIO()
    screen.save(out, "PNG", compress_level=1)
    return out.getvalue()


def image_of(data_base64: str) -> Image.Image:
    """The image a request carried as base64 (of a data URL or a base64 source), verified."""
    raw = base64.b64decode(data_base64.split(",", 1)[-1], validate=True)
    Image.open(io.BytesIO(raw)).verify()
    return Image.open(io.BytesIO(raw))
