"""The planner's tools: the JSON schemas the model sees, and the parser that makes a call an action.

Every device action requires a non-empty `purpose` and `expected_outcome` in its schema: the tool
schema is the one structured-output boundary every provider enforces, so the intent of an action
survives even when the free-text rationale is suppressed (forced retry). The parser strips the two
fields from the executable arguments, carries them beside, and checks the call against the scene
the model was shown, so a hallucinated element id or an off-screen point never reaches a phone.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from amc.v1 import types_pb2
from planner.errors import ToolCallError
from planner.scene import Scene

#: The most characters (code points, as JSON Schema's `maxLength` counts them) of each free
#: text a tool takes. An argument over its limit is an unusable call, sent back to the model
#: with the limit (`parse_tool_call`), never cut: a cut text typed into a phone is a wrong
#: text typed, and an uncut one of megabytes was stored twice in a decision record (the
#: action, `arguments_json`) past the record's cap (`MAX_RECORD_BYTES`), which cuts only texts
#: people read. At 4 bytes a character the executable texts stay far within that cap, so a
#: record never needs to cut what the host executes, and a retried Decide answered from the
#: stored row gives the host the action the first answer did.
MAX_TEXT_CHARS = 4000
#: A reason is the task's result summary, which the cloud keeps to 2,000 characters.
MAX_REASON_CHARS = 2000
#: A purpose or expected outcome may quote the text typed (`the note says "…"`), as models
#: and the offline planner do: room for a text at its limit and the words around it (at 500 a
#: note of 1,800 characters was refused twice and its task failed).
MAX_INTENT_CHARS = 6000
MAX_ID_CHARS = 100
MAX_PACKAGE_CHARS = 255


def _text(limit: int, description: str = "", *, least: int = 0) -> dict[str, Any]:
    """A string argument of at most `limit` characters. The limit is declared (`maxLength`,
    which both providers accept in a tool schema that is not strict, as amc's are) and said in
    the description too: a schema that is not strict is not enforced while the model writes,
    but read."""
    said = f"At most {limit:,} characters."
    schema: dict[str, Any] = {"type": "string", "maxLength": limit}
    if least:
        schema["minLength"] = least
    schema["description"] = f"{description} {said}" if description else said
    return schema


_INTENT_PROPERTIES: dict[str, Any] = {
    "purpose": _text(
        MAX_INTENT_CHARS,
        'Why this action is taken, in a few words ("open display settings").',
        least=1,
    ),
    "expected_outcome": _text(
        MAX_INTENT_CHARS,
        'What the screen should show afterwards ("the Display page is open").',
        least=1,
    ),
}
_INTENT_REQUIRED = ["purpose", "expected_outcome"]
#: The model's judgement of the step before this one, checked with the host's verdict.
VERDICTS = ("met", "not_met", "unknown")
MAX_NOTE_CHARS = 512
_PREVIOUS_STEP: dict[str, Any] = {
    "previous_step": {
        "type": "object",
        "description": "Your judgement of the previous step: did the current screen reach its "
        "expected outcome? met, not_met, or unknown (also on the first step, when there is none).",
        "properties": {
            "verdict": {"type": "string", "enum": list(VERDICTS)},
            "note": _text(
                MAX_NOTE_CHARS,
                'One line: what you see that decides it ("the switch is still off").',
            ),
        },
        "required": ["verdict", "note"],
        "additionalProperties": False,
    }
}

DEVICE_TOOLS = frozenset({"tap", "swipe", "input_text", "press_key", "launch_app", "terminate_app"})
KEYS: dict[str, types_pb2.Key.ValueType] = {
    "back": types_pb2.KEY_BACK,
    "home": types_pb2.KEY_HOME,
    "enter": types_pb2.KEY_ENTER,
    "delete": types_pb2.KEY_DELETE,
}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool in a provider-neutral form; each provider renders it in its own wire format."""

    name: str
    description: str
    parameters: dict[str, Any]


def _device_tool(
    name: str, description: str, props: dict[str, Any], required: list[str]
) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        parameters={
            "type": "object",
            "properties": {**props, **_INTENT_PROPERTIES, **_PREVIOUS_STEP},
            "required": [*required, *_INTENT_REQUIRED, "previous_step"],
            "additionalProperties": False,
        },
    )


_COORD = {"type": "integer", "minimum": 0}

TOOLS: tuple[ToolSpec, ...] = (
    _device_tool(
        "tap",
        "Tap (or long-press) one element of the current screen by its id, or a raw point x/y for "
        "targets the element list does not expose. Give element_id OR both x and y.",
        {
            "element_id": _text(MAX_ID_CHARS, "Element id from the scene, e.g. e12."),
            "x": {**_COORD, "description": "Horizontal pixel, 0 <= x < screen width."},
            "y": {**_COORD, "description": "Vertical pixel, 0 <= y < screen height."},
            "long_press": {"type": "boolean", "description": "Hold instead of a short tap."},
        },
        [],
    ),
    _device_tool(
        "swipe",
        "Swipe from one point to another (to scroll a list down, swipe from low to high: "
        "start_y > end_y).",
        {
            "start_x": _COORD,
            "start_y": _COORD,
            "end_x": _COORD,
            "end_y": _COORD,
            "duration_ms": {"type": "integer", "minimum": 0, "maximum": 10000},
        },
        ["start_x", "start_y", "end_x", "end_y"],
    ),
    _device_tool(
        "input_text",
        "Type text into the focused field, or into element_id after focusing it. Set sensitive "
        "for secrets (passwords, codes): the value is typed but never recorded. A secret the "
        "goal names as {{secret:NAME}} is typed by writing exactly that reference as the text: "
        "its value is filled in on the phone and never shown to you.",
        {
            "text": _text(
                MAX_TEXT_CHARS, "The text to type; a longer one in several input_text calls."
            ),
            "sensitive": {"type": "boolean"},
            "element_id": _text(MAX_ID_CHARS, "Optional field to focus first."),
        },
        ["text"],
    ),
    _device_tool(
        "press_key",
        "Press a key: back, home, enter (submit, or move to the next field), or delete "
        "(backspace: erase the character before the cursor in the focused field).",
        {"key": {"type": "string", "enum": sorted(KEYS)}},
        ["key"],
    ),
    _device_tool(
        "launch_app",
        "Start an app by its Android package name.",
        {"package_name": _text(MAX_PACKAGE_CHARS, least=1)},
        ["package_name"],
    ),
    _device_tool(
        "terminate_app",
        "Force-stop an app by its Android package name.",
        {"package_name": _text(MAX_PACKAGE_CHARS, least=1)},
        ["package_name"],
    ),
    ToolSpec(
        name="complete",
        description="End the task: success true when the goal is visibly reached, false when it "
        "cannot be reached. The reason is required.",
        parameters={
            "type": "object",
            "properties": {
                "success": {"type": "boolean"},
                "reason": _text(MAX_REASON_CHARS, least=1),
                **_PREVIOUS_STEP,
            },
            "required": ["success", "reason"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="get_ui_tree",
        description="Return the structured node list of the current screen. Changes nothing.",
        parameters={
            "type": "object",
            "properties": {**_PREVIOUS_STEP},
            "additionalProperties": False,
        },
    ),
)
TOOL_NAMES = frozenset(t.name for t in TOOLS)
_BY_NAME = {t.name: t for t in TOOLS}


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """A validated tool call: executable `arguments` (intent removed) plus the typed action."""

    tool_name: str
    arguments: dict[str, Any]
    action: types_pb2.Action
    purpose: str
    expected_outcome: str
    #: The model's judgement of the previous step, None when it gave none.
    previous_step: Judgement | None = None


@dataclass(frozen=True, slots=True)
class Judgement:
    """The model's `previous_step` argument: a verdict of `VERDICTS` and one line."""

    verdict: str
    note: str


def _judgement(name: str, value: Any) -> Judgement | None:
    """`previous_step` checked for shape. Absent is allowed (recorded as no judgement): a
    missing bookkeeping field is not worth a corrective model call; a malformed one is an
    error the model is told about, like any other argument."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ToolCallError(f"{name}: `previous_step` must be an object with verdict and note")
    verdict = value.get("verdict")
    if verdict not in VERDICTS:
        raise ToolCallError(
            f"{name}: `previous_step.verdict` must be one of {', '.join(VERDICTS)}, got {verdict!r}"
        )
    note = value.get("note", "")
    if not isinstance(note, str):
        raise ToolCallError(f"{name}: `previous_step.note` must be a string")
    note = " ".join(note.split())
    if len(note) > MAX_NOTE_CHARS:
        note = note[: MAX_NOTE_CHARS - 1] + "…"
    extra = sorted(set(value) - {"verdict", "note"})
    if extra:
        raise ToolCallError(f"{name}: `previous_step` has unknown key(s) {', '.join(extra)}")
    return Judgement(str(verdict), note)


def _not_unicode(value: Any, where: str = "") -> str | None:
    """Where in `value` (a decoded JSON value) a string holds a lone surrogate, or None.

    JSON lets a string escape half of a surrogate pair (`"\\ud83d"`) and Python's decoder
    keeps it, but such a string cannot be encoded: left in, it failed the decision as an
    unexpected UnicodeEncodeError when the action, the decision log or the next request was
    written, instead of the corrective turn an unusable argument gets."""
    if isinstance(value, str):
        broken = any("\ud800" <= c <= "\udfff" for c in value)
        return (f"`{where}`" if where else "a string") if broken else None
    items: Any = ()
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    for key, item in items:
        if _not_unicode(key) is not None:
            return "an argument name"
        found = _not_unicode(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _too_long(name: str, args: Mapping[str, Any]) -> None:
    """Refuse a string argument longer than its tool schema's `maxLength`: the model is told
    which, its length and the limit (not the value: it may be a secret, and this message is
    stored), and how to do with less."""
    properties = _BY_NAME[name].parameters["properties"]
    for key, value in args.items():
        limit = properties.get(key, {}).get("maxLength")
        if isinstance(value, str) and limit is not None and len(value) > limit:
            how = (
                "type a longer text in several input_text calls"
                if (name, key) == ("input_text", "text")
                else "say it shorter"
            )
            raise ToolCallError(
                f"{name}: `{key}` is {len(value):,} characters, over the {limit:,} allowed; {how}"
            )


def over_limit_noted(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """`args` with each string argument over its tool schema's `maxLength` replaced by a note
    of its length, as the corrective turn tells it (`_too_long`); `args` itself when none is.

    What a conversation keeps of an answer and sends back: the call is refused (never
    executed, parsed from the answer as sent), and kept whole a text of megabytes was stored in
    the session and sent to the provider again with every later call of the task."""
    spec = _BY_NAME.get(name)
    if spec is None:
        return args
    properties = spec.parameters["properties"]
    noted = dict(args)
    for key, value in args.items():
        limit = properties.get(key, {}).get("maxLength") if isinstance(key, str) else None
        if isinstance(value, str) and limit is not None and len(value) > limit:
            noted[key] = f"[{len(value):,} characters, over the {limit:,} allowed: not kept]"
    return noted if noted != args else args


def _int(args: Mapping[str, Any], key: str, tool: str) -> int:
    value = args.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolCallError(f"{tool}: `{key}` must be an integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ToolCallError(f"{tool}: `{key}` must be a whole number of pixels, got {value!r}")
    return int(value)


def _str(args: Mapping[str, Any], key: str, tool: str, *, required: bool = True) -> str:
    value = args.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ToolCallError(f"{tool}: `{key}` must be a non-empty string, got {value!r}")
    return value


def _bool(args: Mapping[str, Any], key: str, tool: str, *, required: bool = False) -> bool:
    value = args.get(key)
    if value is None and not required:
        return False
    if not isinstance(value, bool):
        raise ToolCallError(f"{tool}: `{key}` must be true or false, got {value!r}")
    return value


_INT32_END = 2**31


class _Checker:
    """Validates element ids and points against what the model was shown."""

    def __init__(
        self, element_ids: Collection[str] | None, screen_size: tuple[int, int] | None
    ) -> None:
        self.element_ids = element_ids
        self.screen_size = screen_size

    def element(self, tool: str, element_id: str) -> None:
        if self.element_ids is not None and element_id not in self.element_ids:
            raise ToolCallError(
                f"{tool}: element_id {element_id!r} is not in the current scene; "
                "use an id from the elements list"
            )

    def point(self, tool: str, x: int, y: int, what: str = "point") -> None:
        if self.screen_size is None or self.screen_size[0] <= 0 or self.screen_size[1] <= 0:
            # The screen's size is not known, but no screen is 2**31 pixels wide, and the
            # action's int32 fields refused such a number as an unexpected ValueError.
            if not (0 <= x < _INT32_END and 0 <= y < _INT32_END):
                raise ToolCallError(f"{tool}: {what} ({x}, {y}) is off the screen")
            return
        w, h = self.screen_size
        if not (0 <= x < w and 0 <= y < h):
            raise ToolCallError(
                f"{tool}: {what} ({x}, {y}) is off the screen; the screen is {w}x{h} pixels "
                f"(0 <= x < {w}, 0 <= y < {h})"
            )


def parse_tool_call(
    name: str,
    arguments: Mapping[str, Any] | str | None,
    *,
    element_ids: Collection[str] | None = None,
    screen_size: tuple[int, int] | None = None,
) -> ParsedToolCall:
    """Validate one tool call and build its typed action.

    `arguments` may be the JSON string OpenAI sends. `element_ids`/`screen_size` of None skip
    those checks (the caller did not say what was shown). Raises `ToolCallError` with a message
    meant for the model's corrective retry.
    """
    if name not in _BY_NAME:
        raise ToolCallError(
            f"unknown tool {name!r}; call exactly one of: {', '.join(sorted(TOOL_NAMES))}"
        )
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise ToolCallError(f"{name}: arguments are not valid JSON ({err.msg})") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise ToolCallError(f"{name}: arguments must be a JSON object")
    args = dict(arguments)
    broken = _not_unicode(args)
    if broken is not None:
        # The value is not echoed: it may be a secret, and this message is stored.
        raise ToolCallError(
            f"{name}: {broken} holds a lone surrogate escape (such as \\ud83d without its "
            "pair), which is not text; write the characters themselves"
        )
    allowed = set(_BY_NAME[name].parameters["properties"])
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise ToolCallError(
            f"{name}: unknown argument(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    _too_long(name, args)

    purpose = expected = ""
    if name in DEVICE_TOOLS:
        missing = [k for k in _INTENT_REQUIRED if not str(args.get(k) or "").strip()]
        if missing:
            raise ToolCallError(
                f"{name}: {' and '.join(missing)} must be given as non-empty strings "
                "(every device action states why it is taken and what should happen)"
            )
        purpose = _str(args, "purpose", name).strip()
        expected = _str(args, "expected_outcome", name).strip()
    judgement = _judgement(name, args.get("previous_step"))
    exe = {k: v for k, v in args.items() if k not in (*_INTENT_REQUIRED, "previous_step")}
    check = _Checker(element_ids, screen_size)
    action = types_pb2.Action(purpose=purpose, expected_outcome=expected)

    if name == "tap":
        has_id = exe.get("element_id") not in (None, "")
        has_xy = "x" in exe or "y" in exe
        if has_id == has_xy:
            raise ToolCallError("tap: give either element_id or both x and y, not both or neither")
        long_press = _bool(exe, "long_press", name)
        if has_id:
            element_id = _str(exe, "element_id", name)
            check.element(name, element_id)
            action.tap.element_id = element_id
            exe = {"element_id": element_id}
        else:
            x, y = _int(exe, "x", name), _int(exe, "y", name)
            check.point(name, x, y)
            action.tap.point.x, action.tap.point.y = x, y
            exe = {"x": x, "y": y}
        action.tap.long_press = long_press
        if long_press:
            exe["long_press"] = True
    elif name == "swipe":
        sx, sy = _int(exe, "start_x", name), _int(exe, "start_y", name)
        ex, ey = _int(exe, "end_x", name), _int(exe, "end_y", name)
        check.point(name, sx, sy, "start")
        check.point(name, ex, ey, "end")
        duration = _int(exe, "duration_ms", name) if "duration_ms" in exe else 0
        if not 0 <= duration <= 10000:
            raise ToolCallError(f"swipe: duration_ms must be 0..10000, got {duration}")
        action.swipe.start.x, action.swipe.start.y = sx, sy
        action.swipe.end.x, action.swipe.end.y = ex, ey
        action.swipe.duration_ms = duration
        exe = {"start_x": sx, "start_y": sy, "end_x": ex, "end_y": ey}
        if duration:
            exe["duration_ms"] = duration
    elif name == "input_text":
        text = exe.get("text")
        if not isinstance(text, str):
            # The value is not echoed: it may be a secret, and this message is stored.
            raise ToolCallError(f"input_text: `text` must be a string, got {type(text).__name__}")
        sensitive = _bool(exe, "sensitive", name)
        element_id = _str(exe, "element_id", name, required=False)
        if element_id:
            check.element(name, element_id)
        action.input_text.text = text
        action.input_text.sensitive = sensitive
        action.input_text.element_id = element_id
        exe = {"text": text, "sensitive": sensitive}
        if element_id:
            exe["element_id"] = element_id
    elif name == "press_key":
        key = exe.get("key")
        if not isinstance(key, str) or key.lower() not in KEYS:
            raise ToolCallError(f"press_key: `key` must be one of {sorted(KEYS)}, got {key!r}")
        action.press_key.key = KEYS[key.lower()]
        exe = {"key": key.lower()}
    elif name in ("launch_app", "terminate_app"):
        package = _str(exe, "package_name", name).strip()
        getattr(action, name).package_name = package
        exe = {"package_name": package}
    elif name == "complete":
        success = _bool(exe, "success", name, required=True)
        reason = _str(exe, "reason", name).strip()
        action.complete.success = success
        action.complete.reason = reason
        exe = {"success": success, "reason": reason}
    else:  # get_ui_tree
        action.get_ui_tree.SetInParent()
        exe = {}
    return ParsedToolCall(name, exe, action, purpose, expected, judgement)


def ui_tree_result(scene: Scene) -> list[dict[str, Any]]:
    """What `get_ui_tree` returns: the scene's structured node list (same form as the prompt)."""
    return [e.to_prompt() for e in scene.elements]
