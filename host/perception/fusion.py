"""Add OCR text the hierarchy lacks (text drawn in images, canvases, web views) to a Scene."""

from __future__ import annotations

import re

from planner.scene import Element, OcrObservation, Scene

_WORD_RE = re.compile(r"[a-z0-9]+")


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


def _covered(obs: OcrObservation, tree_texts: list[tuple[Element, str]], all_text: str) -> bool:
    """True when the tree already says what OCR read (same words, anywhere or where it was read)."""
    words = _norm(obs.text)
    if not words:
        return True
    if words in all_text:
        return True
    for el, text in tree_texts:
        if _overlap_ratio(el, obs) > 0.5 and (words in text or text in words):
            return True
    # Most OCR words already appear in the tree: a misread of text the tree has.
    tokens = words.split()
    known = sum(1 for t in tokens if t in all_text)
    return len(tokens) > 1 and known / len(tokens) >= 0.6


def fuse_ocr(
    scene: Scene,
    observations: list[OcrObservation],
    min_confidence: float = 60.0,
) -> Scene:
    """Keep every raw observation on `scene.ocr`; add confident, new text as `source="ocr"`."""
    tree_texts = [
        (e, _norm(f"{e.text} {e.content_desc}")) for e in scene.elements if e.text or e.content_desc
    ]
    all_text = " | ".join(t for _, t in tree_texts)
    next_id = len(scene.elements) + 1
    added: list[Element] = []
    for obs in observations:
        if obs.confidence < min_confidence or len(_norm(obs.text).replace(" ", "")) < 2:
            continue
        if _covered(obs, tree_texts, all_text):
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
    return Scene(
        elements=[*scene.elements, *added],
        package=scene.package,
        page_title=scene.page_title,
        screen_width=scene.screen_width,
        screen_height=scene.screen_height,
        ocr=list(observations),
    )
