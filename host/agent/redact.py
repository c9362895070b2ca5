"""Keep secrets the agent typed out of everything that follows: scenes, prompts, OCR, screenshots.

A sensitive `input_text` is executed but never recorded. Yet a field that does not mask its
input shows the secret on the next screen, so the next scene (and so the next prompt, the cloud's
decision log and the timeline) would carry it. After typing a secret, every later observation of
the task is scrubbed: matching text becomes "•••" and the matching screen areas are painted over.
"""

from __future__ import annotations

import io
import re
import threading
from dataclasses import replace

from PIL import Image, ImageDraw

from host.timeline.record import SENSITIVE_MASK
from planner.scene import Bounds, OcrObservation, Scene

MIN_SUBSTRING = 3
#: What a screen puts between the characters of a value when it shows it grouped: a phone
#: number typed as "5550100" reads "555-0100" or "(555) 010-0" in Android's Contacts, a card
#: number "4111 1111 1111 1111". Spaces (also no-break and thin ones), - . / ( ).
_SEPARATORS = r"[\s\u00a0\u2009\u202f./()\-]"
#: Characters (separators not counted) a secret needs before it is also found grouped: a
#: shorter one would mask ordinary numbers ("1.5", "2-3") on every screen.
MIN_GROUPED = 4


def _grouped(secret: str) -> re.Pattern[str] | None:
    """A pattern finding `secret` as a screen may show it grouped (`_SEPARATORS` between any
    two of its characters) or in other letter case (a view styled all caps, which OCR reads
    as shown: "HUNTER2PW"), or None when it is too short to be looked for that way."""
    chars = [c for c in secret if not re.fullmatch(_SEPARATORS, c)]
    if len(chars) < MIN_GROUPED:
        return None
    return re.compile(f"{_SEPARATORS}*".join(re.escape(c) for c in chars), re.IGNORECASE)


class SecretRedactor:
    """The secrets of one task run."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._grouped: dict[str, re.Pattern[str]] = {}
        self._lock = threading.Lock()

    def add(self, secret: str) -> None:
        if secret:
            pattern = _grouped(secret)
            with self._lock:
                self._secrets.add(secret)
                if pattern is not None:
                    self._grouped[secret] = pattern

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def text(self, value: str) -> str:
        """`value` with every secret masked, also one the screen shows grouped ("555-0100"
        for a typed "5550100"): found only as typed, such a value went on to the next prompt,
        the decision log and the timeline, and its screen area was not painted over."""
        with self._lock:
            secrets = sorted(self._secrets, key=len, reverse=True)
            grouped = [self._grouped[s] for s in secrets if s in self._grouped]
        for s in secrets:
            if value == s or (len(s) >= MIN_SUBSTRING and s in value):
                value = value.replace(s, SENSITIVE_MASK)
        for pattern in grouped:
            value = pattern.sub(SENSITIVE_MASK, value)
        return value

    def field_text(self, value: str) -> str:
        """`text` for what a text field holds, which may also be what is left of a secret
        after the agent erased its end (delete key): a long enough prefix of one is masked
        too. Only fields: a title that merely begins like a secret must stay readable."""
        kept = value.strip()
        with self._lock:
            partial = any(
                len(kept) >= max(MIN_SUBSTRING, len(s) // 2) and s.startswith(kept)
                for s in self._secrets
            )
        return SENSITIVE_MASK if partial else self.text(value)

    def scene(self, scene: Scene) -> tuple[Scene, list[Bounds]]:
        """The scene with secrets masked, and the screen areas that showed one."""
        boxes: list[Bounds] = []
        elements = []
        for e in scene.elements:
            editable = "EditText" in e.class_name
            text = self.field_text(e.text) if editable else self.text(e.text)
            desc = self.text(e.content_desc)
            if text != e.text or desc != e.content_desc:
                boxes.append(e.bounds)
                e = replace(e, text=text, content_desc=desc)
            elements.append(e)
        ocr: list[OcrObservation] = []
        for o in scene.ocr:
            masked = self.text(o.text)
            if masked != o.text:
                boxes.append(o.bounds)
                o = OcrObservation(masked, o.bounds, o.confidence)
            ocr.append(o)
        out = replace(
            scene,
            elements=elements,
            page_title=self.text(scene.page_title),
            activity=self.text(scene.activity),
            ocr=ocr,
        )
        return out, boxes

    @staticmethod
    def paint(png: bytes, boxes: list[Bounds]) -> bytes:
        """The screenshot with each box filled, so the secret is not readable in the image."""
        if not boxes:
            return png
        img = Image.open(io.BytesIO(png)).convert("RGB")
        draw = ImageDraw.Draw(img)
        for b in boxes:
            draw.rectangle((b.left, b.top, b.right, b.bottom), fill=(40, 40, 40))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return buf.getvalue()
