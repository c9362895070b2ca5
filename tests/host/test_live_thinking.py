"""The host's live view of the model's thinking: per attempt, bounded, replaced per step."""

from __future__ import annotations

from typing import Any

from host.agent.live_thinking import ClearingPlanner, LiveThinking
from planner.scene import Scene

SCENE = Scene(elements=[], package="", page_title="", screen_width=1080, screen_height=2400)


class Thinker:
    """A planner that streams a thought per decision into the sink (as SessionPlanner does)."""

    def __init__(self, sink: Any, live: LiveThinking) -> None:
        self.sink = sink
        self.live = live
        self.seen_before: list[str] = []

    async def decide(self, goal: str, scene: Any, history: Any = (), screenshot: Any = None) -> Any:
        self.seen_before.append(self.live.text("t", 1))
        self.sink(f"thinking about {goal}")
        return goal


async def test_each_step_replaces_the_last_and_other_attempts_are_apart() -> None:
    live = LiveThinking(limit=64)
    inner = Thinker(live.sink("t", 1), live)
    planner = ClearingPlanner(inner, live, "t", 1)
    live.sink("t", 2)("another attempt")

    await planner.decide("step one", SCENE)
    assert live.text("t", 1) == "thinking about step one"  # readable while the step acts
    await planner.decide("step two", SCENE)
    assert inner.seen_before == ["", ""]  # cleared when each step's planning began
    assert live.text("t", 1) == "thinking about step two"
    assert live.text("t", 2) == "another attempt"

    live.sink("t", 1)("x" * 100)
    assert live.text("t", 1) == "x" * 64  # bounded: the newest text wins
    live.clear("t", 1)
    assert live.text("t", 1) == ""
