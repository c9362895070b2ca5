"""Prompt size per step over a 40-step task: compact history against the old full-scene history,
session mode's whole request with its context budget against none, and the input tokens billed
per step with Anthropic prompt caching against without.

The old design (`_history_summary()` in the seed) serialized every past step's full WorldEvent,
scene included, into the next prompt, so the prompt grew by a whole screen per step. The compact
history sends one small record per step (page, action with purpose and expected outcome,
rationale, success) and only the last `history_window` of them.

The steps are real: the offline planner works through a list of goals on the in-process virtual
phone, one long task's worth of screens and decisions, and each step's prompt is built both ways
from the same scene and the same history. Session mode sends the whole conversation each step:
its request (the Anthropic projection's messages, thinking on) is measured with the default
context budget (`keep_scenes` 6: older screens condensed at checkpoints) and without one; the
model's turns are the offline decisions with a 1,000-character thinking block and signature
standing in for a real model's.

Prompt caching: each step's Anthropic request is built by the planner's own request builder
(`planner/vendors/anthropic/messages.py`, model profile claude-4.6) with caching on (breakpoints
on the system prompt and tools; in session mode also the request-level one on the conversation)
and off, and priced as the API documents (`tests/support/fakes/cache.py`: reads at 0.1x, writes
at 1.25x, a 1,024-token minimum, ~tokens = chars/4).

    python bench/prompt_growth.py           # 40 steps
    python bench/prompt_growth.py --smoke   # 8 steps, for CI
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from host.agent.actions import execute
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.perceive import Perceiver
from planner.conversation.items import (
    AssistantText,
    ContextCheckpoint,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)
from planner.conversation.turns import next_checkpoint
from planner.history import WorldEvent
from planner.model_profiles import PROFILES
from planner.planner import Planner
from planner.prompts import HISTORY_WINDOW, SYSTEM_PROMPT, build_user_prompt
from planner.providers.offline import OfflineProvider
from planner.scene import Scene
from planner.session.prompt import SESSION_SYSTEM_PROMPT
from planner.session.step_planner import condensed_text, observation_text, step_outcome
from planner.tools import TOOLS
from planner.vendors.anthropic.messages import Cache, request_params
from planner.vendors.anthropic.projection import project_anthropic
from planner.vendors.base import ThinkingConfig
from tests.support.fakes.cache import PromptCache

GOALS = [
    "Turn on dark theme",
    "Turn off Wi-Fi",
    "Set the screen timeout to 5 minutes",
    "Create a contact named Ada Lovelace with phone 555 0100",
    "Enable battery saver",
    "Set an alarm for 6:15 am",
    "Turn off Bluetooth",
    "Open About phone",
    "Compute 45 plus 17 on the calculator",
    "Turn on airplane mode",
    "Turn on color inversion in the accessibility settings",
    "Turn on Do Not Disturb",
]


def old_user_prompt(goal: str, scene: Scene, history: list[tuple[WorldEvent, Scene]]) -> str:
    """The seed design's prompt: goal, scene, and every past WorldEvent with its full scene."""
    past = []
    for event, past_scene in history:
        record = event.to_dict()
        record["scene_summary"] = past_scene.to_prompt()
        past.append(record)
    return (
        f"Goal: {goal}\n\nCurrent scene:\n{json.dumps(scene.to_prompt())}\n\n"
        f"History:\n{json.dumps(past)}"
    )


async def collect(steps: int) -> list[tuple[str, Scene, WorldEvent]]:
    """`steps` real (goal, scene, event) triples from the offline planner on the virtual phone."""
    phone = VirtualPhone("bench")
    driver = VirtualDriver(phone)
    perceiver = Perceiver(ocr=None, retry_delay_s=0.0)
    planner = Planner(OfflineProvider())
    out: list[tuple[str, Scene, WorldEvent]] = []
    goal_index = 0
    task_history: list[WorldEvent] = []
    while len(out) < steps:
        goal = GOALS[goal_index % len(GOALS)]
        scene = perceiver.perceive(driver, with_ocr=False).scene
        decision = await planner.decide(goal, scene, task_history)
        result = execute(driver, decision.action, scene)
        event = WorldEvent.from_decision(decision, page=scene.page, success=result.ok)
        out.append((goal, scene, event))
        task_history.append(event)
        if decision.tool_name == "complete":
            goal_index += 1
            task_history = []
            phone.go_home()
    return out


class SessionTrace:
    """One session's items as a SessionPlanner would commit them, with or without a budget."""

    def __init__(self, keep_scenes: int | None) -> None:
        self.keep_scenes = keep_scenes
        self.items: list[SessionItem] = []

    def request(self, goal: str | None, scene: Scene) -> list[dict[str, Any]]:
        """Add this step's observation and return the messages of the request it makes."""
        cut = next_checkpoint(self.items, self.keep_scenes)
        if cut is not None:
            self.items.append(ContextCheckpoint(cut))
        self.items.append(
            UserObservation(observation_text(goal, scene), condensed=condensed_text(goal, scene))
        )
        return project_anthropic(self.items, thinking=True).messages

    def answer(self, step: int, event: WorldEvent) -> None:
        turn, call = f"msg_{step}", f"toolu_{step}"
        arguments = {k: v for k, v in event.action.items() if k != "tool"}
        self.items += [
            Reasoning("anthropic", turn, text="t" * 1000, signature="s" * 400),
            AssistantText("anthropic", turn, event.rationale or "next step"),
            ToolCall("anthropic", turn, call, str(event.action.get("tool")), arguments),
        ]
        output, failed = step_outcome(event)
        self.items.append(ToolResult(call, output, failed))


PROFILE = PROFILES["claude-4.6"]


def anthropic_body(system: str, messages: list[dict[str, Any]], cache: Cache) -> dict[str, Any]:
    """The request the planner sends for these messages (thinking adaptive, profile 4.6)."""
    return request_params(
        model="claude-sonnet-4-6",
        system=system,
        messages=messages,
        tools=TOOLS,
        profile=PROFILE,
        thinking=ThinkingConfig("adaptive"),
        thinking_on=True,
        forced=False,
        max_tokens=2048,
        cache=cache,
    )


class Billing:
    """Input tokens billed per step for one stream of requests, cached and not."""

    def __init__(self, system: str, cache: Cache) -> None:
        self.system, self.cache = system, cache
        self.prompt_cache = PromptCache(min_tokens=1024)

    def bill(self, messages: list[dict[str, Any]], cache: bool) -> float:
        body = anthropic_body(self.system, messages, self.cache if cache else "off")
        return self.prompt_cache.account(body).billed()


def measure(steps: int) -> list[dict[str, Any]]:
    trace = asyncio.run(collect(steps))
    rows = []
    events: list[WorldEvent] = []
    full: list[tuple[WorldEvent, Scene]] = []
    budgeted, unbounded = SessionTrace(keep_scenes=6), SessionTrace(keep_scenes=None)
    compact_cached, compact_plain = Billing(SYSTEM_PROMPT, "prompt"), Billing(SYSTEM_PROMPT, "off")
    session_cached = Billing(SESSION_SYSTEM_PROMPT, "conversation")
    session_plain = Billing(SESSION_SYSTEM_PROMPT, "off")
    for i, (_goal, scene, event) in enumerate(trace, start=1):
        goal = "Work through the maintenance checklist"
        compact = build_user_prompt(goal, scene, events)
        old = old_user_prompt(goal, scene, full)
        shown = goal if i == 1 else None
        session = budgeted.request(shown, scene)
        compact_messages = [{"role": "user", "content": [{"type": "text", "text": compact}]}]
        rows.append(
            {
                "step": i,
                "compact": len(compact),
                "full": len(old),
                "session": len(json.dumps(session, ensure_ascii=False)),
                "session_unbounded": len(
                    json.dumps(unbounded.request(shown, scene), ensure_ascii=False)
                ),
                "compact_billed": compact_plain.bill(compact_messages, cache=False),
                "compact_billed_cached": compact_cached.bill(compact_messages, cache=True),
                "session_billed": session_plain.bill(session, cache=False),
                "session_billed_cached": session_cached.bill(session, cache=True),
            }
        )
        events.append(event)
        full.append((event, scene))
        budgeted.answer(i, event)
        unbounded.answer(i, event)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--smoke", action="store_true", help="8 steps only")
    args = parser.parse_args(argv)
    steps = 8 if args.smoke else args.steps
    rows = measure(steps)
    print("User prompt size per step (characters; ~tokens = chars/4),")
    print(f"history window {HISTORY_WINDOW} records")
    head = ("step", "compact", "~tok", "full-scene", "~tok", "full/compact")
    print(f"{head[0]:>4} | {head[1]:>8} {head[2]:>6} | {head[3]:>10} {head[4]:>7} | {head[5]:>12}")
    print("-" * 62)
    for r in rows:
        ratio = r["full"] / r["compact"]
        print(
            f"{r['step']:>4} | {r['compact']:>8} {r['compact'] // 4:>6} | "
            f"{r['full']:>10} {r['full'] // 4:>7} | {ratio:>11.1f}x"
        )
    total_compact = sum(r["compact"] for r in rows)
    total_full = sum(r["full"] for r in rows)
    last = rows[-1]
    print("-" * 62)
    print(
        f"step {last['step']}: full-scene prompt is "
        f"{last['full'] / last['compact']:.1f}x the compact one; "
        f"over all {len(rows)} steps {total_full / total_compact:.1f}x "
        f"({total_full // 4:,} vs {total_compact // 4:,} ~tokens)"
    )
    first_compact = rows[0]["compact"]
    print(
        f"compact growth step 1 -> {last['step']}: {first_compact} -> {last['compact']} chars "
        f"(max {max(r['compact'] for r in rows)})"
    )
    print()
    print("Session mode: whole request per step (characters of the messages sent),")
    print("context budget keep_scenes=6 against none")
    head2 = ("step", "budget", "~tok", "no budget", "~tok", "none/budget")
    print(
        " | ".join(
            [
                f"{head2[0]:>4}",
                f"{head2[1]:>8} {head2[2]:>6}",
                f"{head2[3]:>10} {head2[4]:>7}",
                f"{head2[5]:>12}",
            ]
        )
    )
    print("-" * 62)
    for r in rows:
        ratio = r["session_unbounded"] / r["session"]
        print(
            f"{r['step']:>4} | {r['session']:>8} {r['session'] // 4:>6} | "
            f"{r['session_unbounded']:>10} {r['session_unbounded'] // 4:>7} | {ratio:>11.1f}x"
        )
    print("-" * 62)
    print(
        f"step {last['step']}: session request without a budget is "
        f"{last['session_unbounded'] / last['session']:.1f}x the budgeted one "
        f"(max budgeted {max(r['session'] for r in rows) // 4:,} ~tokens)"
    )
    print()
    print("Anthropic prompt caching: input tokens billed per step (at the normal input rate;")
    print("cache writes 1.25x, reads 0.1x), caching off against on")
    head3 = ("step", "compact off", "on", "session off", "on")
    print(f"{head3[0]:>4} | {head3[1]:>11} {head3[2]:>8} | {head3[3]:>11} {head3[4]:>8}")
    print("-" * 50)
    for r in rows:
        print(
            f"{r['step']:>4} | {r['compact_billed']:>11,.0f} {r['compact_billed_cached']:>8,.0f} | "
            f"{r['session_billed']:>11,.0f} {r['session_billed_cached']:>8,.0f}"
        )
    print("-" * 50)
    for mode in ("compact", "session"):
        plain = sum(r[f"{mode}_billed"] for r in rows)
        cached = sum(r[f"{mode}_billed_cached"] for r in rows)
        print(
            f"{mode}: {plain:,.0f} billed input tokens over {len(rows)} steps without caching, "
            f"{cached:,.0f} with ({cached / plain:.0%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
