"""The one place SDK exceptions become planner errors, for every vendor and both planning modes.

Every failure lands in one of three classes (`planner/errors.py`): planning temporarily
impossible (`PlannerTransient`), the credentials refused (`PlannerAuthError`), or an invalid
request (`PlannerRejected`). A stream that fails after HTTP 200 is classified by the error type it
carries, never by the status: an overloaded stream is transient, not a rejection.

Retries are ours, not the SDKs' (the adapters turn theirs off): the Anthropic SDK sleeps for
whatever `retry-after` says, uncapped, once per retry, and the OpenAI SDK up to two minutes per
retry, so a rate-limited account blocked a decision past the host's Decide deadline. Here a
failure worth asking again (429, 5xx and 529, 408/409, no connection) is asked again after the
provider's `retry-after` or a short backoff, as long as one call's waits stay within
`RETRY_WAIT_LIMIT_S`; a longer wait ends the call at once with an error that carries the
provider's retry-after, and whoever asked waits it out (the host's step waits inside its lease
without holding a Decide call open). The reason an operator reads never carries an API key:
providers echo (partly masked) keys in 401 messages, a proxy may quote the request's headers,
and a reason ends up in task results, statuses, logs and the decision log. Nor does a planner
error carry the SDK's exception (the adapters raise it `from None`): its message is the
provider's text unscrubbed, and a traceback or a span event that shows a planner error shows
the exception it was raised from.
"""

from __future__ import annotations

import email.utils
import math
import random
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import anthropic
import httpx
import httpx2
import openai

from planner.errors import (
    PlannerAuthError,
    PlannerContextExceeded,
    PlannerError,
    PlannerParameterRejected,
    PlannerRateLimited,
    PlannerRefused,
    PlannerRejected,
    PlannerUnavailable,
    UnreadableAnswer,
    carry_cut_off,
)
from telemetry.redaction import scrub

if TYPE_CHECKING:
    from planner.decision import Billed

T = TypeVar("T")

#: The most one decision's calls wait in all between their attempts (`streaming.Tries`: a
#: decision may take several calls, a retry without thinking, a corrective turn, and shares
#: one budget): the host gives one Decide 300 s (`AMC_HOST_PLANNER_DEADLINE_S`), thinking
#: included: waits beyond this are the host's to do.
RETRY_WAIT_LIMIT_S = 30.0
#: The SDKs' backoff when the provider names no wait: 0.5 s doubling up to 8 s, less up to 25%.
_BACKOFF_FIRST_S = 0.5
_BACKOFF_MAX_S = 8.0


class IncompleteStream(RuntimeError):
    """A streamed answer ended before it was complete; the partial turn is discarded."""


class StreamError(IncompleteStream):
    """The provider reported an error inside a stream that had started (an `error` or
    `response.failed` event after HTTP 200); `code` is its error type or code."""

    def __init__(self, message: str, code: str | None) -> None:
        super().__init__(message)
        self.code = code


class FailedResponse(StreamError):
    """The provider answered HTTP 200 with a response that says it failed (OpenAI Responses
    `status: "failed"` and its `error`): classified by its code, as an error inside a stream
    is; never read as an answer (its output may hold a call the model never finished)."""


class UnusableAnswer(ValueError):
    """An answer the provider sent that holds nothing the planner can use, found while reading
    it (a Chat Completion with no choices); the message says what it lacks."""


class NotAnAnswer(RuntimeError):
    """The call "succeeded" with something that is no API response: the SDKs hand back the body
    of a 200 that is not JSON as text, which a proxy or gateway in front of the API (or a base
    URL naming a web page) answers. The message is the start of that text."""

    def __init__(self, body: object) -> None:
        super().__init__(repr(" ".join(str(body).split())[:200]))


#: The most of a provider's error text a planner error carries. The SDKs put a whole non-JSON
#: error body in the message (a load balancer's HTML 502 page runs to tens of KB), and the
#: message becomes a gRPC status's details: over 16 KB of trailers the client sees
#: RESOURCE_EXHAUSTED instead of the status we chose.
MAX_DETAIL = 400
_TAG = re.compile(r"<[^>]*>")


def _detail(err: BaseException) -> str:
    body: Any = getattr(err, "body", None)
    text = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            text = str(inner["message"])
    if text is None:
        text = str(getattr(err, "message", None) or err)
    return _short(scrub(text))


def _short(text: str) -> str:
    """`text` on one line, an HTML page's words without its tags, at most MAX_DETAIL long."""
    if "<html" in text[:2_000].lower():
        text = _TAG.sub(" ", text)
    text = " ".join(text.split())
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


#: OpenAI's codes of a 429 that is no rate limit but money: the quota or a spend limit is used
#: up (type `insufficient_quota`, the code naming which: "credit_balance_exhausted",
#: "organization_spend_limit_exceeded", … in OpenAI's error-code guide). Only an operator ends
#: it, so it is never asked again.
_QUOTA_CODES = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "organization_usage_limit_exceeded",
    }
)
#: Error types / codes the providers put in an error body (also inside a stream after HTTP 200).
_AUTH_CODES = (
    frozenset(
        {
            "authentication_error",
            "permission_error",
            "billing_error",
            "invalid_api_key",
            "account_deactivated",
        }
    )
    | _QUOTA_CODES
)
#: Billing refusals Anthropic sends as 400 invalid_request_error, told apart only by their
#: words ("Your credit balance is too low to access the Anthropic API. …", "You have reached your
#: specified API usage limits. You will regain access on …"; public issue trackers quote both).
_BILLING_WORDS = ("credit balance is too low", "reached your specified api usage limits")
_RATE_CODES = frozenset({"rate_limit_error", "rate_limit_exceeded"})
#: A request over the model's context window: OpenAI's code (400, or a failed stream), and
#: Anthropic's words for it (400 invalid_request_error "prompt is too long: 208656 tokens >
#: 200000 maximum"; the Claude models before Sonnet 4.5 also refuse input and `max_tokens`
#: that only together pass the window: "input length and `max_tokens` exceed context limit:
#: 188240 + 21333 > 200000, …"; GPT-5's input limit, below its window, is "Input tokens exceed
#: the configured limit of 272000 tokens. …", seen with and without the code). Sent again it is
#: refused again: `PlannerContextExceeded`.
_CONTEXT_CODES = frozenset({"context_length_exceeded"})
_CONTEXT_WORDS = (
    "prompt is too long",
    "exceed context limit",
    "input tokens exceed the configured limit",
)
#: OpenAI's codes for a request parameter the model or the organisation does not take (the
#: error's `param` names it): `PlannerParameterRejected`, also inside a stream that had started
#: (there neither transient nor a reason to start a session afresh).
_PARAMETER_CODES = frozenset({"unsupported_parameter", "unsupported_value"})
#: A request field outside the conversation, at the start of an Anthropic error message (its
#: validation errors lead with the field's path: "max_tokens: 128001 > 64000, which is the
#: maximum allowed number of output tokens for …", "output_config.effort: Input should be …",
#: "thinking.type.enabled is not supported for this model. …"): `PlannerParameterRejected`.
_ANTHROPIC_PARAMETER = re.compile(
    r"`?(model|max_tokens|thinking|output_config|tool_choice|tools|temperature|top_p|top_k"
    r"|stop_sequences|metadata|service_tier|cache_control|context_management)\b`?[.:\s]"
)
#: The request fields that hold the conversation (OpenAI's `param`): a refusal naming one is
#: about what was said, which a session started afresh may change.
_CONVERSATION_PARAMS = frozenset({"input", "messages", "instructions", "system"})
#: What in the request cannot be answered, also as the code of a Responses answer that failed
#: (`status: "failed"`, `response.failed`: the screenshot it was sent, the data region it asked
#: for; openai-python's `ResponseError.code`): asked again unchanged, refused the same.
_INVALID_CODES = frozenset(
    {
        "invalid_request_error",
        "not_found_error",
        "request_too_large",
        "invalid_prompt",
        "context_length_exceeded",
        "model_not_found",
        "data_residency_mismatch",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    }
)
#: The codes of a Responses answer a policy stopped: a refusal (`PlannerRefused`), never asked
#: again.
_POLICY_CODES = frozenset(
    {"bio_policy", "misalignment_policy_violation", "image_content_policy_violation"}
)
#: A request the provider's content filter refused before the model answered: Azure OpenAI's
#: 400 with `code: "content_filter"` (`param: "prompt"`, `innererror.code:
#: "ResponsibleAIPolicyViolation"`, learn.microsoft.com's content-filter page). Its `param`
#: made it read as a refused request parameter, "rejected the request", and a session did
#: not even start afresh over it; sent again, the filter refuses it again.
_FILTER_CODES = frozenset({"content_filter"})
_FILTER_INNER_CODES = frozenset({"ResponsibleAIPolicyViolation"})
#: What an operator reads for it (after "planner: <provider>: ").
CONTENT_FILTER_REFUSED = "the provider's content filter refused this step"


def _codes(err: BaseException) -> set[str]:
    """The error type and code the provider's body names, if any."""
    body: Any = getattr(err, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(err, StreamError):
        return {err.code} if err.code else set()
    if not isinstance(inner, dict):
        return set()
    return {str(v) for v in (inner.get("type"), inner.get("code")) if v}


def _content_filtered(err: BaseException, codes: set[str]) -> bool:
    """Whether the provider's content filter refused the request (`_FILTER_CODES`, or the
    inner code Azure puts beside it)."""
    if codes & _FILTER_CODES:
        return True
    body: Any = getattr(err, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    innererror = inner.get("innererror") if isinstance(inner, dict) else None
    code = innererror.get("code") if isinstance(innererror, dict) else None
    return isinstance(code, str) and code in _FILTER_INNER_CODES


def planner_error(err: BaseException, vendor: str, *, retries: int) -> PlannerError:
    """Map an SDK exception (anthropic or openai; they share the shape) to a PlannerError of
    one of three classes: transient (429, 5xx, 529, 408/409, an error event inside a stream
    that had started — with the stream's status 200 or, as the OpenAI SDK raises the live
    API's nested error event, with none — a broken stream, a connection failure), the
    credentials refused (401, 403, billing or quota, whatever the status says), or an invalid
    request (other 4xx, or an invalid-request code mid-stream or in a failed response; one over
    the context window is `PlannerContextExceeded`). A response a policy stopped, and a request
    the provider's content filter refused (Azure's 400 `content_filter`), is `PlannerRefused`.

    `vendor` is the adapter name ("anthropic", "openai") or its label ("Anthropic", "OpenAI").
    """
    label = {"anthropic": "Anthropic", "openai": "OpenAI"}.get(vendor, vendor)
    if isinstance(err, PlannerError):
        return err
    if isinstance(err, NotAnAnswer):
        setting = f"AMC_PLANNER_{vendor.upper()}_BASE_URL"
        return PlannerUnavailable(
            f"planner: what answered for {label} is not an API answer (HTTP 200: "
            f"{scrub(str(err))}): a proxy or gateway answered in its place, or {setting} names "
            f"no {label} API"
        )
    codes = _codes(err)
    detail = _short(scrub(str(err))) if isinstance(err, IncompleteStream) else _detail(err)
    # An SDK error without an HTTP status that is no connection failure: the SDK met an error
    # event inside a stream that had started (the OpenAI SDK raises the live API's nested
    # `{"type": "error", "error": {…}}` event as a bare APIError). Classified like a broken
    # stream, by the code it carries.
    mid_stream = isinstance(err, IncompleteStream) or (
        isinstance(err, anthropic.APIError | openai.APIError)
        and not hasattr(err, "status_code")
        and not is_connection_error(err)
    )
    # A billing refusal in an invalid-request error is no invalid request: sent again, after a
    # session "started afresh" over it, it is refused the same; an operator must act.
    billing = any(words in detail.lower() for words in _BILLING_WORDS)
    if codes & _AUTH_CODES or getattr(err, "status_code", None) in (401, 402, 403) or billing:
        status = getattr(err, "status_code", None)
        if status == 401 or codes & {"authentication_error", "invalid_api_key"}:
            return PlannerAuthError(f"planner: {label} rejected the API key")
        if status == 402 or codes & (_QUOTA_CODES | {"billing_error"}) or billing:
            return PlannerAuthError(f"planner: {label} refused the request for billing ({detail})")
        return PlannerAuthError(f"planner: {label} denied permission ({detail})")
    if _content_filtered(err, codes):
        status = getattr(err, "status_code", None)
        said = f"HTTP {status}: {detail}" if status not in (None, 200) else detail
        return PlannerRefused(f"planner: {label}: {CONTENT_FILTER_REFUSED} ({said})")
    if codes & _CONTEXT_CODES or any(words in detail.lower() for words in _CONTEXT_WORDS):
        return PlannerContextExceeded(
            f"planner: {label} refused the request: the conversation does not fit the model's "
            f"context window ({detail})"
        )
    if mid_stream:
        kind = "/".join(sorted(codes)) or "error"
        if codes & _POLICY_CODES:
            return PlannerRefused(f"planner: {label} refused to answer ({kind}: {detail})")
        if codes & _PARAMETER_CODES:  # before the invalid-request type it comes with
            return _naming(
                PlannerParameterRejected(f"planner: {label} rejected the request ({detail})"), err
            )
        if codes & _RATE_CODES:
            return PlannerRateLimited(f"planner: {label} rate limit hit mid-stream ({detail})")
        if codes & _INVALID_CODES:
            return PlannerRejected(f"planner: {label} rejected the request ({kind}: {detail})")
        if isinstance(err, FailedResponse):
            return PlannerUnavailable(
                f"planner: {label} answered that it failed ({kind}: {detail})"
            )
        if isinstance(err, IncompleteStream):
            return PlannerUnavailable(f"planner: {label} stream broke off ({detail})")
        return PlannerUnavailable(f"planner: {label} failed mid-stream ({kind}: {detail})")
    if not hasattr(err, "status_code") and not is_connection_error(err):
        return PlannerError(f"planner: {label} call failed: {scrub(str(err))}")
    status = getattr(err, "status_code", None)
    wait = retry_after(err)
    asks = f"; it asks to wait {wait:.0f} s" if wait is not None and wait >= 1 else ""
    if status == 429 or (status == 200 and codes & _RATE_CODES):
        return PlannerRateLimited(
            f"planner: {label} rate limit still hit after {retries} retries{asks} ({detail})",
            retry_after=wait,
        )
    if status == 200 and not codes & _INVALID_CODES:
        # An error event inside a stream that had started: overloaded or failing, whatever
        # status the SDK carries over from the stream's start.
        kind = "/".join(sorted(codes)) or "error"
        return PlannerUnavailable(f"planner: {label} failed mid-stream ({kind}: {detail})")
    if isinstance(status, int) and (status >= 500 or status in (408, 409)):
        return PlannerUnavailable(
            f"planner: {label} is unavailable (HTTP {status} after {retries} retries{asks}: "
            f"{detail})",
            retry_after=wait,
        )
    if status is None:
        return PlannerUnavailable(f"planner: cannot reach {label} ({detail})")
    parameter = codes & _PARAMETER_CODES or _names_a_parameter(err, detail)
    reason = f"planner: {label} rejected the request (HTTP {status}: {detail})"
    return _naming(PlannerParameterRejected(reason), err) if parameter else PlannerRejected(reason)


def _naming(failure: PlannerParameterRejected, err: BaseException) -> PlannerParameterRejected:
    """`failure` carrying the parameter `err` names (OpenAI's `param`), if any."""
    failure.param = refused_param(err)
    return failure


def refused_param(err: BaseException) -> str | None:
    """The request parameter an OpenAI error names (`param`: "stream", "reasoning.summary"),
    or None."""
    body: Any = getattr(err, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    param = inner.get("param") if isinstance(inner, dict) else getattr(err, "param", None)
    return param if isinstance(param, str) and param else None


def _names_a_parameter(err: BaseException, detail: str) -> bool:
    """Whether an invalid request names a request parameter outside the conversation: OpenAI's
    `param` ("max_output_tokens", "reasoning.effort"; not "input[3].content[0].image_url"),
    or the field an Anthropic message starts with. Only the settings change those."""
    body: Any = getattr(err, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    param = inner.get("param") if isinstance(inner, dict) else None
    if isinstance(param, str) and param:
        return re.split(r"[.\[]", param, maxsplit=1)[0] not in _CONVERSATION_PARAMS
    return isinstance(err, anthropic.APIError) and bool(_ANTHROPIC_PARAMETER.match(detail))


async def probe_model(
    client: anthropic.AsyncAnthropic | openai.AsyncOpenAI, model: str, vendor: str
) -> None:
    """One cheap authenticated call (the model's metadata): raises a planner error while the
    API is unreachable or failing, or answers with something that is not the API's (a proxy's
    HTML page), as a model call would."""
    try:
        info = await client.models.retrieve(model, timeout=10.0)
        if not callable(getattr(info, "to_dict", None)):  # a 200 that was not JSON
            raise NotAnAnswer(info)
    except Exception as err:
        raise planner_error(err, vendor, retries=0) from None


def is_connection_error(err: BaseException) -> bool:
    """The SDKs' connection and timeout errors, and a transport error raised mid-stream (the
    Anthropic SDK lets those through unwrapped while it reads the events)."""
    return isinstance(
        err,
        anthropic.APIConnectionError
        | openai.APIConnectionError
        | httpx2.RequestError
        | httpx.RequestError,
    )


def may_have_been_billed(err: BaseException) -> bool:
    """Whether a model call that failed with `err` (and reported no usage) may still have been
    billed: its request may have reached the provider and its answer been lost (a connection
    dropped or timed out, the SDK's or ours), or it was answered with something the planner
    could not read (`UnreadableAnswer`). An answer that was an error (a 4xx or 5xx status)
    generated nothing, and a failure with no provider error behind it was never sent; nor was
    a request whose connection could not be made (refused, timed out connecting, no
    connection free in the pool): it left a marker "unknown, at most" on every call made
    while the provider was unreachable, and, asked again, one on each of its tries. The SDK
    error is the planner error's cause or context (`planner_error(...) from None` keeps it
    as the context)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, UnreadableAnswer):  # answered, its usage unreadable
            return True
        if is_connection_error(seen) or isinstance(seen, TimeoutError):
            return not _never_connected(seen)
        if isinstance(seen, anthropic.APIStatusError | openai.APIStatusError):
            return False
        seen = seen.__cause__ or seen.__context__
    return False


#: The transport errors of a request that never went out: no connection was made for it.
_NOT_CONNECTED = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpx2.PoolTimeout,
)


def _never_connected(err: BaseException) -> bool:
    """Whether `err` (a connection error) or the error it wraps is a connection never made."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, _NOT_CONNECTED):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def read_answer(
    vendor: str, read: Callable[[], T], billed: Callable[[], Billed] | None = None
) -> T:
    """`read()`: an answer the provider sent (and billed), turned into ours. Whatever goes
    wrong there — an answer with nothing usable in it (`UnusableAnswer`), or a bug meeting an
    answer shaped as we did not expect (a KeyError, a TypeError) — happened after the call was
    answered, so it is no call "never sent": it fails the decision as `UnreadableAnswer`,
    billed from the usage the answer reported (`billed()`, carried as a failed call's:
    `carry_cut_off`), or, when that cannot be read either (or there is no `billed`: nothing of
    the answer could be read), as a call of unknown cost (its marker stays:
    `may_have_been_billed`). A stream that broke off or that the provider failed
    (`IncompleteStream`, raised by a stream's accumulator) is no answer read wrong: it passes
    through, to be classified by `planner_error`."""
    try:
        return read()
    except IncompleteStream:
        raise
    except Exception as err:
        label = {"anthropic": "Anthropic", "openai": "OpenAI"}.get(vendor, vendor)
        what = str(err) if isinstance(err, UnusableAnswer) else f"{type(err).__name__}: {err}"
        failure = UnreadableAnswer(
            f"planner: {label} answered with something the planner cannot use "
            f"({_short(scrub(what))})"
        )
        try:
            cost = billed() if billed is not None else None
        except Exception:
            cost = None  # its usage unreadable too: a call of unknown cost
        if cost is not None:
            carry_cut_off(failure, cost, failed=True)
        raise failure from err


#: The codes of a Responses answer that failed (`status: "failed"`, HTTP 200) that say the
#: provider failed, not the request (openai-python's `ResponseError.code`: `server_error` is
#: the API's 500, `rate_limit_exceeded` its 429, `vector_store_timeout` a timeout); asked
#: again they may be answered, as a 500 or a 429 is. Every other code names what in the
#: request cannot be answered, or a policy.
_RETRIED_FAILURE_CODES = frozenset({"server_error", "rate_limit_exceeded", "vector_store_timeout"})


def failed_response_wait(failed: FailedResponse, retries_taken: int, waited: float) -> float | None:
    """How long to wait before asking again after a response that failed, or None to give up
    now: only for a code that says the provider failed, after the SDKs' backoff, within
    RETRY_WAIT_LIMIT_S as `retry_wait`."""
    if failed.code not in _RETRIED_FAILURE_CODES:
        return None
    wait = min(_BACKOFF_FIRST_S * 2.0**retries_taken, _BACKOFF_MAX_S)
    wait *= 1 - 0.25 * random.random()
    return wait if waited + wait <= RETRY_WAIT_LIMIT_S else None


def retry_after(err: BaseException) -> float | None:
    """The seconds the provider's answer asked to wait before the next request: its
    `retry-after-ms`, else its `retry-after` in either form RFC 9110 allows (delay-seconds, as
    both providers send it, or an HTTP-date, as a gateway in front of them may: the time from
    now until then, 0 for a date past). None when the failure has no answer (a connection
    error, a broken stream) or the answer did not say. Either form is then capped alike: a
    wait past RETRY_WAIT_LIMIT_S ends the call and travels with its error (`retry_wait`)."""
    response = getattr(err, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            seconds = float(headers.get(name)) / scale
        except (TypeError, ValueError):
            continue
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    return _seconds_until(headers.get("retry-after"))


def _seconds_until(value: Any) -> float | None:
    """The seconds from now until the HTTP-date `value` (0 for a date past), or None when it
    is not one. The SDKs read this form too; with their retries off it was dropped, and a
    rate-limited call was asked again at once and the host told no wait."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # RFC 9110: an HTTP-date is UTC ("GMT")
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


def retry_wait(err: BaseException, retries_taken: int, waited: float) -> float | None:
    """How long to wait before asking again after `err`, or None to give up now: the failure is
    not worth asking again (what the SDKs retry: no connection, 408, 409, 429, 5xx, unless the
    answer says `x-should-retry: false`; but never a refusal of the credentials or the money,
    which OpenAI sends as a 429 too), or the wait — the provider's retry-after, else the
    SDKs' backoff — would take the call's waits (`waited` so far) past RETRY_WAIT_LIMIT_S."""
    if not _worth_retrying(err):
        return None
    wait = retry_after(err)
    if not wait:  # not said, or "now": the backoff, as the SDKs do
        wait = min(_BACKOFF_FIRST_S * 2.0**retries_taken, _BACKOFF_MAX_S)
        wait *= 1 - 0.25 * random.random()
    return wait if waited + wait <= RETRY_WAIT_LIMIT_S else None


def _worth_retrying(err: BaseException) -> bool:
    if isinstance(err, anthropic.APIConnectionError | openai.APIConnectionError):
        return True
    if not isinstance(err, anthropic.APIStatusError | openai.APIStatusError):
        return False
    if _codes(err) & _AUTH_CODES:  # the same refusal until an operator acts
        return False
    told = err.response.headers.get("x-should-retry")
    if told in ("true", "false"):
        return told == "true"
    return err.status_code in (408, 409, 429) or err.status_code >= 500
