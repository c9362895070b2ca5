"""Planner failures, each carrying a message an operator can act on (never a stack trace).

Three classes matter to whoever runs a task (`planner/vendors/failures.py` maps every provider
error onto them): planning temporarily impossible (`PlannerTransient`: wait and ask again, the
task has not failed), the provider refusing the credentials (`PlannerAuthError`: fail fast, an
operator must act), and a request the provider refuses as invalid (`PlannerRejected`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.decision import Billed
    from planner.vendors.base import Turn

#: Trailing metadata of a Decide answered UNAVAILABLE or RESOURCE_EXHAUSTED: what is unavailable,
#: in words for the host's progress line ("the model provider", "the cloud's database").
WAITING_FOR_KEY = "amc-waiting-for"
MODEL_PROVIDER = "the model provider"
#: The same for every call the cloud answers UNAVAILABLE because its database is unreachable
#: (not Decide only): a client tells a cloud that answered from one it could not reach.
CLOUD_DATABASE = "the cloud's database"
#: Trailing metadata of such a Decide when the model provider said how long to wait: seconds, a
#: decimal number (`PlannerTransient.retry_after`). A host waits at least that long.
RETRY_AFTER_KEY = "amc-retry-after-s"
#: Trailing metadata of a Decide answered PERMISSION_DENIED: who refused, since the code is the
#: same for two refusals a host treats apart. `REFUSED_BY_LEASE`: the lease is another host's
#: (this call was wrong); `REFUSED_BY_PROVIDER`: the model provider refused the cloud's
#: credentials (an operator must fix the cloud). Text in the details is for people only.
REFUSED_BY_KEY = "amc-refused-by"
REFUSED_BY_LEASE = "lease"
REFUSED_BY_PROVIDER = "provider"
#: The most a status's details may say, in UTF-8 bytes. They travel percent-encoded in the
#: trailers, which gRPC clients refuse past 16 KiB (RESOURCE_EXHAUSTED "received metadata size
#: exceeds hard limit", in place of the status sent): a refusal that echoes what the client sent
#: (an id of 100 KB) is cut to this, so the client still reads the status the proto promises.
MAX_STATUS_DETAILS = 1024


class PlannerError(Exception):
    """The planner could not produce a decision. `str(err)` is the operator-facing reason.

    `billed`: what the calls the provider answered before the decision failed cost (None when
    none was answered), set by `planner.deciding.decide`; whoever counts it sets it back to None
    (`take_billed`), so an error handed to two waiting callers is counted once."""

    billed: Billed | None = None


def bill(err: BaseException, billed: Billed) -> None:
    """Carry `billed` on `err`: a `PlannerError`, the `asyncio.CancelledError` of a decision
    whose caller went away (a cancelled or timed-out Decide, a revoked attempt), or any other
    error that ended it after the provider answered (a session store that could not keep the
    model's turn), which the provider billed for the calls it answered all the same."""
    err.billed = billed  # type: ignore[attr-defined]  # CancelledError has no such field


def billed_of(err: BaseException) -> Billed | None:
    """What `err` carries (`bill`), left on it (for the caller who takes it, `take_billed`)."""
    found: Billed | None = getattr(err, "billed", None)
    return found


def take_billed(err: BaseException) -> Billed | None:
    """What `err` carries (`bill`), taken off it so it is counted once."""
    billed: Billed | None = getattr(err, "billed", None)
    if billed is not None:
        err.billed = None  # type: ignore[attr-defined]
    return billed


#: The `error` a call whose stream was cut off is counted with (`cut_off_label`), in the
#: failed-calls record.
CUT_OFF = "StreamCutOff"


def carry_cut_off(err: BaseException, cut_off: Billed, *, failed: bool = False) -> None:
    """Carry on the error of a call that ended before its answer did what the provider
    reported of it by then: a stream cut off (the `asyncio.CancelledError` of a hang-up, or the
    `PlannerError` of a stream the provider broke off), or, `failed`, a response the provider
    answered as failed (OpenAI's `status: "failed"`, usage and all, streamed or not). A call
    that stops early stops the answer, not the bill for the input it read."""
    err.cut_off = cut_off  # type: ignore[attr-defined]  # CancelledError has no such field
    err.cut_off_failed = failed  # type: ignore[attr-defined]  # likewise


def cut_off_label(err: BaseException) -> str:
    """The `error` what `err` carries (`carry_cut_off`) is counted with: `CUT_OFF` for a stream
    cut off, else the error's class, as for the answered calls (`take_billed`): a response that
    failed was never cut off, the provider ended it."""
    return type(err).__name__ if getattr(err, "cut_off_failed", False) else CUT_OFF


def cut_off_of(err: BaseException) -> Billed | None:
    """What `err` carries (`carry_cut_off`), left on it (to be priced on its way up)."""
    found: Billed | None = getattr(err, "cut_off", None)
    return found


def take_cut_off(err: BaseException) -> Billed | None:
    """What `err` carries (`carry_cut_off`), taken off it so it is counted once (labelled by
    `cut_off_label`)."""
    found = cut_off_of(err)
    if found is not None:
        err.cut_off = None  # type: ignore[attr-defined]
    return found


@dataclass(frozen=True, slots=True)
class InFlight:
    """A model call (not streamed) still under way when its decision was cancelled. The
    provider answers and bills it whether or not anyone waits (hanging up on a call not
    streamed does not stop it), so it is left to finish: `call` gives its turn (usage priced)
    once the provider answers, to be counted then by whoever took it (`take_in_flight`)."""

    provider: str
    model: str
    call: asyncio.Future[Turn]


def carry_in_flight(err: BaseException, in_flight: InFlight) -> None:
    """Carry the call still under way on the `asyncio.CancelledError` of its decision."""
    err.in_flight = in_flight  # type: ignore[attr-defined]  # CancelledError has no such field


def take_in_flight(err: BaseException) -> InFlight | None:
    """The call `err` carries (`carry_in_flight`), taken off it so it is counted once."""
    found: InFlight | None = getattr(err, "in_flight", None)
    if found is not None:
        err.in_flight = None  # type: ignore[attr-defined]
    return found


class PlannerConfigError(PlannerError, ValueError):
    """The configuration cannot work with the chosen model (found at start, before any call)."""


class PlannerAuthError(PlannerError):
    """The provider refused the credentials: the API key, a permission, or billing ("planner:
    Anthropic rejected the API key"). Retrying cannot help; an operator must act."""


class PlannerTransient(PlannerError):
    """Planning is temporarily impossible (the provider is overloaded, failing, rate limiting
    or unreachable, also when a stream breaks off after it started). The same request may
    succeed later: wait and ask again; never a reason to fail a task.

    `retry_after`: the seconds the provider's last answer asked to wait (its `retry-after`
    header), None when it did not say. A wait longer than the planner takes inside one call
    (`planner/vendors/failures.py: RETRY_WAIT_LIMIT_S`) is left to the caller, who waits at
    least this long before asking again rather than hitting the same limit."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PlannerUnavailable(PlannerTransient):
    """The provider failed (5xx, overloaded, an error inside a stream, network, timeout) after
    the planner's own retries."""


class PlannerRateLimited(PlannerTransient):
    """The provider kept answering 429 after the planner's own retries with backoff, or asked
    for a longer wait than one call takes (see `retry_after`)."""


class PlannerRejected(PlannerError):
    """The provider refused the request itself (HTTP 4xx other than credentials and rate
    limits): sending it again unchanged fails the same way."""


class PlannerParameterRejected(PlannerRejected):
    """The provider refused a parameter of the request, not its conversation (OpenAI 400
    `unsupported_parameter` / `unsupported_value`, also as an error inside a stream that had
    started: an effort level, reasoning summaries for an organisation not verified). Only the
    settings change what is sent, so a session does not start afresh over it: that would
    condense it for good and be refused the same way.

    `param`: the parameter the provider named (OpenAI's `param`), where it named one: `stream`
    alone is one the adapter can drop by itself (an organisation not verified to stream the
    model is answered the same request unstreamed)."""

    param: str | None = None


class PlannerContextExceeded(PlannerRejected):
    """The conversation no longer fits the model's context window: Anthropic stopped the
    answer there (`stop_reason: "model_context_window_exceeded"`) or refused the prompt as too
    long, OpenAI refused it (400 `context_length_exceeded`). Asked again it overflows again,
    and a corrective turn only adds to it, so it is never corrected: a session starts afresh
    once (earlier screens condensed), a compact prompt fails the decision (gRPC UNKNOWN
    through Decide), and nothing of the overflowed answer is kept."""


class UnreadableAnswer(PlannerError):
    """The provider answered the call, and billed it, with something the planner cannot use:
    an answer with nothing in it to read (a Chat Completion with no choices), or one shaped as
    the planner did not expect (a bug where an adapter reads it). Asked again, the same server
    is likely to answer the same: the decision fails, naming what was wrong, and the call is
    billed from the usage it reported, or, where that cannot be read, recorded as a call of
    unknown cost (`planner.vendors.failures.read_answer`)."""


class PlannerRefused(PlannerError):
    """The model declined to answer (Anthropic `stop_reason: "refusal"`, an OpenAI refusal), or
    OpenAI's content filter or a policy stopped the answer (`content_filter`, a response failed
    with `bio_policy` or the like). `str(err)` names the
    provider's category and explanation, the refusal text, or the content filter. Asking
    again unchanged gets the same (Anthropic: "continuing without resetting will result in
    continued refusals"), so it is never retried: the attempt fails with the reason, and a
    session keeps nothing of the refused turn."""


class SessionStateError(PlannerError):
    """A session was used out of order (a tool result with no call waiting, or for a call the
    conversation never made)."""


class ToolCallError(ValueError):
    """A tool call the model made is unusable. The message is sent back to the model verbatim in
    the one corrective retry, so it says exactly what was wrong and how to fix it."""


class BudgetExhausted(PlannerError):
    """What the task spent reached one of its caps (or today's fleet spending a daily cap): no
    model call was made. `str(err)` starts "budget exhausted: " and says what of what; the
    attempt fails and is not retried (`planner/budget.py`)."""
