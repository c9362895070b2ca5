"""FlowService: operators read learned flows and turn them off and on. Operators only."""

from __future__ import annotations

from typing import Any

import grpc

from amc.v1 import flow_service_pb2 as pb
from amc.v1 import flow_service_pb2_grpc, types_pb2
from cloud import authz
from cloud.services.decision_log_service import fitting
from cloud.services.status import abort
from cloud.store import convert, flows
from cloud.store.database import Store

MAX_REASON = 500
_SETTABLE = {
    types_pb2.FLOW_STATUS_ACTIVE: flows.ACTIVE,
    types_pb2.FLOW_STATUS_DISABLED: flows.DISABLED,
}
_NAMES = {v: k for k, v in convert.FLOW_STATUSES.items()}


async def _check_id(context: grpc.aio.ServicerContext[Any, Any], flow_id: str) -> None:
    """Refuse a missing flow id, and one longer than any flow id can be: it is malformed, not
    a flow that is not there (it was cut to 64 characters and answered NOT_FOUND)."""
    if not flow_id:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "flow_id: required")
    if len(flow_id) > flows.FLOW_ID_LENGTH:
        await abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"flow_id: at most {flows.FLOW_ID_LENGTH} characters, got {len(flow_id)}",
        )


class FlowServicer(flow_service_pb2_grpc.FlowServiceServicer):
    """List, get and set the status of learned flows."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def ListFlows(
        self,
        request: pb.ListFlowsRequest,
        context: grpc.aio.ServicerContext[pb.ListFlowsRequest, pb.ListFlowsResponse],
    ) -> pb.ListFlowsResponse:
        if not 0 <= request.page_size <= 500:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "page_size: 0 to 500")
        statuses = []
        for status in sorted(set(request.statuses)):  # each once, as ListTasks
            if status not in _NAMES:
                await abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, f"statuses: unknown value {status}"
                )
            statuses.append(_NAMES[status])
        try:
            rows, token = await flows.list_page(
                self._store, tuple(statuses), request.page_size or 50, request.page_token
            )
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")
        listed = [convert.flow(r, with_steps=False) for r in rows]
        # A flow keeps its goal twice (template, embedding text): 16 kB for 2,000 emoji. A page
        # of 500 is cut where it would pass what a default gRPC client reads, as ListTasks' is.
        kept = fitting(listed)
        if kept < len(rows):
            listed = listed[:kept]
            token = flows.encode_cursor(tuple(statuses), rows[kept - 1])
        return pb.ListFlowsResponse(flows=listed, next_page_token=token)

    async def GetFlow(
        self,
        request: pb.GetFlowRequest,
        context: grpc.aio.ServicerContext[pb.GetFlowRequest, pb.GetFlowResponse],
    ) -> pb.GetFlowResponse:
        await _check_id(context, request.flow_id)
        row = await flows.get(self._store, request.flow_id)
        if row is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"flow {request.flow_id} not found")
        return pb.GetFlowResponse(flow=convert.flow(row))

    async def SetFlowStatus(
        self,
        request: pb.SetFlowStatusRequest,
        context: grpc.aio.ServicerContext[pb.SetFlowStatusRequest, pb.SetFlowStatusResponse],
    ) -> pb.SetFlowStatusResponse:
        await _check_id(context, request.flow_id)
        status = _SETTABLE.get(request.status)
        if status is None:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "status: FLOW_STATUS_ACTIVE or FLOW_STATUS_DISABLED (retiring is the cloud's)",
            )
        if len(request.reason) > MAX_REASON:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"reason: at most {MAX_REASON} characters",
            )
        verb = "enabled" if status == flows.ACTIVE else "disabled"
        reason = f"{verb} by operator {authz.caller().name}" + (
            f": {request.reason}" if request.reason else ""
        )
        row = await flows.set_status(self._store, request.flow_id, status, reason)
        if row is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"flow {request.flow_id} not found")
        return pb.SetFlowStatusResponse(flow=convert.flow(row))
