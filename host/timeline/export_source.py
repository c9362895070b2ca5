"""The host's side of a run: its timeline (steps with screens and screenshots, what its
failed decisions' billed calls cost, and its calls of unknown cost) as an export `Run`.

A host holds the attempts it ran itself; each step keeps the screen it was decided on and its
before/after screenshots (secrets already painted over by the agent loop). The step index is the
one the cloud assigned when the decision came from the cloud, so a host's export merges into the
cloud's step by step (`export/merge.py`).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.json_format import ParseDict, ParseError

from amc.v1 import types_pb2
from export.run import FailedCalls, Judged, Outcome, Run, Step, Unsettled
from host.timeline.artifacts import ArtifactPathError
from host.timeline.record import TimelineRecord
from host.timeline.store import TaskRow, TimelineStore
from planner.decision import ResumedFrom, ThinkingBlock, Usage
from planner.observation import scene_from_observation
from planner.scene import Scene
from planner.verify import WORDS as VERDICT_WORDS

_USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "thinking_tokens",
)


def _screen(record: TimelineRecord) -> Scene | None:
    if not record.screen:
        return None  # a record from before hosts kept the screen
    try:
        return scene_from_observation(ParseDict(record.screen, types_pb2.ScreenObservation()))
    except ParseError:
        return None


def _action(record: TimelineRecord) -> types_pb2.Action:
    action = types_pb2.Action()
    try:
        ParseDict(record.action, action, ignore_unknown_fields=True)
    except ParseError:
        action.Clear()
    return action


def _png(store: TimelineStore, relative: str | None) -> bytes | None:
    if not relative:
        return None
    try:
        return store.artifacts.read(relative)
    except (ArtifactPathError, OSError):
        return None  # pruned or never written (a failed after-capture)


def _latency(record: TimelineRecord) -> float | None:
    value = record.timings.get("plan_s")
    return float(value) if isinstance(value, int | float) else None


def _outcome(record: TimelineRecord) -> Outcome:
    result: dict[str, Any] = record.result or {}
    detail = {k: v for k, v in result.items() if k in ("point", "focused")}
    return Outcome(
        executed=record.success,
        error=record.error or "",
        driver_output=json.dumps(detail, sort_keys=True) if detail else "",
    )


def _judged(record: TimelineRecord) -> Judged | None:
    """The model's verdict on its previous step ({"verdict": "not_met", "note": …}) as a word."""
    judged = record.previous_step or {}
    word = VERDICT_WORDS.get(str(judged.get("verdict") or ""))
    return Judged(word, str(judged.get("note") or "")) if word is not None else None


def _resumed(record: TimelineRecord) -> ResumedFrom | None:
    """The kept answer the step's decision went on from ({"turn_id", "position"}), None when
    it asked the model (or its host was older than the mark)."""
    return ResumedFrom.from_dict(record.resumed_from)


def step_from_record(
    store: TimelineStore, task: TaskRow, record: TimelineRecord, host_id: str
) -> Step:
    """One timeline record as an export `Step`."""
    usage = None
    if record.usage:
        usage = Usage()
        for k in _USAGE_KEYS:  # the token counts (its markers, `Usage.calls`, are the cloud's)
            setattr(usage, k, int(record.usage.get(k, 0)))
    cost = record.usage.get("cost_usd") if record.usage else None
    if usage is not None and cost is not None:
        usage.cost_usd = float(cost)
    before = _png(store, record.before_screenshot_path)
    after = (
        before
        if record.after_screenshot_path == record.before_screenshot_path
        else _png(store, record.after_screenshot_path)
    )
    # The checker's verdict ({"verdict": "not_met", "evidence": …}), as a word and its evidence.
    checked = record.verdict or {}
    name = str(checked.get("verdict") or "")
    verdict = VERDICT_WORDS.get(name) if name else None
    flow = record.flow or {}
    return Step(
        attempt=record.attempt,
        step_index=record.decision_step_index or record.step_index,
        tool_name=record.tool_name or "",
        action=_action(record),
        arguments=dict(record.arguments),
        purpose=record.purpose or "",
        expected_outcome=record.expected_outcome or "",
        rationale=record.rationale or "",
        system_prompt=record.system_prompt or "",
        user_prompt=record.user_prompt or "",
        thinking=[
            ThinkingBlock(str(b.get("text", "")), bool(b.get("redacted", False)))
            for b in record.thinking
        ],
        thinking_kind=record.thinking_kind,
        provider=record.provider or "",
        model=record.model or "",
        planner_mode=record.planner_mode,
        transport=task.planner_transport,
        host_id=host_id,
        device_serial=task.device_serial,
        started_at=record.started_at,
        page=record.page or "",
        screen=_screen(record),
        usage=usage,
        cost_usd=float(cost) if cost is not None else None,
        latency_s=_latency(record),
        outcome=_outcome(record),
        verdict=verdict,
        verdict_detail=str(checked.get("evidence") or ""),
        previous_step=_judged(record),
        flow_id=str(flow.get("flow_id") or ""),
        flow_step=int(flow.get("flow_step") or 0),
        replay_divergence=str(flow.get("divergence") or ""),
        flow_set_aside=str(flow.get("set_aside") or ""),
        resumed_from=_resumed(record),
        before_png=before,
        after_png=after,
    )


def run_from_timeline(store: TimelineStore, task_id: str, host_id: str = "") -> Run | None:
    """Every attempt of `task_id` this host still holds, as one `Run`; None for a task it has
    not run (or has pruned)."""
    latest = store.get_task(task_id)
    if latest is None:
        return None
    rows = [r for n in range(1, latest.attempt + 1) if (r := store.get_task(task_id, n))]
    run = Run(
        task_id=task_id,
        goal=latest.goal,
        status=latest.status,
        result=latest.summary,
        origin="host",
        attempts={r.attempt: f"{host_id or 'this host'}/{r.device_serial}" for r in rows},
    )
    for row in rows:
        for record in store.steps(task_id, row.attempt):
            run.steps.append(step_from_record(store, row, record, host_id))
        failed, usage = store.failed_calls(task_id, row.attempt)
        if failed:
            run.failed_calls.append(FailedCalls(row.attempt, failed, usage))
        lost, at_most = store.unsettled_calls(task_id, row.attempt)
        if lost:
            run.unsettled.append(Unsettled(row.attempt, lost, at_most))
    run.sort()
    if any(s.screen is None for s in run.steps):
        run.notes.append(
            "some steps were recorded by an older host that kept no screen: their actions "
            "on named elements have no coordinates"
        )
    return run
