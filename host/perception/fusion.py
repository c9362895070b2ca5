"""Add OCR text the hierarchy lacks (text drawn in images, canvases, web views) to a Scene."""

from __future__ import annotations

import re
from dataclasses import replace
from difflib import SequenceMatcher

from planner.scene import Bounds, Element, OcrObservation, Scene

_WORD_RE = re.compile(r"[a-z0-9]+")
_ID_RE = re.compile(r"e\d+")
#: How far the screenshot's aspect ratio may stray from the screen's and still be the same
#: picture scaled (rounding of odd sizes); beyond it the image is turned (or cropped).
ASPECT_TOLERANCE = 0.02


def same_aspect(image_size: tuple[int, int], screen_size: tuple[int, int]) -> bool:
    """Whether a screenshot of `image_size` pixels is the screen (`screen_size`) at some
    scale, within `ASPECT_TOLERANCE`; False for an image turned against it."""
    iw, ih = image_size
    sw, sh = screen_size
    if min(iw, ih, sw, sh) <= 0:
        return False
    return abs((iw / ih) / (sw / sh) - 1) <= ASPECT_TOLERANCE


def to_screen_space(
    observations: list[OcrObservation],
    image_size: tuple[int, int],
    screen_size: tuple[int, int],
) -> list[OcrObservation] | None:
    """OCR boxes (screenshot pixels) in the dump's coordinates (`screen_size`): unchanged when
    the sizes agree, scaled when the screenshot is the same picture at another resolution
    (`screencap` captures the physical size while an override size is set, before Android
    12), None when the aspect ratios differ (an image turned against the dump's rotation):
    its boxes cannot be placed."""
    iw, ih = image_size
    sw, sh = screen_size
    if (iw, ih) == (sw, sh):
        return observations
    if not same_aspect(image_size, screen_size):
        return None
    fx, fy = sw / iw, sh / ih
    return [
        replace(
            o,
            bounds=Bounds(
                round(o.bounds.left * fx),
                round(o.bounds.top * fy),
                round(o.bounds.right * fx),
                round(o.bounds.bottom * fy),
            ),
        )
        for o in observations
    ]


def _norm(text: str) -> str:
    return " ".join(_WORD_RE.findall(text.lower()))


def _overlap_ratio(a: Element, o: OcrObservation) -> float:
    b = o.bounds
    w = min(a.bounds.right, b.right) - max(a.bounds.left, b.left)
    h = min(a.bounds.bottom, b.bottom) - max(a.bounds.top, b.top)
    if w <= 0 or h <= 0:
        return 0.0
    area = max(1, b.width * b.height)
    return (w * h) / area


def _similar(a: str, b: str) -> bool:
    return a == b or SequenceMatcher(None, a, b).ratio() >= 0.8


def _covered(obs: OcrObservation, tree_texts: list[tuple[Element, str]]) -> bool:
    """True when the tree already says what OCR read: the same text anywhere on screen, or
    overlapping text that contains it, is contained in it, or is a near miss (a misread)."""
    words = _norm(obs.text)
    if not words:
        return True
    for el, text in tree_texts:
        if text == words:
            return True
        if _overlap_ratio(el, obs) > 0.5 and (
            words in text or text in words or _similar(words, text)
        ):
            return True
    return False


def fuse_ocr(
    scene: Scene,
    observations: list[OcrObservation],
    min_confidence: float = 70.0,
) -> Scene:
    """Keep every raw observation on `scene.ocr`; add confident, new text as `source="ocr"`."""
    tree_texts = [
        (e, _norm(f"{e.text} {e.content_desc}")) for e in scene.elements if e.text or e.content_desc
    ]
    numbers = [int(e.element_id[1:]) for e in scene.elements if _ID_RE.fullmatch(e.element_id)]
    next_id = max(numbers, default=0) + 1
    added: list[Element] = []
    for obs in observations:
        if obs.confidence < min_confidence or len(_norm(obs.text).replace(" ", "")) < 2:
            continue
        if _covered(obs, tree_texts):
            continue
        added.append(
            Element(
                element_id=f"e{next_id}",
                bounds=obs.bounds,
                text=obs.text,
                package=scene.package,
                source="ocr",
            )
        )
        next_id += 1
    return replace(scene, elements=[*scene.elements, *added], ocr=list(observations))
