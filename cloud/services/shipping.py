"""What a host may ship after the fact: its direct-transport decisions and its step screenshots.

One rule for both (`check_lease`): the calling host's own lease of that attempt, live or ended
less than the shipping window ago — so a host that was offline can send its backlog when it is
back, and nobody can write into another host's attempts. `ship_decisions` is
DecisionLogService.ShipDecisions: every entry is checked first, then each is logged in order
through the decision log's own append (step index, masking), once per host decision id; then
the failed decisions' calls it carries are counted (`spend.count_failed`), once per host spend
id, settling the calls of unknown cost they name; then the calls of unknown cost it carries
are recorded (`unsettled.shipped`, once per host call id), but for those its failed decisions'
records settle (a resend of the request would bring them back otherwise). A record the cloud
can never take for what it holds is refused alone, named in the reply
(`ShipDecisionsResponse.refused`, as OTLP's partial success): the call fails as a whole only
for what concerns all of it.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias, TypeVar

import grpc
from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

from amc.v1 import decision_log_service_pb2 as pb
from amc.v1 import types_pb2
from cloud import wire
from cloud.lease import validate
from cloud.lease.validate import MAX_ID
from cloud.services import durations
from cloud.services.status import abort
from cloud.store import decisions, flows, leases, spend, unsettled
from cloud.store.database import Store
from planner.convert import (
    decision_from_proto,
    fit_record,
    merge_thinking_past_limit,
    usage_from_proto,
)
from planner.decide_limits import MAX_SYSTEM_PROMPT, MAX_USER_PROMPT
from planner.decision import (
    ACTION_TEXT_LIMITS,
    MAX_MODEL_TEXT,
    MAX_THINKING_BLOCK_BYTES,
    MAX_TURN_ID_BYTES,
    MAX_TYPED_TEXT,
    Billed,
    Decision,
)
from planner.observation import observation_problem, scene_from_observation
from planner.plan_step import on_screen
from planner.steps import MAX_DRIVER_OUTPUT_BYTES, MAX_OUTCOME_ERROR_BYTES
from planner.targets import MAX_TARGET_TEXT_BYTES
from planner.verify import MAX_EVIDENCE_BYTES

log = logging.getLogger(__name__)

MAX_ENTRIES = 100
HOST_DECISION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Field size limits in bytes (the prompts' as Decide's).
_LIMITS = {
    "system_prompt": MAX_SYSTEM_PROMPT,
    "user_prompt": MAX_USER_PROMPT,
    "rationale": MAX_MODEL_TEXT,
    "purpose": MAX_MODEL_TEXT,
    "expected_outcome": MAX_MODEL_TEXT,
    "provider": 32,
    "model": 128,
    "tool_name": 64,
    "flow_id": 32,  # the cloud's flow ids (a column of that width)
    "replay_divergence": MAX_MODEL_TEXT,
    "flow_set_aside": MAX_MODEL_TEXT,
}
#: The most one shipped usage may count, of each kind of token and in dollars: far past what
#: any model call costs, yet a sum of millions of them still fits the 64-bit totals. A usage
#: near 2**63 overflowed them, and its task could no longer be read (GetTask UNAVAILABLE on
#: SQLite, the shipment INTERNAL on PostgreSQL); a negative one lowered what the task had spent.
MAX_USAGE_TOKENS = 1_000_000_000
MAX_USAGE_COST_USD = 1_000_000
#: The most a shipped decision's model calls may have taken, and corrective turns it may have
#: needed: far past any (a call times out in minutes; the Python planner makes one corrective
#: turn), so only a host's mistake is refused. Below 0 they read back as nonsense in the log.
MAX_LATENCY_SECONDS = 86_400
MAX_CORRECTIVE_RETRIES = 100
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
#: A record of one of ShipDecisions' lists (`entries`, `failed_calls`, `unsettled_calls`).
_Record = TypeVar("_Record", bound=Message)


async def check_lease(
    context: Context,
    store: Store,
    window: dt.timedelta,
    host_id: str,
    task_id: str,
    attempt: int,
    lease_id: str,
    field: str = "",
) -> leases.RecentLease:
    """Abort unless (task, attempt, lease id) is `host_id`'s, live or lately ended:
    PERMISSION_DENIED for another host's lease, FAILED_PRECONDITION for anything else."""
    held = await leases.held_recently(store, host_id, task_id, attempt, lease_id, window)
    if held.ok:
        return held
    where = f"{field}: " if field else ""
    await abort(context, lease_refusal(held), where + held.message)


def lease_refusal(held: leases.RecentLease) -> grpc.StatusCode:
    """The code of a lease the caller may not ship into: PERMISSION_DENIED for another host's,
    FAILED_PRECONDITION for anything else."""
    return (
        grpc.StatusCode.PERMISSION_DENIED if held.not_yours else grpc.StatusCode.FAILED_PRECONDITION
    )


def lease_ref_problem(field: str, task_id: str, attempt: int, lease_id: str) -> str | None:
    """The INVALID_ARGUMENT text for a malformed (task, attempt, lease id), or None."""
    prefix = f"{field}." if field else ""
    if not task_id or len(task_id) > MAX_ID:
        return f"{prefix}task_id: required, at most {MAX_ID} characters"
    if attempt < 1:
        return f"{prefix}attempt: must be 1 or more"
    if not lease_id or len(lease_id) > MAX_ID:
        return f"{prefix}lease_id: required, at most {MAX_ID} characters"
    return None


def entry_problem(i: int, entry: pb.ShippedDecision) -> str | None:
    """The INVALID_ARGUMENT text for one entry, naming the field (`entries[i].…`), or None."""
    field = f"entries[{i}]"
    if not HOST_DECISION_ID.fullmatch(entry.host_decision_id):
        return f"{field}.host_decision_id: 1 to 64 characters of A-Z a-z 0-9 _ -"
    problem = lease_ref_problem(field, entry.task_id, entry.attempt, entry.lease_id)
    if problem:
        return problem
    if not entry.HasField("decision"):
        return f"{field}.decision: required"
    d = entry.decision
    for name, limit in _LIMITS.items():
        size = len(getattr(d, name).encode("utf-8"))
        if size > limit:
            return f"{field}.decision.{name}: {size} bytes; at most {limit}"
    if not d.tool_name:
        return f"{field}.decision.tool_name: required"
    kind = d.action.WhichOneof("kind")
    if kind != d.tool_name:
        return f"{field}.decision.tool_name: {d.tool_name!r} but the action is {kind or 'unset'}"
    typed = len(d.action.input_text.text.encode("utf-8"))
    if typed > MAX_TYPED_TEXT:  # what the phone got is kept whole or not at all
        return f"{field}.decision.action.input_text.text: {typed} bytes; at most {MAX_TYPED_TEXT}"
    # The rest is cut, not refused: see keep_texts.
    wire.keep_texts(d.action, "action.", MAX_MODEL_TEXT, limits=ACTION_TEXT_LIMITS)
    problem = usage_problem(f"{field}.decision.usage", d.usage)
    if problem:
        return problem
    problem = durations.problem(f"{field}.decision.latency", d.latency)
    if problem:
        return problem
    if not 0 <= durations.seconds(d.latency) <= MAX_LATENCY_SECONDS:
        return f"{field}.decision.latency: 0 s to {MAX_LATENCY_SECONDS:,} s"
    if not 0 <= d.corrective_retries <= MAX_CORRECTIVE_RETRIES:
        return f"{field}.decision.corrective_retries: 0 to {MAX_CORRECTIVE_RETRIES}"
    resumed = d.resumed_from
    size = len(resumed.turn_id.encode("utf-8"))
    if size > MAX_TURN_ID_BYTES:  # this project's hosts cut it (`ResumedFrom.of`)
        return f"{field}.decision.resumed_from.turn_id: {size:,} bytes, at most {MAX_TURN_ID_BYTES}"
    if d.HasField("resumed_from") and resumed.position < 1:
        # Item 0 is the attempt's first observation: no answer begins there. An empty mark (a
        # builder's default message) would log a decision as resumed when it was not.
        return f"{field}.decision.resumed_from.position: 1 or more (the answer's first item)"
    if resumed.HasField("answered_at") and not _plausible(resumed.answered_at):
        # A note by the host's clock, not worth the decision: a refused entry is set aside by
        # the host for good (its rationale and usage with it), and a host a day fast is a
        # skewed clock, not a bad record. Logged as "not known", as a store that did not say.
        resumed.ClearField("answered_at")
    # Held to the limits of what makes them: a model's text, the planner's target descriptor.
    t = d.target
    for name, value, limit in (
        ("previous_step.note", d.previous_step.note, MAX_MODEL_TEXT),
        *(
            (f"target.{n}", getattr(t, n), MAX_TARGET_TEXT_BYTES)
            for n in (
                "resource_id",
                "text",
                "content_description",
                "class_name",
                "hint",
                "row_label",
            )
        ),
    ):
        size = len(value.encode("utf-8"))
        if size > limit:
            return f"{field}.decision.{name}: {size} bytes; at most {limit}"
    for j, block in enumerate(d.thinking):
        size = len(block.text.encode("utf-8"))
        if size > MAX_THINKING_BLOCK_BYTES:
            limit = MAX_THINKING_BLOCK_BYTES
            return f"{field}.decision.thinking[{j}].text: {size} bytes; at most {limit}"
    if d.HasField("observation"):
        problem = observation_problem(d.observation, f"{field}.decision.observation")
        if problem:
            return problem
    if entry.HasField("outcome"):
        for name, value, limit in (
            ("error", entry.outcome.error, MAX_OUTCOME_ERROR_BYTES),
            ("driver_output", entry.outcome.driver_output, MAX_DRIVER_OUTPUT_BYTES),
            ("evidence", entry.outcome.evidence, MAX_EVIDENCE_BYTES),
        ):
            size = len(value.encode("utf-8"))
            if size > limit:
                return f"{field}.outcome.{name}: {size} bytes; at most {limit}"
    return None


def failed_calls_problem(i: int, record: pb.ShippedFailedCalls) -> str | None:
    """The INVALID_ARGUMENT text for one failed_calls record, naming the field
    (`failed_calls[i].…`), or None."""
    field = f"failed_calls[{i}]"
    if not HOST_DECISION_ID.fullmatch(record.host_spend_id):
        return f"{field}.host_spend_id: 1 to 64 characters of A-Z a-z 0-9 _ -"
    problem = lease_ref_problem(field, record.task_id, record.attempt, record.lease_id)
    if problem:
        return problem
    for name, value, limit in (
        ("provider", record.provider, _LIMITS["provider"]),
        ("model", record.model, _LIMITS["model"]),
        ("error", record.error, 64),
    ):
        size = len(value.encode("utf-8"))
        if name != "error" and not size:
            return f"{field}.{name}: required"
        if size > limit:
            return f"{field}.{name}: {size} bytes; at most {limit}"
    if len(record.settles_calls) > MAX_ENTRIES:
        return f"{field}.settles_calls: at most {MAX_ENTRIES}"
    for j, call_id in enumerate(record.settles_calls):
        if not HOST_DECISION_ID.fullmatch(call_id):
            return f"{field}.settles_calls[{j}]: 1 to 64 characters of A-Z a-z 0-9 _ -"
    return usage_problem(f"{field}.usage", record.usage)


def unsettled_call_problem(i: int, call: pb.ShippedUnsettledCall) -> str | None:
    """The INVALID_ARGUMENT text for one unsettled call, naming the field
    (`unsettled_calls[i].…`), or None."""
    field = f"unsettled_calls[{i}]"
    if not HOST_DECISION_ID.fullmatch(call.host_call_id):
        return f"{field}.host_call_id: 1 to 64 characters of A-Z a-z 0-9 _ -"
    problem = lease_ref_problem(field, call.task_id, call.attempt, call.lease_id)
    if problem:
        return problem
    for name, value in (("provider", call.provider), ("model", call.model)):
        size = len(value.encode("utf-8"))
        if not size:
            return f"{field}.{name}: required"
        if size > _LIMITS[name]:
            return f"{field}.{name}: {size} bytes; at most {_LIMITS[name]}"
    if call.HasField("started_at") and not _plausible(call.started_at):
        # The rule of a resumed decision's `answered_at`: a note by the host's clock, not worth
        # the call's record. Taken as sent, a zero time showed the call as started in 1970, a
        # far one years ahead, and nanos past a second failed the whole request (INTERNAL) as
        # it was read. Recorded as unset: when the cloud recorded it, as the proto says.
        call.ClearField("started_at")
    return usage_problem(f"{field}.at_most", call.at_most)


#: The earliest time a shipped decision may name (no amc host answered before it).
_EARLIEST_S = int(dt.datetime(2000, 1, 1, tzinfo=dt.UTC).timestamp())
#: How far past the cloud's clock a host's may run (skewed clocks happen; years ahead is a bug).
_AHEAD_S = 86_400


def _plausible(ts: timestamp_pb2.Timestamp) -> bool:
    """Whether a host's time is one a model answer can have been given at: a valid Timestamp
    (nanos 0 to 999,999,999) from 2000-01-01 to a day past now. Logged as sent, a zero time
    (Go's year 1, JavaScript's epoch) or a far future one would be shown to auditors as when
    the answer was given."""
    return 0 <= ts.nanos <= 999_999_999 and _EARLIEST_S <= ts.seconds <= time.time() + _AHEAD_S


def usage_problem(field: str, u: types_pb2.Usage) -> str | None:
    """The INVALID_ARGUMENT text for a shipped usage outside what a model call can cost, or
    None: it is added to the task's totals and the fleet's day as sent."""
    tokens = (
        u.input_tokens,
        u.output_tokens,
        u.cache_read_input_tokens,
        u.cache_creation_input_tokens,
        u.thinking_tokens,
    )
    if min(tokens) < 0:
        return f"{field}: token counts must not be negative"
    if max(tokens) > MAX_USAGE_TOKENS:
        return f"{field}: token counts at most {MAX_USAGE_TOKENS:,} each"
    if not 0 <= u.cache_creation_1h_input_tokens <= u.cache_creation_input_tokens:
        return (
            f"{field}.cache_creation_1h_input_tokens: 0 to cache_creation_input_tokens "
            f"({u.cache_creation_input_tokens})"
        )
    if not (math.isfinite(u.cost_usd) and 0 <= u.cost_usd <= MAX_USAGE_COST_USD):
        return f"{field}.cost_usd: a finite amount, 0 to {MAX_USAGE_COST_USD:,} dollars"
    return None


#: A ShipDecisionsRequest's record fields, each with its record's id field.
_RECORD_FIELDS: Final = (
    ("entries", "host_decision_id"),
    ("failed_calls", "host_spend_id"),
    ("unsettled_calls", "host_call_id"),
)


def records_apart(
    partial: Message | None,
) -> tuple[pb.ShipDecisionsRequest, dict[tuple[str, int], str]] | None:
    """A ShipDecisionsRequest that did not parse, read record by record from its bytes twin
    (`wire.bytes_twin`, what `wire.Malformed.partial` holds when only its text was not UTF-8):
    the request with every record that parses alone (`wire.parser`: SANITISED text mended),
    an empty one in place of each other (so the indexes stay the host's), and the problem of
    each of those by (field, index). The contract refuses a record alone for what it holds;
    refusing the whole call for bytes in one record lost every other record. None when
    `partial` is not such a twin."""
    if (
        partial is None
        or partial.DESCRIPTOR.full_name != pb.ShipDecisionsRequest.DESCRIPTOR.full_name
    ):
        return None
    request = pb.ShipDecisionsRequest()
    unreadable: dict[tuple[str, int], str] = {}
    for field, _id in _RECORD_FIELDS:
        out = getattr(request, field)
        parse = wire.parser(type(out.add()).FromString)
        del out[-1]
        for i, twin in enumerate(getattr(partial, field)):
            record = parse(twin.SerializeToString())
            if isinstance(record, wire.Malformed):
                unreadable[(field, i)] = f"{field}[{i}].{record.problem}"
                placeholder = out.add()
                raw_id = getattr(twin, _id)
                setattr(placeholder, _id, raw_id.decode("utf-8", "replace").replace("\x00", ""))
            else:
                out.append(record)
    return request, unreadable


async def ship_decisions(
    context: Context,
    store: Store,
    window: dt.timedelta,
    host_id: str,
    request: pb.ShipDecisionsRequest,
    retire_after: int,
    counted: spend.OnCounted | None = None,
    check_texts: bool = False,
    unreadable: dict[tuple[str, int], str] | None = None,
) -> pb.ShipDecisionsResponse:
    """DecisionLogService.ShipDecisions (see the proto): check every record, then log each
    (a late handover counts on its flow, retired after `retire_after` divergences in a row).
    A record the cloud can never take for what it holds, or for the attempt it names (the lease
    rule), is refused alone (`refused` in the reply) and the others are taken: refusing the
    whole call for it lost every other record of a client that resends nothing refused, and was
    resent for ever by one that resends all.
    `counted` hears the tasks whose totals or calls of unknown cost what was logged moved, once
    the last is committed, with the totals the counting returned (`EventBus.decisions_counted`),
    also when a later record was refused. `check_texts`: the request holds a NUL somewhere
    (`boundary.PER_RECORD`): a record holding one is refused alone, as any malformed field.
    `unreadable`: records that did not parse alone, by (field, index), and why
    (`records_apart`): each is refused alone with that problem."""
    if not request.entries and not request.failed_calls and not request.unsettled_calls:
        await abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            "entries: at least one (or failed_calls, or unsettled_calls)",
        )
    if len(request.entries) > MAX_ENTRIES:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"entries: at most {MAX_ENTRIES}")
    if len(request.failed_calls) > MAX_ENTRIES:
        await abort(
            context, grpc.StatusCode.INVALID_ARGUMENT, f"failed_calls: at most {MAX_ENTRIES}"
        )
    if len(request.unsettled_calls) > MAX_ENTRIES:
        await abort(
            context, grpc.StatusCode.INVALID_ARGUMENT, f"unsettled_calls: at most {MAX_ENTRIES}"
        )
    response = pb.ShipDecisionsResponse()

    def refuse(
        field: str,
        index: int,
        record_id: str,
        reason: str,
        code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
    ) -> None:
        log.warning("ShipDecisions from %s: %s[%d] refused: %s", host_id, field, index, reason)
        response.refused.append(
            pb.ShipRefusal(
                field=field, index=index, record_id=record_id, reason=reason, code=code.name
            )
        )

    async def refuse_all() -> None:
        """Nothing to take: the whole call, as a request of its first refused record alone."""
        first = response.refused[0]
        await abort(context, grpc.StatusCode[first.code], first.reason)

    def well_formed(
        field: str,
        records: Sequence[_Record],
        problem_of: Callable[[int, _Record], str | None],
        record_id: Callable[[_Record], str],
    ) -> list[tuple[int, _Record]]:
        """The records of `field` (with their index) that have no problem of their own; each
        other one is refused alone."""
        kept: list[tuple[int, _Record]] = []
        for i, record in enumerate(records):
            problem = (unreadable or {}).get((field, i))
            text = wire.check_text(record) if check_texts and problem is None else None
            if problem is None:
                problem = f"{field}[{i}].{text}" if text else problem_of(i, record)
            if problem:
                refuse(field, i, record_id(record), problem)
            else:
                kept.append((i, record))
        return kept

    for entry in request.entries:
        # More blocks than the log keeps are merged, not refused: the step is never lost.
        merge_thinking_past_limit(entry.decision.thinking)
    entries = well_formed("entries", request.entries, entry_problem, lambda e: e.host_decision_id)
    failed = well_formed(
        "failed_calls", request.failed_calls, failed_calls_problem, lambda f: f.host_spend_id
    )
    calls = well_formed(
        "unsettled_calls", request.unsettled_calls, unsettled_call_problem, lambda c: c.host_call_id
    )
    total = len(request.entries) + len(request.failed_calls) + len(request.unsettled_calls)
    if len(response.refused) == total:  # nothing to take: an answer that says so
        await refuse_all()
    # A record for an attempt this host may not ship into is refused alone as well: a client
    # shipping several attempts in one call lost them all for one ended long ago.
    takes: dict[tuple[str, int, str], tuple[grpc.StatusCode, str] | None] = {}

    async def taken(field: str, i: int, item: _Leased, record_id: str) -> bool:
        ref = (item.task_id, item.attempt, item.lease_id)
        if ref not in takes:
            takes[ref] = await _lease_problem(store, window, host_id, *ref)
        problem = takes[ref]
        if problem is not None:
            refuse(field, i, record_id, f"{field}[{i}]: {problem[1]}", problem[0])
        return problem is None

    entries = [(i, e) for i, e in entries if await taken("entries", i, e, e.host_decision_id)]
    failed = [(i, f) for i, f in failed if await taken("failed_calls", i, f, f.host_spend_id)]
    calls = [(i, c) for i, c in calls if await taken("unsettled_calls", i, c, c.host_call_id)]
    if len(response.refused) == total:
        await refuse_all()
    acks: dict[int, pb.ShippedDecisionAck] = {}
    handed: dict[tuple[str, int], dict[str, int | None]] = {}
    moved: list[str] = []  # the tasks whose totals or calls of unknown cost moved, in order
    totals: list[spend.TaskSpent] = []  # as counted, once committed (each write's own return)
    #: The calls of unknown cost a failed_calls record of this request settles (counted now or
    #: before): not recorded. A marker is settled by deleting it, so recording one before its
    #: record, as this did, let a resend of the request (its answer lost) record it again while
    #: the record, a duplicate then, settled nothing: "cost unknown" for a call counted.
    settled: set[str] = set()
    try:
        for i, entry in entries:
            await _trusted_handover(store, host_id, f"entries[{i}]", entry, handed)
            outcome = entry.outcome if entry.HasField("outcome") else None
            try:
                heard: list[spend.TaskSpent] = []
                row, duplicate = await decisions.append_shipped(
                    store,
                    host_id,
                    entry.task_id,
                    entry.attempt,
                    entry.host_decision_id,
                    _decision(entry.decision),
                    outcome,
                    retire_after=retire_after,
                    on_totals=heard.append,
                )
                totals += heard
            except decisions.ShippedElsewhere as exc:
                refuse("entries", i, entry.host_decision_id, f"entries[{i}]: {exc}")
                continue
            acks[i] = pb.ShippedDecisionAck(
                host_decision_id=entry.host_decision_id,
                decision_id=row.decision_id,
                step_index=row.step_index,
                duplicate=duplicate,
            )
            if not duplicate:
                moved.append(entry.task_id)
        for i, record in failed:
            usage = usage_from_proto(record.usage)
            # Counted, they are settled in the same write (`spend.add_to_task_totals`).
            usage.calls = [unsettled.host_call_key(host_id, c) for c in record.settles_calls]
            heard = []
            try:
                if await spend.count_failed(
                    store,
                    host_id,
                    record.task_id,
                    record.attempt,
                    Billed(record.provider, record.model, usage),
                    record.error,
                    host_spend_id=record.host_spend_id,
                    on_totals=heard.append,
                ):
                    moved.append(record.task_id)
                    totals += heard
                settled.update(record.settles_calls)
            except spend.SpentElsewhere as exc:
                refuse("failed_calls", i, record.host_spend_id, f"failed_calls[{i}]: {exc}")
        for _, call in calls:
            if call.host_call_id in settled:
                continue  # its cost came with it: recorded, a resend would bring it back
            if await unsettled.shipped(
                store,
                host_id,
                call.host_call_id,
                call.task_id,
                call.attempt,
                call.provider,
                call.model,
                call.started_at.ToDatetime(tzinfo=dt.UTC) if call.HasField("started_at") else None,
                usage_from_proto(call.at_most),
            ):
                moved.append(call.task_id)
    finally:
        if counted is not None and moved:
            newest: dict[str, spend.TaskSpent] = {}
            for s in totals:  # a task's later count has every figure at least as large
                newest[s.task_id] = newest[s.task_id].newest(s) if s.task_id in newest else s
            await counted(list(dict.fromkeys(moved)), list(newest.values()))
    if len(response.refused) == total:  # found while logging: still nothing taken
        await refuse_all()
    response.acks.extend(
        acks.get(i) or pb.ShippedDecisionAck(host_decision_id=e.host_decision_id)
        for i, e in enumerate(request.entries)
    )
    return response


_Leased: TypeAlias = pb.ShippedDecision | pb.ShippedFailedCalls | pb.ShippedUnsettledCall


async def _lease_problem(
    store: Store, window: dt.timedelta, host_id: str, task_id: str, attempt: int, lease_id: str
) -> tuple[grpc.StatusCode, str] | None:
    """Why `host_id` may not ship into (task, attempt, lease id), with its code (final: a
    resend gets the same answer), or None (`check_lease`'s rule)."""
    held = await leases.held_recently(store, host_id, task_id, attempt, lease_id, window)
    if not held.ok:
        return lease_refusal(held), held.message
    if held.planner_transport == types_pb2.PLANNER_TRANSPORT_CLOUD:
        # Decide logged and counted its steps already: a host's claims would sit among them,
        # and its calls count twice.
        return grpc.StatusCode.FAILED_PRECONDITION, (
            f"task {task_id!r} attempt {attempt} is planned by the cloud (cloud transport): "
            "the cloud logs its decisions and counts its calls itself"
        )
    return None


async def _trusted_handover(
    store: Store,
    host_id: str,
    field: str,
    entry: pb.ShippedDecision,
    handed: dict[tuple[str, int], dict[str, int | None]],
) -> None:
    """Leave out the replay handover of `entry` (flow_id, flow_step, replay_divergence) unless
    it is about a flow its attempt was handed (`handed`: those flows by attempt, read once).
    It is counted on the flow it names, and divergences retire a flow: the decision is logged
    (the phone did the step), a report the cloud cannot trust is not, as a result's replay
    report (`validate.replay`)."""
    d = entry.decision
    if not d.flow_id:
        return
    attempt = (entry.task_id, entry.attempt)
    if attempt not in handed:
        handed[attempt] = await flows.handed_steps(store, *attempt)
    report = types_pb2.FlowReplayReport(
        flow_id=d.flow_id, diverged=bool(d.replay_divergence), diverged_at_step=d.flow_step
    )
    problem = validate.replay(report, handed[attempt])
    if problem:
        log.warning(
            "%s: the replay handover of %s/%d from %s is left out: %s",
            field, entry.task_id, entry.attempt, host_id, problem,
        )  # fmt: skip
        for name in ("flow_id", "flow_step", "replay_divergence", "flow_set_aside"):
            d.ClearField(name)


def _decision(message: types_pb2.Decision) -> Decision:
    """The host's decision as the planner's type: arguments rebuilt from the typed action (what
    the host put in arguments_json is not trusted), so masking works as for the cloud's own."""
    decision = decision_from_proto(message)
    decision.step_index = None
    if message.HasField("observation"):  # where it was made, derived as for the cloud's own
        on_screen(decision, scene_from_observation(message.observation), message.observation)
    fit_record(decision)  # each text within its limit, yet all of them past what a record takes
    return decision
