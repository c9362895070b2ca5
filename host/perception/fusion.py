"""Add OCR text the hierarchy lacks (text drawn in images, canvases, web views) to a Scene."""

from __future__ import annotations

import re
from dataclasses import replace
from difflib import SequenceMatcher

from planner.scene import Element, OcrObservation, Scene

_WORD_RE = re.compile(r"[a-z0-9]+")
_ID_RE = re.compile(r"e\d+")


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
