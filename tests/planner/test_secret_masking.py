"""Where a sensitive typed text is stored or shown: a lone `{{secret:NAME}}` reference is kept
(it is no secret, and a learned flow types it again), any other text is "•••" — in every place
that masks, which all go through `secret_refs.stored`."""

from __future__ import annotations

from typing import Any

import pytest

from amc.v1 import types_pb2
from export.run import Step
from host.agent.actions import action_to_record
from host.console.present import mask_sensitive as present_masked
from host.timeline.record import mask_text_arguments
from planner.convert import masked_action
from planner.decision import Decision, Usage
from planner.describe import describe
from planner.flows.synthesis import SourceStep, synthesize
from planner.history import WorldEvent
from planner.prompts import compact_history
from planner.vendors.base import mask_sensitive

MASK = "•••"
#: Sensitive texts that are, or hold, something besides one reference: masked whole.
MIXED = [
    "1234 {{secret:pin}}",
    "{{secret:pin}}1234",
    "{{secret:pin}} {{secret:pin}}",
    "{{secret:pin}}{{secret:other}}",
    "pin is {{secret:pin}} ok",
    "{{secret:pin}} hunter2",
    "{{secret:Pin}}",
    "hunter2",
]


def _decision(text: str) -> Decision:
    action = types_pb2.Action()
    action.input_text.text = text
    action.input_text.sensitive = True
    return Decision(
        tool_name="input_text",
        arguments={"text": text, "sensitive": True},
        action=action,
        purpose="",
        expected_outcome="",
        rationale=None,
        thinking=[],
        usage=Usage(),
        provider="anthropic",
        model="m",
        latency_s=0.0,
        forced_retry=False,
        system_prompt="",
        user_prompt="",
    )


def _stored_forms(text: str) -> list[Any]:
    """The text as each masking place keeps or shows it."""
    decision = _decision(text)
    event = WorldEvent.from_decision(decision, page="p", success=True)
    args, act = present_masked(
        {"text": text, "sensitive": True}, {"input_text": {"text": text, "sensitive": True}}
    )
    step = Step(1, 1, "input_text", decision.action, {"text": text, "sensitive": True})
    return [
        decision.masked_arguments()["text"],
        masked_action(decision).input_text.text,
        mask_text_arguments({"text": text}, True)["text"],
        action_to_record(decision.action)["input_text"]["text"],
        event.to_dict()["action"]["text"],
        compact_history([event])[0]["action"]["text"],
        mask_sensitive("input_text", {"text": text, "sensitive": True})["text"],
        args["text"],
        act["input_text"]["text"],
        step.action.input_text.text,
        step.arguments["text"],
    ]


@pytest.mark.parametrize("text", MIXED)
def test_a_sensitive_text_with_more_than_one_reference_stays_masked_everywhere(text: str) -> None:
    assert _stored_forms(text) == [MASK] * 11


@pytest.mark.parametrize("text", ["{{secret:pin}}", " {{ secret:pin }}\n"])
def test_a_sensitive_text_that_is_one_reference_is_kept_everywhere(text: str) -> None:
    assert _stored_forms(text) == [text] * 11


def _typing(text: str) -> list[SourceStep]:
    """A run that typed `text` marked sensitive (as the decision log kept it) and completed."""
    decision = _decision(text)
    kept = masked_action(decision)
    complete = types_pb2.Action()
    complete.complete.success = True
    page = "com.android.contacts: Create contact"
    return [
        SourceStep(1, "input_text", decision.masked_arguments(), kept, None, "p", "e", page, "met"),
        SourceStep(
            2, "complete", {"success": True, "reason": "done"}, complete, None, "", "", page
        ),
    ]


def test_a_flow_keeps_a_lone_reference_and_never_a_mixed_text() -> None:
    goal = "Unlock with {{secret:pin}}"
    (kept,) = synthesize(goal, _typing("{{secret:pin}}")).flow.steps  # type: ignore[union-attr]
    assert (kept.action.input_text.text, kept.text_parameter) == ("{{secret:pin}}", "")
    (mixed,) = synthesize(goal, _typing("1234 {{secret:pin}}")).flow.steps  # type: ignore[union-attr]
    assert (mixed.action.input_text.text, mixed.text_parameter) == ("", "secret1")


@pytest.mark.parametrize("text", ["{{secret:pin}}", " {{ secret:pin }}\n"])
def test_a_step_typing_one_reference_is_worded_with_the_secret_it_types(text: str) -> None:
    """The progress line, the consoles and the exports word an action with `describe`: a
    lone reference is no secret, so the phrase says which secret the step typed (it said
    "type •••", the same for every secret of the task)."""
    assert describe(_decision(text).action) == "type {{secret:pin}}"
    assert describe(masked_action(_decision(text))) == "type {{secret:pin}}"  # as logged


@pytest.mark.parametrize("text", MIXED)
def test_a_step_typing_any_other_sensitive_text_is_worded_with_the_mask(text: str) -> None:
    assert describe(_decision(text).action) == f"type {MASK}"
    assert describe(masked_action(_decision(text))) == f"type {MASK}"
