"""`planner.decision.Decision` <-> `amc.v1.Decision`.

Masking happens here, once: a sensitive `input_text` value becomes "•••" in `arguments_json` and
in the typed action unless the caller explicitly asks to reveal it. Only the Decide response to
the host that must type the value reveals it; every stored or listed decision stays masked.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import cast

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from amc.v1 import types_pb2
from planner.decision import (
    CUT_MARK,
    MAX_RECORD_BYTES,
    MAX_THINKING_BLOCK_BYTES,
    MAX_THINKING_BLOCKS,
    Decision,
    ResumedFrom,
    RetryKind,
    ThinkingBlock,
    ThinkingKind,
    Usage,
    kept,
)
from planner.observation import clip
from planner.secret_refs import stored
from planner.tools import Judgement
from planner.verify import verdict_from_proto, verdict_to_proto

_PROVIDERS: dict[str, types_pb2.ModelProvider.ValueType] = {
    "anthropic": types_pb2.MODEL_PROVIDER_ANTHROPIC,
    "openai": types_pb2.MODEL_PROVIDER_OPENAI,
    "offline": types_pb2.MODEL_PROVIDER_OFFLINE,
}
_MODES: dict[str, types_pb2.PlannerMode.ValueType] = {
    "compact": types_pb2.PLANNER_MODE_COMPACT,
    "session": types_pb2.PLANNER_MODE_SESSION,
    "replay": types_pb2.PLANNER_MODE_REPLAY,
}


def provider_enum(name: str) -> types_pb2.ModelProvider.ValueType:
    """`Decision.provider` as the typed enum (UNSPECIFIED for a name it does not know)."""
    return _PROVIDERS.get(name, types_pb2.MODEL_PROVIDER_UNSPECIFIED)


def mode_enum(mode: str) -> types_pb2.PlannerMode.ValueType:
    """`Decision.planner_mode` as the typed enum."""
    return _MODES.get(mode, types_pb2.PLANNER_MODE_UNSPECIFIED)


def usage_to_proto(usage: Usage) -> types_pb2.Usage:
    return types_pb2.Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        thinking_tokens=usage.thinking_tokens,
        cost_usd=usage.cost_usd,
        cache_creation_1h_input_tokens=usage.cache_creation_1h_input_tokens,
    )


def usage_from_proto(usage: types_pb2.Usage) -> Usage:
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        thinking_tokens=usage.thinking_tokens,
        cost_usd=usage.cost_usd,
        cache_creation_1h_input_tokens=usage.cache_creation_1h_input_tokens,
    )


_THINKING_KINDS: dict[str, types_pb2.ThinkingKind.ValueType] = {
    "none": types_pb2.THINKING_KIND_NONE,
    "full": types_pb2.THINKING_KIND_FULL,
    "summarized": types_pb2.THINKING_KIND_SUMMARIZED,
    "omitted": types_pb2.THINKING_KIND_OMITTED,
    "redacted": types_pb2.THINKING_KIND_REDACTED,
}
_RETRY_KINDS: dict[str, types_pb2.RetryKind.ValueType] = {
    "none": types_pb2.RETRY_KIND_NONE,
    "forced": types_pb2.RETRY_KIND_FORCED_TOOL_CHOICE,
    "nudge": types_pb2.RETRY_KIND_NUDGE,
}


def thinking_kind_to_proto(kind: str) -> types_pb2.ThinkingKind.ValueType:
    """ "summarized" → THINKING_KIND_SUMMARIZED; anything unknown (a row from before the field
    existed) → UNSPECIFIED."""
    return _THINKING_KINDS.get(kind, types_pb2.THINKING_KIND_UNSPECIFIED)


def thinking_kind_from_proto(value: types_pb2.ThinkingKind.ValueType) -> ThinkingKind:
    for name, v in _THINKING_KINDS.items():
        if v == value:
            return cast(ThinkingKind, name)
    return "none"


def retry_kind_to_proto(kind: str) -> types_pb2.RetryKind.ValueType:
    return _RETRY_KINDS.get(kind, types_pb2.RETRY_KIND_UNSPECIFIED)


def retry_kind_from_proto(value: types_pb2.RetryKind.ValueType) -> RetryKind:
    for name, v in _RETRY_KINDS.items():
        if v == value:
            return cast(RetryKind, name)
    return "none"


def masked_action(decision: Decision) -> types_pb2.Action:
    """The typed action with a sensitive text replaced by "•••" (a lone secret reference
    stays: `secret_refs.stored`)."""
    action = types_pb2.Action()
    action.CopyFrom(decision.action)
    if action.WhichOneof("kind") == "input_text" and action.input_text.sensitive:
        action.input_text.text = stored(action.input_text.text)
    return action


def decision_to_proto(
    decision: Decision,
    *,
    decision_id: str = "",
    host_id: str = "",
    task_id: str = "",
    attempt: int = 0,
    created_at: datetime | None = None,
    reveal_sensitive: bool = False,
) -> types_pb2.Decision:
    """The wire form. `reveal_sensitive` only for the host that executes the action."""
    latency = duration_pb2.Duration()
    latency.FromNanoseconds(int(decision.latency_s * 1e9))
    created = timestamp_pb2.Timestamp()
    created.FromDatetime(created_at or datetime.now(UTC))
    if reveal_sensitive:
        action = types_pb2.Action()
        action.CopyFrom(decision.action)
    else:
        action = masked_action(decision)
    return types_pb2.Decision(
        decision_id=decision_id,
        host_id=host_id,
        task_id=task_id,
        attempt=attempt,
        step_index=decision.step_index or 0,
        provider=decision.provider,
        model=decision.model,
        system_prompt=decision.system_prompt,
        user_prompt=decision.user_prompt,
        tool_name=decision.tool_name,
        arguments_json=json.dumps(decision.masked_arguments(), ensure_ascii=False, sort_keys=True),
        action=action,
        rationale=decision.rationale or "",
        thinking=[
            types_pb2.ThinkingBlock(text=b.text, redacted=b.redacted) for b in decision.thinking
        ],
        purpose=decision.purpose,
        expected_outcome=decision.expected_outcome,
        usage=usage_to_proto(decision.usage),
        latency=latency,
        forced_retry=decision.forced_retry,
        created_at=created,
        corrective_retries=decision.corrective_retries,
        planner_mode=decision.planner_mode,
        model_provider=provider_enum(decision.provider),
        mode=mode_enum(decision.planner_mode),
        thinking_kind=thinking_kind_to_proto(decision.thinking_kind),
        retry_kind=retry_kind_to_proto(decision.retry_kind),
        output_truncated=decision.output_truncated,
        previous_step=judgement_to_proto(decision.previous_step),
        target=decision.target_descriptor,
        flow_id=decision.flow_id,
        flow_step=decision.flow_step,
        replay_divergence=decision.replay_divergence,
        flow_set_aside=decision.flow_set_aside,
        resumed_from=resumed_to_proto(decision.resumed_from),
    )


def resumed_to_proto(resumed: ResumedFrom | None) -> types_pb2.ResumedTurn | None:
    """`Decision.resumed_from` on the wire; None (the field unset) for a decision that called
    the model."""
    if resumed is None:
        return None
    out = types_pb2.ResumedTurn(turn_id=resumed.turn_id, position=resumed.position)
    if resumed.answered_at is not None:
        out.answered_at.FromDatetime(resumed.answered_at.astimezone(UTC))
    return out


def resumed_from_proto(message: types_pb2.Decision) -> ResumedFrom | None:
    """The kept answer `message` went on from, read by presence (an empty `turn_id` is still a
    resumed decision), or None."""
    if not message.HasField("resumed_from"):
        return None
    r = message.resumed_from
    at = r.answered_at.ToDatetime(tzinfo=UTC) if r.HasField("answered_at") else None
    return ResumedFrom(r.turn_id, r.position, at)


def judgement_to_proto(judgement: Judgement | None) -> types_pb2.StepJudgement | None:
    """The model's `previous_step` on the wire; None when it gave none."""
    if judgement is None:
        return None
    return types_pb2.StepJudgement(verdict=verdict_to_proto(judgement.verdict), note=judgement.note)


def judgement_from_proto(message: types_pb2.StepJudgement) -> Judgement | None:
    verdict = verdict_from_proto(message.verdict)
    return Judgement(verdict, message.note) if verdict is not None else None


def decision_from_proto(message: types_pb2.Decision) -> Decision:
    """The host's view of a Decide answer. Arguments come from the typed action (which carries
    the real text of a sensitive input in a Decide response), not from the masked JSON."""
    action = types_pb2.Action()
    action.CopyFrom(message.action)
    arguments = _arguments_from_action(action)
    return Decision(
        tool_name=message.tool_name,
        arguments=arguments,
        action=action,
        purpose=message.purpose,
        expected_outcome=message.expected_outcome,
        rationale=message.rationale or None,
        thinking=[ThinkingBlock(text=b.text, redacted=b.redacted) for b in message.thinking],
        usage=usage_from_proto(message.usage),
        provider=message.provider,
        model=message.model,
        latency_s=message.latency.ToNanoseconds() / 1e9,
        forced_retry=message.forced_retry,
        system_prompt=message.system_prompt,
        user_prompt=message.user_prompt,
        corrective_retries=message.corrective_retries,
        step_index=message.step_index or None,
        extra={
            **({"decision_id": message.decision_id} if message.decision_id else {}),
            **(
                {"mode": message.planner_mode}
                if message.planner_mode in ("session", "replay")
                else {}
            ),
        },
        thinking_kind=thinking_kind_from_proto(message.thinking_kind),
        retry_kind=retry_kind_from_proto(message.retry_kind),
        output_truncated=message.output_truncated,
        previous_step=judgement_from_proto(message.previous_step)
        if message.HasField("previous_step")
        else None,
        target_descriptor=message.target if message.HasField("target") else None,
        flow_id=message.flow_id,
        flow_step=message.flow_step,
        replay_divergence=message.replay_divergence,
        flow_set_aside=message.flow_set_aside,
        resumed_from=resumed_from_proto(message),
    )


def _arguments_from_action(action: types_pb2.Action) -> dict[str, object]:
    kind = action.WhichOneof("kind")
    if kind == "tap":
        args: dict[str, object] = (
            {"element_id": action.tap.element_id}
            if action.tap.WhichOneof("target") == "element_id"
            else {"x": action.tap.point.x, "y": action.tap.point.y}
        )
        if action.tap.long_press:
            args["long_press"] = True
        return args
    if kind == "swipe":
        s = action.swipe
        args = {"start_x": s.start.x, "start_y": s.start.y, "end_x": s.end.x, "end_y": s.end.y}
        if s.duration_ms:
            args["duration_ms"] = s.duration_ms
        return args
    if kind == "input_text":
        t = action.input_text
        args = {"text": t.text, "sensitive": t.sensitive}
        if t.element_id:
            args["element_id"] = t.element_id
        return args
    if kind == "press_key":
        names = {
            types_pb2.KEY_BACK: "back",
            types_pb2.KEY_HOME: "home",
            types_pb2.KEY_ENTER: "enter",
            types_pb2.KEY_DELETE: "delete",
        }
        return {"key": names.get(action.press_key.key, "")}
    if kind == "launch_app":
        return {"package_name": action.launch_app.package_name}
    if kind == "terminate_app":
        return {"package_name": action.terminate_app.package_name}
    if kind == "complete":
        return {"success": action.complete.success, "reason": action.complete.reason}
    return {}


def merge_thinking_past_limit(
    blocks: RepeatedCompositeFieldContainer[types_pb2.ThinkingBlock],
) -> None:
    """Merge the blocks from the decision log's MAX_THINKING_BLOCKS-th on into that one, so a
    decision that thought in more blocks (a long tool loop) is kept, not refused whole: a line
    saying how many were merged, then their texts (a redacted one named so), a blank line
    between, cut to one block's limit with a marker when longer."""
    if len(blocks) <= MAX_THINKING_BLOCKS:
        return
    rest = list(blocks[MAX_THINKING_BLOCKS - 1 :])
    del blocks[MAX_THINKING_BLOCKS - 1 :]
    head = (
        f"[{len(rest)} thinking blocks merged into this one: the decision log keeps at most "
        f"{MAX_THINKING_BLOCKS} of a decision]"
    )
    texts = [b.text or ("[redacted]" if b.redacted else "") for b in rest]
    text = "\n\n".join([head, *(t for t in texts if t)])
    size, limit = len(text.encode("utf-8")), MAX_THINKING_BLOCK_BYTES
    marker = f"{CUT_MARK}these merged blocks are {size:,} bytes, over the {limit:,} kept of one]"
    blocks.add(text=clip(text, limit, marker))


#: The least `fit_record` leaves of a text it cuts: room for its cut marker and a readable head.
_LEAST_KEPT = 1024


#: What a record gains when it is logged and listed, past `record_bytes`: its ids (decision,
#: host, task: a few hundred bytes at most), its transport, the framing of its screen.
_LOGGED_BYTES = 1024


def record_bytes(decision: Decision) -> int:
    """The size of `decision` as one decision record on the wire (the Decide reply, one entry
    of ListDecisions with the screen it was made on), but for what logging adds to it
    (`_LOGGED_BYTES`) and its outcome and checks, recorded later. The larger of its two forms:
    the Decide reply reveals a sensitive text to the host that types it, the decision log
    stores and lists it masked (`masked_action`, `steps.stored_arguments`), and a secret
    shorter than its mask makes the stored form the larger."""
    size = max(
        decision_to_proto(decision, reveal_sensitive=reveal).ByteSize() for reveal in (True, False)
    )
    return size + (decision.observation.ByteSize() if decision.observation is not None else 0)


def fit_record(decision: Decision, limit: int = MAX_RECORD_BYTES) -> None:
    """Cut the texts people read of `decision` (prompts, rationale, purpose, expected outcome,
    thinking) until the whole record fits in `limit` bytes, the largest first: every text
    longer than one level is cut to it (`kept`, its marker naming the text), the shorter ones
    stay whole. Called before a decision is logged and before Decide answers with it.

    Nothing the next model call needs is here: signed thinking and encrypted reasoning live in
    the session's items (`planner.conversation.items`), which keep them whole; `thinking` holds
    only their readable text. What the host executes is not cut; the action's purpose and
    expected outcome are: copies of the decision's (`parse_tool_call`), each as many bytes of
    the record, read by people, never by the host's driver."""
    texts: dict[str, str] = {
        "system_prompt": decision.system_prompt,
        "user_prompt": decision.user_prompt,
        "rationale": decision.rationale or "",
        "purpose": decision.purpose,
        "expected_outcome": decision.expected_outcome,
        "action.purpose": decision.action.purpose,
        "action.expected_outcome": decision.action.expected_outcome,
        **{f"thinking[{i}]": b.text for i, b in enumerate(decision.thinking)},
    }
    sizes = sorted((len(text.encode("utf-8")) for text in texts.values()), reverse=True)
    rest = f"a decision record is kept within {limit:,} bytes, its largest texts cut first"
    limit -= _LOGGED_BYTES
    need = over = record_bytes(decision) - limit
    while over > 0:
        level = max(_level(sizes, need), _LEAST_KEPT)
        cut = {n: kept(t, level, f"this {n.replace('_', ' ')}", rest) for n, t in texts.items()}
        decision.system_prompt = cut["system_prompt"]
        decision.user_prompt = cut["user_prompt"]
        decision.rationale = cut["rationale"] if decision.rationale is not None else None
        decision.purpose = cut["purpose"]
        decision.expected_outcome = cut["expected_outcome"]
        decision.action.purpose = cut["action.purpose"]
        decision.action.expected_outcome = cut["action.expected_outcome"]
        decision.thinking = [
            ThinkingBlock(cut[f"thinking[{i}]"], redacted=b.redacted)
            for i, b in enumerate(decision.thinking)
        ]
        over = record_bytes(decision) - limit
        if level == _LEAST_KEPT:  # what is left is not text people read: the action, the screen
            return
        need += over  # the markers and field lengths: a few bytes more next time


def _level(sizes: list[int], over: int) -> int:
    """The highest length that texts of `sizes` (largest first) cut to it lose `over` bytes."""
    for n in range(1, len(sizes) + 1):
        # The n largest cut to one level L lose sum(top n) - n * L; the next one must stay whole.
        level = (sum(sizes[:n]) - over) // n
        below = sizes[n] if n < len(sizes) else 0
        if level >= below:
            return max(level, 0)
    return 0
