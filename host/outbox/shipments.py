"""What the agent loop hands the outbox, as the cloud's requests: a step's decision (direct
transport), its outcome once the action ran, what a failed decision's answered model calls cost
(direct transport), the model calls whose cost the host never learned (direct transport:
`host.outbox.calls`), and its before/after screenshots (both transports).

Everything is masked here as it is for the timeline: the decision's sensitive text by
`decision_to_proto` (the typed action and the arguments), anything typed as sensitive earlier
in the task by the loop's redactor (`redact`) over every text field; screenshots arrive already
painted over by the loop. Writes are one row each, durable when the call returns.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from amc.v1 import artifact_service_pb2, decision_log_service_pb2, types_pb2
from cloud.wire import keep_texts
from host.outbox.calls import OutboxCallLedger, unsettled_calls
from host.outbox.kinds import DECISION, FAILED_CALLS, SCREENSHOT, UNSETTLED
from host.outbox.store import OutboxStore
from host.timeline.store import UnsettledCall
from planner.convert import decision_to_proto, usage_to_proto
from planner.decide_limits import MAX_USER_PROMPT
from planner.decision import (
    ACTION_TEXT_LIMITS,
    MAX_MODEL_TEXT,
    MAX_THINKING_BLOCK_BYTES,
    Billed,
    Decision,
    kept,
)
from planner.scene import Bounds

Redact = Callable[[str], str]
Phase = Literal["before", "after"]
_PHASES = {
    "before": artifact_service_pb2.SCREENSHOT_PHASE_BEFORE,
    "after": artifact_service_pb2.SCREENSHOT_PHASE_AFTER,
}


@dataclass(frozen=True, slots=True)
class StepRef:
    """How the cloud names a step's decision: its own id (cloud transport) or the id this host
    shipped it with (direct transport)."""

    task_id: str
    attempt: int
    lease_id: str
    decision_id: str = ""
    host_decision_id: str = ""


class Shipments:
    """The outbox seen from the agent loop. `transport` says who logs decisions: the cloud
    itself ("cloud": only screenshots are shipped) or this host ("direct")."""

    def __init__(
        self,
        store: OutboxStore,
        transport: Literal["direct", "cloud"],
        *,
        screenshots: bool = True,
    ) -> None:
        self.store = store
        self.transport = transport
        self.screenshots = screenshots

    def decision(
        self, task_id: str, attempt: int, lease_id: str, decision: Decision, redact: Redact
    ) -> StepRef | None:
        """Ship a decision just made (direct transport); the step's reference either way, None
        when the cloud cannot name it (a planner that gave no decision id on the cloud
        transport, or no lease to ship under)."""
        if not lease_id:
            return None
        if self.transport == "cloud":
            decision_id = str(decision.extra.get("decision_id") or "")
            return (
                StepRef(task_id, attempt, lease_id, decision_id=decision_id)
                if decision_id
                else None
            )
        ref = StepRef(task_id, attempt, lease_id, host_decision_id=uuid.uuid4().hex)
        self._put_decision(ref, decision, redact, None)
        return ref

    def outcome(
        self,
        ref: StepRef,
        decision: Decision,
        redact: Redact,
        outcome: types_pb2.ActionOutcome,
    ) -> None:
        """Ship the decision again with what executing it did (direct transport only: the
        cloud transport reports outcomes with the next Decide)."""
        if ref.host_decision_id:
            self._put_decision(ref, decision, redact, outcome)

    def call_ledger(self, task_id: str, attempt: int, lease_id: str) -> OutboxCallLedger | None:
        """Where a decision's model calls are written down before they are made (direct
        transport only: on the cloud transport the cloud makes them)."""
        if self.transport != "direct" or not lease_id:
            return None
        return OutboxCallLedger(self.store, task_id, attempt, lease_id)

    def release_calls(self, call_ids: list[str]) -> list[UnsettledCall]:
        """Ship the markers among `call_ids` still open: their calls ended without the host
        learning their cost (the provider may have billed them). The calls shipped."""
        return unsettled_calls(self.store.release_calls(UNSETTLED, call_ids))

    def failed_calls(
        self, task_id: str, attempt: int, lease_id: str, billed: Billed, error: str
    ) -> None:
        """Ship what a failed decision's answered model calls cost (direct transport only: the
        cloud counts its own): the provider billed them, and the task's budget, the fleet's
        daily cap and GetSpend must see them though no decision is logged."""
        if self.transport != "direct" or not lease_id:
            return
        record = decision_log_service_pb2.ShippedFailedCalls(
            host_spend_id=uuid.uuid4().hex,
            task_id=task_id,
            attempt=attempt,
            lease_id=lease_id,
            provider=billed.provider,
            model=billed.model,
            usage=usage_to_proto(billed.usage),
            error=error[:64],
            # A call shipped earlier as of unknown cost (its answer came late) is settled by it.
            settles_calls=billed.usage.calls,
        )
        self.store.put(
            FAILED_CALLS,
            record.host_spend_id,
            record.SerializeToString(),
            settles=billed.usage.calls,
        )

    def screenshot(
        self, ref: StepRef, phase: Phase, png: bytes, target: Bounds | None = None
    ) -> None:
        """Ship one screenshot of the step (already scrubbed of sensitive text)."""
        if not self.screenshots:
            return
        request = artifact_service_pb2.UploadStepScreenshotRequest(
            task_id=ref.task_id,
            attempt=ref.attempt,
            lease_id=ref.lease_id,
            phase=_PHASES[phase],
            content_type="image/png",
            data=png,
        )
        if ref.host_decision_id:
            request.host_decision_id = ref.host_decision_id
        else:
            request.decision_id = ref.decision_id
        if target is not None:
            request.marks.target.CopyFrom(
                types_pb2.Rect(
                    left=target.left, top=target.top, right=target.right, bottom=target.bottom
                )
            )
        item_id = f"{ref.host_decision_id or ref.decision_id}-{phase}"
        self.store.put(SCREENSHOT, item_id, request.SerializeToString())

    def _put_decision(
        self,
        ref: StepRef,
        decision: Decision,
        redact: Redact,
        outcome: types_pb2.ActionOutcome | None,
    ) -> None:
        message = decision_to_proto(decision)  # masked: never reveals a sensitive value
        prompt = redact(message.user_prompt)
        message.user_prompt = kept(prompt, MAX_USER_PROMPT, "the prompt the model read")
        message.system_prompt = redact(message.system_prompt)
        for name in ("rationale", "purpose", "expected_outcome"):
            said = redact(getattr(message, name))
            setattr(message, name, kept(said, MAX_MODEL_TEXT, f"this {name.replace('_', ' ')}"))
        # What to type, a reason, an id, a purpose: the model's writing too, at any length.
        keep_texts(message.action, "action.", MAX_MODEL_TEXT, redact, ACTION_TEXT_LIMITS)
        for block in message.thinking:
            thought = redact(block.text)
            block.text = kept(thought, MAX_THINKING_BLOCK_BYTES, "this thinking block")
        if decision.observation is not None:  # the screen as data, as the cloud keeps its own
            message.observation.CopyFrom(decision.observation)
            message.observation.ClearField("ocr_blocks")
        entry = decision_log_service_pb2.ShippedDecision(
            host_decision_id=ref.host_decision_id,
            task_id=ref.task_id,
            attempt=ref.attempt,
            lease_id=ref.lease_id,
            decision=message,
        )
        if outcome is not None:
            entry.outcome.CopyFrom(outcome)
        self.store.put(
            DECISION, ref.host_decision_id, entry.SerializeToString(), settles=decision.usage.calls
        )
