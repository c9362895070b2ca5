"""The offline provider: the heuristic agent behind the model adapter protocol, compound goals
worked part by part."""

from __future__ import annotations

from typing import Literal

from planner.conversation.items import AssistantText, ToolCall, UserObservation
from planner.decision import Usage
from planner.prompts import ParsedPrompt, parse_user_prompt
from planner.providers.offline.goal import split_goal
from planner.providers.offline.memory import Memory, parts_done
from planner.providers.offline.screen import Screen
from planner.providers.offline.tactics import MAX_STEPS, Agent, Step
from planner.vendors.base import Turn, TurnRequest

MODEL = "amc-offline-heuristic-1"


class OfflineProvider:
    """Deterministic heuristic agent behind the model adapter protocol."""

    @property
    def name(self) -> str:
        return "offline"

    @property
    def model(self) -> str:
        return MODEL

    @property
    def retry_form(self) -> Literal["forced"]:
        return "forced"

    async def aclose(self) -> None:
        return None

    async def complete(self, request: TurnRequest) -> Turn:
        prompt = next((m.text for m in request.items if isinstance(m, UserObservation)), "")
        try:
            parsed = parse_user_prompt(prompt)
            step = decide(parsed)
            step.args["previous_step"] = Memory(parsed.history).judgement(Screen(parsed.scene))
        except ValueError as err:
            step = Step(
                f"I cannot read this prompt ({err}).",
                "complete",
                {"success": False, "reason": f"offline planner: {err}"},
            )
        words = len(prompt.split())
        call_id = f"offline_{len(prompt)}"
        return Turn(
            turn_id=call_id,
            items=[
                AssistantText("offline", call_id, step.rationale),
                ToolCall("offline", call_id, call_id, step.tool, step.args),
            ],
            usage=Usage(input_tokens=words, output_tokens=len(step.rationale.split()) + 20),
            model=MODEL,
            stop_reason="tool_use",
            raw_calls=[step.args],
        )


def decide(parsed: ParsedPrompt) -> Step:
    """Split a compound goal into parts and work on the first part not yet done.

    Which parts are done is read from the agent's own earlier rationales ("Part 1/2 done: ..."),
    which the compact history carries; each part sees only the history since it started.
    """
    parts = split_goal(parsed.goal)
    if len(parts) == 1:
        return Agent(parsed).decide_part()
    n = len(parts)
    if len(parsed.history) >= MAX_STEPS:
        return Agent(parsed).finish(False, f"gave up after {len(parsed.history)} steps")
    k, start = parts_done(parsed.history)
    history = parsed.history[start:] if k else parsed.history
    notes: list[str] = []
    while True:
        step = Agent(ParsedPrompt(parts[k], parsed.scene, history)).decide_part()
        done = step.tool == "complete" and step.args["success"]
        if done and k + 1 < n:
            notes.append(f"Part {k + 1}/{n} done: {step.args['reason']}.")
            k, history = k + 1, []
            continue
        if step.tool == "complete":
            reason = str(step.args["reason"])
            step.args = {
                "success": bool(step.args["success"]),
                "reason": f"all {n} parts done ({reason})"
                if done
                else f"part {k + 1}/{n} '{parts[k]}': {reason}",
            }
        step.rationale = " ".join([*notes, f"Part {k + 1}/{n} ('{parts[k]}'): {step.rationale}"])
        return step
