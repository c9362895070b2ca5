"""Reading screenshot bytes as an image the same way everywhere: what Pillow raises on bytes
that are no readable image, the largest screenshot amc decodes, and `open_image`, which
decodes one (smaller when asked) or says why it cannot.

The cloud's upload check, the host's look and the planner's image fitting each caught their
own list of Pillow's errors, and the cloud's missed two (a decompression bomb is no OSError, a
file cut short can be an EOFError): such an upload was an INTERNAL "retry later" that a host
retried forever. `Image.verify()` alone decodes nothing (a JPEG cut in half, a PNG whose chunks
check out around broken compressed data pass it), so a screenshot accepted on that check broke
every export of its task later.
"""

from __future__ import annotations

import io

from PIL import Image

#: What Pillow raises on a corrupt, truncated or oversized image (`UnidentifiedImageError` is
#: an OSError; `DecompressionBombError` is not). Its `DecompressionBombWarning` (a claim over
#: 89 M pixels, refused by `MAX_PIXELS` anyway) is raised only where warnings are errors (the
#: tests): it is such an image too.
IMAGE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
)
#: The largest screenshot side amc takes (pixels): above the largest phone and tablet screens
#: (2960 × 1848 and the like) with room to spare.
MAX_SIDE = 8192
#: The most pixels a screenshot may have: a 17 KB PNG may claim 12000 × 12000, and decoding it
#: took hundreds of MB in every export that showed it.
MAX_PIXELS = 40_000_000


class UnreadableImage(ValueError):
    """Bytes that are no image amc decodes, with why in one line."""


def size_problem(size: tuple[int, int]) -> str | None:
    """Why an image of `size` (width, height) is over the cap, or None."""
    width, height = size
    if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
        return f"{width}x{height} pixels; at most {MAX_SIDE} a side and {MAX_PIXELS:,} in all"
    return None


def open_image(data: bytes, max_width: int | None = None) -> Image.Image:
    """The image in `data` decoded whole (every byte of it read), at most `max_width` wide when
    given (a JPEG decoded smaller from the start, any other format reduced right after), aspect
    kept; `UnreadableImage` when it is no image, a damaged one or one over the cap (checked on
    its header, before anything is decoded)."""
    try:
        with Image.open(io.BytesIO(data)) as header:
            problem = size_problem(header.size)
            if problem is None:
                header.verify()
        if problem is not None:
            raise UnreadableImage(problem)
        image: Image.Image = Image.open(io.BytesIO(data))
        if max_width is not None and image.width > max_width:
            # JPEG only: decodes at a 1/2, 1/4 or 1/8 scale that is still at least this big.
            image.draft(image.mode, (max_width, round(image.height * max_width / image.width)))
        image.load()
    except UnreadableImage:
        raise
    except IMAGE_ERRORS as exc:
        raise UnreadableImage(f"{type(exc).__name__}: {exc}") from exc
    if max_width is not None and image.width > max_width:
        if image.mode not in ("RGB", "RGBA", "L", "LA"):
            image = image.convert("RGB")  # a palette or 1-bit image resizes only by nearest
        image.thumbnail((max_width, MAX_SIDE), Image.Resampling.LANCZOS, reducing_gap=3.0)
    return image
