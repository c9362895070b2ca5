"""What the agent loop learns about each step after it ran: the checker's verdict, and how a
replayed learned flow went (reported to the cloud with the result on the direct transport)."""

from __future__ import annotations

from dataclasses import dataclass

from amc.v1 import types_pb2
from planner.decision import Decision
from planner.flows.replay import MODE as REPLAY_MODE
from planner.observation import clip
from planner.scene import Scene
from planner.verify import MAX_EVIDENCE_BYTES, Check, verify


def check_step(decision: Decision, ran: bool, before: Scene, after: Scene | None) -> Check | None:
    """The checker's verdict on a step that ran and was meant to change the screen; None for
    one that did not run (its outcome says why) or states no expected outcome."""
    if not ran or not decision.expected_outcome:
        return None
    if decision.tool_name in ("complete", "get_ui_tree"):
        return None
    if after is None:
        return Check("unknown", "the screen after the action could not be read")
    return verify(
        decision.expected_outcome,
        decision.tool_name,
        decision.masked_arguments(),
        after,
        before,
    )


@dataclass(slots=True)
class ReplayTally:
    """Counts the replayed steps of an attempt and notes where a replay handed over."""

    flow_id: str = ""
    steps_replayed: int = 0
    diverged_at: int = 0
    reason: str = ""
    #: The last step seen was the flow's replayed `complete`: the replay ran to its end. A
    #: replay that stopped without a divergence (a switch already set, the flow withdrawn) and
    #: was finished by the model did not, and the cloud must not count it as one.
    completed: bool = False

    def saw(self, decision: Decision) -> None:
        self.completed = decision.planner_mode == REPLAY_MODE and decision.tool_name == "complete"
        if decision.planner_mode == REPLAY_MODE:
            self.flow_id = decision.flow_id  # the flow it is on (it may go on with another)
            if decision.tool_name != "complete":
                self.steps_replayed += 1
        elif decision.replay_divergence and not self.diverged_at:
            self.flow_id = decision.flow_id
            self.diverged_at = decision.flow_step
            self.reason = decision.replay_divergence

    def report(self) -> types_pb2.FlowReplayReport | None:
        """The result's `replay` field; None when no flow was replayed or handed over."""
        if not self.flow_id:
            return None
        return types_pb2.FlowReplayReport(
            flow_id=self.flow_id,
            steps_replayed=self.steps_replayed,
            diverged=bool(self.diverged_at),
            diverged_at_step=self.diverged_at,
            reason=clip(self.reason, MAX_EVIDENCE_BYTES),
            completed=self.completed,
        )
