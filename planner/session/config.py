"""The session's own knobs (how a session talks to its model is its adapter's business).

These are plain values; `planner/settings.py` (owned by the planner settings class) maps the
environment onto them: `AMC_PLANNER_MODE=session` selects session mode, and the
`AMC_PLANNER_SESSION_*` names listed on `SessionConfig` tune it.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.conversation.turns import ForeignReasoning


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Session-mode knobs, each with its environment name for the planner settings class.

    - `keep_scenes` (`AMC_PLANNER_SESSION_KEEP_SCENES`, default 6): the context budget. Full
      observations accumulate up to twice this number; then a checkpoint condenses all but the
      last `keep_scenes` (and, for Anthropic, retires the reasoning made before it). Cutting in
      steps keeps the request prefix identical in between, which preserved thinking and prompt
      caching both need. None never condenses.
    - `keep_reasoning_turns` (`AMC_PLANNER_SESSION_KEEP_REASONING_TURNS`, default None = all):
      OpenAI Responses only — encrypted reasoning of turns before the last N is not sent back.
      (Anthropic thinking is bound to its prefix, so it is only retired at checkpoints.)
    - `foreign_reasoning` (`AMC_PLANNER_SESSION_FOREIGN_REASONING`, `drop` | `text`): what happens
      to reasoning another provider made after a provider switch.
    - `stream` (`AMC_PLANNER_SESSION_STREAM`): stream responses and forward live thinking.
    - `max_tokens` (`AMC_PLANNER_MAX_TOKENS`): output token limit per call.
    """

    keep_scenes: int | None = 6
    keep_reasoning_turns: int | None = None
    foreign_reasoning: ForeignReasoning = "drop"
    stream: bool = False
    max_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.foreign_reasoning not in ("drop", "text"):
            raise ValueError(
                f"foreign_reasoning must be drop or text, got {self.foreign_reasoning!r}"
            )
        if self.keep_scenes is not None and self.keep_scenes < 1:
            raise ValueError(f"keep_scenes must be at least 1 (or None), got {self.keep_scenes}")
        if self.keep_reasoning_turns is not None and self.keep_reasoning_turns < 1:
            raise ValueError(
                "keep_reasoning_turns must be at least 1 (or None), "
                f"got {self.keep_reasoning_turns}"
            )
