"""Merge a host's export into the cloud's: the cloud's record of the task, with the screenshots
and screens the host kept, the steps only the host has (attempts on the direct transport), and
the failed decisions' billed calls of whichever side counted more of them.

Steps are matched by (attempt, step index): the host records the cloud-assigned index of each
decision it got from the cloud, and a direct-transport decision shipped to the cloud gets the
index the host's loop gave it. A matched pair whose tools differ is not merged (a note says so).
"""

from __future__ import annotations

from dataclasses import replace

from export.run import FailedCalls, Run, Step
from planner.decision import MAX_THINKING_BLOCKS, whole_of


class MergeError(ValueError):
    """The exports cannot be merged (another task's export)."""


def _fill(cloud: Step, host: Step) -> Step:
    """The cloud's decision with what only the host knew: also a text the host cut to ship
    the step (the decision log's limits) that its timeline kept whole, and the thinking blocks
    the log merged into its last one past the number it keeps."""
    thinking = cloud.thinking
    if len(thinking) == len(host.thinking):
        thinking = [
            replace(c, text=whole_of(c.text, h.text))
            for c, h in zip(thinking, host.thinking, strict=True)
        ]
    elif len(thinking) == MAX_THINKING_BLOCKS < len(host.thinking):
        thinking = host.thinking  # the log merged the blocks past its limit into its last
    return replace(
        cloud,
        user_prompt=whole_of(cloud.user_prompt, host.user_prompt) or host.user_prompt,
        rationale=whole_of(cloud.rationale, host.rationale),
        purpose=whole_of(cloud.purpose, host.purpose),
        expected_outcome=whole_of(cloud.expected_outcome, host.expected_outcome),
        thinking=thinking,
        screen=cloud.screen or host.screen,
        before_png=cloud.before_png or host.before_png,
        after_png=cloud.after_png or host.after_png,
        page=cloud.page or host.page,
        started_at=host.started_at or cloud.started_at,
        device_serial=cloud.device_serial or host.device_serial,
        outcome=cloud.outcome if cloud.outcome.executed is not None else host.outcome,
        verdict=cloud.verdict if cloud.verdict is not None else host.verdict,
        verdict_detail=cloud.verdict_detail or host.verdict_detail,
        transport=cloud.transport or host.transport,
        system_prompt=cloud.system_prompt or host.system_prompt,
        previous_step=cloud.previous_step or host.previous_step,
        flow_id=cloud.flow_id or host.flow_id,
        flow_step=cloud.flow_step or host.flow_step,
        replay_divergence=cloud.replay_divergence or host.replay_divergence,
        flow_set_aside=cloud.flow_set_aside or host.flow_set_aside,
        resumed_from=cloud.resumed_from or host.resumed_from,
    )


def merge(cloud: Run, *hosts: Run) -> Run:
    """`cloud` completed from `hosts` (their order decides between two hosts claiming one step)."""
    by_key: dict[tuple[int, int], Step] = {}
    for host in hosts:
        if host.task_id != cloud.task_id:
            raise MergeError(f"the host export is of task {host.task_id!r}, not {cloud.task_id!r}")
        for step in host.steps:
            by_key.setdefault(step.key, step)
    merged = replace(cloud, steps=[], origin="cloud+host", attempts=dict(cloud.attempts))
    merged.notes = [n for n in cloud.notes if "direct transport" not in n]
    for step in cloud.steps:
        host_step = by_key.pop(step.key, None)
        if host_step is None:
            merged.steps.append(step)
        elif host_step.tool_name != step.tool_name:
            merged.steps.append(step)
            merged.notes.append(
                f"attempt {step.attempt} step {step.step_index}: the host recorded "
                f"{host_step.tool_name!r} where the cloud logged {step.tool_name!r}; the "
                "host's screenshots were not attached"
            )
        else:
            merged.steps.append(_fill(step, host_step))
    merged.steps.extend(by_key.values())  # steps only a host has (direct transport)
    for host in hosts:
        for attempt, where in host.attempts.items():
            merged.attempts.setdefault(attempt, where)
    merged.failed_calls = _failed_calls(cloud, *hosts)
    merged.pruned = cloud.pruned  # a host's export knows nothing of the cloud's retention
    merged.unsettled = cloud.unsettled  # nor of the calls of unknown cost (the cloud's record)
    merged.sort()
    return merged


def _failed_calls(*runs: Run) -> list[FailedCalls]:
    """Per attempt, the record that counts the most failed decisions (the first, the cloud's,
    when they count as many): a host's outbox may still hold some the cloud has not counted,
    and a host knows nothing of another's."""
    best: dict[int, FailedCalls] = {}
    for run in runs:
        for f in run.failed_calls:
            if f.attempt not in best or f.decisions > best[f.attempt].decisions:
                best[f.attempt] = f
    return [best[a] for a in sorted(best)]
