"""DecisionLogService: the durable per-step planner record. Operators read it; hosts on the
direct transport ship their decisions into it (`shipping.ship_decisions`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Final

import grpc
from google.protobuf.message import Message

from amc.v1 import decision_log_service_pb2 as pb
from amc.v1 import decision_log_service_pb2_grpc, types_pb2
from cloud import authz, wire
from cloud.events import EventBus
from cloud.services.attempts import known_attempt, known_step_page
from cloud.services.conversation import conversation_item
from cloud.services.shipping import records_apart, ship_decisions
from cloud.services.status import abort
from cloud.store import convert, decisions, sessions, spend
from cloud.store.database import Store
from cloud.store.paging import page_token, position, token_int
from planner.conversation.items import loads_item
from planner.convert import usage_to_proto

#: The most one ListDecisions or GetConversation page carries of decisions or items, in bytes
#: (one larger entry still goes alone). gRPC clients refuse messages over 4 MiB unless told
#: otherwise (the console's channel, Python's and Node's defaults), and large entries within
#: every limit (long prompts, thinking, observations) made a page of the default 100 too big
#: for them, and for the server's own 16 MiB: that task's log could no longer be read at all.
PAGE_BYTES: Final = 3 * 1024 * 1024


def fitting(page: Sequence[Message], budget: int = PAGE_BYTES) -> int:
    """How many of `page`, from its start, fit in `budget` bytes (at least one)."""
    total = 0
    for i, entry in enumerate(page):
        total += entry.ByteSize()
        if total > budget and i > 0:
            return i
    return len(page)


class DecisionLogServicer(decision_log_service_pb2_grpc.DecisionLogServiceServicer):
    """List and get decisions; read a session-mode attempt's conversation; take shipped ones."""

    def __init__(
        self,
        store: Store,
        ship_window: dt.timedelta = dt.timedelta(days=1),
        *,
        flow_retire_after: int,
        bus: EventBus | None = None,
    ) -> None:
        self._store = store
        self._ship_window = ship_window
        self._retire_after = flow_retire_after
        self._bus = bus

    async def ShipDecisions(
        self,
        request: pb.ShipDecisionsRequest | wire.Malformed,
        context: grpc.aio.ServicerContext[pb.ShipDecisionsRequest, pb.ShipDecisionsResponse],
    ) -> pb.ShipDecisionsResponse:
        # A request holding a NUL comes as its `Malformed` (`boundary.PER_RECORD`): each
        # record's text is checked, and one holding a NUL is refused alone. One that did not
        # parse (bytes that are not UTF-8) is read record by record (`records_apart`).
        check_texts = isinstance(request, wire.Malformed)
        unreadable: dict[tuple[str, int], str] = {}
        if isinstance(request, wire.Malformed):
            if not request.text_only:
                apart = records_apart(request.partial)
                if apart is None:
                    await abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.problem)
                    raise AssertionError("abort raises")
                request, unreadable = apart
            else:
                assert isinstance(request.partial, pb.ShipDecisionsRequest), request
                request = request.partial
        return await ship_decisions(
            context,
            self._store,
            self._ship_window,
            authz.caller().name,
            request,
            self._retire_after,
            None if self._bus is None else self._bus.decisions_counted,
            check_texts,
            unreadable,
        )

    async def ListDecisions(
        self,
        request: pb.ListDecisionsRequest,
        context: grpc.aio.ServicerContext[pb.ListDecisionsRequest, pb.ListDecisionsResponse],
    ) -> pb.ListDecisionsResponse:
        await known_step_page(context, self._store, request, 500)
        try:
            rows, token = await decisions.list_page(
                self._store,
                request.task_id,
                request.attempt,
                request.page_size or 100,
                request.page_token,
                request.after_step,
                request.newest_first,
            )
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")
        listed = [
            convert.decision(r, include_observation=request.include_observation) for r in rows
        ]
        kept = fitting(listed)
        if kept < len(listed):
            listed = listed[:kept]
            token = decisions.cursor(
                rows[kept - 1], request.newest_first, request.attempt, request.after_step
            )
        failed = await spend.failed_by_attempt(self._store, request.task_id, request.attempt)
        pruned = await decisions.pruned(self._store, request.task_id)
        counted = (
            await decisions.step_counts(self._store, request.task_id, request.attempt)
            if request.count_steps
            else []
        )
        return pb.ListDecisionsResponse(
            step_counts=[
                pb.AttemptStepCounts(
                    attempt=c.attempt,
                    decisions=c.decisions,
                    met=c.verdicts["met"],
                    not_met=c.verdicts["not_met"],
                    unknown=c.verdicts["unknown"],
                    unchecked=c.verdicts[None],
                )
                for c in counted
            ],
            decisions=listed,
            next_page_token=token,
            failed_calls=[
                pb.FailedCalls(
                    attempt=f.attempt, decisions=f.decisions, usage=usage_to_proto(f.usage)
                )
                for f in failed
            ],
            pruned=None
            if pruned is None
            else pb.PrunedRecord(
                decisions=pruned.decisions,
                failed_decisions=pruned.failed_decisions,
                pruned_at=convert.ts(pruned.at),
                usage=usage_to_proto(pruned.usage),
                unsettled=types_pb2.UnsettledCalls(
                    calls=pruned.unsettled_calls,
                    at_most=usage_to_proto(pruned.unsettled_at_most),
                )
                if pruned.unsettled_calls
                else None,
            ),
        )

    async def GetDecision(
        self,
        request: pb.GetDecisionRequest,
        context: grpc.aio.ServicerContext[pb.GetDecisionRequest, pb.GetDecisionResponse],
    ) -> pb.GetDecisionResponse:
        if not request.decision_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "decision_id: required")
        row = await decisions.get(self._store, request.decision_id)
        if row is None:
            await abort(
                context, grpc.StatusCode.NOT_FOUND, f"decision {request.decision_id} not found"
            )
        return pb.GetDecisionResponse(decision=convert.decision(row))

    async def GetConversation(
        self,
        request: pb.GetConversationRequest,
        context: grpc.aio.ServicerContext[pb.GetConversationRequest, pb.GetConversationResponse],
    ) -> pb.GetConversationResponse:
        if not request.task_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "task_id: required")
        if request.attempt < 1:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "attempt: must be >= 1")
        if not 0 <= request.page_size <= 500:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "page_size: 0 to 500")
        listing = f"conversation/{request.task_id}/{request.attempt}"
        start = 0
        if request.page_token:
            try:
                (seq,) = position(listing, request.page_token, 1)
                start = token_int(seq)
            except (TypeError, ValueError) as exc:
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")
        await known_attempt(context, self._store, request.task_id, request.attempt)
        size = request.page_size or 100
        rows = await sessions.page(self._store, request.task_id, request.attempt, start, size + 1)
        more = len(rows) > size
        items = [conversation_item(seq, loads_item(body)) for seq, body in rows[:size]]
        kept = fitting(items)
        if kept < len(items):
            items, more = items[:kept], True
        return pb.GetConversationResponse(
            items=items,
            next_page_token=page_token(listing, items[-1].seq + 1) if more else "",
        )
