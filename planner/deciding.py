"""One decision from a conversation, for both planning modes: the retries and the `Decision`.

The flow of a decision:
1. Ask with `tool_choice=auto` (thinking as configured) so rationale and thinking can appear.
2. No tool call at all → ask once more, in the form the model's profile allows: a forced tool
   choice with thinking off for that call, or — where thinking cannot be turned off for one
   call — a nudge: one more turn with thinking kept and an instruction to call exactly one tool.
   Which retry happened is recorded. The first answer's thinking is kept: it is the model's
   judgement for this step even though it did not act.
3. The tool call is unusable (none, unknown tool, missing purpose/expected outcome, invalid
   arguments, an element id not on screen, a point off screen) → one corrective turn: the answer
   goes back with a tool result (or, without a call, an instruction) saying what was wrong; then
   from 1 again. Still unusable → `PlannerError`.
An answer cut off at the output token limit (thinking counts toward the limit) makes every
later call of the decision ask for twice the limit (at least THINKING_MAX_TOKENS, at most
MAX_CALL_TOKENS, and never above the model's own output limit where its profile knows it: a call
asking for more is refused with a 400): asked with the same limit, a model that keeps thinking
on its retry is cut off again. The final error then names the limit.
A tool call in an answer cut off at the limit is never executed (its arguments may be cut off
and still validate): it gets the corrective turn, asked with the raised limit.
Extra tool calls in one answer are answered "not executed"; the first one is used. An answer
whose calls share an id (or, Anthropic, lack one) cannot have each call answered in the next
request: it fails the decision as `UnreadableAnswer` before anything of it runs or is kept.
An answer that stopped at the model's context window (Anthropic `model_context_window_exceeded`;
OpenAI refuses such a request, 400 `context_length_exceeded`) is no cut-off answer: more output
room cannot help and a corrective turn adds to a full context. It is never kept:
`PlannerContextExceeded`, which runs `recover` (session mode: start afresh) once whichever call
met it, and otherwise fails the decision. A refused request parameter (`PlannerParameterRejected`)
never runs it: the settings decide what is sent, not the conversation.
A refusal (the model declined: Anthropic `stop_reason: "refusal"`, an OpenAI refusal; or
OpenAI's content filter stopped the answer: Chat `finish_reason: "content_filter"`, Responses
incomplete for `content_filter`) ends the decision at once with `PlannerRefused`, before the
turn is kept: no retry, no corrective turn. So does, with a `PlannerError` naming why, an answer
the provider ended unfinished for any other reason than the output limit (`Turn.cut_short`:
OpenAI Responses `incomplete` for `max_messages` or a newer reason, or `status: cancelled`;
Anthropic `stop_reason: "pause_turn"` or a newer stop reason).
Its calls share one budget of retries after transient failures (`TurnRequest.spent`):
`AMC_PLANNER_MAX_RETRIES` is the most one decision takes, however many calls it needs.
A conversation the adapter cannot project into a request (`SessionHistoryError`) fails the
decision as `UnreadableAnswer`, billed like any other planner error.
A decision may also go on from an answer already kept (`Kept`): one that an earlier decision of
the same step received and kept, then failed on a write after it (the "not executed" answers to
its extra calls, its correction: the database dropped). That answer was billed on the earlier
decision's error; it is used as received, never asked again and never billed twice.
Usage and latency add up over every call the decision needed; a decision that fails after calls
were answered carries what they cost on its error (`PlannerError.billed`; a decision cancelled
by its caller on the `CancelledError`, `planner.errors.bill`): the provider billed them all the
same.

What differs between the modes is the conversation (`Conversation`): compact mode keeps it in
memory and adds an answer only when a correction needs it; session mode stores every turn as it
arrives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Protocol

from planner.conversation.items import (
    AssistantText,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)
from planner.conversation.turns import SessionHistoryError
from planner.decision import Billed, Decision, RetryKind, ThinkingBlock, ThinkingKind, Usage
from planner.errors import (
    InFlight,
    PlannerContextExceeded,
    PlannerError,
    PlannerParameterRejected,
    PlannerRefused,
    PlannerRejected,
    ToolCallError,
    UnreadableAnswer,
    bill,
    carry_in_flight,
    take_cut_off,
)
from planner.model_profiles import RetryForm
from planner.settings import MAX_CALL_TOKENS, THINKING_MAX_TOKENS
from planner.tools import ParsedToolCall, parse_tool_call
from planner.vendors.base import (
    LiveBlocks,
    ModelAdapter,
    RetrySpend,
    Turn,
    TurnRequest,
    live_blocks,
)

NUDGE = "You answered without calling a tool. Call exactly one tool now."
#: The instruction after an answer the output limit cut off before it called anything (it may
#: have meant to): it is asked again with more room, and told why, not that it chose prose.
CUT_OFF_NUDGE = (
    "Your answer was cut off at the output token limit before it called a tool; you have more "
    "room now. Call exactly one tool now."
)
EXTRA_CALL = "Not executed: call exactly one tool per turn."
CUT_OFF = "[cut off: the answer reached the output token limit]"
_KIND_ORDER: tuple[ThinkingKind, ...] = ("full", "summarized", "redacted", "omitted")


REJECTED = "That tool call was rejected: "


def rejected_call(error: str) -> str:
    """The tool result that sends an unusable call back to the model."""
    return f"{REJECTED}{error}. Fix it and call exactly one tool."


@dataclasses.dataclass(frozen=True, slots=True)
class Kept:
    """The latest answer of this step, received and kept by an earlier decision that then
    failed on a write (the conversation could not be stored on after it). Its cost was billed
    on that decision's error (`planner.errors.bill`), so a decision that goes on from it adds
    none of it. `corrective` and `retry` are what that decision had done before the answer:
    a decision corrects once, however many requests it took. `position` is where the answer
    begins in the conversation (its first item's index): the decision's record names the
    answer by it, as a provider may send no turn id. `provider` is who wrote it: the
    configuration may have changed since (a session survives a provider switch), and a
    decision made from it names its writer, not the adapter asked now."""

    turn: Turn
    corrective: int = 0
    retry: RetryKind = "none"
    position: int = 0
    provider: str = ""


class Conversation(Protocol):
    """The conversation one decision adds to, and how its calls are asked."""

    def request(self, *, forced: bool, thinking: bool) -> TurnRequest:
        """The next call over the conversation as it stands."""
        ...

    def thinking_allowed(self) -> bool:
        """Whether the next call may think (compact: only when every answer in the
        conversation carried thinking, as Anthropic requires of a tool-use continuation)."""
        ...

    async def received(self, turn: Turn) -> None:
        """A model turn arrived (session: it is stored now; compact: kept aside until a
        correction needs it)."""
        ...

    async def before_retry(self, form: RetryForm, nudge: str) -> None:
        """The answer had no tool call; it is asked again in this form (a nudge form tells the
        model `nudge`)."""
        ...

    async def add(self, items: Sequence[SessionItem]) -> None:
        """Add user-side items (tool results, instructions) after the latest answer."""
        ...


Recover = Callable[[PlannerRejected], Awaitable[None]]


async def decide(
    adapter: ModelAdapter,
    conversation: Conversation,
    *,
    system_prompt: str,
    user_prompt: str,
    element_ids: Collection[str] | None = None,
    screen_size: tuple[int, int] | None = None,
    recover: Recover | None = None,
    answered_without_call: bool = False,
    kept: Kept | None = None,
) -> tuple[Decision, list[Turn]]:
    """Ask `adapter` over `conversation` until one usable tool call comes back.

    `recover`, when given, runs once if the first call is refused as invalid, or any call meets
    the context window; that call is then asked once more. `answered_without_call`: the
    conversation already ends with this step's first answer, without a tool call (kept, then
    the decision failed before its retry: the database dropped while storing the nudge); the
    decision starts at that retry rather than asking the paid question again. `kept`: the
    conversation already ends with this step's latest answer, with a tool call (kept, then the
    decision failed on a write after it); the decision starts from that answer as if it had
    just arrived: its first call is used when usable, else corrected, and the answer is
    neither asked for nor billed again. Returns the decision and every turn it took, the last
    being the one whose (first) call the decision carries.
    """
    ids = frozenset(element_ids) if element_ids is not None else None
    started = time.monotonic()
    turns: list[Turn] = []
    usage = Usage()
    retry: RetryKind = "none"
    corrective = 0
    room: int | None = None  # the raised output limit, once an answer was cut off
    answered_by = ""  # the model of the latest answered call ("": none answered yet)
    recovered = False  # `recover` ran (once a decision)
    in_flight: asyncio.Future[Turn] | None = None  # a call not streamed, until it answers

    async def call(asked: TurnRequest) -> Turn:
        """`adapter.complete`. A call not streamed goes on when the decision is cancelled: the
        provider answers and bills it anyway, so its usage is counted when it answers (the
        cancelled error carries it, `InFlight`). A streamed one is cut off (hanging up stops
        the answer); what the provider reported of it by then rides on the error
        (`planner.errors.carry_cut_off`, set by the adapter), as it does on the error of a
        stream the provider broke off."""
        nonlocal in_flight
        if asked.stream:
            return await adapter.complete(asked)
        running = in_flight = asyncio.ensure_future(adapter.complete(asked))
        running.add_done_callback(_retrieved)
        try:
            turn = await asyncio.shield(running)
        except asyncio.CancelledError:
            raise  # the call goes on, carried on this error
        except BaseException:
            in_flight = None
            raise
        in_flight = None
        return turn

    live: LiveBlocks | None = None  # one live view for every call of the decision
    spent = RetrySpend()  # one budget of retries for every call of the decision

    def request(*, force: bool, thinking: bool) -> TurnRequest:
        nonlocal live
        asked = dataclasses.replace(
            conversation.request(forced=force, thinking=thinking), spent=spent
        )
        if asked.on_thinking is not None:
            live = live or live_blocks(asked.on_thinking)
            asked = dataclasses.replace(asked, on_thinking=live)
        return asked if room is None else dataclasses.replace(asked, max_tokens=room)

    async def complete(asked: TurnRequest) -> Turn:
        nonlocal answered_by
        try:
            turn = await call(asked)
        except SessionHistoryError as err:
            # The adapter could not project the conversation into a request (nothing was
            # sent): a named planner error, so the answers before it are billed on it and the
            # host is told why, not a bare ValueError past every handler.
            raise UnreadableAnswer(
                f"planner: {adapter.name} model {answered_by or adapter.model}: the "
                f"conversation cannot be sent back ({err}); nothing more is asked"
            ) from err
        if turn.context_exceeded:
            usage.add(turn.usage)  # billed, though never used
            answered_by = turn.model or adapter.model
            raise _overflowed(adapter, turn)
        return turn

    async def ask(*, force: bool, first: bool = False) -> Turn:
        nonlocal room, answered_by, recovered
        thinking = not force and conversation.thinking_allowed()
        try:
            turn = await complete(request(force=force, thinking=thinking))
        except PlannerRejected as err:
            overflow = isinstance(err, PlannerContextExceeded)
            fresh_helps = not isinstance(err, PlannerParameterRejected)
            if recover is None or recovered or not fresh_helps or not (first or overflow):
                raise
            recovered = True
            broken = take_cut_off(err)  # a stream that broke off said what it cost: billed
            if broken is not None:
                usage.add(broken.usage)
                answered_by = broken.model
            await recover(err)
            turn = await complete(request(force=force, thinking=thinking))
        usage.add(turn.usage)  # billed, whatever becomes of it
        answered_by = turn.model or adapter.model
        if turn.refusal is not None:
            # Never kept, never asked again: the same conversation gets the same refusal.
            raise PlannerRefused(
                f"planner: {adapter.name} model {turn.model or adapter.model} refused to answer "
                f"({turn.refusal})"
            )
        if turn.cut_short is not None:
            # Its call may be unfinished, and nothing says asking again ends otherwise.
            raise PlannerError(
                f"planner: {adapter.name} model {turn.model or adapter.model} ended its answer "
                f"unfinished ({turn.cut_short}); nothing of it is used"
            )
        unanswerable = _unanswerable(turn)
        if unanswerable is not None:
            # Kept, its calls could not each get their result in the next request: nothing of
            # it runs or is kept, and the same server is likely to answer the same way.
            raise UnreadableAnswer(
                f"planner: {adapter.name} model {turn.model or adapter.model} answered with "
                f"tool calls that cannot be answered ({unanswerable}); nothing of it is used"
            )
        if turn.truncated:  # kept so: a decision resumed from the record never runs them
            turn.items = [
                dataclasses.replace(i, cut_off=True) if isinstance(i, ToolCall) else i
                for i in turn.items
            ]
        await conversation.received(turn)
        turns.append(turn)
        if turn.truncated and room is None and turn.max_tokens:
            room = _raised(turn.max_tokens, turn.output_limit)
        return turn

    try:
        turn: Turn | None = None
        if kept is not None:
            turn, corrective, retry = kept.turn, kept.corrective, kept.retry
            turns.append(kept.turn)
        elif not answered_without_call:
            turn = await ask(force=False, first=True)
        while True:
            if turn is None or not turn.tool_calls:
                form = adapter.retry_form
                retry = form
                cut_off = turn is not None and turn.truncated
                await conversation.before_retry(form, CUT_OFF_NUDGE if cut_off else NUDGE)
                turn = await ask(force=form == "forced")
            try:
                parsed = await _parse(conversation, turn, ids, screen_size)
                break
            except ToolCallError as err:
                if corrective >= 1:
                    raise PlannerError(
                        f"planner: {adapter.name} gave an unusable tool call twice: {err}"
                    ) from None
                corrective += 1
                await conversation.add(_correction(turn, str(err)))
                turn = await ask(force=False)
    except (Exception, asyncio.CancelledError) as err:
        # A caller that went away mid-decision (a cancelled Decide, a revoked attempt) does
        # not undo what the provider answered before: it is billed. So does a conversation
        # that could not be stored (the database dropped): the answers were paid for.
        if answered_by:
            bill(err, Billed(adapter.name, answered_by, usage))
        if in_flight is not None and isinstance(err, asyncio.CancelledError):
            carry_in_flight(err, InFlight(adapter.name, adapter.model, in_flight))
        raise

    decision = build_decision(
        parsed,
        turns,
        usage=usage,
        # A decision made from the kept answer itself names that answer's writer, as far as
        # it was kept ("" when it was not): the adapter configured now may not be it.
        provider=kept.provider or adapter.name
        if kept is not None and turn is kept.turn
        else adapter.name,
        model=turn.model if kept is not None and turn is kept.turn else turn.model or adapter.model,
        latency_s=time.monotonic() - started,
        retry_kind=retry,
        corrective_retries=corrective,
        system_prompt=system_prompt,
        user_prompt=user_prompt,
    )
    return decision, turns


def _retrieved(call: asyncio.Future[Turn]) -> None:
    """A call left to finish that fails (the planner closed, the provider failed) is nobody's
    error any more: read here, so asyncio does not report it as never retrieved."""
    if not call.cancelled():
        call.exception()


def _overflowed(adapter: ModelAdapter, turn: Turn) -> PlannerContextExceeded:
    """The error of an answer that filled the context window: never kept, never corrected
    (the correction would go on top of a full context)."""
    return PlannerContextExceeded(
        f"planner: {adapter.name} model {turn.model or adapter.model} stopped at its context "
        f"window (stop reason {turn.stop_reason}): the conversation does not fit; its answer "
        "is not used"
    )


def _unanswerable(turn: Turn) -> str | None:
    """Why the next request could not answer each of `turn`'s calls with its own result, or
    None. Every call is answered there (the first with what ran, or a correction; each extra
    one "not executed"), and a result names its call by id only: two calls sharing an id
    cannot be told apart (Anthropic refuses a second tool_result for a tool_use id, and a
    Chat `tool` message or a Responses `function_call_output` would answer either call).
    Anthropic also requires an id on every tool_use block its tool_result names. OpenAI
    always sends ids, but a compatible server may send one empty id, and it pairs: left to
    that server. Real providers send unique ids; a `*_BASE_URL` proxy or a compatible server
    may not. Nor may two Responses output items share an id: the next request (a session's,
    or a compact corrective turn) sends each back with its id, and the API refuses the whole
    request ("Duplicate item found with id …"), as `SessionPlanner.received` refuses an id an
    earlier answer gave."""
    ids = [c.call_id for c in turn.tool_calls]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        return f"call ids {repeated} each name more than one call"
    items = _output_item_ids(turn)
    repeated = sorted({i for i in items if items.count(i) > 1})
    if repeated:
        return f"output item ids {repeated} each name more than one item"
    if any(not c.call_id and c.provider == "anthropic" for c in turn.tool_calls):
        return "a tool_use block without an id"
    return None


def _output_item_ids(turn: Turn) -> list[str]:
    """The id of each OpenAI Responses output item of `turn`, once per item: the text parts
    of one message are items of their own here, under the message's id."""
    out: list[str] = []
    before: object = None
    for item in turn.items:
        if item.provider == "openai" and item.item_id:
            text = isinstance(item, AssistantText)
            if not (text and before == item.item_id):
                out.append(item.item_id)
            before = item.item_id if text else None
        else:
            before = None
    return out


def _raised(max_tokens: int, output_limit: int | None) -> int:
    """The output limit for the rest of a decision after an answer was cut off at `max_tokens`:
    twice that, at least THINKING_MAX_TOKENS, at most MAX_CALL_TOKENS and the model's own limit."""
    room = min(max(2 * max_tokens, THINKING_MAX_TOKENS), MAX_CALL_TOKENS)
    return room if output_limit is None else min(room, output_limit)


async def _parse(
    conversation: Conversation,
    turn: Turn,
    ids: frozenset[str] | None,
    screen_size: tuple[int, int] | None,
) -> ParsedToolCall:
    if not turn.tool_calls:
        if turn.truncated:
            raise ToolCallError(
                "no tool call: the answer was cut off at the output token limit "
                f"({turn.max_tokens} tokens, thinking included; AMC_PLANNER_MAX_TOKENS)"
            )
        raise ToolCallError("no tool call; call exactly one tool")
    call, *extra = turn.tool_calls
    if extra:
        await conversation.add([ToolResult(c.call_id, EXTRA_CALL, is_error=True) for c in extra])
    if turn.truncated:
        # Its arguments may be cut off mid-way and still validate (a shorter text, a partial
        # list): never executed, whatever they say (the docs: retry an incomplete tool_use with
        # a higher max_tokens). Asked again through the corrective turn, with more room.
        raise ToolCallError(
            "not executed: your answer was cut off at the output token limit "
            f"({turn.max_tokens} tokens, thinking included), so this call may be incomplete; "
            "call the tool again"
        )
    # The first call's own arguments, by position: ids may repeat (`Turn.raw_calls`).
    raw = turn.raw_calls
    arguments: Any = raw[0] if len(raw) == len(turn.tool_calls) else call.arguments
    return parse_tool_call(call.name, arguments, element_ids=ids, screen_size=screen_size)


def _correction(turn: Turn, error: str) -> list[SessionItem]:
    """What goes back after an unusable answer: an error result for its (first) call, or an
    instruction when it called nothing. Extra calls were already answered."""
    if turn.tool_calls:
        return [ToolResult(turn.tool_calls[0].call_id, rejected_call(error), is_error=True)]
    return [UserObservation(CUT_OFF_NUDGE if turn.truncated else NUDGE, kind="instruction")]


def build_decision(
    parsed: ParsedToolCall,
    turns: Sequence[Turn],
    *,
    usage: Usage,
    provider: str,
    model: str,
    latency_s: float,
    retry_kind: RetryKind,
    corrective_retries: int,
    system_prompt: str,
    user_prompt: str,
    extra: dict[str, Any] | None = None,
) -> Decision:
    """The one place a `Decision` is made from the turns a decision needed.

    The rationale is the text of the answer whose call is used, or — when that answer wrote
    none (a forced call writes none) — of the latest earlier answer: a corrected answer usually
    repeats its judgement, and it must not appear twice. Every answer's thinking is kept (but
    the thinking blocks that hold an answer's text, on the models that return it there: that
    is its rationale, `Turn.said`). The
    recorded user prompt is what the model read: a note sent in place of a screenshot that
    could not be made to fit, then the prompt.
    """
    reasoning = [r for t in turns for r in t.thought]
    # What stood in for a screenshot the provider could not take was sent before the prompt:
    # the record says what the model was told.
    notes = turns[-1].projection.screenshot_notes if turns else []
    said = next((t for t in reversed(turns) if t.text), None)
    rationale = said.text if said is not None else None
    if said is not None and said.truncated:
        rationale = f"{rationale}\n{CUT_OFF}"
    kinds = {t.thinking_kind for t in turns}
    thinking_kind: ThinkingKind = next((k for k in _KIND_ORDER if k in kinds), "none")
    return Decision(
        tool_name=parsed.tool_name,
        arguments=parsed.arguments,
        action=parsed.action,
        purpose=parsed.purpose,
        expected_outcome=parsed.expected_outcome,
        rationale=rationale,
        thinking=[
            ThinkingBlock(r.readable, redacted=r.redacted_data is not None) for r in reasoning
        ],
        usage=usage,
        provider=provider,
        model=model,
        latency_s=latency_s,
        forced_retry=retry_kind != "none",
        system_prompt=system_prompt,
        user_prompt="\n\n".join([*notes, user_prompt]),
        corrective_retries=corrective_retries,
        extra=dict(extra or {}),
        thinking_kind=thinking_kind,
        retry_kind=retry_kind,
        output_truncated=any(t.truncated for t in turns),
        previous_step=parsed.previous_step,
    )
