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
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from planner import deciding
from planner.conversation.items import (
    AssistantItem,
    ContextCheckpoint,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
    unanswered_calls,
)
from planner.conversation.turns import ProjectionStats, next_checkpoint
from planner.decision import Decision, ResumedFrom
from planner.errors import PlannerRejected, SessionStateError, UnreadableAnswer
from planner.model_profiles import RetryForm
from planner.session.config import SessionConfig
from planner.session.kept_answer import kept_answer
from planner.session.prompt import SESSION_SYSTEM_PROMPT
from planner.session.store import SessionStore
from planner.tools import TOOLS, ToolSpec
from planner.vendors.base import ModelAdapter, ThinkingSink, Turn, TurnRequest

NUDGE = deciding.NUDGE
NOT_RECORDED = (
    "The outcome of this action was not recorded (the planner restarted before it was "
    "reported). Judge it from the current screen."
)
NOT_CARRIED_OUT = (
    "This action was not carried out: the decision never reached the phone (the planner "
    "stopped or the request was cancelled before it was delivered), so nothing was done. "
    "Decide again from the current screen."
)
EXTRA_CALL = deciding.EXTRA_CALL

log = logging.getLogger(__name__)


class SessionPlanner:
    """A planner that keeps one conversation per (task, attempt) in a `SessionStore`."""

    def __init__(
        self,
        *,
        adapter: ModelAdapter,
        store: SessionStore,
        task_id: str,
        attempt: int,
        config: SessionConfig | None = None,
        system_prompt: str = SESSION_SYSTEM_PROMPT,
        tools: Sequence[ToolSpec] = TOOLS,
        on_thinking: ThinkingSink | None = None,
        history: Sequence[SessionItem] = (),
        owns_adapter: bool = False,
    ) -> None:
        self.adapter = adapter
        self.config = config or SessionConfig()
        self.system_prompt = system_prompt
        self.tools = tuple(tools)
        self.on_thinking = on_thinking
        self.task_id = task_id
        self.attempt = attempt
        self._owns_adapter = owns_adapter
        self._store = store
        self._items: list[SessionItem] = list(history)
        self.last_stats = ProjectionStats()
        self._started_afresh = False

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

    async def aclose(self) -> None:
        if self._owns_adapter:
            await self.adapter.aclose()

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

    # --- the conversation one decision adds to (planner.deciding.Conversation) ---

    def request(self, *, forced: bool, thinking: bool) -> TurnRequest:
        cfg = self.config
        return TurnRequest(
            system=self.system_prompt,
            items=list(self._items),
            tools=self.tools,
            mode="session",
            forced=forced,
            thinking=thinking,
            max_tokens=cfg.max_tokens,
            stream=cfg.stream,
            on_thinking=self.on_thinking,
            foreign_reasoning=cfg.foreign_reasoning,
            keep_reasoning_turns=cfg.keep_reasoning_turns,
        )

    def thinking_allowed(self) -> bool:
        # An unthought tool-use turn is sent as text by the projection; thinking stays on.
        return True

    async def received(self, turn: Turn) -> None:
        """Commit `turn` as received, unless it reuses an id this conversation gave before (a
        proxy that numbers calls or items per answer): every later request would carry both.
        Anthropic refuses two calls under one id ("`tool_use` ids must be unique"), and a
        Responses `function_call_output` would answer either; a stateless Responses request
        holds every earlier output item with its id, and the API refuses two of one id
        ("Duplicate item found with id …"). Such an answer fails the decision as
        `UnreadableAnswer` (billed by `deciding.decide`) before it runs or is kept; the
        conversation stays as it was."""
        reused = _reused_ids(self._items, turn)
        if reused:
            raise UnreadableAnswer(
                f"planner: {self.adapter.name} model {turn.model or self.adapter.model} "
                f"answered with ids earlier answers of this conversation already have ({reused}); "
                "nothing of it is used"
            )
        self.last_stats = turn.projection
        dropped = {
            k: v
            for k, v in turn.projection.as_dict().items()
            if v and k in ("unsigned_dropped", "foreign_dropped", "orphan_reasoning_dropped")
        }
        if dropped:
            log.info(
                "session %s/%s: reasoning not sent back: %s", self.task_id, self.attempt, dropped
            )
        await self._commit(turn.items)

    async def before_retry(self, form: RetryForm, nudge: str) -> None:
        await self._commit([UserObservation(nudge, kind="instruction")])

    async def add(self, items: Sequence[SessionItem]) -> None:
        """Add `items`, but a result for a call the conversation already answered: a decision
        resumed from a kept answer (`kept_answer`) answers its extra calls again, and both
        providers refuse two results for one call."""
        answered = {i.call_id for i in self._items if isinstance(i, ToolResult)}
        await self._commit(
            [i for i in items if not (isinstance(i, ToolResult) and i.call_id in answered)]
        )

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
        self._started_afresh = True
        await self._commit([ContextCheckpoint(current)])

    async def decide(
        self,
        observation_text: str,
        *,
        condensed: str | None = None,
        element_ids: Collection[str] | None = None,
        screen_size: tuple[int, int] | None = None,
        not_carried_out: Collection[str] = (),
    ) -> Decision:
        """Add the observation, ask the model for one action, and return it as a Decision.

        `condensed` is the short form the observation takes once a context checkpoint falls
        after it. A tool call still waiting for its result (the host restarted mid-step) is
        answered with a "not recorded" note first, or, when it is one of `not_carried_out`
        (its decision was never delivered), told plainly that it was not carried out: every
        call gets its answer in the next user turn, as both providers require. The same
        observation asked again after its call failed (planning was temporarily impossible) is
        not added twice. The retries are `planner.deciding`'s.
        """
        observation = UserObservation(observation_text, condensed=condensed)
        answered = [i for i, item in enumerate(self._items) if isinstance(item, AssistantItem)]
        start = answered[-1] + 1 if answered else 0  # what this step sends begins here
        kept = _answered_without_call(self._items, observation)
        resumed = None
        if kept is None:
            resumed = kept_answer(
                self._items, observation_text, element_ids, screen_size, self.adapter
            )
        if kept is not None:
            start = kept
        elif resumed is not None:
            start, answer = resumed
            log.info(
                "session %s/%s: going on from the kept answer %s (billed with the decision "
                "that failed after keeping it), not asking the model again",
                self.task_id,
                self.attempt,
                answer.turn.turn_id,
            )
        elif not (self._items and self._items[-1] == observation):
            opening: list[SessionItem] = [
                ToolResult(call_id, NOT_CARRIED_OUT, is_error=True)
                if call_id in not_carried_out
                else ToolResult(call_id, NOT_RECORDED)
                for call_id in unanswered_calls(self._items)
            ]
            cut = next_checkpoint([*self._items, *opening], self.config.keep_scenes)
            if cut is not None:
                opening.append(ContextCheckpoint(cut))
            opening.append(observation)
            await self._commit(opening)

        # When the store kept the resumed answer, read before any call is made: a failed read
        # after the decision lost a correction call already paid for (its billing rides only
        # on errors raised inside `deciding.decide`) and the step was paid for again; the
        # time is a note in the record, not worth failing the decision for.
        answered_at = await self._answered_at(resumed[1].position) if resumed is not None else None
        self._started_afresh = False
        decision, turns = await deciding.decide(
            self.adapter,
            self,
            system_prompt=self.system_prompt,
            user_prompt=observation_text,
            element_ids=element_ids,
            screen_size=screen_size,
            recover=self._start_afresh,
            answered_without_call=kept is not None,
            kept=resumed[1] if resumed is not None else None,
        )
        # The record says what the model was sent for the answer that is the decision: the notes
        # answering calls left open, the previous action's result, the observation, and any
        # nudge or correction after it; not what was written after that answer (the "not
        # executed" answers to its extra calls), which the model never saw before answering. A
        # decision resumed from a kept answer thus records the prompt that answer was given
        # for, not the one rebuilt around it since.
        made_from = _final_answer(self._items)
        decision.user_prompt = sent(self._items[start:made_from]) or decision.user_prompt
        decision.extra = {
            "mode": "session",
            "call_id": turns[-1].tool_calls[0].call_id,
            "turn_ids": [t.turn_id for t in turns],
            "projection": self.last_stats.as_dict(),
            "started_afresh": self._started_afresh,
            # The answer this decision went on from, billed with an earlier decision's error.
            "resumed_turn": resumed[1].turn.turn_id if resumed is not None else "",
        }
        if resumed is not None:
            # The record says so by presence: a provider may send no turn id. When the store
            # kept the answer is when it was answered: the decision may come an attempt later.
            position = resumed[1].position
            decision.resumed_from = ResumedFrom.of(resumed[1].turn.turn_id, position, answered_at)
        return decision

    async def _answered_at(self, position: int) -> datetime | None:
        """When the store kept the item at `position`, or None when it cannot say now (the
        proto's "not known"): kept answers exist because the database drops."""
        try:
            return await self._store.stored_at(self.task_id, self.attempt, position)
        except Exception as exc:  # a database away: the decision goes on without the time
            # Its type only: a driver's text names the database's host and the SQL.
            log.warning(
                "when the kept answer was answered is not recorded (%s)", type(exc).__name__
            )
            return None

    def resumes(
        self,
        observation_text: str,
        element_ids: Collection[str] | None = None,
        screen_size: tuple[int, int] | None = None,
    ) -> bool:
        """Whether `decide` on this observation goes on from an answer already kept for it
        (`planner.session.kept_answer`): the step is being asked again, not a new one."""
        found = kept_answer(self._items, observation_text, element_ids, screen_size, self.adapter)
        return found is not None


def _final_answer(items: Sequence[SessionItem]) -> int:
    """Where the conversation's latest model turn begins: the answer a decision was made from
    (a turn's items are stored together, and a user-side item comes before every request, so a
    turn is the last run of assistant items). `len(items)` when there is none."""
    said = [n for n, item in enumerate(items) if isinstance(item, AssistantItem)]
    if not said:
        return len(items)
    begin = said[-1]
    while begin and isinstance(items[begin - 1], AssistantItem):
        begin -= 1
    return begin


def _answered_without_call(
    items: Sequence[SessionItem], observation: UserObservation
) -> int | None:
    """Where `observation` is, when the conversation ends with it and the model's answer to it
    that called no tool, or None. That answer was paid for and kept; the decision then failed
    before its retry (the database dropped while storing the instruction to call a tool), so
    this step goes on with the retry rather than asking the same question again."""
    n = len(items)
    while n and isinstance(items[n - 1], AssistantItem):
        n -= 1
    tail = items[n:]
    if not tail or any(isinstance(i, ToolCall) for i in tail):
        return None
    return n - 1 if n and items[n - 1] == observation else None


def _reused_ids(items: Sequence[SessionItem], turn: Turn) -> str | None:
    """Which of `turn`'s call ids and OpenAI output item ids earlier answers of the
    conversation already have ("call ids ['toolu_R']", "item ids ['fc_R']"), or None."""
    earlier = [i for i in items if isinstance(i, AssistantItem)]
    calls = {i.call_id for i in earlier if isinstance(i, ToolCall)}
    outputs = {i.item_id for i in earlier if i.provider == "openai" and i.item_id}
    reused_calls = sorted({c.call_id for c in turn.tool_calls} & calls)
    given = {i.item_id for i in turn.items if i.provider == "openai" and i.item_id}
    reused_items = sorted(given & outputs)
    parts = [f"call ids {reused_calls}"] if reused_calls else []
    parts += [f"item ids {reused_items}"] if reused_items else []
    return " and ".join(parts) or None


def sent(items: Sequence[SessionItem]) -> str:
    """The user side of `items` as a decision records it (its user prompt): each tool result
    and instruction labelled, each observation as it is, in order, a blank line between."""
    parts: list[str] = []
    for item in items:
        if isinstance(item, ToolResult):
            parts.append(f"[tool result{', error' if item.is_error else ''}] {item.output}")
        elif isinstance(item, UserObservation):
            label = "" if item.kind == "observation" else f"[{item.kind}] "
            parts.append(label + item.text)
    return "\n\n".join(parts)
