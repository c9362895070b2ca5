"""What one planning call produced, independent of provider and transport."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from amc.v1 import types_pb2
from planner.observation import clip
from planner.secret_refs import stored

if TYPE_CHECKING:
    from planner.tools import Judgement

ThinkingKind = Literal["none", "full", "summarized", "omitted", "redacted"]
RetryKind = Literal["none", "forced", "nudge"]

#: How every console and the CLI name a decision's thinking kind ("" = a decision recorded
#: before the kind was): a word, never a blank.
THINKING_WORDS: dict[str, str] = {
    "full": "full thinking",
    "summarized": "summarized thinking",
    "omitted": "thinking omitted by the provider",
    "redacted": "redacted thinking",
    "none": "no thinking",
    "": "thinking kind not recorded",
}
#: What an empty block that is not redacted means (a signature or encrypted content only).
OMITTED_BLOCK = "omitted by the provider: it returned no text for this block, only its signature"
RETRY_WORDS: dict[str, str] = {"forced": "forced retry", "nudge": "nudged retry"}
#: What the decision log takes of a decision a host on the direct transport ships
#: (ShipDecisions), in UTF-8 bytes: of its rationale, purpose and expected outcome each, of one
#: thinking block, and how many blocks.
MAX_MODEL_TEXT = 64 * 1024
#: What the host typed (an input_text action's text) is not cut to `MAX_MODEL_TEXT` with the
#: action's other texts: a cut record said another text than the phone got. Today's planner
#: refuses one over 4,000 characters (`planner.tools.MAX_TEXT_CHARS`); a longer one is kept
#: whole up to this cap, which a record holds twice (the action and its `arguments_json`)
#: within `MAX_RECORD_BYTES`. Over it: the Python host cuts it to the cap with the marker of
#: every cut (`kept`, naming `action.input_text.text`) before it ships the decision
#: (host/outbox/shipments.py), so the step and its cost are logged rather than refused; the
#: cloud refuses an entry over it from a host that did not cut it (ShipDecisions,
#: INVALID_ARGUMENT naming the field), and does not cut it itself.
MAX_TYPED_TEXT = 512 * 1024
#: `cloud.wire.keep_texts`' limits of an action's texts (paths from "action.") that differ
#: from `MAX_MODEL_TEXT`.
ACTION_TEXT_LIMITS = {"action.input_text.text": MAX_TYPED_TEXT}
MAX_THINKING_BLOCK_BYTES = 64 * 1024
MAX_THINKING_BLOCKS = 64
#: The most one decision record takes in all, in bytes of its wire form (`types_pb2.Decision`,
#: with the screen it was made on): its largest texts are cut to fit (`convert.fit_record`).
#: Each text within its own limit still added up past gRPC's default 4 MiB (64 thinking blocks
#: of 64 KiB and the prompts): the reply to Decide, and every page of the task's decision log,
#: were then refused by a client with default limits. Half of that leaves room for what is
#: added to a record later (its outcome, its checks) and for the page around it.
MAX_RECORD_BYTES = 2 * 1024 * 1024
#: How the marker of a text cut to those limits begins (`kept`).
CUT_MARK = "\n\n[… cut here: "
#: Where a text cut by the decision log is whole: a host on the direct transport ships what
#: it kept.
IN_THE_TIMELINE = "the host's own timeline has all of it"


def kept(text: str, limit: int, what: str, rest: str = IN_THE_TIMELINE) -> str:
    """`text` as the decision log takes it (ShipDecisions' limits, in UTF-8 bytes): what the
    model read and wrote has no such limit (the prompt with the note that stood in for a
    screenshot the provider could not take, a long thought, a long text to type). Cut, it says
    so, naming it as `what`, and where the rest is: the host cuts before it ships (the cloud
    would refuse the step with it), the cloud cuts what an older host sent whole. `rest` says
    where the whole text is, or why it was cut."""
    size = len(text.encode("utf-8"))
    if size <= limit:
        return text
    marker = (
        f"{CUT_MARK}{what} is {size:,} bytes, over the {limit:,} the decision log keeps; {rest}]"
    )
    return clip(text, limit, marker)


def whole_of(text: str, other: str) -> str:
    """`other` when `text` is a cut of it (its head, then the cut marker), else `text`: where
    one record of a step holds a text cut to the decision log's limits and another holds it
    whole, the whole one is what the model read or wrote."""
    head, mark, _ = text.rpartition(CUT_MARK)
    return other if mark and len(other) > len(head) and other.startswith(head) else text


def thinking_word(kind: str) -> str:
    """The word for a thinking kind (an unknown value reads as "not recorded")."""
    return THINKING_WORDS.get(kind, THINKING_WORDS[""])


@dataclass(frozen=True, slots=True)
class ThinkingBlock:
    """One reasoning block. `redacted` blocks carry no readable text (redacted_thinking); a
    block with empty text that is not redacted was omitted by the provider (a signature or
    encrypted content only)."""

    text: str
    redacted: bool = False


class TokenCounts(Protocol):
    """Anything with a usage's four token counts: `Usage`, the wire's `types_pb2.Usage`, the
    consoles' models of them."""

    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cache_read_input_tokens(self) -> int: ...
    @property
    def cache_creation_input_tokens(self) -> int: ...


def billed_tokens(usage: TokenCounts) -> int:
    """Every token a provider bills: input, output, cache reads and cache writes. The one
    definition of "tokens" wherever a total is shown or capped (budgets, the task totals, both
    consoles, the CLI): a page that summed fewer disagreed with the others on one attempt."""
    return (
        usage.input_tokens
        + usage.output_tokens
        + usage.cache_read_input_tokens
        + usage.cache_creation_input_tokens
    )


@dataclass(slots=True)
class Usage:
    """Token usage summed over every provider call a decision needed, and what it cost.

    `input_tokens` are the input tokens billed at the normal rate (cache reads and writes are
    counted apart, as Anthropic reports them; the OpenAI adapters subtract cached tokens);
    `output_tokens` include thinking (`thinking_tokens` is the part of them the provider
    reported as reasoning). `cost_usd` is priced from the model's row of the price table
    (`planner/prices.py`) when the call returns; 0 for a model without a price.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    thinking_tokens: int = 0
    cost_usd: float = 0.0
    #: The part of `cache_creation_input_tokens` written to the 1-hour cache (Anthropic's
    #: `usage.cache_creation.ephemeral_1h_input_tokens`), billed at its own, higher rate
    #: (`planner.prices.Price.cache_write_1h`); kept with the decision's record, so its cost
    #: can be explained, but not in sums of usage (task totals, spending).
    cache_creation_1h_input_tokens: int = 0
    #: The unsettled-call markers (`planner.unsettled`) of the calls summed here: whoever
    #: records this usage settles them in the same write. Not a figure: never compared.
    calls: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def billed_tokens(self) -> int:
        """Every token a provider bills (`billed_tokens`): what a token budget counts."""
        return billed_tokens(self)

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_input_tokens += other.cache_read_input_tokens
        self.cache_creation_input_tokens += other.cache_creation_input_tokens
        self.thinking_tokens += other.thinking_tokens
        self.cost_usd += other.cost_usd
        self.cache_creation_1h_input_tokens += other.cache_creation_1h_input_tokens
        self.calls.extend(other.calls)


@dataclass(frozen=True, slots=True)
class Billed:
    """What the answered calls of a decision that then failed cost: the provider bills every
    answered call (a refusal, an answer without a usable tool call, one cut off) whether or not
    a decision comes of it, so the spending ledger and the budgets must count it."""

    provider: str
    model: str
    usage: Usage


#: The longest provider turn id a resumed decision names (`ResumedFrom.turn_id`): far past any
#: provider's ids (Anthropic's and OpenAI's are under 64 bytes); the cloud refuses longer.
MAX_TURN_ID_BYTES = 256


@dataclass(frozen=True, slots=True)
class ResumedFrom:
    """The kept model answer a decision went on from instead of asking the model its question
    again (`planner.session.kept_answer`): its rationale, thinking and call were written for an
    earlier decision of the step, which was billed for them and then failed on a write. Its
    call became the decision, or, unusable, was corrected by a model call of this decision.

    `turn_id` is the provider's id of the answer, "" when the provider sent none; `position` is
    where the answer begins in the attempt's conversation (its first item's 0-based index), so
    the record tells the answer apart, and says it was resumed, with or without an id.
    `answered_at` is when the session store kept the answer (UTC), None when it did not say:
    the decision may come long after it (a later attempt, after a restart)."""

    turn_id: str
    position: int
    answered_at: datetime | None = None

    def words(self) -> str:
        """How a record shows it (both consoles, `amc task decisions`): that this decision went
        on from an answer written for an earlier request of the step, which answer, and when
        it was answered."""
        named = f"turn {self.turn_id}" if self.turn_id else "a turn without an id"
        when = (
            f", answered at {self.answered_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
            if self.answered_at is not None
            else ""
        )
        return (
            f"resumed from the kept answer ({named}, at item {self.position} of the "
            f"conversation, counted from 0{when}): the model wrote it for an earlier request of "
            "this step, whose decision was billed for it and failed after keeping it; this "
            "decision went on from it (its call, or its correction) instead of asking that "
            "question again"
        )

    def as_dict(self) -> dict[str, Any]:
        """As a JSON record keeps it (the host's timeline): `answered_at` ISO 8601 or None."""
        at = self.answered_at.isoformat() if self.answered_at is not None else None
        return {"turn_id": self.turn_id, "position": self.position, "answered_at": at}

    @classmethod
    def from_dict(cls, value: dict[str, Any] | None) -> ResumedFrom | None:
        """A record's mark back (`as_dict`), None for none; a record of an older host has no
        `answered_at` (read as not known) and what is not of its type reads as missing."""
        if not value:
            return None
        position = value.get("position")
        at = value.get("answered_at")
        try:
            answered_at = datetime.fromisoformat(at) if isinstance(at, str) else None
        except ValueError:
            answered_at = None
        return cls(
            str(value.get("turn_id") or ""),
            position if isinstance(position, int) else 0,
            answered_at,
        )

    @classmethod
    def of(cls, turn_id: str, position: int, answered_at: datetime | None = None) -> ResumedFrom:
        """The mark, its turn id cut to `MAX_TURN_ID_BYTES` (a provider's id is far shorter;
        an overlong one must not make the cloud refuse the decision it annotates)."""
        clipped = turn_id.encode("utf-8")[:MAX_TURN_ID_BYTES].decode("utf-8", errors="ignore")
        return cls(clipped, position, answered_at)


@dataclass(slots=True)
class Decision:
    """One step's decision with everything an auditor needs.

    `arguments` are the executable arguments: `purpose` and `expected_outcome` are removed from
    them and carried beside, and a sensitive `input_text` value is present here (it must run) but
    masked by `masked_arguments()` for anything that is stored or logged.
    """

    tool_name: str
    arguments: dict[str, Any]
    action: types_pb2.Action
    purpose: str
    expected_outcome: str
    rationale: str | None
    thinking: list[ThinkingBlock]
    usage: Usage
    provider: str
    model: str
    latency_s: float
    forced_retry: bool
    system_prompt: str
    user_prompt: str
    corrective_retries: int = 0
    step_index: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Page of the screen the decision was made on, and the label of the element its action
    #: names: what the attempt's later history says about this step (set by `plan_step`).
    page: str = ""
    target: str | None = None
    thinking_kind: ThinkingKind = "none"
    """What `thinking` holds: "full", "summarized", "omitted" (the provider returned no text),
    "redacted" or "none" — so a reader never has to guess from a blank."""
    retry_kind: RetryKind = "none"
    """The retry the first answer without a tool call needed: "none", "forced" (forced tool
    choice, thinking off for that call) or "nudge" (thinking kept, an instruction)."""
    output_truncated: bool = False
    """An answer was cut off by the output token limit (the rationale then says so)."""
    observation: types_pb2.ScreenObservation | None = None
    """The screen the decision was made on (set by `plan_step`): the decision log keeps it so
    an export of the run has its screens and can place actions on them."""
    previous_step: Judgement | None = None
    """The model's judgement of the step before this one (its `previous_step` argument)."""
    target_descriptor: types_pb2.ElementTarget | None = None
    """The semantic target of the element the action names (set by `plan_step`), so a learned
    flow can find that element again on another screen."""
    flow_id: str = ""
    """A replayed step: the learned flow it comes from (mode "replay")."""
    flow_step: int = 0
    """A replayed step: its 1-based position in that flow."""
    replay_divergence: str = ""
    """The first decision after a replay handed over: which flow step diverged and why."""
    flow_set_aside: str = ""
    """The first decision after a replay set its flow aside uncounted (a switch already set, the
    phone part-way through the flow): why; `flow_id`/`flow_step` name where. No divergence:
    nothing reads it to count, it is there for the step's record and the consoles."""
    resumed_from: ResumedFrom | None = None
    """Set when the decision went on from an answer an earlier decision of the step had kept
    (and been billed for) before failing on a write, instead of asking the model its question
    again. None for every other decision."""

    @property
    def planner_mode(self) -> str:
        """ "session" when the model saw a kept conversation (`user_prompt` is then this step's
        addition to it), "replay" for a step of a learned flow (no model call), else "compact"
        (the prompts were the whole request)."""
        mode = self.extra.get("mode")
        return mode if mode in ("session", "replay") else "compact"

    @property
    def sensitive(self) -> bool:
        return bool(self.arguments.get("sensitive")) and self.tool_name == "input_text"

    def masked_arguments(self) -> dict[str, Any]:
        """Arguments safe to store: a sensitive text becomes "•••", unless it is a lone secret
        reference (`secret_refs.stored`)."""
        if self.sensitive:
            return {**self.arguments, "text": stored(self.arguments.get("text"))}
        return dict(self.arguments)
