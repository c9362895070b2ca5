"""The cloud's side of a run: the task and its decision log, as an operator reads them.

The cloud keeps every host's decisions with the screen each was made on (elements, size), those
of the direct transport shipped from the hosts' outboxes included, and each step's screenshots
in its artifact store. Screenshots come from a `ScreenshotSource` (the consoles pass their
cloud client, which reads ArtifactService; `NO_SCREENSHOTS` when there is none); a step whose
screenshots have not arrived exports without them, and a host's export merged in
(`export/merge.py`) supplies them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC
from typing import Literal, Protocol

from amc.v1 import decision_log_service_pb2, types_pb2
from export.run import FailedCalls, Judged, Outcome, Pruned, Run, Step, Unsettled
from planner.convert import resumed_from_proto, thinking_kind_from_proto, usage_from_proto
from planner.decision import ThinkingBlock, Usage
from planner.observation import scene_from_observation
from planner.verify import WORDS as VERDICT_WORDS
from planner.verify import verdict_from_proto

Which = Literal["before", "after"]


class ScreenshotSource(Protocol):
    """Where the cloud export gets a step's screenshot (PNG bytes), None when it has none."""

    async def screenshot(
        self, task_id: str, attempt: int, step_index: int, which: Which
    ) -> bytes | None: ...


class _NoScreenshots:
    """The cloud keeps no screenshots (yet): every step exports without one."""

    async def screenshot(
        self, task_id: str, attempt: int, step_index: int, which: Which
    ) -> bytes | None:
        return None


NO_SCREENSHOTS: ScreenshotSource = _NoScreenshots()

_TRANSPORTS = {
    types_pb2.PLANNER_TRANSPORT_CLOUD: "cloud",
    types_pb2.PLANNER_TRANSPORT_DIRECT: "direct",
}


def status_word(status: types_pb2.TaskStatus.ValueType) -> str:
    """`TASK_STATUS_SUCCEEDED` -> "succeeded" (the host timeline's words)."""
    return types_pb2.TaskStatus.Name(status).removeprefix("TASK_STATUS_").lower()


def _arguments(d: types_pb2.Decision) -> dict[str, object]:
    try:
        value = json.loads(d.arguments_json) if d.arguments_json else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def step_from_decision(d: types_pb2.Decision, attempt: types_pb2.Attempt | None) -> Step:
    """One logged decision as a `Step` (no screen, no screenshots)."""
    kind = (
        thinking_kind_from_proto(d.thinking_kind)
        if d.thinking_kind != types_pb2.THINKING_KIND_UNSPECIFIED
        else ""
    )
    u = d.usage
    outcome = (
        Outcome(d.outcome.executed, d.outcome.error, d.outcome.driver_output)
        if d.HasField("outcome")
        else Outcome()
    )
    action = types_pb2.Action()
    action.CopyFrom(d.action)
    action.ClearField("purpose")
    action.ClearField("expected_outcome")
    screen = scene_from_observation(d.observation) if d.HasField("observation") else None
    return Step(
        attempt=d.attempt,
        step_index=d.step_index,
        tool_name=d.tool_name,
        action=action,
        arguments=_arguments(d),
        purpose=d.purpose,
        expected_outcome=d.expected_outcome,
        rationale=d.rationale,
        system_prompt=d.system_prompt,
        user_prompt=d.user_prompt,
        thinking=[ThinkingBlock(b.text, b.redacted) for b in d.thinking],
        thinking_kind=kind,
        provider=d.provider,
        model=d.model,
        planner_mode=d.planner_mode,
        transport=_TRANSPORTS.get(attempt.planner_transport, "") if attempt else "",
        host_id=d.host_id,
        device_serial=attempt.device_serial if attempt else "",
        started_at=d.created_at.ToJsonString() if d.HasField("created_at") else "",
        page=screen.page if screen is not None else "",
        screen=screen,
        usage=Usage(
            u.input_tokens,
            u.output_tokens,
            u.cache_read_input_tokens,
            u.cache_creation_input_tokens,
            u.thinking_tokens,
            u.cost_usd,
        ),
        cost_usd=u.cost_usd,
        latency_s=d.latency.ToNanoseconds() / 1e9 if d.HasField("latency") else None,
        outcome=outcome,
        verdict=_verdict(d),
        verdict_detail=d.verification.evidence,
        previous_step=_judged(d.previous_step) if d.HasField("previous_step") else None,
        flow_id=d.flow_id,
        flow_step=d.flow_step,
        replay_divergence=d.replay_divergence,
        flow_set_aside=d.flow_set_aside,
        resumed_from=resumed_from_proto(d),
    )


def _verdict(d: types_pb2.Decision) -> str | None:
    """The checker's verdict as a word ("met", "not met", "unknown"), None when unchecked."""
    name = verdict_from_proto(d.verification.verdict)
    return VERDICT_WORDS[name] if name is not None else None


def _judged(judgement: types_pb2.StepJudgement) -> Judged | None:
    """The model's verdict on its previous step as a word, None when it gave none."""
    name = verdict_from_proto(judgement.verdict)
    return Judged(VERDICT_WORDS[name], judgement.note) if name is not None else None


async def run_from_cloud(
    task: types_pb2.Task,
    decisions: Sequence[types_pb2.Decision],
    screenshots: ScreenshotSource = NO_SCREENSHOTS,
    failed_calls: Sequence[decision_log_service_pb2.FailedCalls] = (),
    pruned: decision_log_service_pb2.PrunedRecord | None = None,
) -> Run:
    """The run as the cloud knows it: the task's goal and result, every logged decision, what
    the failed decisions' billed calls cost (ListDecisionsResponse.failed_calls) and each
    attempt's calls of unknown cost (`Attempt.unsettled`)."""
    attempts = {a.attempt: a for a in task.attempts}
    run = Run(
        task_id=task.task_id,
        goal=task.goal,
        status=status_word(task.status),
        result=task.result_summary,
        origin="cloud",
        attempts={n: f"{a.host_id}/{a.device_serial}" for n, a in attempts.items()},
        failed_calls=[
            FailedCalls(f.attempt, f.decisions, usage_from_proto(f.usage)) for f in failed_calls
        ],
        pruned=None
        if pruned is None
        else Pruned(
            pruned.decisions,
            pruned.failed_decisions,
            pruned.pruned_at.ToDatetime(tzinfo=UTC) if pruned.HasField("pruned_at") else None,
            usage_from_proto(pruned.usage),
        ),
        unsettled=[
            Unsettled(n, a.unsettled.calls, usage_from_proto(a.unsettled.at_most))
            for n, a in sorted(attempts.items())
            if a.unsettled.calls
        ],
    )
    for d in decisions:
        step = step_from_decision(d, attempts.get(d.attempt))
        step.before_png = await screenshots.screenshot(
            task.task_id, d.attempt, d.step_index, "before"
        )
        step.after_png = await screenshots.screenshot(
            task.task_id, d.attempt, d.step_index, "after"
        )
        run.steps.append(step)
    run.sort()
    direct = sorted(
        n for n, a in attempts.items() if _TRANSPORTS.get(a.planner_transport) == "direct"
    )
    logged = {s.attempt for s in run.steps}
    missing = [n for n in direct if n not in logged]
    if missing:
        run.notes.append(
            f"attempt {', '.join(map(str, missing))} ran on the direct transport and none of its "
            "decisions has reached the cloud yet (its host ships them from its outbox); merge "
            "that host's export to include them"
        )
    return run
