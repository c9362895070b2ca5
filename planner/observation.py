"""The typed screen observation (`amc.v1.ScreenObservation`) and the planner's `Scene`.

A host sends what it sees as a typed observation; the planner shows the model a scene built from
it by `scene_from_observation` — on the cloud and in a host process alike, so both transports
build byte-identical prompts from the same observation. The Python host's perception already
produces a `Scene`; `observation_from_scene` converts it (clipping to the contract's limits, so a
real phone with a huge chat history still plans). `observation_problem` checks an observation
from any host against the limits the proto documents and names the offending field.
"""

from __future__ import annotations

import math
import re

from amc.v1 import types_pb2
from planner.scene import Bounds, Element, OcrObservation, Scene, derive_page_title

MAX_ELEMENTS = 1000
MAX_OCR_BLOCKS = 1000
MAX_TEXT_BYTES = 4096  # text, content description, OCR text
MAX_NAME_BYTES = 256  # resource id, class, package, foreground package
MAX_ACTIVITY_BYTES = 512
MAX_TITLE_BYTES = 1024
MAX_TREE_MISSING_BYTES = 512
MAX_SCREEN_PIXELS = 16384
MAX_COORDINATE = 100_000
MAX_OBSERVATION_BYTES = 1024 * 1024
ELEMENT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,32}")
SYSTEM_UI = "com.android.systemui"
ELLIPSIS = "…"

MAX_OVERLAYS = 8
MAX_OMITTED = 100_000
_OVERLAYS: dict[str, types_pb2.Overlay.ValueType] = {
    "keyboard": types_pb2.OVERLAY_KEYBOARD,
    "permission_prompt": types_pb2.OVERLAY_PERMISSION_PROMPT,
    "app_not_responding": types_pb2.OVERLAY_APP_NOT_RESPONDING,
    "app_crash": types_pb2.OVERLAY_APP_CRASH,
    "system_dialog": types_pb2.OVERLAY_SYSTEM_DIALOG,
    "notification_shade": types_pb2.OVERLAY_NOTIFICATION_SHADE,
    "lock_screen": types_pb2.OVERLAY_LOCK_SCREEN,
}
_OVERLAY_NAMES = {v: k for k, v in _OVERLAYS.items()}

_ROTATIONS = (
    types_pb2.ROTATION_0,
    types_pb2.ROTATION_90,
    types_pb2.ROTATION_180,
    types_pb2.ROTATION_270,
)


def clip(text: str, limit: int, marker: str = ELLIPSIS) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, ending in `marker` ("…") when cut.

    Also made sendable: a NUL becomes U+FFFD and an unpaired surrogate "?". Real phones' dumps
    and driver output can hold either, and the contract refuses NULs in every text field (a
    step whose screen showed one could never be planned), while a surrogate cannot be encoded.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= limit:
        return raw.decode("utf-8")
    room = limit - len(marker.encode("utf-8"))
    return raw[:room].decode("utf-8", errors="ignore") + marker


def _rect(b: Bounds) -> types_pb2.Rect:
    return types_pb2.Rect(left=b.left, top=b.top, right=b.right, bottom=b.bottom)


def _bounds(r: types_pb2.Rect) -> Bounds:
    return Bounds(r.left, r.top, r.right, r.bottom)


def observation_from_scene(scene: Scene) -> types_pb2.ScreenObservation:
    """The Python host's perception as the typed contract, clipped to its limits.

    Elements past `MAX_ELEMENTS` are left out (the model could not name them anyway); long texts
    end in "…". Element ids and bounds are kept exactly, so the host resolves the model's ids
    against its own scene.
    """
    return types_pb2.ScreenObservation(
        elements=[
            types_pb2.UiElement(
                element_id=e.element_id,
                text=clip(e.text, MAX_TEXT_BYTES),
                content_description=clip(e.content_desc, MAX_TEXT_BYTES),
                resource_id=clip(e.resource_id, MAX_NAME_BYTES),
                class_name=clip(e.class_name, MAX_NAME_BYTES),
                package_name=clip(e.package, MAX_NAME_BYTES),
                bounds=_rect(e.bounds),
                clickable=e.clickable,
                long_clickable=e.long_clickable,
                checkable=e.checkable,
                checked=e.checked,
                enabled=e.enabled,
                focused=e.focused,
                focusable=e.focusable,
                scrollable=e.scrollable,
                selected=e.selected,
                password=e.password,
                hint=clip(e.hint, MAX_TEXT_BYTES),
                source=types_pb2.ELEMENT_SOURCE_OCR
                if e.source == "ocr"
                else types_pb2.ELEMENT_SOURCE_HIERARCHY,
            )
            for e in scene.elements[:MAX_ELEMENTS]
        ],
        screen_width=scene.screen_width,
        screen_height=scene.screen_height,
        rotation=_ROTATIONS[scene.rotation % 4],
        foreground_package=clip(scene.package, MAX_NAME_BYTES),
        foreground_activity=clip(scene.activity, MAX_ACTIVITY_BYTES),
        keyboard_shown=scene.keyboard_shown,
        ocr_blocks=[
            types_pb2.OcrBlock(
                text=clip(o.text, MAX_TEXT_BYTES), bounds=_rect(o.bounds), confidence=o.confidence
            )
            for o in scene.ocr[:MAX_OCR_BLOCKS]
        ],
        title=clip(scene.page_title, MAX_TITLE_BYTES),
        overlays=[_OVERLAYS[o] for o in scene.overlays if o in _OVERLAYS][:MAX_OVERLAYS],
        omitted_elements=min(
            scene.omitted + max(0, len(scene.elements) - MAX_ELEMENTS), MAX_OMITTED
        ),
        ui_tree_missing=clip(scene.tree_missing, MAX_TREE_MISSING_BYTES),
        ui_tree_repaired=clip(scene.tree_repaired, MAX_TREE_MISSING_BYTES),
        screenshot_blank=clip(scene.screenshot_blank, MAX_TREE_MISSING_BYTES),
    )


def _dominant_package(elements: list[Element]) -> str:
    """The package whose elements cover the most screen; the system UI only when alone."""
    area: dict[str, int] = {}
    for e in elements:
        if e.package:
            area[e.package] = area.get(e.package, 0) + e.bounds.width * e.bounds.height
    candidates = {p: a for p, a in area.items() if p != SYSTEM_UI} or area
    return max(sorted(candidates), key=lambda p: candidates[p]) if candidates else ""


def scene_from_observation(observation: types_pb2.ScreenObservation) -> Scene:
    """The scene the model is shown for `observation`: the one place prompts get a screen from.

    An empty `foreground_package` becomes the package covering most of the screen, an empty
    `title` the page name `derive_page_title` finds in the elements. An element source or
    overlay kind this planner does not know (a newer host's) is read as UNSPECIFIED: a
    hierarchy node, and an overlay left out, as a host that cannot tell one leaves it out.
    """
    elements = [
        Element(
            element_id=e.element_id,
            bounds=_bounds(e.bounds),
            text=e.text,
            content_desc=e.content_description,
            resource_id=e.resource_id,
            class_name=e.class_name,
            package=e.package_name,
            clickable=e.clickable,
            long_clickable=e.long_clickable,
            checkable=e.checkable,
            checked=e.checked,
            enabled=e.enabled,
            focusable=e.focusable,
            focused=e.focused,
            scrollable=e.scrollable,
            selected=e.selected,
            password=e.password,
            hint=e.hint,
            source="ocr" if e.source == types_pb2.ELEMENT_SOURCE_OCR else "tree",
        )
        for e in observation.elements
    ]
    rotation = _ROTATIONS.index(observation.rotation) if observation.rotation in _ROTATIONS else 0
    return Scene(
        elements=elements,
        package=observation.foreground_package or _dominant_package(elements),
        page_title=observation.title or derive_page_title(elements, observation.screen_height),
        screen_width=observation.screen_width,
        screen_height=observation.screen_height,
        ocr=[
            OcrObservation(b.text, _bounds(b.bounds), b.confidence) for b in observation.ocr_blocks
        ],
        rotation=rotation,
        activity=observation.foreground_activity,
        keyboard_shown=observation.keyboard_shown,
        overlays=[_OVERLAY_NAMES[o] for o in observation.overlays if o in _OVERLAY_NAMES],
        omitted=observation.omitted_elements,
        tree_missing=observation.ui_tree_missing,
        tree_repaired=observation.ui_tree_repaired,
        screenshot_blank=observation.screenshot_blank,
    )


def _size(value: str) -> int:
    return len(value.encode("utf-8"))


def _rect_problem(name: str, r: types_pb2.Rect, present: bool) -> str | None:
    if not present:
        return f"{name}: required"
    if any(abs(v) > MAX_COORDINATE for v in (r.left, r.top, r.right, r.bottom)):
        return f"{name}: coordinates must lie within ±{MAX_COORDINATE}"
    if r.left > r.right or r.top > r.bottom:
        return f"{name}: left must be <= right and top <= bottom, got {_bounds(r).to_list()}"
    return None


def _too_long(name: str, value: str, limit: int) -> str | None:
    size = _size(value)
    return f"{name} is {size} bytes; at most {limit}" if size > limit else None


def observation_problem(
    observation: types_pb2.ScreenObservation, name: str = "observation"
) -> str | None:
    """What is wrong with an observation, naming the field (INVALID_ARGUMENT text), or None."""
    size = observation.ByteSize()
    if size > MAX_OBSERVATION_BYTES:
        return f"{name} is {size} bytes serialized; at most {MAX_OBSERVATION_BYTES}"
    for axis in ("screen_width", "screen_height"):
        value = getattr(observation, axis)
        if not 1 <= value <= MAX_SCREEN_PIXELS:
            return f"{name}.{axis}: must be 1 to {MAX_SCREEN_PIXELS} pixels, got {value}"
    if len(observation.elements) > MAX_ELEMENTS:
        return f"{name}.elements: {len(observation.elements)} elements; at most {MAX_ELEMENTS}"
    if len(observation.ocr_blocks) > MAX_OCR_BLOCKS:
        count = len(observation.ocr_blocks)
        return f"{name}.ocr_blocks: {count} blocks; at most {MAX_OCR_BLOCKS}"
    for field, value, limit in (
        ("foreground_package", observation.foreground_package, MAX_NAME_BYTES),
        ("foreground_activity", observation.foreground_activity, MAX_ACTIVITY_BYTES),
        ("title", observation.title, MAX_TITLE_BYTES),
        ("ui_tree_missing", observation.ui_tree_missing, MAX_TREE_MISSING_BYTES),
        ("ui_tree_repaired", observation.ui_tree_repaired, MAX_TREE_MISSING_BYTES),
        ("screenshot_blank", observation.screenshot_blank, MAX_TREE_MISSING_BYTES),
    ):
        problem = _too_long(f"{name}.{field}", value, limit)
        if problem:
            return problem
    # proto3 enums are open. An unknown rotation would change what every coordinate means, so
    # it is refused; an unknown overlay kind or element source only informs the model and is
    # read as UNSPECIFIED (`scene_from_observation`), so a newer host's steps still plan.
    if observation.rotation not in (types_pb2.ROTATION_UNSPECIFIED, *_ROTATIONS):
        return f"{name}.rotation: unknown value {observation.rotation}"
    if len(observation.overlays) > MAX_OVERLAYS:
        return f"{name}.overlays: {len(observation.overlays)} entries; at most {MAX_OVERLAYS}"
    if not 0 <= observation.omitted_elements <= MAX_OMITTED:
        return f"{name}.omitted_elements: must be 0 to {MAX_OMITTED}"
    seen: set[str] = set()
    for i, e in enumerate(observation.elements):
        where = f"{name}.elements[{i}]"
        if not ELEMENT_ID.fullmatch(e.element_id):
            return (
                f"{where}.element_id: {e.element_id[:40]!r} is not 1 to 32 characters of "
                "A-Z a-z 0-9 _ . : -"
            )
        if e.element_id in seen:
            return f"{where}.element_id: {e.element_id!r} is used twice"
        seen.add(e.element_id)
        for field, value, limit in (
            ("text", e.text, MAX_TEXT_BYTES),
            ("content_description", e.content_description, MAX_TEXT_BYTES),
            ("hint", e.hint, MAX_TEXT_BYTES),
            ("resource_id", e.resource_id, MAX_NAME_BYTES),
            ("class_name", e.class_name, MAX_NAME_BYTES),
            ("package_name", e.package_name, MAX_NAME_BYTES),
        ):
            problem = _too_long(f"{where}.{field}", value, limit)
            if problem:
                return problem
        problem = _rect_problem(f"{where}.bounds", e.bounds, e.HasField("bounds"))
        if problem:
            return problem
    for i, b in enumerate(observation.ocr_blocks):
        where = f"{name}.ocr_blocks[{i}]"
        problem = _too_long(f"{where}.text", b.text, MAX_TEXT_BYTES) or _rect_problem(
            f"{where}.bounds", b.bounds, b.HasField("bounds")
        )
        if problem:
            return problem
        if not (math.isfinite(b.confidence) and 0 <= b.confidence <= 100):
            return f"{where}.confidence: must be 0 to 100, got {b.confidence}"
    return None
