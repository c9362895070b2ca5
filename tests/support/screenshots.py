"""Screenshots of the size real phones take, for tests of what goes to a provider, and damaged
or oversized ones built byte by byte, for tests of what refuses them."""

from __future__ import annotations

import base64
import io
import random
import struct
import zlib

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


def cut_jpeg(width: int = 108, height: int = 240) -> bytes:
    """A real JPEG of noise cut to half its bytes: its header (size, format) reads well, and
    `Image.verify()` passes it (it checks nothing of a JPEG's data)."""
    noise = random.Random(3).randbytes(width * height * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), noise).save(out, "JPEG", quality=90)
    whole = out.getvalue()
    return whole[: len(whole) // 2]


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_with_bad_data(width: int = 108, height: int = 240) -> bytes:
    """A PNG whose chunks all carry valid CRCs around compressed data that is not zlib: every
    chunk check passes (`Image.verify()` included), only decoding finds it."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", b"\x78\x9c" + bytes(range(256)) * 4)
        + _chunk(b"IEND", b"")
    )


def bilevel_png(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of `width`×`height` white pixels: tiny on the wire (12000×12000 is
    about 17 KB), hundreds of MB decoded."""
    out = io.BytesIO()
    Image.new("1", (width, height), 1).save(out, "PNG")
    return out.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A well-formed PNG (valid CRCs) claiming `width`×`height` with one byte of data: Pillow
    refuses a claim over twice its pixel limit on opening (`DecompressionBombError`)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(b"\x00"))
        + _chunk(b"IEND", b"")
    )
