"""`SessionPlanner`: one real multi-turn conversation per task attempt.

Where the compact planner sends a fresh two-message prompt each step, a session keeps the
conversation: observation → assistant turn (reasoning, text, tool call) → tool result → next
observation … Every model turn is committed to the history — and to the store — as it was
received, before anything else happens, and each request is a projection of that history onto
the provider's wire format. Models that reason across turns therefore keep their reasoning, and
a planner built after a restart (`SessionPlanner.open`) continues the same conversation.

Use: `decision = await planner.decide(observation)`, execute the action, then
`await planner.record_tool_result(outcome)`; repeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

import anthropic
import openai

from planner.decision import Decision, ThinkingBlock, Usage
from planner.errors import PlannerError, PlannerRejected, SessionStateError, ToolCallError
from planner.session import anthropic_turn, responses_turn
from planner.session.anthropic_projection import ProjectionStats, project_anthropic
from planner.session.config import SessionConfig, SessionProvider, ThinkingConfig
from planner.session.items import (
    AssistantText,
    ContextCheckpoint,
    Reasoning,
    SessionItem,
    ToolResult,
    UserObservation,
    unanswered_calls,
)
from planner.session.prompt import SESSION_SYSTEM_PROMPT
from planner.session.provider_turn import TurnResult
from planner.session.responses_projection import project_responses
from planner.session.store import SessionStore
from planner.session.streaming import ThinkingSink
from planner.session.turns import next_checkpoint
from planner.tools import TOOLS, ToolSpec, parse_tool_call

NUDGE = "You answered without calling a tool. Call exactly one tool now."
NOT_RECORDED = (
    "The outcome of this action was not recorded (the planner restarted before it was "
    "reported). Judge it from the current screen."
)
EXTRA_CALL = "Not executed: call exactly one tool per turn."

Client = anthropic.AsyncAnthropic | openai.AsyncOpenAI
log = logging.getLogger(__name__)


def make_client(
    provider: SessionProvider,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    max_retries: int = 2,
) -> Client:
    """The official SDK client for a provider (`base_url` points tests at a local server)."""
    if provider == "anthropic":
        return anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=max_retries)
    return openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=max_retries)


class SessionPlanner:
    """A planner that keeps one conversation per (task, attempt) in a `SessionStore`."""

    def __init__(
        self,
        *,
        provider: SessionProvider,
        model: str,
        client: Client,
        store: SessionStore,
        task_id: str,
        attempt: int,
        thinking: ThinkingConfig | None = None,
        config: SessionConfig | None = None,
        system_prompt: str = SESSION_SYSTEM_PROMPT,
        tools: Sequence[ToolSpec] = TOOLS,
        on_thinking: ThinkingSink | None = None,
        history: Sequence[SessionItem] = (),
        owns_client: bool = False,
    ) -> None:
        if provider == "anthropic" and not isinstance(client, anthropic.AsyncAnthropic):
            raise TypeError("provider anthropic needs an anthropic.AsyncAnthropic client")
        if provider == "openai-responses" and not isinstance(client, openai.AsyncOpenAI):
            raise TypeError("provider openai-responses needs an openai.AsyncOpenAI client")
        self.provider = provider
        self.model = model
        self.thinking = thinking or ThinkingConfig()
        self.config = config or SessionConfig()
        self.system_prompt = system_prompt
        self.tools = tuple(tools)
        self.on_thinking = on_thinking
        self.task_id = task_id
        self.attempt = attempt
        self._client = client
        self._owns_client = owns_client
        self._store = store
        self._items: list[SessionItem] = list(history)
        self.last_stats = ProjectionStats()

    @classmethod
    async def open(
        cls,
        *,
        store: SessionStore,
        task_id: str,
        attempt: int,
        continue_previous_attempt: bool = True,
        **kwargs: Any,
    ) -> SessionPlanner:
        """A planner with the stored conversation of this attempt loaded.

        A new attempt with nothing stored yet continues the latest earlier attempt's
        conversation (copied into this attempt, so each attempt's record is complete on its
        own). Other keyword arguments go to the constructor.
        """
        items = await store.load(task_id, attempt)
        if not items and continue_previous_attempt:
            previous = await store.latest_attempt(task_id, before=attempt)
            if previous is not None:
                items = await store.load(task_id, previous)
                await store.append(task_id, attempt, items)
        return cls(store=store, task_id=task_id, attempt=attempt, history=items, **kwargs)

    @property
    def history(self) -> tuple[SessionItem, ...]:
        """The conversation so far, as committed."""
        return tuple(self._items)

    @property
    def pending_call_id(self) -> str | None:
        """The tool call waiting for `record_tool_result`, if any."""
        pending = unanswered_calls(self._items)
        return pending[-1] if pending else None

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.close()

    async def _commit(self, items: Sequence[SessionItem]) -> None:
        """Store first, then remember: what the next request is built from is always on disk."""
        if not items:
            return
        await self._store.append(self.task_id, self.attempt, items)
        self._items.extend(items)

    async def record_tool_result(
        self, output: str, *, is_error: bool = False, call_id: str | None = None
    ) -> None:
        """Report what the executed action did (or why it failed). `call_id` defaults to the
        call of the last decision."""
        pending = unanswered_calls(self._items)
        target = call_id or (pending[-1] if pending else None)
        if target is None or target not in pending:
            raise SessionStateError(f"no tool call waiting for a result (got {call_id!r})")
        await self._commit([ToolResult(target, output, is_error)])

    async def _call(self, *, forced: bool) -> TurnResult:
        cfg = self.config
        if isinstance(self._client, anthropic.AsyncAnthropic):
            projection = project_anthropic(
                self._items,
                thinking=self.thinking.enabled and not forced,
                foreign_reasoning=cfg.foreign_reasoning,
            )
            self.last_stats = projection.stats
            params = anthropic_turn.request_params(
                model=self.model,
                system=self.system_prompt,
                messages=projection.messages,
                tools=self.tools,
                thinking=self.thinking,
                forced=forced,
                max_tokens=cfg.max_tokens,
            )
            turn = await anthropic_turn.anthropic_turn(
                self._client, params=params, stream=cfg.stream, on_thinking=self.on_thinking
            )
        else:
            rprojection = project_responses(
                self._items,
                foreign_reasoning=cfg.foreign_reasoning,
                keep_reasoning_turns=cfg.keep_reasoning_turns,
            )
            self.last_stats = rprojection.stats
            params = responses_turn.request_params(
                model=self.model,
                system=self.system_prompt,
                input_items=rprojection.input,
                tools=self.tools,
                thinking=self.thinking,
                forced=forced,
                max_tokens=cfg.max_tokens,
            )
            turn = await responses_turn.responses_turn(
                self._client, params=params, stream=cfg.stream, on_thinking=self.on_thinking
            )
        dropped = {
            k: v
            for k, v in self.last_stats.as_dict().items()
            if v and k in ("unsigned_dropped", "foreign_dropped", "orphan_reasoning_dropped")
        }
        if dropped:
            log.info(
                "session %s/%s: reasoning not sent back: %s", self.task_id, self.attempt, dropped
            )
        await self._commit(turn.items)
        return turn

    async def _start_afresh(self, err: PlannerRejected) -> None:
        """Recover from a request the provider refused, once: a checkpoint right after the
        current observation condenses every earlier screen and retires all earlier reasoning
        (Anthropic then gets earlier turns as plain text). A conversation the provider no longer
        accepts — signatures it cannot verify after a model or key change, a context grown too
        long — would otherwise fail the same way on every retry and every later attempt, since
        a new attempt continues this conversation."""
        current = max(
            i
            for i, item in enumerate(self._items)
            if isinstance(item, UserObservation) and item.kind == "observation"
        )
        log.warning(
            "session %s/%s: %s; asking once more with earlier screens condensed and earlier "
            "reasoning retired",
            self.task_id,
            self.attempt,
            err,
        )
        await self._commit([ContextCheckpoint(current)])

    async def decide(
        self,
        observation_text: str,
        *,
        condensed: str | None = None,
        element_ids: Collection[str] | None = None,
        screen_size: tuple[int, int] | None = None,
    ) -> Decision:
        """Add the observation, ask the model for one action, and return it as a Decision.

        `condensed` is the short form the observation takes once a context checkpoint falls
        after it. A tool call still waiting for its result (the host restarted mid-step) is
        answered with a "not recorded" note first. Without a tool call the model is nudged and
        forced once; an invalid call gets one corrective retry; then a PlannerError.
        """
        started = time.monotonic()
        opening: list[SessionItem] = [
            ToolResult(call_id, NOT_RECORDED) for call_id in unanswered_calls(self._items)
        ]
        cut = next_checkpoint([*self._items, *opening], self.config.keep_scenes)
        if cut is not None:
            opening.append(ContextCheckpoint(cut))
        opening.append(UserObservation(observation_text, condensed=condensed))
        await self._commit(opening)

        usage = Usage()
        turns: list[TurnResult] = []
        forced = False
        corrective = 0

        recovered = False
        try:
            turn = await self._call(forced=False)
        except PlannerRejected as err:
            await self._start_afresh(err)
            recovered = True
            turn = await self._call(forced=False)
        turns.append(turn)
        usage.add(turn.usage)
        if not turn.tool_calls:
            forced = True
            await self._commit([UserObservation(NUDGE, kind="instruction")])
            turn = await self._call(forced=True)
            turns.append(turn)
            usage.add(turn.usage)
        while True:
            if not turn.tool_calls:
                raise PlannerError(
                    "planner: the model answered without a tool call"
                    + (" even when forced" if forced else " after a corrective retry")
                )
            call, *extra = turn.tool_calls
            await self._commit([ToolResult(c.call_id, EXTRA_CALL, is_error=True) for c in extra])
            arguments = turn.raw_calls.get(call.call_id, call.arguments)
            try:
                parsed = parse_tool_call(
                    call.name, arguments, element_ids=element_ids, screen_size=screen_size
                )
                break
            except ToolCallError as err:
                await self._commit([ToolResult(call.call_id, str(err), is_error=True)])
                if corrective >= 1:
                    raise PlannerError(
                        f"planner: the model's tool call stayed invalid after a corrective retry: "
                        f"{err}"
                    ) from None
                corrective += 1
                turn = await self._call(forced=False)
                turns.append(turn)
                usage.add(turn.usage)

        reasoning = [i for t in turns for i in t.items if isinstance(i, Reasoning)]
        texts = [i.text.strip() for t in turns for i in t.items if isinstance(i, AssistantText)]
        return Decision(
            tool_name=parsed.tool_name,
            arguments=parsed.arguments,
            action=parsed.action,
            purpose=parsed.purpose,
            expected_outcome=parsed.expected_outcome,
            rationale="\n".join(t for t in texts if t) or None,
            thinking=[ThinkingBlock(r.readable, redacted=not r.readable) for r in reasoning],
            usage=usage,
            provider="anthropic" if self.provider == "anthropic" else "openai",
            model=turn.model,
            latency_s=time.monotonic() - started,
            forced_retry=forced,
            system_prompt=self.system_prompt,
            user_prompt=observation_text,
            corrective_retries=corrective,
            extra={
                "mode": "session",
                "call_id": call.call_id,
                "turn_ids": [t.turn_id for t in turns],
                "projection": self.last_stats.as_dict(),
                "started_afresh": recovered,
            },
        )
