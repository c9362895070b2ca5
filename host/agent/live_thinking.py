"""The model's thinking as it streams, per running attempt, for the host's local console.

Only the direct transport in session mode calls the model from the host, so only there is there
anything to show (on the cloud transport the cloud streams it to the operators' console). The
text is a live view: bounded, kept in memory, replaced when the next step is planned and
dropped when the attempt ends — what is kept is the decision's thinking in the timeline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from planner.decision import Decision
from planner.history import WorldEvent
from planner.scene import Scene

LIMIT = 16_384  # characters kept per attempt: the newest text wins


class LiveThinking:
    """Thinking text per (task, attempt) while a step is planned."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._text: dict[tuple[str, int], str] = {}

    def sink(self, task_id: str, attempt: int) -> Callable[[str], None]:
        """The callback a streaming planner feeds deltas to."""

        def add(delta: str) -> None:
            key = (task_id, attempt)
            self._text[key] = (self._text.get(key, "") + delta)[-self._limit :]

        return add

    def text(self, task_id: str, attempt: int) -> str:
        return self._text.get((task_id, attempt), "")

    def clear(self, task_id: str, attempt: int) -> None:
        self._text.pop((task_id, attempt), None)


class ClearingPlanner:
    """A `StepPlanner` that clears an attempt's live thinking when a new step is planned, so
    the console shows the latest step's thinking only."""

    def __init__(self, inner: Any, live: LiveThinking, task_id: str, attempt: int) -> None:
        self._inner = inner
        self._live = live
        self._key = (task_id, attempt)

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        self._live.clear(*self._key)
        decision: Decision = await self._inner.decide(goal, scene, history, screenshot)
        return decision
