"""How stored records read on the pages: one `StepView` per timeline step, the phones "now".

Templates only format; every decision about what a record means (which screenshot is which, what
an older record's fields stand for, what must be masked) is made here, in typed code, so the
page and the tests agree on it. Any record the store can load renders: every field is optional.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from google.protobuf.json_format import ParseDict, ParseError

from amc.v1 import types_pb2
from host.agent.progress import ProgressSnapshot
from host.timeline.record import TimelineRecord
from host.timeline.store import TaskRow
from planner.budget import dollars
from planner.decision import RETRY_WORDS, ResumedFrom, Usage, billed_tokens, thinking_word
from planner.describe import typed_text
from planner.observation import scene_from_observation
from planner.secret_refs import stored
from planner.tools import ui_tree_result
from planner.verify import WORDS as VERDICT_WORDS
from webui.steps import step_line

#: Tool names whose result is a UI tree (`ui_tree` is what older hosts called it).
UI_TREE_TOOLS = frozenset({"get_ui_tree", "ui_tree"})


def badge(step_index: int, step_status: str, summary: str, *, ended: bool = False) -> str:
    """`step 4 · acting · tap 'Display'`, `last step 6 · action done · give up: …` once the
    attempt ended: the cloud console's and the terminal's words (`webui.steps`); empty before
    step 1. Its own words put the step's raw status beside the task's ("failed · step 6 ·
    succeeded · give up"), as if the task had succeeded."""
    if not step_index:
        return ""
    return step_line(step_index, step_status, summary, 0, terminal=ended)


def nodes_json(nodes: list[Any]) -> str:
    """A node list as JSON, one node per line (as the prompt shows a scene): easy to scan."""
    lines = [json.dumps(n, ensure_ascii=False, default=str) for n in nodes]
    return "[\n" + ",\n".join(lines) + "\n]" if lines else "[]"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def artifact_url(relative: str | None) -> str | None:
    """The console URL of a stored screenshot (the route checks it stays in the folder)."""
    if not relative:
        return None
    return "/artifacts/" + quote(relative, safe="/")


def prompts_url(task_id: str, attempt: int, step_index: int) -> str:
    """The page of one step's prompts, which its section loads when opened."""
    return f"/tasks/{quote(task_id, safe='')}/attempts/{attempt}/steps/{step_index}/prompts"


def _is_sensitive(arguments: dict[str, Any], action: dict[str, Any]) -> bool:
    it = action.get("input_text")
    return bool(arguments.get("sensitive")) or (isinstance(it, dict) and bool(it.get("sensitive")))


def mask_sensitive(
    arguments: dict[str, Any], action: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Arguments and action with a sensitive input's text as "•••", whatever the record held.

    The agent loop already stores it masked; this guards records written by anything else.
    """
    if not _is_sensitive(arguments, action):
        return arguments, action
    args = dict(arguments)
    if "text" in args:
        args["text"] = stored(args["text"])
    act = dict(action)
    it = act.get("input_text")
    if isinstance(it, dict):
        act["input_text"] = {**it, "text": stored(it.get("text"))}
    return args, act


@dataclass(slots=True)
class TreeNode:
    """One `get_ui_tree` node, nested under the smallest node whose bounds contain it."""

    node: dict[str, Any]
    children: list[TreeNode] = field(default_factory=list)
    #: The node this one is listed under (None: a top-level node).
    parent: TreeNode | None = None
    #: 1 for a top-level node.
    depth: int = 1

    @property
    def label(self) -> str:
        n = self.node
        parts = [str(n.get("id", "?"))]
        if n.get("cls"):
            parts.append(str(n["cls"]))
        text = n.get("text") or n.get("desc")
        if text:
            parts.append(repr(str(text)[:60]))
        if n.get("source") == "ocr":
            parts.append("(ocr)")
        return " ".join(parts)

    @property
    def hint(self) -> str:
        """For a node without text of its own: the first text inside it ("Display")."""
        if self.node.get("text") or self.node.get("desc"):
            return ""
        for child in self.children:
            text = child.node.get("text") or child.node.get("desc") or child.hint
            if text:
                return str(text)[:60]
        return ""

    @property
    def flags(self) -> list[str]:
        raw = self.node.get("flags")
        if isinstance(raw, list):
            return [str(f) for f in raw]
        return []


def _bounds(node: dict[str, Any]) -> tuple[int, int, int, int] | None:
    b = node.get("bounds")
    if isinstance(b, list) and len(b) == 4 and all(isinstance(v, int | float) for v in b):
        return (int(b[0]), int(b[1]), int(b[2]), int(b[3]))
    return None


def _contains(outer: tuple[int, int, int, int], inner: tuple[int, int, int, int]) -> bool:
    return (
        outer[0] <= inner[0]
        and outer[1] <= inner[1]
        and outer[2] >= inner[2]
        and outer[3] >= inner[3]
        and outer != inner
    )


def _area(b: tuple[int, int, int, int]) -> int:
    return max(b[2] - b[0], 0) * max(b[3] - b[1], 0)


#: Levels the UI tree is nested to at most; deeper nodes are listed at this level. The page
#: draws the nesting with a recursive template: a screen of elements each inside the last (a
#: web page's nested boxes) ran past Python's recursion limit at about 250 levels.
MAX_TREE_DEPTH = 50


def ui_tree(nodes: list[Any]) -> list[TreeNode]:
    """Nest the flat node list `get_ui_tree` returns by bounds containment, keeping its order.

    The tool returns elements in document order without parent links; the smallest earlier
    node that contains a node's bounds is the best available parent, and nodes without bounds
    stay at the top level. A node that would be nested deeper than `MAX_TREE_DEPTH` is listed
    beside its parent instead.
    """
    placed: list[tuple[tuple[int, int, int, int] | None, TreeNode]] = []
    roots: list[TreeNode] = []
    for raw in nodes:
        if not isinstance(raw, dict):
            raw = {"value": raw}
        item = TreeNode(raw)
        bounds = _bounds(raw)
        parent: TreeNode | None = None
        best = -1
        if bounds is not None:
            for pb, candidate in placed:
                if pb is not None and _contains(pb, bounds):
                    area = _area(pb)
                    if parent is None or area < best:
                        parent, best = candidate, area
        if parent is not None and parent.depth >= MAX_TREE_DEPTH:
            parent = parent.parent
        if parent is not None:
            item.parent, item.depth = parent, parent.depth + 1
        (parent.children if parent is not None else roots).append(item)
        placed.append((bounds, item))
    return roots


#: Timing keys as a person reads them, in the order the step spends them. The agent loop
#: records `<phase>_s` keys (`before_…` are perception's parts of the first look); a key not
#: listed here reads as its own words.
TIMING_NAMES: dict[str, str] = {
    "perceive_before_s": "Looking at the screen (before)",
    "before_screenshot_s": "· screenshot",
    "before_hierarchy_s": "· UI hierarchy dump",
    "before_ocr_s": "· text recognition (OCR)",
    "plan_s": "Planning (until the decision arrived)",
    "planner_latency_s": "· the model's answer",
    "act_s": "Acting on the phone",
    "perceive_after_s": "Looking at the screen (after)",
    "record_s": "Recording the step",
}


def timing_rows(timings: dict[str, float]) -> list[tuple[str, float]]:
    """(readable name, seconds) in step order; unknown keys last, in their own words."""
    known = [(TIMING_NAMES[k], timings[k]) for k in TIMING_NAMES if k in timings]
    other = [
        (k.removesuffix("_s").replace("_", " ").capitalize(), v)
        for k, v in sorted(timings.items())
        if k not in TIMING_NAMES
    ]
    return known + other


@dataclass(frozen=True, slots=True)
class Marker:
    """Where the action touched the screen, in screen pixels, to draw over the screenshot:
    a tap (or the tap that focused a field) is a point, a swipe a line from start to end."""

    kind: str  # "tap" | "swipe"
    x: int
    y: int
    x2: int = 0
    y2: int = 0


def _pair(value: Any) -> tuple[int, int] | None:
    pair = isinstance(value, list | tuple) and len(value) == 2
    if pair and all(isinstance(v, int | float) for v in value):
        return int(value[0]), int(value[1])
    if isinstance(value, dict) and isinstance(value.get("x", 0), int | float):
        return int(value.get("x", 0)), int(value.get("y", 0))
    return None


def marker(record: TimelineRecord) -> Marker | None:
    """The point a tap hit (as executed: the element's centre), or a swipe's path."""
    for key in ("point", "focused"):
        point = _pair(record.result.get(key)) if isinstance(record.result, dict) else None
        if point is not None:
            return Marker("tap", *point)
    tap = record.action.get("tap")
    if isinstance(tap, dict):
        point = _pair(tap.get("point"))
        if point is not None:
            return Marker("tap", *point)
    swipe = record.action.get("swipe")
    if isinstance(swipe, dict):
        start, end = _pair(swipe.get("start") or {}), _pair(swipe.get("end") or {})
        if start is not None and end is not None:
            return Marker("swipe", *start, *end)
    return None


def shown_nodes(screen: dict[str, Any]) -> list[Any] | None:
    """The node list the model was shown for a recorded screen (`TimelineRecord.screen`), in
    `get_ui_tree`'s form; None for a record it cannot be read from."""
    try:
        observation = ParseDict(screen, types_pb2.ScreenObservation(), ignore_unknown_fields=True)
    except ParseError:
        return None
    return ui_tree_result(scene_from_observation(observation))


def screen_size(record: TimelineRecord) -> tuple[int, int] | None:
    """The recorded screen's size in pixels (the coordinates an action's point uses)."""
    width, height = record.screen.get("screen_width"), record.screen.get("screen_height")
    if isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0:
        return width, height
    return None


def _action_line(record: TimelineRecord, arguments: dict[str, Any]) -> str:
    """A short human line for the step header: "tap 'Display'", "type •••", "launch com.x"."""
    tool = record.tool_name or next(iter(record.action), "") or "step"
    target = None
    event_action = record.world_event.get("action") if record.world_event else None
    if isinstance(event_action, dict):
        target = event_action.get("target")
    if tool == "tap":
        what = target or arguments.get("element_id") or (arguments.get("x"), arguments.get("y"))
        return f"tap '{what}'" if target else f"tap {what}"
    if tool == "input_text":
        text = str(arguments.get("text", ""))
        return f"type {typed_text(text, sensitive=_is_sensitive(arguments, record.action))}"
    if tool == "launch_app":
        return f"launch {arguments.get('package_name', '')}".strip()
    if tool == "terminate_app":
        return f"stop {arguments.get('package_name', '')}".strip()
    if tool == "press_key":
        return f"press {arguments.get('key', 'key')}"
    if tool == "complete":
        word = "done" if arguments.get("success") else "give up"
        return f"{word}: {arguments.get('reason', '')}"
    if tool in UI_TREE_TOOLS:
        return "read the UI tree"
    return tool


@dataclass(slots=True)
class StepView:
    """Everything one step's section on the timeline page shows."""

    index: int
    tool_name: str
    line: str
    page: str | None
    success: bool | None
    error: str | None
    started_at: str
    finished_at: str
    before_url: str | None
    after_url: str | None
    same_screen: bool
    purpose: str | None
    expected_outcome: str | None
    rationale: str | None
    thinking: list[tuple[str, bool]]
    system_prompt: str | None
    user_prompt: str | None
    session: bool
    legacy_prompt: str | None
    answer_json: str
    provider: str | None
    model: str | None
    usage: dict[str, float]
    latency_s: float | None
    forced_retry: bool
    corrective_retries: int
    thinking_kind: str
    retry_kind: str
    output_truncated: bool
    action_json: str | None
    result_json: str | None
    ocr: list[dict[str, Any]]
    ocr_after: list[dict[str, Any]]
    ui_tree: list[TreeNode] | None
    ui_tree_json: str | None
    #: The tree came from the model's own `get_ui_tree` call (else: the screen it was shown).
    ui_tree_asked: bool
    timings: list[tuple[str, float]]
    legacy_json: str | None
    marker: Marker | None = None
    #: (width, height) of the before screenshot, to scale the marker onto it; None: unknown.
    screen: tuple[int, int] | None = None
    #: The checker's verdict ("met", "not met", "unknown"; None: not checked) and evidence.
    verdict: str | None = None
    evidence: str = ""
    #: The model's judgement of this step, given with the next step ("" until then).
    model_verdict: str = ""
    model_note: str = ""
    #: "replayed · flow F step N · no model call", "took over from flow F at step N: why", or
    #: "flow F set aside at step N: why" (no divergence).
    flow_line: str = ""
    #: Set when the decision went on from a kept model answer (`ResumedFrom.words`).
    resumed_line: str = ""
    replayed: bool = False
    #: Where the step's prompts are (`prompts_url`): the timeline loads them when opened.
    prompts_url: str = ""

    @property
    def disagree(self) -> bool:
        return {self.verdict, self.model_verdict} == {"met", "not met"}

    @property
    def status(self) -> str:
        if self.success is None:
            return "unknown"
        return "ok" if self.success else "failed"

    @property
    def redacted_thinking(self) -> bool:
        return any(redacted for _, redacted in self.thinking)

    @property
    def thinking_word(self) -> str:
        """What kind of thinking this step carries, as a word (never a blank)."""
        return thinking_word(self.thinking_kind)

    @property
    def retry_word(self) -> str:
        return RETRY_WORDS.get(self.retry_kind, "forced retry" if self.forced_retry else "")

    @property
    def total_tokens(self) -> int:
        """Every token the step's calls were billed (`billed_tokens`, as the cloud counts)."""
        u = self.usage
        counts = Usage(
            input_tokens=int(u.get("input_tokens", 0)),
            output_tokens=int(u.get("output_tokens", 0)),
            cache_read_input_tokens=int(u.get("cache_read_input_tokens", 0)),
            cache_creation_input_tokens=int(u.get("cache_creation_input_tokens", 0)),
        )
        return billed_tokens(counts)

    @property
    def cost_usd(self) -> float:
        """What the step's model calls cost (list prices; 0 for steps recorded before)."""
        return float(self.usage.get("cost_usd", 0.0))


def steps_cost(steps: list[StepView], failed: Usage | None = None) -> str:
    """Tokens and cost of the steps together, with the failed decisions' billed calls
    (`failed`), as the task page shows them: what the attempt spent."""
    extra = failed or Usage()
    tokens = sum(s.total_tokens for s in steps) + extra.billed_tokens
    return f"{tokens:,} tokens · {dollars(sum(s.cost_usd for s in steps) + extra.cost_usd)}"


def failed_calls_words(failed: int, usage: Usage) -> str:
    """`1 failed decision's billed model calls: 2,400 tokens · $0.0120` (no step shows them)."""
    whose = f"{failed} failed decision's" if failed == 1 else f"{failed} failed decisions'"
    return f"{whose} billed model calls: {usage.billed_tokens:,} tokens · {dollars(usage.cost_usd)}"


def verdict_counts(steps: list[StepView]) -> dict[str, int]:
    """How many device steps the checker found met, not met, unknown, or did not check (the
    same counts as the cloud console's task page; `complete` and UI-tree reads are no device
    steps)."""
    counts = {"met": 0, "not met": 0, "unknown": 0, "unchecked": 0}
    for step in steps:
        if step.tool_name == "complete" or step.tool_name in UI_TREE_TOOLS:
            continue
        counts[step.verdict or "unchecked"] += 1
    return counts


def _flow_line(flow: dict[str, Any] | None, mode: str) -> str:
    if not flow:
        return ""
    where = f"flow {flow.get('flow_id', '?')} step {flow.get('flow_step', '?')}"
    if mode == "replay":
        return f"replayed · {where} · no model call"
    if flow.get("set_aside"):  # no divergence: the flow set aside, counted nowhere
        at = f"step {flow.get('flow_step', '?')}"
        return f"flow {flow.get('flow_id', '?')} set aside at {at}: {flow['set_aside']}"
    return f"took over from {where}: {flow.get('divergence') or 'the screen differed'}"


def _resumed_line(resumed: dict[str, Any] | None) -> str:
    """The words for a decision that went on from a kept answer, from its record ("" for any
    other, or a record of an older host)."""
    mark = ResumedFrom.from_dict(resumed)
    return mark.words() if mark is not None else ""


def step_views(
    records: list[TimelineRecord], screens: list[tuple[int, int] | None] | None = None
) -> list[StepView]:
    """The page's views of an attempt's steps, each with the model's judgement of it (which
    the next step's record carries); `screens` the before screenshots' sizes, in order."""
    sizes = screens if screens is not None else [None] * len(records)
    views = [step_view(r, size) for r, size in zip(records, sizes, strict=True)]
    for view, following in zip(views, records[1:], strict=False):
        judged = following.previous_step or {}
        view.model_verdict = VERDICT_WORDS.get(str(judged.get("verdict") or ""), "")
        view.model_note = str(judged.get("note") or "")
    return views


def step_view(record: TimelineRecord, screen: tuple[int, int] | None = None) -> StepView:
    """The page's view of one stored step (new or older format); `screen` is the before
    screenshot's size in pixels (`png_size`), which places the action's marker on it."""
    arguments, action = mask_sensitive(dict(record.arguments), dict(record.action))
    tool = record.tool_name or (next(iter(action), None) if action else None) or ""
    thinking: list[tuple[str, bool]] = []
    for block in record.thinking:
        if isinstance(block, dict):
            thinking.append((str(block.get("text") or ""), bool(block.get("redacted"))))
        else:
            thinking.append((str(block), False))
    answer: dict[str, Any] = {"tool": tool, "arguments": arguments}
    if record.purpose:
        answer["purpose"] = record.purpose
    if record.expected_outcome:
        answer["expected_outcome"] = record.expected_outcome
    tree: list[TreeNode] | None = None
    tree_json: str | None = None
    nodes = record.result.get("nodes") if isinstance(record.result, dict) else None
    asked = tool in UI_TREE_TOOLS and isinstance(nodes, list)
    shown: list[Any] | None = nodes if asked and isinstance(nodes, list) else None
    if shown is None and record.screen:
        shown = shown_nodes(record.screen)
    if shown is not None:
        tree = ui_tree(shown)
        tree_json = nodes_json(shown)
    result = record.result
    if asked:
        result = {k: v for k, v in result.items() if k != "nodes"}
        result["nodes"] = f"{len(nodes or [])} nodes (the UI tree below)"
    legacy = dict(record.legacy)
    legacy_prompt = legacy.get("prompt")
    before = record.before_screenshot_path
    after = record.after_screenshot_path
    latency = record.timings.get("planner_latency_s")
    success = record.success
    if success is None and isinstance(record.result.get("ok"), bool):
        success = bool(record.result["ok"])  # older records kept only the result
    return StepView(
        index=record.step_index,
        tool_name=tool or "—",
        line=_action_line(record, arguments),
        page=record.page,
        success=success,
        error=record.error,
        started_at=record.started_at,
        finished_at=record.finished_at,
        before_url=artifact_url(before),
        after_url=artifact_url(after),
        same_screen=bool(before) and before == after,
        purpose=record.purpose,
        expected_outcome=record.expected_outcome,
        rationale=record.rationale,
        thinking=thinking,
        system_prompt=record.system_prompt,
        user_prompt=record.user_prompt,
        session=record.planner_mode == "session",
        legacy_prompt=str(legacy_prompt) if legacy_prompt else None,
        answer_json=pretty_json(answer),
        provider=record.provider,
        model=record.model,
        usage={
            k: (float(v) if k == "cost_usd" else int(v))
            for k, v in record.usage.items()
            if isinstance(v, int | float)
        },
        latency_s=float(latency) if isinstance(latency, int | float) else None,
        forced_retry=record.forced_retry,
        corrective_retries=record.corrective_retries,
        thinking_kind=record.thinking_kind,
        retry_kind=record.retry_kind,
        output_truncated=record.output_truncated,
        action_json=pretty_json(action) if action else None,
        result_json=pretty_json(result) if result else None,
        ocr=[o for o in record.ocr if isinstance(o, dict)],
        ocr_after=[o for o in record.ocr_after if isinstance(o, dict)],
        ui_tree=tree,
        ui_tree_json=tree_json,
        verdict=VERDICT_WORDS.get(str((record.verdict or {}).get("verdict") or "")) or None,
        evidence=str((record.verdict or {}).get("evidence") or ""),
        flow_line=_flow_line(record.flow, record.planner_mode),
        resumed_line=_resumed_line(record.resumed_from),
        replayed=record.planner_mode == "replay",
        ui_tree_asked=asked,
        timings=timing_rows(
            {k: float(v) for k, v in record.timings.items() if isinstance(v, int | float)}
        ),
        legacy_json=pretty_json(legacy) if legacy else None,
        marker=marker(record),
        screen=screen_size(record) or screen,
        prompts_url=prompts_url(record.task_id, record.attempt, record.step_index),
    )


@dataclass(slots=True)
class PhoneNow:
    """One phone on the "now" page: what it is and what it is doing."""

    serial: str
    model: str
    state: str
    #: adb's serial when it is not `serial` or other phones have it too (cheap phones ship
    #: with one): the operator learns why the id is not the serial, and what to fix.
    adb_serial: str = ""
    #: adb lists another phone with the same serial now.
    serial_shared: bool = False
    #: Why the phone takes no work though adb lists it, in words for its operator: the host
    #: keeps it out (`host.devices.health`), or adb may not open it (`DeviceInfo.adb_reason`);
    #: "" when neither.
    unhealthy: str = ""
    #: Why the cloud would refuse the phone's id (`host.devices.registry.refused_serial`): the
    #: host leaves it out of what it reports, so it gets no work; "" when the cloud takes it.
    refused: str = ""
    task_id: str | None = None
    attempt: int | None = None
    goal: str | None = None
    step_index: int = 0
    step_status: str = ""
    summary: str = ""
    updated_at: datetime | None = None

    @property
    def busy(self) -> bool:
        return self.task_id is not None

    @property
    def badge(self) -> str:
        """`step 4 · acting · tap 'Display'`, or "starting" before the first step."""
        if not self.step_index:
            return "starting" if self.busy else ""
        return badge(self.step_index, self.step_status, self.summary)


def with_progress(
    phone: PhoneNow, task_id: str, attempt: int, goal: str, snap: ProgressSnapshot
) -> PhoneNow:
    phone.task_id = task_id
    phone.attempt = attempt
    phone.goal = goal
    phone.step_index = snap.step_index
    phone.step_status = snap.status_name
    phone.summary = snap.summary
    phone.updated_at = snap.updated_at
    return phone


def task_badge(task: TaskRow) -> str:
    ended = task.status != "running"
    return badge(task.step_index, task.step_status, task.progress_summary, ended=ended)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def when(value: str | datetime | None) -> str:
    moment = parse_time(value) if isinstance(value, str) or value is None else value
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "—"


def ago(value: str | datetime | None) -> str:
    moment = parse_time(value) if isinstance(value, str) or value is None else value
    if moment is None:
        return ""
    seconds = max(int((datetime.now(UTC) - moment).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    if seconds < 86400:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG's header (its first 24 bytes), None for anything else.

    The host saves screenshots as the phone captured them, so this is the screen's size in
    the pixels the action's coordinates use.
    """
    try:
        with path.open("rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return (width, height) if width and height else None
