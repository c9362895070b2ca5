"""One short human phrase per action ("tap 'Display'", "type •••", "swipe up"): what the host's
progress line, the consoles and every exported file call an action. Here, not in the host,
because the exporter and the consoles need it without loading the host.

A sensitive text is "•••" unless it is a lone `{{secret:NAME}}` reference
(`secret_refs.stored`): the reference is no secret (the goal carries it), and "type •••" hid
which of a task's secrets a step typed."""

from __future__ import annotations

from amc.v1 import types_pb2
from planner import secret_refs
from planner.scene import Scene

SENSITIVE_MASK = "•••"

KEY_WORDS: dict[int, str] = {
    types_pb2.KEY_BACK: "back",
    types_pb2.KEY_HOME: "home",
    types_pb2.KEY_ENTER: "enter",
    types_pb2.KEY_DELETE: "delete",
}


def element_label(scene: Scene | None, element_id: str) -> str:
    """`'Display'` for an element with a text (or description, or resource id), else its id."""
    el = scene.element(element_id) if scene else None
    if el is None:
        return element_id
    label = el.text or el.content_desc or el.resource_id.rsplit("/", 1)[-1]
    return f"'{label[:40]}'" if label else element_id


def swipe_direction(action: types_pb2.SwipeAction) -> str:
    """ "up", "down", "left" or "right": where the finger moves (the larger axis wins)."""
    dx, dy = action.end.x - action.start.x, action.end.y - action.start.y
    if abs(dy) >= abs(dx):
        return "up" if dy < 0 else "down"
    return "left" if dx < 0 else "right"


def describe(action: types_pb2.Action, scene: Scene | None = None) -> str:
    """Short human phrase: "tap 'Display'", "type •••", "type {{secret:pin}}", "swipe up",
    "launch com.x"."""
    kind = action.WhichOneof("kind")
    if kind == "tap":
        t = action.tap
        verb = "long-press" if t.long_press else "tap"
        if t.WhichOneof("target") == "element_id":
            return f"{verb} {element_label(scene, t.element_id)}"
        return f"{verb} ({t.point.x}, {t.point.y})"
    if kind == "swipe":
        return f"swipe {swipe_direction(action.swipe)}"
    if kind == "input_text":
        return f"type {_typed(action.input_text)}"
    if kind == "press_key":
        return f"press {KEY_WORDS.get(action.press_key.key, 'key')}"
    if kind == "launch_app":
        return f"launch {action.launch_app.package_name}"
    if kind == "terminate_app":
        return f"stop {action.terminate_app.package_name}"
    if kind == "get_ui_tree":
        return "read the UI tree"
    if kind == "complete":
        word = "done" if action.complete.success else "give up"
        return f"{word}: {action.complete.reason}"
    return kind or "nothing"


def _typed(action: types_pb2.InputTextAction) -> str:
    return typed_text(action.text, sensitive=action.sensitive)


def typed_text(text: str, *, sensitive: bool) -> str:
    """The typed text as "type …" shows it: quoted (its first 40 characters), or for a
    sensitive one the secret a lone reference names, unquoted and written the one way whatever
    spaces the model put in it (`{{secret:pin}}`), or the mask. The one wording of every
    place that names a typing step (both consoles, the progress line, exports): the host's
    console said `type '{{secret:pin}}'` where the rest said `type {{secret:pin}}`."""
    if not sensitive:
        return f"'{text[:40]}'"
    if secret_refs.stored(text) == secret_refs.MASK:
        return SENSITIVE_MASK
    return secret_refs.reference(secret_refs.names_in(text)[0])
