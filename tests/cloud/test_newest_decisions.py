"""An attempt's decision log read newest first, and its step and verdict counts from one
grouped count, on both backends.

The console's task page shows an attempt's newest 50 steps and its whole verdict counts, yet
read the attempt's whole log (up to 5,000 decisions with their prompts) to get them.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from amc.v1 import types_pb2
from cloud.store import decisions, tasks
from cloud.store.database import Store
from cloud.store.paging import ELSEWHERE
from tests.cloud.test_store import _decision


async def _logged(store: Store, tools: list[str], attempt: int = 1) -> str:
    view, _ = await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
    )
    task_id = view.task.task_id
    for tool in tools:
        await decisions.append(
            store, "h1", task_id, attempt, dataclasses.replace(_decision(), tool_name=tool)
        )
    return task_id


async def test_newest_first_pages_walk_an_attempt_backwards_once_each(store: Store) -> None:
    task_id = await _logged(store, ["tap"] * 7)
    await decisions.append(store, "h1", task_id, 2, _decision())  # another attempt's
    seen: list[int] = []
    rows, token = await decisions.list_page(store, task_id, 1, 3, "", newest_first=True)
    seen += [r.step_index for r in rows]
    while token:
        rows, token = await decisions.list_page(store, task_id, 1, 3, token, newest_first=True)
        seen += [r.step_index for r in rows]
    assert seen == [7, 6, 5, 4, 3, 2, 1]
    everything, _ = await decisions.list_page(store, task_id, 0, 10, "", newest_first=True)
    assert [(r.attempt, r.step_index) for r in everything][:2] == [(2, 1), (1, 7)]
    # A token of one order is not a position of the other: its page would skip or repeat.
    _, ascending = await decisions.list_page(store, task_id, 1, 3, "")
    with pytest.raises(ValueError, match=re.escape(ELSEWHERE)):
        await decisions.list_page(store, task_id, 1, 3, ascending, newest_first=True)


async def test_step_counts_are_the_whole_attempts_by_verdict(store: Store) -> None:
    task_id = await _logged(store, ["tap", "tap", "get_ui_tree", "tap", "tap", "complete"])
    await decisions.append(store, "h1", task_id, 2, _decision())
    for step, verdict in [(1, types_pb2.VERDICT_MET), (2, types_pb2.VERDICT_NOT_MET)]:
        outcome = types_pb2.ActionOutcome(step_index=step, executed=True, verdict=verdict)
        assert await decisions.record_outcome(store, task_id, 1, outcome)
    first, second = await decisions.step_counts(store, task_id)
    assert (first.attempt, first.decisions, second.attempt, second.decisions) == (1, 6, 2, 1)
    # `complete` and `get_ui_tree` do nothing to the screen: no verdict is counted for them.
    assert dict(first.verdicts) == {"met": 1, "not_met": 1, None: 2}
    (only,) = await decisions.step_counts(store, task_id, 2)
    assert (only.attempt, only.decisions, dict(only.verdicts)) == (2, 1, {None: 1})
    assert await decisions.step_counts(store, task_id, 3) == []
