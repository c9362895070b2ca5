"""Execute one typed `amc.v1.Action` on a driver (`describe`, its short human line, is the
planner's: re-exported here for the agent loop)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict

from amc.v1 import types_pb2
from host.devices.base import DeviceBusy, DeviceError, Driver, KeyName
from host.perception.hierarchy import ui_tree_nodes
from planner.describe import describe as describe
from planner.scene import Scene
from planner.secret_refs import stored

_KEYS: dict[int, KeyName] = {
    types_pb2.KEY_BACK: "back",
    types_pb2.KEY_HOME: "home",
    types_pb2.KEY_ENTER: "enter",
    types_pb2.KEY_DELETE: "delete",
}
DEFAULT_SWIPE_MS = 300
LONG_PRESS_MS = 800


class ActionError(DeviceError):
    """The action cannot run as given (unknown element, unknown key); the phone is fine."""


@dataclass(slots=True)
class ActionResult:
    """What executing an action produced, as stored in the timeline."""

    ok: bool
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    complete: bool = False
    complete_success: bool = False
    complete_reason: str = ""
    #: The phone did not answer the action in time (`DeviceBusy`: a timeout, a stream cut
    #: short), so whether it took effect is unknown; the loop ends an attempt whose actions
    #: go unanswered `ACTIONS_UNANSWERED` times in a row (`host.agent.loop`).
    unanswered: bool = False
    #: The action asked the phone something (a gesture, a key, a launch, text): only such
    #: results move that count. One that never reached it (reading the tree, an unknown
    #: element, a withheld secret) says nothing of whether the phone answers, and reset it:
    #: a model alternating a hung tap with a tree read never ended the attempt.
    reached: bool = False

    def report(self) -> str:
        """What the driver reported, one JSON line for `ActionOutcome.driver_output` (the
        node list of `get_ui_tree` is left out: it is the screen, which the cloud gets)."""
        detail = {k: v for k, v in self.detail.items() if k != "nodes"}
        return json.dumps(detail, ensure_ascii=False, sort_keys=True) if detail else ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, **self.detail}
        if self.error:
            out["error"] = self.error
        if self.complete:
            out["complete"] = {"success": self.complete_success, "reason": self.complete_reason}
        return out


def strip_intent(action: types_pb2.Action) -> types_pb2.Action:
    """The executable action: `purpose` and `expected_outcome` removed (they are recorded aside)."""
    out = types_pb2.Action()
    out.CopyFrom(action)
    out.ClearField("purpose")
    out.ClearField("expected_outcome")
    return out


def action_to_record(action: types_pb2.Action) -> dict[str, Any]:
    """The executed action as a JSON-able dict, a sensitive text masked."""
    data = MessageToDict(strip_intent(action), preserving_proto_field_name=True)
    it = data.get("input_text")
    if isinstance(it, dict) and action.input_text.sensitive:
        it["text"] = stored(it.get("text"))
    return data


def _target(scene: Scene, element_id: str) -> tuple[int, int]:
    el = scene.element(element_id)
    if el is None:
        raise ActionError(f"no element {element_id} on this screen")
    return el.bounds.center


def execute(driver: Driver, action: types_pb2.Action, scene: Scene) -> ActionResult:
    """Run the action (synchronously; the loop calls this in a worker thread).

    `DeviceGone` propagates (the task fails); other driver errors become a failed result so
    the planner sees the failure and may try something else.
    """
    act = strip_intent(action)
    kind = act.WhichOneof("kind")
    try:
        result = _run(driver, act, kind, scene)
    except ActionError as exc:
        return ActionResult(ok=False, error=str(exc))
    except DeviceError as exc:
        from host import metrics
        from host.devices.base import DeviceGone

        if isinstance(exc, DeviceGone):
            raise
        metrics.device_error(exc)
        unanswered = isinstance(exc, DeviceBusy)
        return ActionResult(ok=False, error=str(exc), unanswered=unanswered, reached=True)
    result.reached = kind in _REACHES_PHONE
    return result


#: The actions that ask the phone something (`ActionResult.reached`).
_REACHES_PHONE = frozenset(
    {"tap", "swipe", "input_text", "press_key", "launch_app", "terminate_app"}
)


def _run(driver: Driver, act: types_pb2.Action, kind: str | None, scene: Scene) -> ActionResult:
    """`execute`'s work, its errors left to it."""
    if kind == "tap":
        t = act.tap
        if t.WhichOneof("target") == "element_id":
            x, y = _target(scene, t.element_id)
        elif t.HasField("point"):
            x, y = t.point.x, t.point.y
        else:
            raise ActionError("tap without a target")
        if t.long_press:
            driver.long_press(x, y, LONG_PRESS_MS)
        else:
            driver.tap(x, y)
        return ActionResult(ok=True, detail={"point": [x, y]})
    if kind == "swipe":
        s = act.swipe
        ms = s.duration_ms or DEFAULT_SWIPE_MS
        driver.swipe(s.start.x, s.start.y, s.end.x, s.end.y, ms)
        return ActionResult(ok=True)
    if kind == "input_text":
        it = act.input_text
        detail: dict[str, Any] = {}
        if it.element_id:
            x, y = _target(scene, it.element_id)
            driver.tap(x, y)
            detail["focused"] = [x, y]
        driver.input_text(it.text)
        return ActionResult(ok=True, detail=detail)
    if kind == "press_key":
        key = _KEYS.get(act.press_key.key)
        if key is None:
            raise ActionError("unknown key")
        driver.press_key(key)
        return ActionResult(ok=True)
    if kind == "launch_app":
        driver.launch_app(act.launch_app.package_name)
        return ActionResult(ok=True)
    if kind == "terminate_app":
        driver.terminate_app(act.terminate_app.package_name)
        return ActionResult(ok=True)
    if kind == "get_ui_tree":
        return ActionResult(ok=True, detail={"nodes": ui_tree_nodes(scene)})
    if kind == "complete":
        c = act.complete
        return ActionResult(
            ok=True, complete=True, complete_success=c.success, complete_reason=c.reason
        )
    raise ActionError(f"unsupported action {kind!r}")


def changes_screen(action: types_pb2.Action) -> bool:
    return action.WhichOneof("kind") not in ("get_ui_tree", "complete")
