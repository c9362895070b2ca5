"""What one planning call produced, independent of provider and transport."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amc.v1 import types_pb2


@dataclass(frozen=True, slots=True)
class ThinkingBlock:
    """One reasoning block. `redacted` blocks carry no readable text (redacted_thinking)."""

    text: str
    redacted: bool = False


@dataclass(slots=True)
class Usage:
    """Token usage summed over every provider call a decision needed."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    thinking_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_input_tokens += other.cache_read_input_tokens
        self.cache_creation_input_tokens += other.cache_creation_input_tokens
        self.thinking_tokens += other.thinking_tokens


@dataclass(slots=True)
class Decision:
    """One step's decision with everything an auditor needs.

    `arguments` are the executable arguments: `purpose` and `expected_outcome` are removed from
    them and carried beside, and a sensitive `input_text` value is present here (it must run) but
    masked by `masked_arguments()` for anything that is stored or logged.
    """

    tool_name: str
    arguments: dict[str, Any]
    action: types_pb2.Action
    purpose: str
    expected_outcome: str
    rationale: str | None
    thinking: list[ThinkingBlock]
    usage: Usage
    provider: str
    model: str
    latency_s: float
    forced_retry: bool
    system_prompt: str
    user_prompt: str
    corrective_retries: int = 0
    step_index: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Page of the screen the decision was made on, and the label of the element its action
    #: names: what the attempt's later history says about this step (set by `plan_step`).
    page: str = ""
    target: str | None = None

    @property
    def planner_mode(self) -> str:
        """ "session" when the model saw a kept conversation (`user_prompt` is then this step's
        addition to it), else "compact" (the prompts were the whole request)."""
        return "session" if self.extra.get("mode") == "session" else "compact"

    @property
    def sensitive(self) -> bool:
        return bool(self.arguments.get("sensitive")) and self.tool_name == "input_text"

    def masked_arguments(self) -> dict[str, Any]:
        """Arguments safe to store: a sensitive text becomes "•••"."""
        if self.sensitive:
            return {**self.arguments, "text": "•••"}
        return dict(self.arguments)
