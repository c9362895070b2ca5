"""A step's answer already kept, to go on from when its decision failed on a write after it.

Session mode keeps every model turn as it arrives, so a decision that fails afterwards (the
database dropped while the "not executed" answers to the answer's extra calls, or its
correction, were written) leaves the answer in the conversation, paid for and billed on the
decision's error. `kept_answer` finds such an answer when the host asks for the step again,
so the step goes on from it (`planner.deciding.Kept`) instead of paying the model for the
same question anew.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Literal

from planner.conversation.items import (
    AssistantItem,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
    unanswered_calls,
)
from planner.deciding import REJECTED, Kept
from planner.decision import Usage
from planner.errors import ToolCallError
from planner.model_profiles import ModelProfile
from planner.secret_refs import MASK
from planner.tools import parse_tool_call
from planner.vendors.base import ModelAdapter, TextInThinking, Turn


def kept_answer(
    items: Sequence[SessionItem],
    observation_text: str,
    element_ids: Collection[str] | None,
    screen_size: tuple[int, int] | None,
    adapter: ModelAdapter,
) -> tuple[int, Kept] | None:
    """(where the observation is, the answer to go on from) when this step's decision was
    cut short by a write after its latest answer was kept, or None.

    The conversation ends with this observation and the items one decision adds after it,
    the last an answer whose first call has no result; and that decision cannot have
    ended: an extra call of the answer has no "not executed" result yet, or the first call
    is unusable and has no correction while the decision had not corrected yet. The
    database dropped while that was written; the answer was paid for and billed on that
    decision's error, and the host asks for the step again. Before, the call was answered
    "not carried out" and the model asked the same question anew (a second bill for one
    turn). A usable call whose extra calls were all answered is a decision that was made
    and then lost: it stays "not carried out" (`planner.plan_step`), as does a call that
    may not run as kept (`_runs_as_kept`). So does an unusable call after the decision's
    one correction: that decision gave up on it ("unusable tool call twice"), writing
    nothing after it, and the step asks the model afresh as it did before answers were
    gone on from."""
    at = _latest_observation(items)
    seen = items[at] if at is not None else None
    if at is None or not isinstance(seen, UserObservation) or seen.text != observation_text:
        return None
    tail = items[at + 1 :]
    made = {i.call_id for i in tail if isinstance(i, ToolCall)}
    if any(isinstance(i, ToolResult) and i.call_id not in made for i in tail):
        return None  # a call before this observation was answered after it: a later step
    span = _latest_answer(tail)
    if span is None:
        return None
    begin, end = span
    answer = [i for i in tail[begin:end] if isinstance(i, AssistantItem)]  # all of them
    calls = [i for i in answer if isinstance(i, ToolCall)]
    if not calls:
        return None  # no call: `_answered_without_call`
    first, *extra = calls
    extra_ids = {c.call_id for c in extra}
    if not all(isinstance(i, ToolResult) and i.call_id in extra_ids for i in tail[end:]):
        return None
    pending = set(unanswered_calls(items))
    if first.call_id not in pending or not _runs_as_kept(first):
        return None
    # What the decision had done before the answer: a retry without a call (an
    # instruction first), a correction (a rejected call, or a second instruction).
    before = tail[:begin]
    told = [i for i in before if isinstance(i, UserObservation)]
    rejected = [i for i in before if isinstance(i, ToolResult) and i.output.startswith(REJECTED)]
    retry = adapter.retry_form if told else "none"
    corrective = 1 if rejected or len(told) > 1 else 0
    try:
        parse_tool_call(
            first.name, first.arguments, element_ids=element_ids, screen_size=screen_size
        )
    except ToolCallError:
        if corrective:
            # Its decision had corrected once already, so it gave up on this call
            # ("unusable tool call twice") and wrote nothing after it: not cut short. Gone on
            # from, it would give up again without asking anything, at every later ask.
            return None
    else:
        if not any(c.call_id in pending for c in extra):
            return None  # its decision was made: lost after (not carried out)
    turn = Turn(
        turn_id=first.turn_id,
        items=list(answer),
        usage=Usage(),  # billed with the decision that kept it
        model=_model(answer),
        stop_reason=None,
        raw_calls=[c.arguments for c in calls],
        readable_thinking=_readable_thinking(answer, adapter),
        text_in_thinking=_text_in_thinking(first.provider, adapter),
    )
    kept = Kept(
        turn, corrective=corrective, retry=retry, position=at + 1 + begin, provider=first.provider
    )
    return at, kept


def _model(answer: Sequence[AssistantItem]) -> str:
    """The model that wrote `answer`, as far as it was kept: its reasoning names the model
    whose call made it (Anthropic); else "" (not kept: an OpenAI answer, an Anthropic one
    without thinking). The decision records this model, and the one configured now may have
    changed since the answer was paid for: naming it would name a model that never saw the
    question."""
    return next((i.model for i in answer if isinstance(i, Reasoning) and i.model), "")


def _text_in_thinking(provider: str, adapter: ModelAdapter) -> TextInThinking:
    """Where the answer's text before its call is, as read on arrival: an Anthropic answer
    by the adapter's thinking setup (`AnthropicAdapter.kept_text_in_thinking`); any other
    provider's never in its reasoning."""
    said = getattr(adapter, "kept_text_in_thinking", None)
    return said() if provider == "anthropic" and callable(said) else "none"


def _readable_thinking(
    answer: Sequence[AssistantItem], adapter: ModelAdapter
) -> Literal["full", "summarized"]:
    """What the answer's readable reasoning text is, as the adapter judged it on arrival, so
    the decision's `thinking_kind` says the same as it would have. An OpenAI answer's
    reasoning text (content, kept in `Reasoning.text`) is the model's own and its summaries
    are summaries (`responses.readable_thinking`); an Anthropic answer's is what the model's
    profile says."""
    reasoning = [i for i in answer if isinstance(i, Reasoning)]
    if any(r.provider == "openai" for r in reasoning):
        return "full" if any(r.text for r in reasoning) else "summarized"
    profile = getattr(adapter, "profile", None)
    return profile.readable_thinking if isinstance(profile, ModelProfile) else "summarized"


def _latest_answer(tail: Sequence[SessionItem]) -> tuple[int, int] | None:
    """Where the latest model turn of `tail` begins and ends (`tail[begin:end]`), or None.

    Told apart by position, not by turn id: a turn's items are stored together, and the
    decision stores a user-side item (an instruction, a result) before every further request,
    so one turn is a run of assistant items with nothing between. Ids cannot tell: an
    OpenAI-compatible server may send none, or one for every answer."""
    said = [n for n, item in enumerate(tail) if isinstance(item, AssistantItem)]
    if not said:
        return None
    end = said[-1] + 1
    begin = end - 1
    while begin and isinstance(tail[begin - 1], AssistantItem):
        begin -= 1
    return begin, end


def _latest_observation(items: Sequence[SessionItem]) -> int | None:
    """Where the conversation's latest screen observation is (None: it has none)."""
    for n in range(len(items) - 1, -1, -1):
        item = items[n]
        if isinstance(item, UserObservation) and item.kind == "observation":
            return n
    return None


def _runs_as_kept(call: ToolCall) -> bool:
    """Whether `call` as stored is the call the model made, so it may run from the record: not
    cut off at the output limit, no sensitive text masked (the text is never stored), no
    argument over its limit replaced by a note of its length (`planner.tools`)."""
    if call.cut_off:
        return False
    args = call.arguments
    masked = args.get("sensitive", False) is not False and args.get("text") == MASK
    if call.name == "input_text" and masked:
        return False
    return not any(isinstance(v, str) and _NOTED.fullmatch(v) for v in args.values())


#: An argument over its limit as a conversation keeps it (`planner.tools.over_limit_noted`).
_NOTED = re.compile(r"\[[\d,]+ characters, over the [\d,]+ allowed: not kept\]")
