"""One neutral record of a run, whichever side it was read from.

The host's timeline has the screenshots and the screens; the cloud has the decisions of every
host. Both become a `Run` (see `host/timeline/export_source.py` and `export/cloud_source.py`), and
every exported file is made from a `Run` alone, so a report reads the same from either side and
two runs of one task can be merged (`export/merge.py`).

Sensitive input never enters a `Run`: the sources hand over masked actions, and `Step.__post_init__`
masks again whatever a source forgot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from amc.v1 import types_pb2
from planner.decision import ResumedFrom, ThinkingBlock, Usage
from planner.scene import Scene
from planner.secret_refs import stored

Origin = Literal["host", "cloud", "cloud+host"]


@dataclass(slots=True)
class Outcome:
    """What executing the step's action did. `executed` is None when nobody reported it (the
    last decision of an attempt, or a cloud record whose host never sent the outcome)."""

    executed: bool | None = None
    error: str = ""
    #: What the driver reported (JSON from the host, e.g. `{"point": [540, 1212]}`), may be "".
    driver_output: str = ""


@dataclass(frozen=True, slots=True)
class Judged:
    """The model's verdict on its previous step's expected outcome, as it gave it."""

    #: "met", "not met" or "unknown" (`planner.verify.WORDS`).
    verdict: str
    note: str = ""


@dataclass(slots=True)
class Step:
    """One step of one attempt: what the model saw, thought, chose, and what came of it."""

    attempt: int
    step_index: int
    tool_name: str
    #: The typed action, intent stripped, a sensitive text already "•••".
    action: types_pb2.Action
    #: The tool call's arguments as stored (masked), purpose and expected outcome removed.
    arguments: dict[str, object] = field(default_factory=dict)
    purpose: str = ""
    expected_outcome: str = ""
    rationale: str = ""
    #: What we asked the model: the prompts sent, sensitive input already masked where they
    #: were recorded ("" when the source has none: a replayed step, an older record). In session
    #: mode `user_prompt` is what this step added to the kept conversation.
    system_prompt: str = ""
    user_prompt: str = ""
    thinking: list[ThinkingBlock] = field(default_factory=list)
    #: "full" | "summarized" | "omitted" | "redacted" | "none" | "" (not recorded).
    thinking_kind: str = ""
    provider: str = ""
    model: str = ""
    #: "compact" or "session".
    planner_mode: str = ""
    #: "cloud" or "direct": where the decision was made ("" when the source does not say).
    transport: str = ""
    host_id: str = ""
    device_serial: str = ""
    started_at: str = ""
    page: str = ""
    #: The screen the decision was made on (elements, size); None when the source lacks it
    #: (the cloud keeps no screens).
    screen: Scene | None = None
    usage: Usage | None = None
    latency_s: float | None = None
    #: US dollars for the step's model calls; None until a price is known (issue 15 adds
    #: prices), and the files then leave it out rather than print a made-up number.
    cost_usd: float | None = None
    outcome: Outcome = field(default_factory=Outcome)
    #: The verification verdict of this step, when a checker gave one (None: none given).
    verdict: str | None = None
    verdict_detail: str = ""
    #: The model's own verdict on the step before this one ("met", "not met", "unknown"; None
    #: when it gave none) and its note: what it believed its last action did.
    previous_step: Judged | None = None
    #: A learned flow's step replayed without the model: the flow and its 1-based step. On the
    #: model's step that took over from a replay: the flow and step that diverged, and why
    #: (`replay_divergence`, as the model's prompt said it).
    flow_id: str = ""
    flow_step: int = 0
    replay_divergence: str = ""
    #: On the model's step where a replay set its flow aside uncounted (no divergence: the
    #: phone part-way through it, a switch already set, another language): why
    #: (`Decision.flow_set_aside`); the flow and step are the ones set aside.
    flow_set_aside: str = ""
    #: Set when the step's decision did not ask the model again: it went on from an answer an
    #: earlier decision of the step kept, was billed for and failed after (its rationale and
    #: thinking were written for that earlier request). None: the decision asked the model.
    resumed_from: ResumedFrom | None = None
    before_png: bytes | None = None
    after_png: bytes | None = None

    def __post_init__(self) -> None:
        if self.sensitive:
            self.action.input_text.text = stored(self.action.input_text.text)
            if "text" in self.arguments:
                self.arguments = {**self.arguments, "text": stored(self.arguments["text"])}

    @property
    def sensitive(self) -> bool:
        """The step typed a sensitive value (its text is never in the record)."""
        return self.action.WhichOneof("kind") == "input_text" and (
            self.action.input_text.sensitive or bool(self.arguments.get("sensitive"))
        )

    @property
    def key(self) -> tuple[int, int]:
        return (self.attempt, self.step_index)


@dataclass(frozen=True, slots=True)
class FailedCalls:
    """The answered model calls of one attempt's decisions that failed (a refusal, no usable
    tool call, a provider error after billed answers): no step is recorded for them, yet the
    provider billed them and the task's totals count them."""

    attempt: int
    #: How many decisions failed after billed calls.
    decisions: int
    #: Their calls' tokens and cost (`usage.cost_usd`), summed.
    usage: Usage


@dataclass(frozen=True, slots=True)
class Pruned:
    """What the cloud's retention deleted of the task's decision log (ListDecisionsResponse.
    pruned): no step is recorded for them, yet the task's totals count them."""

    #: Decisions deleted.
    decisions: int
    #: Failed decisions whose billed calls' records were deleted.
    failed_decisions: int
    #: When the retention last deleted some (UTC), None when not known.
    at: datetime | None
    #: What the deleted rows cost (`usage.cost_usd` too).
    usage: Usage


@dataclass(frozen=True, slots=True)
class Unsettled:
    """One attempt's model calls whose cost was never recorded (decision 0080: the process
    making them died, or their answer was lost after the request went out): the provider may
    have billed them. Not in the run's total, which counts what providers reported."""

    attempt: int
    calls: int
    #: The most they can have cost (`planner.unsettled.at_most`; `at_most.cost_usd` too).
    at_most: Usage


@dataclass(slots=True)
class Run:
    """A task's run as exported: its goal and result, and its steps in (attempt, step) order."""

    task_id: str
    goal: str
    #: "succeeded", "failed", "cancelled", "running", ... as the source names it.
    status: str
    result: str
    steps: list[Step] = field(default_factory=list)
    origin: Origin = "host"
    #: Attempts the steps come from, with where each ran: {attempt: "host/phone"}.
    attempts: dict[int, str] = field(default_factory=dict)
    #: What the export could not include, for the reader ("no screenshots: ...").
    notes: list[str] = field(default_factory=list)
    #: Per attempt (in order), what its failed decisions' calls cost.
    failed_calls: list[FailedCalls] = field(default_factory=list)
    #: What the cloud's retention deleted of the log, None when nothing was.
    pruned: Pruned | None = None
    #: Per attempt (in order, those with some), its calls of unknown cost.
    unsettled: list[Unsettled] = field(default_factory=list)

    def sort(self) -> None:
        self.steps.sort(key=lambda s: s.key)

    def total(self) -> tuple[Usage, float | None]:
        """What every model call of the run cost: the steps', the failed decisions' and what
        the retention deleted, the task's totals as the cloud counts them. The cost is None when
        a step's price is not known (a step recorded before prices existed): a sum without it
        would be made up."""
        usage = Usage()
        deleted = [self.pruned.usage] if self.pruned is not None else []
        for part in (
            [s.usage for s in self.steps if s.usage is not None]
            + [f.usage for f in self.failed_calls]
            + deleted
        ):
            usage.add(part)
        costs = [s.cost_usd for s in self.steps]  # a step's price is its cost_usd, not usage's
        usage.cost_usd = sum(c for c in costs if c is not None)
        usage.cost_usd += sum(f.usage.cost_usd for f in self.failed_calls)
        usage.cost_usd += sum(u.cost_usd for u in deleted)
        return usage, usage.cost_usd if None not in costs else None
